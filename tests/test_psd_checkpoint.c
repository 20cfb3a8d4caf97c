/* psd checkpoints: train a few steps, CHECKPOINT, train more, SIGTERM (which
 * checkpoints again) -> restart with the same --checkpoint-dir: versions and
 * weights equal those before the kill, INIT is answered PS_FLAG_FROM_CKPT
 * and weight INITs are ignored, the momentum read from the file drives the
 * next update (closed form, with the step schedule resumed from the
 * version), only the last two files are kept, and a corrupted newest file
 * falls back to the older one.  --checkpoint-every writes periodically. */
#include <dirent.h>
#include <math.h>

#include "ps_safetensors.h"
#include "tests/lib/psd_testlib.h"
#include "tests/lib/tap.h"

#define NT 2
static const ps_tensor_spec_t TS[NT] = {{"fc.weight", 300, 0}, {"fc.bias", 20, 1}};
#define N 320
static const char *OPTIM =
    "{\"lr\":0.05,\"momentum\":0.9,\"weight_decay\":0.001,\"sched\":\"step\",\"milestones\":[6],"
    "\"gamma\":0.1,\"groups\":[{\"lr_mult\":1,\"wd_mult\":1},{\"lr_mult\":2,\"wd_mult\":0}]}";
static ps_partition_table_t T;
static char dir[256], spec[4096];

static float grad_of(int it, int i) { return cosf(0.05f * i - 0.3f * it); }

static int start(tpsd_t *S, const char *every, void **d)
{
    const char *args[] = {"--num-workers", "1", "--worker-timeout-ms", "0", "--checkpoint-dir", dir,
                          "--checkpoint-every", every, "--log-level", "info", NULL};
    if (tpsd_start(S, "ckpt", args)) return -1;
    *d = t_dealer(S->port);
    return 0;
}

static int count_files(uint64_t *newest)
{
    DIR *dd = opendir(dir);
    int n = 0;
    struct dirent *e;
    *newest = 0;
    while (dd && (e = readdir(dd)))
        if (!strncmp(e->d_name, "psd-0-", 6) && strstr(e->d_name, ".safetensors") &&
            !strstr(e->d_name, ".tmp")) {
            uint64_t q = strtoull(e->d_name + 6, NULL, 10);
            if (q > *newest) *newest = q;
            n++;
        }
    if (dd) closedir(dd);
    return n;
}

static void file_of(char *p, size_t cap, uint64_t seq)
{
    snprintf(p, cap, "%s/psd-0-%012llu.safetensors", dir, (unsigned long long)seq);
}

/* Two workers: rank 0's PUSH is acknowledged, then the server is stopped
 * before rank 1 pushes.  After the restart rank 1's push completes the
 * iteration with rank 0's gradient, which came back from the checkpoint. */
