#!/usr/bin/python3
"""Scaling study analysis: efficiency tables, the alpha-beta cost
model calibrated on the emulated-cluster measurements, its predictions up
to 1,536 workers, data files for bench/scaling/plot.sh, and the generated
tables of docs/scaling.md (between <!-- BEGIN NAME --> / <!-- END NAME -->).

Only the Python standard library: it runs under any python3.

Cost model (per step, exposed communication, emulated seconds):
  ring:  comm = ALPHA * 2(W-1) + max(0, a + b * X)
  PS:    comm = ALPHA * 2      + max(0, a + b * X)
  X = seconds the busiest link needs for its bytes at the measured TCP rate,
      G = max(push, pull) bytes per worker:
      ring: what a rank sends, 2(W-1)/W of the gradient;
      PS, dedicated servers: a server link's max(W/S, 1) G;
      PS, co-located (server s on worker s's host): a host link carries its
      worker's pushes to the S-1 other servers, G (S-1)/S, and its server's
      replies to the W-1 other workers, G (W-1)/S, per direction (with
      S = W: 2(W-1)/W G, the ring's load).
b (~1 when transfers are exposed) and a (0 without overlap; negative with
overlap: the part of the transfers hidden behind the backward, in compute
units, so it scales with F like compute; kept <= 0) are fitted by least
squares per mode and overlap variant (fp16 and fp32 rows together: the
fp32 rows reach the X where transfers no longer hide), on the points with
W <= FIT_MAX_W workers: beyond that the W emulated hosts' CPU work (sums,
casts, kernel copies, all on the 2 shared cores; a real cluster has a CPU
per host) grows with W and is not the cluster's.  Where that leaves fewer
than 2 distinct X, the larger W are used too (the fit table lists the W of
every fit).  Co-located variants are fitted when they have points at >= 3
distinct W (two points fix a and b exactly, whatever noise -- or, at
W = 16, the 2-core host's CPU contention -- put in them); the predictions'
co-located column uses COLOC_FIT.  The tables show measured
against modelled for every point, so that deviation is visible.
ALPHA, the one-hop latency, is not fitted: the emulation's latency is the
shared machine's, not a switch's; 25 us per hop is used (one 25 GbE switch
hop plus TCP and the messaging layer; stated, not measured).  For the real cluster X
and a are divided by F (links at 25 Gb/s with the emulated link's
measured framing loss)."""
import argparse
import csv
import math
import os
import re
import sys


