/* One function per request type, and the update path PUSH / PUSHPULL
 * share (sync: a slot per rank until every required rank has pushed, then
 * sum + apply; async / ssp: apply at once).  Every request is checked
 * against the header and the partition table before anything is touched; a
 * bad one gets ERROR(code, text) and a log line and changes nothing. */
#include "psd.h"

#include <stdlib.h>
#include <string.h>

#include "ps_error.h"
#include "ps_log.h"

#define PSD_INIT_SPEC_PART 0xFFFFFFFFu

static void send_ack(psd_t *s, ps_wire_msg_t *m, uint32_t flags)
{
    Ps__Header h;
    ps_wire_header_init(&h, PS__MSG_TYPE__MSG_ACK);
    h.has_request_id = 1, h.request_id = m->hdr->request_id;
    h.has_partition = m->hdr->has_partition, h.partition = m->hdr->partition;
    if (flags) h.has_flags = 1, h.flags = flags;
    psd_send(s, PSD_ID_OF(m), &h, NULL, 0);
}

static void after_update(psd_t *s, psd_part_t *p)
{
    p->wait_since_ms = 0;
    psd_waiters_notify(s, p);
    psd_checkpoint_maybe(s);
}

/* Every required gradient of p's step is in: update, answer, checkpoint. */
static void apply_sync(psd_t *s, psd_part_t *p)
{
    psd_late_applying(s, p);
    p->rebuilt = 0;
    psd_store_apply_sync(s, p);
    after_update(s, p);
}

/* Whether p's next sync update can be made: every rank whose gradient is
 * required (psd_members_required) has pushed one; *ncontrib: how many did. */
static int sync_ready(psd_t *s, psd_part_t *p, int *ncontrib)
{
    int n = 0;
    for (int r = 0; r < s->st.nworkers; r++) {
        if (p->have[r]) n++;
        else if (psd_members_required(s, r, p->version)) return 0;
    }
    *ncontrib = n;
    return n > 0;
}

void psd_recheck_pending(psd_t *s)
{
    if (!s->st.have_table || s->mode != PSD_SYNC || s->shutting) return;
    for (uint32_t i = 0; i < s->st.table.nparts; i++) {
        psd_part_t *p = &s->st.parts[i];
        int n;
        if (p->owned && p->initialised && sync_ready(s, p, &n)) apply_sync(s, p);
    }
}

/* Checks shared by PUSH / PUSHPULL / PULL / weight INIT: the partition is
 * known, ours, and the header's numel / dtype / codec are usable. */
static psd_part_t *check_part(psd_t *s, ps_wire_msg_t *m, int need_weights)
{
    const Ps__Header *h = m->hdr;
    const char *what = ps_wire_type_name(h->type);
    if (!s->st.have_table) {
        /* Nothing of the job here (a server started empty, its checkpoint
         * lost or never written): workers that keep the partitions' state
         * rebuild it (PS_FLAG_REBUILD); the others stop with this text. */
        char why[900], text[1000];
        psd_checkpoint_why_none(s, why, sizeof why);
        snprintf(text, sizeof text, "%s before INIT: %s", what, why);
        psd_send_rebuild_error(s, PSD_ID_OF(m), h, text);
        return NULL;
    }
    if (!h->has_partition || h->partition >= s->st.table.nparts) {
        psd_send_error(s, PSD_ID_OF(m), h, PS_ENOTFOUND, "%s: unknown partition %u (table has %u)", what,
                       h->partition, s->st.table.nparts);
        return NULL;
    }
    psd_part_t *p = &s->st.parts[h->partition];
    if (!p->owned) {
        psd_send_error(s, PSD_ID_OF(m), h, PS_ENOTFOUND, "%s: partition %u belongs to server %u, not %d",
                       what, p->id, s->st.table.parts[p->id].server, s->o.server_id);
        return NULL;
    }
    if (h->has_table_hash && h->table_hash != s->st.table.hash) {
        psd_send_error(s, PSD_ID_OF(m), h, PS_EMISMATCH, "%s: table hash 0x%016llx, server has 0x%016llx",
                       what, (unsigned long long)h->table_hash,
                       (unsigned long long)s->st.table.hash);
        return NULL;
    }
    if ((unsigned)h->dtype >= PSD_NDTYPE || (unsigned)h->codec >= PSD_NCODEC) {
        psd_send_error(s, PSD_ID_OF(m), h, PS_EINVAL, "%s: unknown dtype %d or codec %d", what, h->dtype,
                       h->codec);
        return NULL;
    }
    if (h->has_reply_codec && h->reply_codec != PS__CODEC__CODEC_RAW && h->reply_codec != PS__CODEC__CODEC_LZ4) {
        psd_send_error(s, PSD_ID_OF(m), h, PS_EINVAL, "%s: reply_codec %d: weights are sent raw or lz4 only",
                       what, (int)h->reply_codec);
        return NULL;
    }
    if (need_weights && !p->initialised) {
        /* Never so at a start (the workers push after rank 0's INIT of every
         * partition): this server is being rebuilt, so PS_FLAG_REBUILD. */
        char text[160];
        snprintf(text, sizeof text, "%s: partition %u has no weights yet (INIT first)", what, p->id);
        psd_send_rebuild_error(s, PSD_ID_OF(m), h, text);
        return NULL;
    }
    return p;
}

