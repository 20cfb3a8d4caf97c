/* ZMQ_MAXMSGSIZE: the largest frame of any valid message about a table,
 * the limit the listener gets at the bind, and whether a table that
 * arrives later fits it.  A listener copies the socket options when it is
 * bound, and re-binding drops every connected worker (and requests in
 * flight), so the limit is fixed at the bind: from a checkpointed table
 * when one is loaded first, else from --max-partition-bytes; a later
 * table must fit it.  An explicit --max-msg-mb wins over both. */
#include "psd.h"

#include <stdio.h>

#include "ps_error.h"
#include "ps_log.h"

int64_t psd_maxmsg_bound(size_t numel)
{
    size_t worst = 0;
    for (int dt = 0; dt < PSD_NDTYPE; dt++)
        for (int c = 0; c < PSD_NCODEC; c++) {
            size_t b = ps_codec_bound((ps_dtype_t)dt, (ps_codec_t)c, numel);
            if (b > worst) worst = b;
        }
    return (int64_t)worst + PS_WIRE_MAX_HEADER;
}

int psd_maxmsg_for_table(psd_t *s, size_t max_numel, char *err, size_t errlen)
{
    int64_t need = psd_maxmsg_bound(max_numel);
    if (!s->sock) {
        s->maxmsg_table = need;
        return 0;
    }
    if (need <= s->maxmsg) return 0;
    if (s->o.max_msg_mb > 0)
        snprintf(err, errlen,
                 "INIT spec: this server's largest partition has %zu elements; its messages can "
                 "reach %lld bytes, over --max-msg-mb %d (ZMQ_MAXMSGSIZE): restart psd with a "
                 "larger --max-msg-mb, or without it (then --max-partition-bytes sizes the limit)",
                 max_numel, (long long)need, s->o.max_msg_mb);
    else
        snprintf(err, errlen,
                 "INIT spec: partition of %zu bytes is larger than --max-partition-bytes %llu, "
                 "which sized ZMQ_MAXMSGSIZE (%lld bytes) at start: restart psd with "
                 "--max-partition-bytes >= psworker's --partition-bytes",
                 max_numel * sizeof(float), (unsigned long long)s->o.max_partition_bytes,
                 (long long)s->maxmsg);
    return PS_ERANGE;
}

int psd_maxmsg_at_bind(psd_t *s)
{
    int64_t maxmsg;
    if (s->o.max_msg_mb > 0) {
        maxmsg = (int64_t)s->o.max_msg_mb << 20;
        s->maxmsg_from = "--max-msg-mb";
        if (s->st.have_table && s->maxmsg_table > maxmsg) {
            ps_error("--max-msg-mb %d is below the largest message of the checkpointed table "
                     "(%lld bytes): its workers would be disconnected; raise it or leave it unset",
                     s->o.max_msg_mb, (long long)s->maxmsg_table);
            return PS_ERANGE;
        }
    } else if (s->st.have_table && s->maxmsg_table > 0) {
        maxmsg = s->maxmsg_table;
        s->maxmsg_from = "the checkpointed table's largest partition";
    } else {
        maxmsg = psd_maxmsg_bound((size_t)(s->o.max_partition_bytes / sizeof(float)));
        s->maxmsg_from = "--max-partition-bytes";
    }
    s->maxmsg = maxmsg;
    return 0;
}
