/* NCCL allreduce among W GPU workers (psworker --allreduce nccl), the
 * GPU counterpart of worker/comm/ps_ring.h: same shape of API, same result (the
 * SUM, or the mean as sum / (float)W the way psd and ps_ring divide), but
 * the data stay in device memory and NCCL moves them over NVLink / PCIe /
 * InfiniBand.  Compiled only when configure found CUDA and libnccl
 * (PS_HAVE_NCCL in config.h); built without NCCL every call below returns
 * PS_EUNSUPPORTED and ps_nccl_compiled() is 0, so callers can link it
 * unconditionally under HAVE_CUDA and fall back to ps_ring.
 *
 * Rendezvous: NCCL needs one ncclUniqueId shared by all ranks.  Rank 0
 * creates it and binds a ZeroMQ ROUTER socket at endpoint0
 * ("tcp://host:port"); every other rank connects a REQ socket and sends
 * (all integers little-endian)
 *   request: u32 magic "PSN1" | u32 rank | u32 world | u32 0        (16 bytes)
 *   reply:   u32 magic "PSN1" | i32 status | u32 world | u32 0
 *            | 128-byte ncclUniqueId                               (144 bytes)
 * status 0 = accepted; PS_EMISMATCH = this rank disagrees on world; PS_EINVAL
 * = rank out of range or already taken.  Rank 0 answers until all W-1 peers
 * have asked, then closes the socket; it is used only during ps_nccl_new.
 *
 * Failures never hang or abort the process: the communicator is created
 * non-blocking (ncclConfig_t.blocking = 0) and every wait -- rendezvous,
 * ncclCommInitRankConfig, each allreduce until its stream work is done --
 * polls ncclCommGetAsyncError / cudaStreamQuery against a deadline of
 * timeout_ms.  Past it the communicator is aborted (ncclCommAbort) and the
 * call returns PS_ETIMEOUT; an NCCL error (e.g. a peer that died and took
 * its socket with it) aborts too and returns PS_ECUDA.  After either the
 * object is broken: later allreduces return PS_ESTATE; destroy it and build
 * a new one (all ranks must).  Every NCCL / CUDA status is checked where the
 * call is made and logged with ncclGetErrorString / cudaGetErrorString.
 *
 * Wire dtypes: PS_DT_FP32 reduces the caller's buffer in place (ncclFloat);
 * PS_DT_FP16 / PS_DT_BF16 round it into a device staging buffer with
 * ps_cuda_f32_to_f16 / _bf16 (RNE, as common/ps_half.c), reduce that with
 * ncclHalf / ncclBfloat16 and widen the result back into the buffer.  NCCL
 * then adds in the wire dtype at every hop, so the error bound is the one
 * ps_ring.h gives (about W roundings of sum_i |x_i|) and fp16 overflows above
 * 65504.  The sum order is NCCL's (ring or tree, chosen at run time), so the
 * result agrees with psd / ps_ring to rounding only, but every rank gets the
 * same bits.
 *
 * One GPU per rank: NCCL refuses two ranks of one communicator on the same
 * device ("Duplicate GPU detected"); that is reported as PS_EUNSUPPORTED.
 * CUDA does not survive fork(): a process that wants to fork its ranks must
 * not touch CUDA (not even ps_cuda_device_count) before forking.
 * Not thread-safe: one thread drives a communicator. */
#ifndef PS_NCCL_H
#define PS_NCCL_H
#include <stddef.h>

#include "ps_codec.h" /* ps_dtype_t */

typedef struct ps_nccl ps_nccl_t;

/* 1 when built with NCCL, 0 when every function below is a stub. */
int ps_nccl_compiled(void);

/* Create rank `rank` of a communicator of `world` ranks on CUDA device
 * `device` (made current for the calling thread).  endpoint0 is the ZeroMQ
 * endpoint rank 0 binds and the others connect to.  timeout_ms (> 0) bounds
 * the rendezvous, the NCCL setup and, later, each allreduce.  Blocks until
 * all ranks have joined.  Returns 0 with *n set; PS_EINVAL (bad rank, world
 * < 1, NULL endpoint, device < 0, timeout_ms <= 0); PS_EZMQ (bind / connect
 * failed); PS_EMISMATCH / PS_EPROTO (rank 0 disagrees or answered garbage);
 * PS_ETIMEOUT (a rank missing); PS_EUNSUPPORTED (no NCCL, or two ranks on one
 * GPU); PS_ECUDA; PS_ENOMEM. */
int ps_nccl_new(ps_nccl_t **n, int rank, int world, const char *endpoint0, int device,
                int timeout_ms);

/* Sum dev_buf[0..count) (device memory, fp32) over all ranks in place, with
 * `dtype` on the wire; every rank calls it with the same count and dtype in
 * the same order.  The work is queued on `stream` (a cudaStream_t, NULL =
 * the default stream) and the call returns once it is complete (the result
 * is in dev_buf).  count == 0 returns 0 at once.  Returns 0; PS_EINVAL (NULL
 * buffer with count > 0, unknown dtype, count too large); PS_ETIMEOUT;
 * PS_ECUDA; PS_ENOMEM (staging buffer); PS_ESTATE (broken earlier). */
int ps_nccl_allreduce(ps_nccl_t *n, float *dev_buf, size_t count, ps_dtype_t dtype,
                      void *stream);

/* ps_nccl_allreduce, then dev_buf[i] /= (float)world in fp32 on the GPU --
 * the division psd and ps_ring_allreduce_mean use. */
int ps_nccl_allreduce_mean(ps_nccl_t *n, float *dev_buf, size_t count, ps_dtype_t dtype,
                           void *stream);

/* dev_recv[r*count .. (r+1)*count) := rank r's dev_send[0..count), every
 * rank r (fp32, device memory; cross-worker BN's gather), queued on stream
 * and complete when it returns; the errors of ps_nccl_allreduce. */
int ps_nccl_allgather(ps_nccl_t *n, const float *dev_send, float *dev_recv, size_t count,
                      void *stream);

int ps_nccl_rank(const ps_nccl_t *n);
int ps_nccl_world(const ps_nccl_t *n);

/* Finalize (waiting at most timeout_ms for peers) or abort the communicator,
 * free the staging buffer and the object; NULLs *n.  Safe on NULL. */
void ps_nccl_destroy(ps_nccl_t **n);
#endif