/* Decode the payload of m into dst (p->numel floats); ERROR on failure. */
static int decode_into(psd_t *s, ps_wire_msg_t *m, psd_part_t *p, float *dst)
{
    const Ps__Header *h = m->hdr;
    const char *what = ps_wire_type_name(h->type);
    if (!h->has_numel || h->numel != p->numel) {
        psd_send_error(s, PSD_ID_OF(m), h, PS_EMISMATCH, "%s: numel %llu but partition %u has %zu elements",
                       what, (unsigned long long)h->numel, p->id, p->numel);
        return -1;
    }
    if (!m->has_payload) {
        psd_send_error(s, PSD_ID_OF(m), h, PS_EPROTO, "%s: partition %u: payload missing", what, p->id);
        return -1;
    }
    size_t need = ps_codec_scratch_size((ps_dtype_t)h->dtype, (ps_codec_t)h->codec, p->numel);
    if (need && psd_store_scratch(&s->st, need)) {
        psd_send_error(s, PSD_ID_OF(m), h, PS_ENOMEM, "%s: out of memory for decode", what);
        return -1;
    }
    ps_dtype_t dt = (ps_dtype_t)h->dtype;
    ps_codec_t cc = (ps_codec_t)h->codec;
    int rc = ps_codec_decode(dst, p->numel, zmq_msg_data(&m->payload), zmq_msg_size(&m->payload),
                             dt, cc, 0, s->st.scratch);
    if (rc) {
        psd_send_error(s, PSD_ID_OF(m), h, rc, "%s: partition %u: %zu payload bytes do not decode as %llu %s/%s: %s",
                       what, p->id, zmq_msg_size(&m->payload), (unsigned long long)h->numel,
                       ps_dtype_name(dt), ps_codec_name(cc), ps_strerror(rc));
        return -1;
    }
    if (s->o.reject_nonfinite && psd_store_nonfinite(s, dst, p->numel)) {
        psd_send_error(s, PSD_ID_OF(m), h, PS_ENONFINITE, "%s: partition %u: NaN or Inf in the data", what,
                       p->id);
        return -1;
    }
    return 0;
}

/* INIT with PS_FLAG_STATE: a worker that kept partition p's state
 * rebuilds it on a server that lost it: raw fp32 weights then momentum at
 * version `iteration`; with PS_FLAG_EXACT too, the weights of the version
 * before (what a worker that died between its pushes computes again from),
 * sent after the state.  A partition that has its state keeps it. */
