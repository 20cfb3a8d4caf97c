/* The task table (task.h), in claim order: the synthetic compute first (it
 * takes --compute whatever --model says), then by --model. */
#include <stdio.h>
#include <string.h>

#include "worker/psworker/psworker.h"

const ps_task_t *const ps_tasks[] = {
    &ps_task_synthetic,
    &ps_task_smoke,
    &ps_task_video,
    &ps_task_det,
    NULL,
};

int ps_task_find(const ps_worker_opts_t *o)
{
    for (int t = 0; ps_tasks[t]; t++)
        if (ps_tasks[t]->claims(o, o->task_opts[t])) return t;
    return -1;
}

const char *ps_task_models(void)
{
    static char buf[512];
    size_t n = 0;
    buf[0] = 0;
    for (int t = 0; ps_tasks[t] && n < sizeof buf; t++)
        n += (size_t)snprintf(buf + n, sizeof buf - n, "%s%s", n ? " | " : "", ps_tasks[t]->models);
    return buf;
}
