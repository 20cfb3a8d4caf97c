/* Inside of psd's shard checkpoints, shared by psd_checkpoint_files.c
 * (names, listing, pruning, the failure note), psd_checkpoint_write.c
 * (snapshot, write off the loop thread), psd_checkpoint_load.c (verify and
 * load at start) and psd_shutdown.c (the final checkpoint of an orderly
 * stop).
 *
 * Shard checkpoints: one safetensors file per checkpoint,
 * DIR/psd-<server>-<seq>.safetensors, holding "w.<part>" (weights) and
 * "m.<part>" (momentum) for every partition this server owns, with metadata:
 *   format       "psd-checkpoint-1"
 *   server_id    this shard
 *   table_hash   hex; spec: the INIT spec JSON (rebuilds the table, optim)
 *   optim        the optimizer config JSON (informational)
 *   versions     JSON [[part, version, initialised, overflow, [pending ranks],
 *                [last iteration + 1 per rank]], ...] in part order
 *   updates      shard updates so far
 *   data_crc32c  hex CRC32C over w.p, m.p, then g.p.r of each pending rank,
 *                in `versions` order
 * "g.<part>.<rank>" are the sync gradients already received (and ACKed) for
 * the current iteration, so a restart does not lose a push that a worker
 * will not send again; the per-rank last iterations keep async retries
 * idempotent across a restart.
 * The writer makes it durable (temp, fsync, rename, fsync dir); the last two
 * are kept, and at start the newest one that verifies is loaded.
 * The state is copied on the loop thread (a memcpy, cheap next to fsync) and
 * written on libuv's thread pool, at most one write in flight.
 * A write that fails (full disk, I/O error, ...) saves nothing: the files
 * before it stand, nothing reports it as done (STATS' checkpoint versions
 * move only on a durable file), it is counted and logged with its cause,
 * a CHECKPOINT request covered by it gets ERROR with that cause, and a
 * failed final checkpoint makes psd exit 1.  A note in the directory
 * (psd_checkpoint_marker_update) lets a restarted server say why it has
 * no checkpoint. */
#ifndef PSD_CHECKPOINT_INTERNAL_H
#define PSD_CHECKPOINT_INTERNAL_H
#include <stddef.h>
#include <stdint.h>

#include "psd.h"

#define CKPT_FORMAT "psd-checkpoint-1"

/* psd_checkpoint_files.c: remove the temporary files of interrupted
 * writes; delete all but the newest CKPT_KEEP files; the failure note's
 * path, its update after a write (pool thread) and what a previous run
 * left in it (1 and its text, or 0 when there is none). */
void psd_checkpoint_remove_stale(const char *dir, int sid);
void psd_checkpoint_prune(psd_t *s);
void psd_checkpoint_marker_path(char *buf, size_t cap, const char *dir, int sid);
void psd_checkpoint_marker_update(const char *path, int failed, const char *cause);
int psd_checkpoint_marker_read(const char *dir, int sid, char *buf, size_t cap);

/* psd_checkpoint_write.c: the lowest and highest version of the owned
 * partitions (0 when there is none or one has no weights yet); the aligned
 * version k*N they are all at, 0 when they are not. */
int psd_checkpoint_versions(const psd_t *s, uint64_t *vmin, uint64_t *vmax);
uint64_t psd_checkpoint_aligned_version(const psd_t *s);

/* psd_shutdown.c: the final checkpoint of a stop ended with rc (0:
 * durable); the stop goes on. */
void psd_shutdown_checkpoint_done(psd_t *s, int rc);

#endif