static void init_state(psd_t *s, ps_wire_msg_t *m, psd_part_t *p)
{
    const Ps__Header *h = m->hdr;
    int prev = (h->flags & PS_FLAG_EXACT) != 0;
    size_t bytes = p->numel * sizeof(float), len = m->has_payload ? zmq_msg_size(&m->payload) : 0;
    if (s->mode != PSD_SYNC || h->dtype != PS__DTYPE__DT_FP32 || h->codec != PS__CODEC__CODEC_RAW ||
        !h->has_iteration || len != (prev ? 1 : 2) * bytes) {
        psd_send_error(s, PSD_ID_OF(m), h, PS_EPROTO,
                       "INIT with state of partition %u: want sync mode, an iteration and raw "
                       "fp32 %s (%zu bytes), got %zu", p->id,
                       prev ? "weights" : "weights then momentum", (prev ? 1 : 2) * bytes, len);
        return;
    }
    const float *src = zmq_msg_data(&m->payload);
    if (s->o.reject_nonfinite && psd_store_nonfinite(s, src, len / sizeof(float))) {
        psd_send_error(s, PSD_ID_OF(m), h, PS_ENONFINITE, "INIT: partition %u: NaN or Inf", p->id);
        return;
    }
    if (prev) {
        float *prev;
        if (p->initialised && p->version == h->iteration + 1 && (prev = psd_store_prev_writable(p))) {
            memcpy(prev, src, bytes);
            p->prev_version = h->iteration;
            p->prev_skipped = 0;
        }
    } else if (!p->initialised) {
        psd_store_weights_writable(s, p);
        memcpy(p->w, src, bytes);
        memcpy(p->m, src + p->numel, bytes);
        psd_store_forget_prev(p);
        p->version = h->iteration;
        p->initialised = 1;
        p->rebuilt = 1;
        ps_info("partition %u rebuilt at version %llu from rank %d's copy", p->id,
                (unsigned long long)p->version, h->has_rank ? h->rank : -1);
        psd_waiters_notify(s, p);
    }
    send_ack(s, m, 0);
}

static void handle_init(psd_t *s, ps_wire_msg_t *m)
{
    const Ps__Header *h = m->hdr;
    char err[512] = "";
    if (!h->has_partition || h->partition == PSD_INIT_SPEC_PART) {
        if (!h->has_body || !h->body.len) {
            psd_send_error(s, PSD_ID_OF(m), h, PS_EPROTO, "INIT spec without a body (JSON model spec)");
            return;
        }
        int rc = psd_spec_hold(s, (const char *)h->body.data, h->body.len,
                               h->has_table_hash ? &h->table_hash : NULL, err, sizeof err);
        if (rc) {
            psd_send_error(s, PSD_ID_OF(m), h, rc, "%s", err);
            return;
        }
        send_ack(s, m, s->st.from_ckpt ? PS_FLAG_FROM_CKPT : 0);
        return;
    }
    psd_part_t *p = check_part(s, m, 0);
    if (!p) return;
    if (h->flags & PS_FLAG_STATE) {
        init_state(s, m, p);
        return;
    }
    if (p->initialised) { /* a retry, or state from a checkpoint: keep what we have */
        send_ack(s, m, s->st.from_ckpt ? PS_FLAG_FROM_CKPT : 0);
        return;
    }
    /* Decode aside so a bad payload cannot leave half-written weights. */
    if (decode_into(s, m, p, s->st.gsum)) return;
    psd_store_weights_writable(s, p);
    memcpy(p->w, s->st.gsum, p->numel * sizeof(float));
    psd_store_forget_prev(p);
    p->version = h->has_iteration ? h->iteration : 0;
    p->initialised = 1;
    ps_debug("partition %u initialised (%zu elements, version %llu)", p->id, p->numel,
             (unsigned long long)p->version);
    send_ack(s, m, 0);
    psd_waiters_notify(s, p);
}

/* A retry of a push that is already applied: answer like the original. */
static void reply_done(psd_t *s, ps_wire_msg_t *m, psd_part_t *p, int pushpull)
{
    if (pushpull && (m->hdr->flags & PS_FLAG_STATE) && s->mode == PSD_SYNC)
        psd_send_state(s, PSD_ID_OF(m), m->hdr->request_id, p);
    else if (pushpull)
        psd_send_weights(s, PSD_ID_OF(m), m->hdr->request_id, p, m->hdr->dtype,
                         psd_reply_codec(m->hdr));
    else if (!(m->hdr->flags & PS_FLAG_NO_REPLY)) send_ack(s, m, 0);
}