static void pending_push_survives(void)
{
    char spec2[4096];
    t_spec_json(spec2, sizeof spec2, TS, NT, 512, 1, 2,
                "{\"lr\":0.5,\"momentum\":0,\"groups\":[{\"lr_mult\":1,\"wd_mult\":1},"
                "{\"lr_mult\":2,\"wd_mult\":0}]}");
    char dir2[300];
    snprintf(dir2, sizeof dir2, "%s-b", dir);
    tpsd_t S;
    void *d;
    const char *args[] = {"--worker-timeout-ms", "0", "--checkpoint-dir", dir2, NULL};
    if (tpsd_start(&S, "ckpt", args)) {
        ok(0, "pending: psd started");
        return;
    }
    d = t_dealer(S.port);
    float w0[N], g0[N], g1[N], out[N], ref[N];
    for (int i = 0; i < N; i++) w0[i] = 0.01f * i, g0[i] = grad_of(0, i), g1[i] = grad_of(1, i);
    int good = t_init_spec(d, spec2, T.hash, NULL) == PS__MSG_TYPE__MSG_ACK;
    for (uint32_t p = 0; p < T.nparts; p++)
        good &= t_init_part(d, p, w0 + T.parts[p].offset, T.parts[p].numel) == PS__MSG_TYPE__MSG_ACK;
    Ps__Header h;
    t_hdr(&h, PS__MSG_TYPE__MSG_PUSH, 0, 1);
    h.has_iteration = 1, h.has_numel = 1, h.numel = T.parts[1].numel;
    good &= t_call(d, &h, g0 + T.parts[1].offset, h.numel * 4, NULL, 0, NULL, NULL, 0) == PS__MSG_TYPE__MSG_ACK;
    ok(good, "pending: INIT and rank 0's PUSH acknowledged");
    zmq_close(d);
    is_int(tpsd_stop(&S, SIGTERM), 0, "pending: SIGTERM exit 0");
    if (tpsd_start(&S, "ckpt", args)) {
        ok(0, "pending: psd restarted");
        return;
    }
    d = t_dealer(S.port);
    t_hdr(&h, PS__MSG_TYPE__MSG_PUSHPULL, 1, 1);
    h.has_iteration = 1, h.has_numel = 1, h.numel = T.parts[1].numel;
    uint64_t v = 0;
    is_int(t_call(d, &h, g1 + T.parts[1].offset, h.numel * 4, out, N, &v, NULL, 0),
           PS__MSG_TYPE__MSG_WEIGHTS, "pending: rank 1's PUSHPULL completes the iteration");
    is_int(v, 1, "pending: version 1");
    size_t off = T.parts[1].offset;
    for (size_t i = 0; i < T.parts[1].numel; i++) {
        float g = (g0[off + i] + g1[off + i]) / 2.0f;
        int grp = off + i >= 300;
        ref[i] = w0[off + i] - 0.5f * (grp ? 2.0f : 1.0f) * g;
    }
    allclose(out, ref, (long)T.parts[1].numel, 1e-7, 1e-6, "pending: mean of the restored and the new gradient");
    zmq_close(d);
    is_int(tpsd_stop(&S, SIGTERM), 0, "pending: exit 0");
    if (tap_failed_) tpsd_dump_log(&S, 30);
    if (!getenv("PSD_KEEP_LOG")) {
        unlink(S.log);
        char cmd[512];
        snprintf(cmd, sizeof cmd, "rm -rf %s", dir2);
        if (system(cmd) != 0) diag("cannot remove %s", dir2);
    }
}

