/* psctl check: the preflight of a cluster's servers (psctl_check.c). */
#ifndef PSCTL_CHECK_H
#define PSCTL_CHECK_H

#include "ps_partition.h"
#include "worker/client/ps_client.h"

typedef struct psctl_check_in {
    ps_client_t *c;                     /* connected to every server, no HELLO */
    char **ep;                          /* (nserv) endpoints, server 0 first */
    int nserv;
    int num_workers;                    /* the workers' --num-workers (0: not checked) */
    const ps_partition_table_t *table;  /* the model's table from --spec, NULL: none */
    int max_skew_ms;                    /* largest clock difference accepted */
} psctl_check_in_t;

/* Print one line per check ("ok ..." or "FAIL ...: what to fix") and a
 * summary; 0 when all passed, PS_EMISMATCH when anything failed. */
int psctl_check(const psctl_check_in_t *in);

/* What listens at a tcp:// or ipc:// endpoint: 1 nothing (refused), 0
 * something accepts connections, -1 cannot tell, -2 the host does not
 * resolve. */
int psctl_endpoint_down(const char *ep);
#endif