/* A raw fp32 payload that can be read in place is not copied into the
 * rank's slot (one pass over 4 bytes/element less): the push that completes
 * p's set is summed straight from the message being handled (p->direct),
 * an earlier one is kept as the received ZMQ message until the update
 * (p->held[rank]).  Returns 1 (staged), 0 (decode normally), -1 (ERROR sent). */
static int stage_direct(psd_t *s, ps_wire_msg_t *m, psd_part_t *p, int rank)
{
    const Ps__Header *h = m->hdr;
    if (h->dtype != PS__DTYPE__DT_FP32 || h->codec != PS__CODEC__CODEC_RAW || !m->has_payload ||
        !h->has_numel || h->numel != p->numel ||
        zmq_msg_size(&m->payload) != p->numel * sizeof(float) ||
        ((uintptr_t)zmq_msg_data(&m->payload) & (_Alignof(float) - 1)))
        return 0;
    int n;
    p->have[rank] = 1;
    int ready = sync_ready(s, p, &n);
    p->have[rank] = 0;
    if (!ready && (!p->held || p->held_on[rank])) return 0;
    const float *g = zmq_msg_data(&m->payload);
    if (s->o.reject_nonfinite && psd_store_nonfinite(s, g, p->numel)) {
        psd_send_error(s, PSD_ID_OF(m), h, PS_ENONFINITE, "%s: partition %u: NaN or Inf in the data",
                       ps_wire_type_name(h->type), p->id);
        return -1;
    }
    if (ready) {
        p->direct = g;
        p->direct_rank = rank;
        return 1;
    }
    /* Keep the message: m's payload frame is left empty (closing it is a no-op). */
    zmq_msg_init(&p->held[rank]);
    if (zmq_msg_move(&p->held[rank], &m->payload) < 0) {
        zmq_msg_close(&p->held[rank]);
        return 0;
    }
    m->has_payload = 0;
    p->held_on[rank] = 1;
    return 1;
}

static void push_sync(psd_t *s, ps_wire_msg_t *m, psd_part_t *p, int rank, int pushpull)
{
    const Ps__Header *h = m->hdr;
    uint64_t it = h->iteration;
    if (it < p->version) {
        reply_done(s, m, p, pushpull);
        return;
    }
    if (it == p->version + 1 && p->rebuilt) {
        /* The server lost here had gone one update further than the copy
         * this partition was rebuilt from (the keeper's reply of that
         * update was lost with it), and this worker saw it: the update must
         * be made again, so this worker computes that step again from the
         * version before (the workers' rebuild path), its push of this
         * iteration kept or not.  Nothing is rolled back. */
        char text[300];
        snprintf(text, sizeof text, "%s for iteration %llu but partition %u was rebuilt at version "
                 "%llu from the workers' copies: compute step %llu again",
                 ps_wire_type_name(h->type), (unsigned long long)it, p->id,
                 (unsigned long long)p->version, (unsigned long long)p->version);
        psd_send_rebuild_error(s, PSD_ID_OF(m), h, text);
        return;
    }
    if (it > p->version) {
        /* Only a server that lost state (restarted from an older
         * checkpoint) sees a sync push from the future: tell the worker,
         * machine-readably, which version to roll everyone back to. */
        psd_send_rollback_error(s, PSD_ID_OF(m), h, p->version,
                                "%s for iteration %llu but partition %u is at version %llu (sync "
                                "mode: this server restarted from a checkpoint; roll back)",
                                ps_wire_type_name(h->type), (unsigned long long)it, p->id,
                                (unsigned long long)p->version);
        /* Only a server whose versions went back (restarted from a
         * checkpoint, or rolled back) drops the round: on any other, a
         * push from the future is a bad message and disturbs no one. */
        if (s->st.from_ckpt || s->rollbacks) psd_rollback_drop_round(s);
        return;
    }
    if (!p->have[rank]) {
        int ovf = (h->flags & PS_FLAG_OVERFLOW) != 0;
        /* An overflowed step is skipped anyway: its (Inf) gradient is not read. */
        if (!ovf) {
            int d = stage_direct(s, m, p, rank);
            if (d < 0 || (d == 0 && decode_into(s, m, p, p->slots + (size_t)rank * p->numel)))
                return;
        }
        p->have[rank] = 1;
        p->overflow |= ovf;
        psd_late_arrived(s, p, rank);
    }
    int n;
    if (pushpull) {
        if (psd_waiters_add(s, m, p, it + 1)) goto out;
    } else if (!(h->flags & PS_FLAG_NO_REPLY)) {
        send_ack(s, m, 0);
    }
    if (sync_ready(s, p, &n)) apply_sync(s, p);
out:
    /* Not applied now (the reply could not be queued): the payload dies
     * with the message, so keep a copy in the rank's slot. */
    if (p->direct) {
        memcpy(p->slots + (size_t)rank * p->numel, p->direct, p->numel * sizeof(float));
        p->direct = NULL;
    }
}