def fnum(x, d=float("nan")):
    try:
        return float(x)
    except (TypeError, ValueError):
        return d


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--csv", required=True)
    ap.add_argument("--results", required=True)
    ap.add_argument("--docs")
    ap.add_argument("--label", default="alone")
    ap.add_argument("--wire-csv")
    a = ap.parse_args()
    rows = [r for r in csv.DictReader(open(a.csv)) if r.get("status") == "ok"]
    if not rows:
        print("analyze.py: no successful points in", a.csv, file=sys.stderr)
        return 1
    F = fnum(rows[0]["scale"]); T = fnum(rows[0]["gpu_step_ms"]) / 1e3
    link_Bps = fnum(rows[0]["link_mbit"]) * 1e6 / 8
    # what TCP really carries through one tbf link (scaling.sh measures it
    # before the sweep; older CSVs lack the column): the physical limit
    link_meas = fnum(rows[0].get("link_measured_mbit") or "nan")
    if link_meas > 0:
        link_Bps = link_meas * 1e6 / 8
    model = rows[0]["model"]
    for r in rows:
        r["W"] = int(r["workers"]); r["S"] = int(r["servers"])
        r["t"] = fnum(r["median_s"]); r["c"] = fnum(r["compute_s"]); r["w"] = fnum(r["comm_wait_s"])
        r["out"] = fnum(r["wire_out_per_iter"], 0); r["in"] = fnum(r["wire_in_per_iter"], 0)
        r["eff_c"] = fnum(r["compute_ms"]) / 1e3 / r["t"]
        # the variants of a point beyond the overlap mode go into its label:
        # placement (co-located servers), partition size, pull credit
        r["coloc"] = r.get("placement") == "colocated"
        pb = int(fnum(r.get("partition_bytes") or "4194304", 4194304))
        cr = int(fnum(r.get("pull_credit") or "0", 0))
        r["overlap"] += (" coloc" if r["coloc"] else "") + \
            (" %dM" % (pb >> 20) if pb != 4194304 and pb % (1 << 20) == 0 else
             " %dK" % (pb >> 10) if pb != 4194304 else "") + (" credit %d" % cr if cr > 0 else "")
        # co-located with S = W: one family over W (S grows with it), S = -1
        r["key"] = (r["mode"], -1 if r["coloc"] and r["S"] == r["W"] else r["S"],
                    r["dtype"], r["codec"], r["overlap"])
    base = {r["key"]: r["t"] for r in rows if r["W"] == 1}
    for r in rows:
        b = base.get(r["key"])
        r["eff_1"] = b / r["t"] if b else float("nan")

    ALPHA = 25e-6

    def hops(mode, W):
        return 2.0 * (W - 1) if mode == "ring" else 2.0

    def feat(r):
        gw = r["out"] if r["mode"] == "ps" else r["out"] * r["W"] / max(2.0 * (r["W"] - 1), 1.0)
        y = r["W"] * gw / 1e9
        if r["mode"] == "ring":
            return y, r["out"] / link_Bps
        G = max(r["out"], r["in"])
        if r["coloc"]:  # host s: G (S-1)/S as a worker, G (W-1)/S as a server
            return y, (G * (r["S"] - 1) / r["S"] + G * (r["W"] - 1) / r["S"]) / link_Bps
        return y, max(r["W"] / r["S"], 1.0) * G / link_Bps

    FIT_MAX_W = 8
    COLOC_FIT = "on coloc 1M"   # the co-located fit the predictions use
    # The models predicted: name, label, fp32 gradient bytes (the trainable
    # parameters x 4; worker/models/model_sizes.c, checked against PyTorch by
    # tests/test_model_sizes) and compute per step relative to TSM-R50's T,
    # taken as the ratio of training FLOPs per clip at each paper's clip
    # (bench/video_cost: TSM-R50 8 x 224^2 65.41 forward GFLOP, I3D-R50
    # 32 x 224^2 227.26 (3x1x1) / 274.94 (3x3x3)): a GPU that runs 3-D
    # convolutions at the same FLOP rate as 2-D ones -- an assumption in
    # I3D's favour (the paper's point is that they do not).
    PRED_MODELS = (("tsm-r50", "TSM-R50", 97.3e6, 1.0),
                   ("i3d-r50-311", "I3D-R50 3x1x1", 112.17e6, 227.26 / 65.41),
                   ("i3d-r50-333", "I3D-R50 3x3x3", 133.74e6, 274.94 / 65.41))
    COLOC_MIN_W = 3             # co-located variants: fitted from >= 3 distinct W
    # fits[(mode, overlap)] = (rms residual s, b, points, a, [W of the points])
    # Fitted: the plain overlap modes (dedicated servers, 4 MiB), and every
    # co-located variant with points at >= COLOC_MIN_W distinct W (one point
    # would be reproduced by construction, two -- the 32-point sweep's
    # "fwd coloc 1M" at W = 8 and 16 -- fix a and b exactly, whatever the
    # noise or the 16 hosts' CPU contention at W = 16 put in them).
    # Points with W <= FIT_MAX_W; where that
    # leaves fewer than 2 distinct X (a variant measured only at W = 8 and
    # beyond), the larger W are taken too, and the table
    # lists the W each fit rests on.  a is free with overlap (>= 2 points)
    # but kept <= 0: it is minus the part hidden behind the backward.
    fits = {}
    kinds = [("ring", ov) for ov in ("on", "off", "fwd")] + [("ps", ov) for ov in ("on", "off", "fwd")]
    kinds += sorted({("ps", r["overlap"]) for r in rows if r["mode"] == "ps" and r["coloc"] and
                     r["codec"] == "raw" and len({q["W"] for q in rows if q["mode"] == "ps" and
                                                  q["overlap"] == r["overlap"] and
                                                  q["codec"] == "raw"}) >= COLOC_MIN_W})
    for mode, ov in kinds:
        every = [r for r in rows if r["mode"] == mode and r["overlap"] == ov and
                 r["codec"] == "raw" and (mode == "ps" or r["W"] > 1)]
        pts = [r for r in every if r["W"] <= FIT_MAX_W]
        if len({round(feat(r)[1], 9) for r in pts}) < 2:
            pts = every
        data = [(feat(r)[1], max(r["w"] - ALPHA * hops(mode, r["W"]), 0.0)) for r in pts]
        if not data:
            continue
        n = len(data)
        mx = sum(x for x, _ in data) / n; my = sum(y for _, y in data) / n
        sxx = sum((x - mx) ** 2 for x, _ in data)
        b = icpt = None
        if ov.split()[0] != "off" and n >= 2 and sxx > 0:
            b = sum((x - mx) * (y - my) for x, y in data) / sxx
            icpt = my - b * mx
        if b is None or icpt > 0 or b < 0:
            icpt = 0.0
            b = sum(x * y for x, y in data) / sum(x * x for x, _ in data)
        rms = math.sqrt(sum((y - max(0.0, icpt + b * x)) ** 2 for x, y in data) / n)
        fits[(mode, ov)] = (rms, b, n, icpt, sorted(r["W"] for r in pts))

    def model_comm(r):
        f = fits.get((r["mode"], r["overlap"]))
        if not f or (r["mode"] == "ring" and r["W"] == 1):
            return 0.0 if f else float("nan")
        return ALPHA * hops(r["mode"], r["W"]) + max(0.0, f[3] + f[1] * feat(r)[1])
    os.makedirs(a.results, exist_ok=True)

    # ---- tables of the measurements ----
    def real_ms(x):
        return x / F * 1e3
    meas = ["| mode | servers | workers | wire | overlap | step (real ms) | compute | comm wait | "
            "model comm | data wait | eff. vs compute | eff. vs 1 worker | wire out / step |",
            "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in sorted(rows, key=lambda r: (r["mode"] != "ps", r["S"], r["dtype"], r["codec"],
                                         r["overlap"], r["W"])):
        wire = r["dtype"] + ("/" + r["codec"] if r["codec"] != "raw" else "")
        mc = model_comm(r) if r["codec"] == "raw" else float("nan")
        meas.append("| %s | %s | %d | %s | %s | %.1f | %.1f | %.1f | %s | 0 | %.0f%% | %s | %.1f MB |" % (
            r["mode"], r["S"] if r["mode"] == "ps" else "-", r["W"], wire, r["overlap"],
            real_ms(r["t"]), real_ms(r["c"]), real_ms(r["w"]),
            "%.1f" % real_ms(mc) if mc == mc else "-", 100 * r["eff_c"],
            "%.0f%%" % (100 * r["eff_1"]) if r["eff_1"] == r["eff_1"] else "-", r["out"] / 1e6))
    fit_t = ["| mode | overlap | b (bandwidth term) | a (real ms) | rms residual (real ms) | "
             "alpha (stated) | points (their W) |", "|---|---|---|---|---|---|---|"]
    for (mode, ov), (rms, b, n, a0, ws) in sorted(fits.items()):
        fit_t.append("| %s | %s | %.2f | %.1f | %.1f%s | %.0f us x %s | %d (%s) |" % (
            mode, ov, b, real_ms(a0), real_ms(rms), " (exact: 2 points)" if n == 2 and a0 < 0 else "",
            ALPHA * 1e6, "2(W-1)" if mode == "ring" else "2", n, ", ".join(str(w) for w in ws)))

    # ---- the number of servers at 4 and 8 workers, both wires ----
    def cell(pick):
        r = [r for r in rows if pick(r)]
        return "%.0f%% (%.1f ms)" % (100 * r[0]["eff_c"], real_ms(r[0]["t"])) if r else "-"

    def ded(S):
        return lambda W, d: (lambda r: r["mode"] == "ps" and r["S"] == S and r["W"] == W and not r["coloc"]
                             and r["dtype"] == d and r["codec"] == "raw" and r["overlap"] == "on")

    def g(x):
        return "%g G" % x
    srv_rows = [("PS, 1 dedicated server", ded(1), lambda W: g(W)),
                ("PS, 2 dedicated servers", ded(2), lambda W: g(W / 2.0)),
                ("PS, 4 dedicated servers", ded(4), lambda W: g(max(W / 4.0, 1))),
                ("PS, S = W co-located, 1 MiB partitions",
                 lambda W, d: (lambda r: r["mode"] == "ps" and r["coloc"] and r["S"] == W and r["W"] == W and
                               r["dtype"] == d and r["codec"] == "raw" and r["overlap"] == COLOC_FIT),
                 lambda W: g(2.0 * (W - 1) / W)),
                ("ring", lambda W, d: (lambda r: r["mode"] == "ring" and r["W"] == W and r["dtype"] == d and
                                       r["codec"] == "raw" and r["overlap"] == "on"),
                 lambda W: g(2.0 * (W - 1) / W))]
    srv = ["| overlap on, 4 MiB partitions unless stated | busiest link per step and direction, W = 4 / 8 | "
           "fp16, W = 4 | fp16, W = 8 | fp32, W = 8 |", "|---|---|---|---|---|"]
    for lab, pick, load in srv_rows:
        srv.append("| %s | %s / %s | %s | %s | %s |" % (lab, load(4), load(8), cell(pick(4, "fp16")),
                                                        cell(pick(8, "fp16")), cell(pick(8, "fp32"))))

    # ---- predictions for the real cluster ----
    sizes = {m[0]: m[2] for m in PRED_MODELS}
    comp = {m[0]: m[3] * T for m in PRED_MODELS}
    # the real link's TCP payload rate: 25 Gb/s with the same framing loss
    # the emulated link showed (measured / nominal), so that X on the real
    # cluster is exactly the emulated X / F
    beta = 25e9 / 8 * (link_Bps / (fnum(rows[0]["link_mbit"]) * 1e6 / 8))
    Ws = [1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 1536]
    pred = []

    def predict(mode, m, W, ov="on", S=None):
        """S = None: a server per worker host (co-located), S = "fit": the
        same with the co-located fit (COLOC_FIT) instead of ov's."""
        f = fits.get((mode, COLOC_FIT if S == "fit" else ov))
        if not f:
            return float("nan")
        G = sizes[m] / 2  # fp16 on the wire
        # the hidden part a scales with compute: F for the emulation, and
        # the model's compute relative to TSM-R50's
        hid = f[3] / F * comp[m] / T
        if mode == "ring":
            comm = 0.0 if W == 1 else ALPHA * 2 * (W - 1) + max(0.0, hid + f[1] * 2 * (W - 1) / W * G / beta)
        elif S == "fit":  # X as the fit defines it for S = W (feat): 2(W-1)/W G, 0 at W = 1
            comm = ALPHA * 2 + max(0.0, hid + f[1] * 2.0 * (W - 1) / W * G / beta)
        elif S is None:  # the dedicated fit on the co-located load, 2(W-1)/W G
            comm = ALPHA * 2 + max(0.0, hid + f[1] * max(2.0 * (W - 1) / W, 1.0 / W) * G / beta)
        else:
            comm = ALPHA * 2 + max(0.0, hid + f[1] * max(W / S, 1.0) * G / beta)
        return comm
    cols = (("ring", None), ("ps", "fit"), ("ps", None), ("ps", 4))
    for W in Ws:
        row = [W]
        for m in sizes:
            for mode, S in cols:
                cm = predict(mode, m, W, "on", S)
                row.append(comp[m] / (comp[m] + cm))
                row.append((comp[m] + cm) * 1e3)
        pred.append(row)
    with open(os.path.join(a.results, "predict.dat"), "w") as f:
        f.write("# W  tsm-r50: ring_eff ms  ps_coloc_fit_eff ms  ps_S=W_dedicated_fit_eff ms  ps4_eff ms"
                "  i3d-r50-311, i3d-r50-333: the same 8 columns each\n")
        for row in pred:
            f.write(" ".join("%.6g" % x for x in row) + "\n")

    def pc(e, ms):
        return "%.0f%% (%.0f ms)" % (100 * e, ms) if e == e else "-"
    cf = fits.get(("ps", COLOC_FIT))
    pt = []
    for k, (_, m, gbytes, cratio) in enumerate(PRED_MODELS):
        o = 1 + 8 * k
        pt += ([""] if k else []) + ["%s (fp32 gradient %.1f MB, compute %s):" % (
            m, gbytes / 1e6, "%.2fx TSM-R50's, %.0f ms" % (cratio, cratio * T * 1e3) if k else "%.0f ms" % (T * 1e3)),
            "",
               "| workers | ring | PS, S = W, co-located fit (%s) | PS, S = W, dedicated-server fit | "
               "PS, S = 4 dedicated |%s" % ("%d point%s" % (cf[2], "s" if cf[2] > 1 else "") if cf else "no fit",
                                            " I3D / TSM step time (faster of ring, PS co-located fit) |"
                                            if k else ""), "|---|---|---|---|---|%s" % ("---|" if k else "")]
        for row in pred:
            if row[0] not in (8, 16, 64, 256, 1024, 1536):
                continue
            line = "| %d | %s | %s | %s | %s |" % (row[0], pc(row[o], row[o + 1]), pc(row[o + 2], row[o + 3]),
                                                   pc(row[o + 4], row[o + 5]), pc(row[o + 6], row[o + 7]))
            if k:
                best = [min([x for x in (row[c], row[c + 2]) if x == x] or [float("nan")]) for c in (2, o + 1)]
                line += " %s |" % ("%.2fx" % (best[1] / best[0]) if best[0] == best[0] and best[1] == best[1] else "-")
            pt.append(line)

    # ---- data files for the plots ----
    fams = {}
    for r in rows:
        fams.setdefault(r["key"], []).append(r)
    with open(os.path.join(a.results, "curves.dat"), "w") as f:
        for key, rs in sorted(fams.items()):
            if len(rs) < 2:
                continue
            mode, S, dt, cd, ov = key
            f.write('"%s%s %s%s overlap %s"\n' % (mode, (" S=W" if S < 0 else " S=%d" % S) if mode == "ps" else "", dt,
                                                  "/" + cd if cd != "raw" else "", ov))
            for r in sorted(rs, key=lambda r: r["W"]):
                f.write("%d %.4f %.4f %.3f\n" % (r["W"], r["eff_c"], r["W"] / r["t"] * fnum(r["compute_ms"]) / 1e3,
                                                 real_ms(r["t"])))
            f.write("\n\n")
    with open(os.path.join(a.results, "split.dat"), "w") as f:
        f.write("# label data compute comm (real ms), workers = 8\n")
        for r in sorted((r for r in rows if r["W"] == 8), key=lambda r: (r["mode"], r["S"], r["dtype"], r["codec"], r["overlap"])):
            lab = "%s%s/%s%s/%s" % (r["mode"], r["S"] if r["mode"] == "ps" else "", r["dtype"],
                                   "-" + r["codec"] if r["codec"] != "raw" else "", r["overlap"])
            f.write('"%s" 0 %.2f %.2f\n' % (lab, real_ms(r["c"]), real_ms(r["w"])))

    # ---- wire-format / accuracy table ----
    wire_t = None
    if a.wire_csv and os.path.exists(a.wire_csv):
        wr = list(csv.DictReader(open(a.wire_csv)))
        if wr:
            wire_t = ["| wire | push bytes / worker / step | pull bytes / worker / step | push vs fp32 | "
                      "final top-1 | top-5 | val loss | train loss (last 10 steps) |", "|---|---|---|---|---|---|---|---|"]
            ref = None
            for r in wr:
                if r["dtype"] == "fp32" and r["codec"] == "raw":
                    ref = fnum(r["push_bytes_per_worker_step"])
            for r in wr:
                pb = fnum(r["push_bytes_per_worker_step"])
                # NaN logits rank as "correct" in the evaluator's counting:
                # a NaN validation loss makes the accuracies meaningless.
                bad = not math.isfinite(fnum(r["val_loss"]))
                wire_t.append("| %s%s | %.2f MB | %.2f MB | %s | %s | %s | %s | %s |" % (
                    r["dtype"], "/" + r["codec"] if r["codec"] != "raw" else "", pb / 1e6,
                    fnum(r["pull_bytes_per_worker_step"]) / 1e6,
                    "%.3f" % (pb / ref) if ref else "-",
                    "invalid (NaN logits)" if bad else r["top1"], "-" if bad else r["top5"],
                    r["val_loss"], r.get("train_loss", "-")))

    gen = {
        "measured": "\n".join(meas),
        "fit": "\n".join(fit_t),
        "predict": "\n".join(pt),
        "servers": "\n".join(srv),
        "run": "Model %s, slow-down F = %g (links %s Mbit/s%s, compute %g ms x F), %d points, "
               "run %s." % (model, F, rows[0]["link_mbit"],
                            "; TCP through one link measured %.0f Mbit/s, the physical limit the "
                            "model uses" % link_meas if link_meas > 0 else "",
                            T * 1e3, len(rows), a.label),
    }
    if wire_t:
        gen["wire"] = "\n".join(wire_t)
    for k, v in gen.items():
        with open(os.path.join(a.results, k + ".md"), "w") as f:
            f.write(v + "\n")
    print("\n\n".join("%s:\n%s" % kv for kv in gen.items()))
    if a.docs:
        try:
            text = open(a.docs).read()
        except OSError as e:
            print("analyze.py: cannot read %s: %s" % (a.docs, e), file=sys.stderr)
            return 1
        for k, v in gen.items():
            pat = re.compile(r"(<!-- BEGIN %s -->\n).*?(<!-- END %s -->)" % (k, k), re.S)
            if pat.search(text):
                text = pat.sub(lambda m: m.group(1) + v + "\n" + m.group(2), text)
        open(a.docs, "w").write(text)
        print("analyze.py: tables regenerated in", a.docs)
    return 0


if __name__ == "__main__":
    sys.exit(main())