int main(void)
{
    ps_log_level = PS_LOG_ERROR;
    if (ps_partition_table_build(&T, TS, NT, 512, 1)) tap_skip_all("partition table unavailable");
    snprintf(dir, sizeof dir, "/tmp/psd-test-ckpt-dir-%d", (int)getpid());
    mkdir(dir, 0755);
    t_spec_json(spec, sizeof spec, TS, NT, 512, 1, 1, OPTIM);

    /* ---- run 1: 5 steps, CHECKPOINT, 3 more steps, SIGTERM ---- */
    tpsd_t S;
    void *d;
    if (start(&S, "0", &d)) {
        ok(0, "psd started");
        return tap_done();
    }
    float w[N], winit[N];
    for (int i = 0; i < N; i++) winit[i] = 0.2f * sinf(0.3f * i);
    is_int(t_init_spec(d, spec, T.hash, NULL), PS__MSG_TYPE__MSG_ACK, "INIT spec");
    int good = 1;
    for (uint32_t p = 0; p < T.nparts; p++)
        good &= t_init_part(d, p, winit + T.parts[p].offset, T.parts[p].numel) == PS__MSG_TYPE__MSG_ACK;
    ok(good, "INIT weights");
    good = 1;
    for (int it = 0; it < 5; it++) good &= t_step_sync(d, &T, it, w, grad_of);
    ok(good, "5 steps");
    Ps__Header ck;
    t_hdr(&ck, PS__MSG_TYPE__MSG_CHECKPOINT, 0, 0);
    is_int(t_call(d, &ck, NULL, 0, NULL, 0, NULL, NULL, 0), PS__MSG_TYPE__MSG_ACK, "CHECKPOINT");
    uint64_t seq1;
    is_int(count_files(&seq1), 1, "one checkpoint file");
    good = 1;
    for (int it = 5; it < 8; it++) good &= t_step_sync(d, &T, it, w, grad_of);
    ok(good, "3 more steps");
    float before[N];
    uint64_t vbefore[8];
    ok(t_pull_all(d, &T, before, vbefore, UINT64_MAX), "pull before the kill");
    zmq_close(d);
    is_int(tpsd_stop(&S, SIGTERM), 0, "SIGTERM: exit 0");
    uint64_t seq2;
    is_int(count_files(&seq2), 2, "SIGTERM wrote a second checkpoint");
    ok(seq2 > seq1, "newer sequence number (%llu > %llu)", (unsigned long long)seq2, (unsigned long long)seq1);

    /* Momentum as stored, for the closed-form check after the restart. */
    float mom[N];
    char path[512], err[256];
    file_of(path, sizeof path, seq2);
    ps_st_file_t f;
    good = ps_st_open(&f, path, err, sizeof err) == 0;
    for (uint32_t p = 0; good && p < T.nparts; p++) {
        char nm[16];
        snprintf(nm, sizeof nm, "m.%u", p);
        good &= ps_st_read_f32(&f, nm, mom + T.parts[p].offset, T.parts[p].numel, err, sizeof err) == 0;
        float wf[N];
        snprintf(nm, sizeof nm, "w.%u", p);
        good &= ps_st_read_f32(&f, nm, wf, T.parts[p].numel, err, sizeof err) == 0 &&
                !memcmp(wf, before + T.parts[p].offset, T.parts[p].numel * 4);
    }
    ok(good, "checkpoint file holds the pulled weights and a momentum buffer (%s)", good ? "ok" : err);
    if (good) ps_st_close(&f);

    /* ---- run 2: restart, state restored ---- */
    if (start(&S, "0", &d)) {
        ok(0, "psd restarted");
        return tap_done();
    }
    Ps__Header hh;
    t_hdr(&hh, PS__MSG_TYPE__MSG_HELLO, 0, 0);
    hh.has_num_workers = 1, hh.num_workers = 1;
    hh.has_table_hash = 1, hh.table_hash = T.hash;
    ps_wire_msg_t m;
    hh.has_request_id = 1, hh.request_id = 1;
    ps_wire_send(d, NULL, 0, &hh, NULL, 0, NULL, NULL, 0);
    good = t_recv(d, &m) == 0 && m.hdr->type == PS__MSG_TYPE__MSG_WELCOME && (m.hdr->flags & PS_FLAG_FROM_CKPT) &&
           m.hdr->table_hash == T.hash;
    ps_wire_msg_close(&m);
    ok(good, "WELCOME says PS_FLAG_FROM_CKPT");
    uint32_t flags = 0;
    is_int(t_init_spec(d, spec, T.hash, &flags), PS__MSG_TYPE__MSG_ACK, "INIT spec after restart");
    ok(flags & PS_FLAG_FROM_CKPT, "INIT answered with PS_FLAG_FROM_CKPT");
    float zeros[N] = {0};
    is_int(t_init_part(d, 0, zeros, T.parts[0].numel), PS__MSG_TYPE__MSG_ACK, "weight INIT acknowledged");
    float after[N];
    uint64_t vafter[8];
    ok(t_pull_all(d, &T, after, vafter, UINT64_MAX), "pull after the restart");
    ok(!memcmp(after, before, sizeof before), "weights equal those before the kill (bit for bit)");
    good = 1;
    for (uint32_t p = 0; p < T.nparts; p++) good &= vafter[p] == vbefore[p] && vafter[p] == 8;
    ok(good, "versions restored (8)");
    char other[4096];
    t_spec_json(other, sizeof other, TS, NT, 256, 1, 1, OPTIM);
    ps_partition_table_t T2;
    ps_partition_table_build(&T2, TS, NT, 256, 1);
    is_int(t_init_spec(d, other, T2.hash, NULL), PS_EMISMATCH, "INIT with another table after restart -> PS_EMISMATCH");
    ps_partition_table_free(&T2);

    /* Step 8 after the restart: lr has decayed at milestone 6; momentum from the file. */
    float next[N];
    ok(t_step_sync(d, &T, 8, next, grad_of), "step 8 after the restart");
    float ref[N];
    for (int i = 0; i < N; i++) {
        int grp = i >= 300;
        float lr = grp ? 0.01f : 0.005f, wd = grp ? 0.0f : 0.001f;
        float dd = grad_of(8, i) + wd * before[i];
        float buf = 0.9f * mom[i] + dd;
        ref[i] = before[i] - lr * buf;
    }
    allclose(next, ref, N, 1e-7, 1e-5, "step 8 equals closed-form SGD with the restored momentum");
    float wstep8[N];
    memcpy(wstep8, next, sizeof next);
    zmq_close(d);
    is_int(tpsd_stop(&S, SIGTERM), 0, "SIGTERM again: exit 0");
    uint64_t seq3;
    is_int(count_files(&seq3), 2, "only the last two checkpoints are kept");
    char p1[512];
    file_of(p1, sizeof p1, seq1);
    ok(access(p1, F_OK) != 0 && seq3 > seq2, "the oldest one was removed");

    /* ---- run 3: newest file corrupted -> the older one (versions 8) ---- */
    file_of(path, sizeof path, seq3);
    FILE *fp = fopen(path, "r+b");
    if (fp) {
        fseek(fp, -100, SEEK_END);
        int c = fgetc(fp);
        fseek(fp, -100, SEEK_END);
        fputc(c ^ 0x5a, fp);
        fclose(fp);
    }
    if (start(&S, "2", &d)) {
        ok(0, "psd restarted");
        return tap_done();
    }
    ok(t_pull_all(d, &T, after, vafter, UINT64_MAX), "pull after restart from the corrupted dir");
    ok(!memcmp(after, before, sizeof before), "corrupt newest checkpoint: the older one was loaded");
    good = 1;
    for (uint32_t p = 0; p < T.nparts; p++) good &= vafter[p] == 8;
    ok(good, "versions are the older checkpoint's (8)");
    ok(memcmp(after, wstep8, sizeof after) != 0, "(and not the corrupted step-9 state)");

    /* --checkpoint-every 2: a step on 3 partitions is 3 shard updates. */
    uint64_t s0, s1;
    count_files(&s0);
    ok(t_step_sync(d, &T, 8, next, grad_of), "step 8 again");
    /* The file is written off the loop thread: it appears shortly after. */
    for (int i = 0; i < 300; i++) {
        count_files(&s1);
        if (s1 > s0) break;
        t_sleep_ms(10);
    }
    ok(s1 > s0, "--checkpoint-every 2 wrote a checkpoint (seq %llu -> %llu)", (unsigned long long)s0,
       (unsigned long long)s1);
    allclose(next, ref, N, 1e-7, 1e-5, "the replayed step 8 gives the same weights");

    Ps__Header sd;
    t_hdr(&sd, PS__MSG_TYPE__MSG_SHUTDOWN, 0, 0);
    is_int(t_call(d, &sd, NULL, 0, NULL, 0, NULL, NULL, 0), PS__MSG_TYPE__MSG_ACK, "SHUTDOWN");
    is_int(tpsd_stop(&S, 0), 0, "exit 0");
    zmq_close(d);
    if (tap_failed_) tpsd_dump_log(&S, 60);
    pending_push_survives();
    if (!getenv("PSD_KEEP_LOG")) {
        unlink(S.log);
        char cmd[512];
        snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
        if (system(cmd) != 0) diag("cannot remove %s", dir);
    }
    zmq_ctx_term(t_ctx);
    ps_partition_table_free(&T);
    return tap_done();
}