static void push_async(psd_t *s, ps_wire_msg_t *m, psd_part_t *p, int rank, int pushpull)
{
    const Ps__Header *h = m->hdr;
    uint64_t it = h->iteration;
    if (it < p->last_iter[rank]) { /* last_iter holds the last applied iteration + 1 */
        reply_done(s, m, p, pushpull);
        return;
    }
    if (s->mode == PSD_SSP && it + (uint64_t)s->o.staleness < p->version) {
        psd_send_error(s, PSD_ID_OF(m), h, PS_ESTALE,
                       "%s for iteration %llu is older than version %llu - staleness %d (partition %u)",
                       ps_wire_type_name(h->type), (unsigned long long)it,
                       (unsigned long long)p->version, s->o.staleness, p->id);
        return;
    }
    if (h->flags & PS_FLAG_OVERFLOW) {
        s->mx.skipped++;
    } else {
        if (decode_into(s, m, p, s->st.gsum)) return;
        psd_store_apply_async(s, p, s->st.gsum);
    }
    p->last_iter[rank] = it + 1;
    reply_done(s, m, p, pushpull);
    after_update(s, p);
}

static void handle_push(psd_t *s, ps_wire_msg_t *m, int pushpull)
{
    psd_part_t *p = check_part(s, m, 1);
    if (!p) return;
    const Ps__Header *h = m->hdr;
    if (!h->has_rank || h->rank < 0 || h->rank >= s->st.nworkers) {
        psd_send_error(s, PSD_ID_OF(m), h, PS_ERANGE, "%s: rank %d not in 0..%d", ps_wire_type_name(h->type),
                       h->has_rank ? h->rank : -1, s->st.nworkers - 1);
        return;
    }
    if (s->mode == PSD_SYNC) push_sync(s, m, p, h->rank, pushpull);
    else push_async(s, m, p, h->rank, pushpull);
}

static void handle_pull(psd_t *s, ps_wire_msg_t *m)
{
    /* PS_FLAG_REBUILD: a worker rebuilding this server waits for the
     * partition's INIT from the worker that kept it */
    int rebuild = (m->hdr->flags & PS_FLAG_REBUILD) != 0;
    psd_part_t *p = check_part(s, m, !rebuild);
    if (!p) return;
    if (!p->initialised) {
        psd_waiters_add(s, m, p, 0);
        return;
    }
    uint64_t want = m->hdr->has_min_version ? m->hdr->min_version : 0;
    if (p->version >= want && (m->hdr->flags & PS_FLAG_EXACT))
        /* a worker that died between its pushes of step `want` comes back:
         * it computes that step from version `want` everywhere */
        psd_send_weights_of(s, PSD_ID_OF(m), m->hdr->request_id, p, want, m->hdr->dtype,
                            psd_reply_codec(m->hdr));
    else if (p->version >= want)
        psd_send_weights(s, PSD_ID_OF(m), m->hdr->request_id, p, m->hdr->dtype,
                         psd_reply_codec(m->hdr));
    else psd_waiters_add(s, m, p, want);
}

