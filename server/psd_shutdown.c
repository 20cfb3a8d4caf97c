/* psd's orderly stop (SHUTDOWN or a signal): no further updates, the
 * final checkpoint (psd_checkpoint_write.c, whose end comes back here),
 * the answers, a short linger so they leave, then the loop stops. */
#include "psd_checkpoint_internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ps_log.h"

#define PSD_LINGER_MS 300

/* The end of an orderly stop: psd_loop_run returns. */
static void on_linger(uv_timer_t *t)
{
    psd_t *s = t->data;
    if (s->stopping) return;
    s->stopping = 1;
    ps_info("stopping: shutdown complete");
    uv_stop(s->loop);
}

/* SHUTDOWN requests get ACK once the final checkpoint's outcome is known:
 * the server stops either way.  When that checkpoint failed the ACK's body
 * says so (and psd exits 1). */
static void answer_shutdown(psd_t *s)
{
    psd_ackwait_t *list = s->shutdown_waiters;
    char body[800] = "";
    s->shutdown_waiters = NULL;
    if (s->final_rc)
        snprintf(body, sizeof body, "server %d stops without a final checkpoint (exit status 1): %s",
                 s->o.server_id, s->mx.ckpt_error);
    while (list) {
        psd_ackwait_t *w = list;
        list = w->next;
        Ps__Header h;
        ps_wire_header_init(&h, PS__MSG_TYPE__MSG_ACK);
        h.has_request_id = 1, h.request_id = w->request_id;
        if (body[0]) h.has_body = 1, h.body.data = (uint8_t *)body, h.body.len = strlen(body);
        psd_send(s, w->id, w->idlen, &h, NULL, 0);
        free(w);
    }
    if (s->drain) s->drain(s);
}

/* Answer, and keep the loop (and the socket) up a little, so the ACKs just
 * queued leave before the socket closes, and retries still get an answer. */
static void shutdown_finish(psd_t *s)
{
    /* Asked to (SHUTDOWN): the job ends here, and its workers are told at
     * once rather than retrying into a closed socket.  A signal may be a
     * restart: the workers keep retrying (and say whom they wait for). */
    int notify = s->shutdown_asked && !uv_is_active((uv_handle_t *)&s->linger_timer);
    answer_shutdown(s); /* first: the requester's own wait ends with its ACK */
    if (notify)
        psd_members_notify_shutdown(s, "asked to by a SHUTDOWN request (psctl shutdown, or "
                                       "rank 0's --shutdown-servers)");
    if (!uv_is_active((uv_handle_t *)&s->linger_timer))
        uv_timer_start(&s->linger_timer, on_linger, PSD_LINGER_MS, 0);
}

/* The final checkpoint ended with rc (0: durable).  A server that could
 * not save its state must not look like one that did: exit status 1. */
void psd_shutdown_checkpoint_done(psd_t *s, int rc)
{
    if (s->final_done) return;
    s->final_done = 1;
    s->final_rc = rc;
    if (rc) {
        s->exit_code = 1;
        if (s->have_ckpt)
            ps_error("final checkpoint not written: %s; stopping anyway, exit status 1 (newest durable "
                     "checkpoint: version %llu; the updates since are lost)", s->mx.ckpt_error,
                     (unsigned long long)s->ckpt_version);
        else
            ps_error("final checkpoint not written: %s; stopping anyway, exit status 1 (no durable "
                     "checkpoint: this shard's state is lost)", s->mx.ckpt_error);
    }
    shutdown_finish(s);
}

void psd_shutdown_begin(psd_t *s, const char *why, psd_ackwait_t *w)
{
    if (s->stopping) {
        free(w);
        return;
    }
    if (w) {
        w->next = s->shutdown_waiters;
        s->shutdown_waiters = w;
        s->shutdown_asked = 1;
    }
    if (!s->shutting) {
        int save = s->o.checkpoint_dir && s->o.checkpoint_dir[0] && s->st.have_table;
        s->shutting = 1;
        ps_info("shutting down (%s): no further updates%s", why ? why : "?",
                save ? "; checkpointing first" : "");
        if (!save) {
            psd_shutdown_checkpoint_done(s, 0);
            return;
        }
        int rc = psd_checkpoint_start(s, NULL);
        if (!s->ckpt_job) psd_shutdown_checkpoint_done(s, rc); /* written here, or failed */
        return; /* else after_work ends the stop */
    }
    /* A repeated SHUTDOWN (a retry) or a signal: answered like the first
     * once the final checkpoint's outcome is known. */
    if (s->final_done) shutdown_finish(s);
}
