/* A failed worker stops the job.  A worker that fails (bad data, a refused
 * HELLO, a divergence, any error after it joined) says so in its BYE
 * (PS_FLAG_FAILED, with its error), and a HELLO refused before the job
 * started is a worker that cannot join.  Either way the job cannot go on
 * with the W workers it was configured for: the server records the first
 * failure, logs it, answers every request of the job that waits (barriers,
 * PUSHPULL and PULL replies) with ERROR(PS_EFAILED, "worker rank r failed:
 * ..."), and refuses every new training request with the same text, so
 * every rank stops with the failed worker's reason instead of training on
 * with fewer or waiting in silence.  Liveness messages, STATS and the admin
 * verbs still work.  Once every rank has said HELLO again (a new run of all
 * the workers) the failure is forgotten and the job may start again (from
 * the server's current state or its checkpoint, as after a restart). */
#include "psd.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>

#include "ps_error.h"
#include "ps_log.h"

void psd_jobfail(psd_t *s, const char *fmt, ...)
{
    if (s->job_failed) return; /* the first failure is the cause; later ones follow from it */
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(s->fail_text, sizeof s->fail_text, fmt, ap);
    va_end(ap);
    s->job_failed = 1;
    for (int r = 0; r < s->nworkers; r++) s->workers[r].back = 0;
    ps_error("%s: the job stops (every worker gets this error; it may start again once every "
             "rank has said HELLO anew)", s->fail_text);
    psd_members_fail_barrier(s, PS_EFAILED, s->fail_text);
    if (s->st.have_table)
        for (uint32_t i = 0; i < s->st.table.nparts; i++)
            psd_waiters_fail(s, &s->st.parts[i], PS_EFAILED, s->fail_text);
}

int psd_jobfail_refuse(psd_t *s, ps_wire_msg_t *m)
{
    if (!s->job_failed) return 0;
    switch (m->hdr->type) {
    case PS__MSG_TYPE__MSG_INIT:
    case PS__MSG_TYPE__MSG_PUSH:
    case PS__MSG_TYPE__MSG_PUSHPULL:
    case PS__MSG_TYPE__MSG_PULL:
    case PS__MSG_TYPE__MSG_BARRIER:
    case PS__MSG_TYPE__MSG_ROLLBACK:
        psd_send_error(s, PSD_ID_OF(m), m->hdr, PS_EFAILED, "%s", s->fail_text);
        return 1;
    default: return 0;
    }
}

void psd_jobfail_hello(psd_t *s, int r)
{
    if (!s->job_failed || r < 0 || r >= s->nworkers) return;
    s->workers[r].back = 1;
    for (int q = 0; q < s->nworkers; q++)
        if (!s->workers[q].back) return;
    ps_info("every rank said HELLO again after the failure (%s): the job may start again",
            s->fail_text);
    s->job_failed = 0;
    s->fail_text[0] = 0;
}