static void handle_stats(psd_t *s, ps_wire_msg_t *m)
{
    char *json = psd_stats_json(s, (m->hdr->flags & PS_FLAG_PREFLIGHT) != 0);
    if (!json) {
        psd_send_error(s, PSD_ID_OF(m), m->hdr, PS_ENOMEM, "STATS: out of memory");
        return;
    }
    Ps__Header h;
    ps_wire_header_init(&h, PS__MSG_TYPE__MSG_ACK);
    h.has_request_id = 1, h.request_id = m->hdr->request_id;
    h.has_body = 1;
    h.body.data = (uint8_t *)json;
    h.body.len = strlen(json);
    psd_send(s, PSD_ID_OF(m), &h, NULL, 0);
    free(json);
}

/* CHECKPOINT: answered ACK once the file is durable (the write runs off the
 * loop thread), or ERROR. */
static void handle_checkpoint(psd_t *s, ps_wire_msg_t *m)
{
    if (!s->o.checkpoint_dir || !s->o.checkpoint_dir[0]) {
        psd_send_error(s, PSD_ID_OF(m), m->hdr, PS_EUNSUPPORTED, "CHECKPOINT: psd runs without --checkpoint-dir");
        return;
    }
    if (!s->st.have_table) {
        psd_send_error(s, PSD_ID_OF(m), m->hdr, PS_ESTATE, "CHECKPOINT before INIT: nothing to save");
        return;
    }
    psd_ackwait_t *w = psd_ackwait_new(m);
    if (!w) {
        psd_send_error(s, PSD_ID_OF(m), m->hdr, PS_ENOMEM, "CHECKPOINT: out of memory");
        return;
    }
    psd_checkpoint_start(s, w); /* answers w, also on failure */
}

static void handle_shutdown(psd_t *s, ps_wire_msg_t *m)
{
    psd_ackwait_t *w = psd_ackwait_new(m);
    if (!w) {
        psd_send_error(s, PSD_ID_OF(m), m->hdr, PS_ENOMEM, "SHUTDOWN: out of memory");
        return;
    }
    psd_shutdown_begin(s, "SHUTDOWN request", w);
}

static void handle_hello(psd_t *s, ps_wire_msg_t *m)
{
    char refusal[320];
    int r = psd_handle_hello(s, m, refusal, sizeof refusal);
    if (refusal[0]) psd_jobfail(s, "%s", refusal);
    else if (r >= 0 && s->job_failed) psd_jobfail_hello(s, r);
}

static void handle_bye(psd_t *s, ps_wire_msg_t *m)
{
    const Ps__Header *h = m->hdr;
    int out = psd_handle_bye(s, m);
    if (out == PSD_BYE_FAILED)
        psd_jobfail(s, "worker rank %d failed: %s%s%s", h->rank,
                    h->has_error_code ? ps_strerror(h->error_code) : "error",
                    h->error_text && *h->error_text ? ": " : "",
                    h->error_text ? h->error_text : "");
    else if (out != PSD_BYE_REFUSED)
        psd_recheck_pending(s);
}

/* A request that changes the job's state must come from a worker of the
 * job: INIT from rank 0's process, ROLLBACK from any rank's (by the session
 * token bound at HELLO).  Servers whose workers sent no tokens (tools and
 * tests that speak the protocol by hand) check nothing: plaintext mode
 * trusts the network (docs/protocol.md, "What a server trusts"). */
static int member_ok(psd_t *s, ps_wire_msg_t *m)
{
    int bound = 0;
    for (int r = 0; r < s->nworkers; r++) bound |= s->workers[r].assigned && s->workers[r].session;
    if (!bound || (s->o.curve && psd_curve_is_admin(s, m))) return 1;
    int r = psd_members_rank_of(s, m);
    const char *what = ps_wire_type_name(m->hdr->type);
    if (m->hdr->type == PS__MSG_TYPE__MSG_INIT && r != 0 && s->workers[0].session) {
        psd_send_error(s, PSD_ID_OF(m), m->hdr, PS_EAUTH,
                       "%s refused: only the process that holds rank 0 sends the model", what);
        return 0;
    }
    if (r < 0) {
        psd_send_error(s, PSD_ID_OF(m), m->hdr, PS_EAUTH,
                       "%s refused: not from a worker of this job (no HELLO with this session)",
                       what);
        return 0;
    }
    return 1;
}

