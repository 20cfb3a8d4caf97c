/* Inside of psctl, shared by psctl.c (options, the servers and the
 * client, the verbs) and psctl_export.c (export: the model spec, the
 * partition table it gives, the pulled weights written as safetensors or
 * ONNX). */
#ifndef PSCTL_INTERNAL_H
#define PSCTL_INTERNAL_H
#include <cjson/cJSON.h>

#include "ps_partition.h"
#include "worker/client/ps_client.h"

typedef struct psctl_opts {
    char *servers;      /* "tcp://h:p,tcp://h:p", server 0 first */
    int timeout_ms;     /* per request */
    int interval_ms;    /* status: second STATS sample for rates (0 = one sample) */
    int server;         /* checkpoint / status: only this server (-1 = all) */
    int json;           /* status: print the raw STATS replies as JSON */
    char *spec;         /* export: spec JSON file or psd checkpoint */
    char *like;         /* export: take shapes from this safetensors file */
    int onnx;           /* export: write the model as ONNX (psctl_onnx.c) */
    char *model;        /* export --onnx: the architecture */
    int frames, size, shift_div;
    char *shift_place;
    int force;          /* keygen: overwrite existing key files */
    char *log_level;
    char *curve_server_key;  /* FILE (shared) or FILE,FILE,... (one per server) */
    char *curve_public_key;  /* this client's Z85 public key file */
    char *curve_secret_key;  /* this client's Z85 secret key file */
    int num_workers;    /* check: the workers' --num-workers (0: not checked) */
    int max_skew_ms;    /* check: largest clock difference accepted */
} psctl_opts_t;

typedef struct psctl {
    psctl_opts_t o;
    char **ep;          /* (nserv) endpoints */
    int nserv;
    ps_partition_table_t table;
    ps_client_t *c;
    char **skeys;       /* (nskeys) server public key files, from --curve-server-key */
    int nskeys;
} psctl_t;

/* psctl.c: connect with the current table (0 or PS_E*, said on stderr);
 * server s's STATS reply as a JSON object (NULL after a message on
 * stderr); member k of a JSON object as a string ("-" when it is not one). */
int psctl_connect(psctl_t *p);
cJSON *psctl_stats(psctl_t *p, int s);
const char *psctl_json_str(const cJSON *o, const char *k);

/* psctl_export.c: the spec JSON from --spec (JSON file or psd checkpoint),
 * else STATS (malloc'd; NULL after a message on stderr); the partition
 * table rebuilt from it into p->table (0 or PS_E*); the export verb. */
char *psctl_spec_load(psctl_t *p);
int psctl_spec_table(psctl_t *p, const char *json);
int psctl_export(psctl_t *p, const char *path);

#endif