/* Admin verbs need an admin key under --curve. */
static int admin_ok(psd_t *s, ps_wire_msg_t *m)
{
    if (psd_curve_is_admin(s, m)) return 1;
    psd_send_error(s, PSD_ID_OF(m), m->hdr, PS_EAUTH, "%s refused: key %s is not an admin key",
                   ps_wire_type_name(m->hdr->type), m->user_id[0] ? m->user_id : "(none)");
    return 0;
}

void psd_handle(psd_t *s, ps_wire_msg_t *m)
{
    const Ps__Header *h = m->hdr;
    s->mx.msgs_in++;
    if (h->has_rank && h->type != PS__MSG_TYPE__MSG_HELLO) psd_members_seen(s, h->rank);
    /* A gradient means training is under way here (psd_members.c: from now
     * on a silent worker can be lost; a restarted psd sees no barrier). */
    if (h->type == PS__MSG_TYPE__MSG_PUSH || h->type == PS__MSG_TYPE__MSG_PUSHPULL)
        psd_members_pushed(s, h->has_rank ? h->rank : -1);
    if (s->shutting) {
        /* The checkpoint of the final state is taken: nothing may change.
         * Updates get no answer, as from a server that is already gone:
         * the workers resend them to the restarted server (they are
         * idempotent), where an ERROR would end their run. */
        switch (h->type) {
        case PS__MSG_TYPE__MSG_INIT:
        case PS__MSG_TYPE__MSG_PUSH:
        case PS__MSG_TYPE__MSG_PUSHPULL:
        case PS__MSG_TYPE__MSG_ROLLBACK:
            s->mx.dropped_replies++;
            ps_debug("%s from rank %d dropped: shutting down", ps_wire_type_name(h->type),
                     h->has_rank ? h->rank : -1);
            return;
        case PS__MSG_TYPE__MSG_CHECKPOINT:
            psd_send_error(s, PSD_ID_OF(m), h, PS_ESHUTDOWN, "%s refused: the server is shutting down",
                           ps_wire_type_name(h->type));
            return;
        default: break;
        }
    }
    if (psd_jobfail_refuse(s, m)) return;
    switch (h->type) {
    case PS__MSG_TYPE__MSG_HELLO: handle_hello(s, m); break;
    case PS__MSG_TYPE__MSG_INIT:
        if (member_ok(s, m)) handle_init(s, m);
        break;
    case PS__MSG_TYPE__MSG_PUSH: handle_push(s, m, 0); break;
    case PS__MSG_TYPE__MSG_PUSHPULL: handle_push(s, m, 1); break;
    case PS__MSG_TYPE__MSG_PULL: handle_pull(s, m); break;
    case PS__MSG_TYPE__MSG_BARRIER: psd_handle_barrier(s, m); break;
    case PS__MSG_TYPE__MSG_HEARTBEAT:
        if (!(h->flags & PS_FLAG_NO_REPLY)) send_ack(s, m, 0);
        break;
    case PS__MSG_TYPE__MSG_STATS: handle_stats(s, m); break;
    case PS__MSG_TYPE__MSG_CHECKPOINT:
        if (admin_ok(s, m)) handle_checkpoint(s, m);
        break;
    case PS__MSG_TYPE__MSG_SHUTDOWN:
        if (admin_ok(s, m)) handle_shutdown(s, m);
        break;
    case PS__MSG_TYPE__MSG_BYE: handle_bye(s, m); break;
    case PS__MSG_TYPE__MSG_ROLLBACK:
        if (member_ok(s, m)) psd_handle_rollback(s, m);
        break;
    case PS__MSG_TYPE__MSG_MEMBERS:
        if (member_ok(s, m)) psd_handle_members(s, m);
        break;
    case PS__MSG_TYPE__MSG_DRAIN: /* psctl drain, or the worker itself (SIGTERM) */
        if ((h->has_rank && psd_members_rank_of(s, m) == h->rank) || admin_ok(s, m))
            psd_handle_drain(s, m);
        break;
    default:
        psd_send_error(s, PSD_ID_OF(m), h, PS_EPROTO, "unexpected message type %d (%s) for a server",
                       (int)h->type, ps_wire_type_name(h->type));
    }
}
