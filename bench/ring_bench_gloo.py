#!/usr/bin/python3
"""Peer for bench/ring_bench.c: torch.distributed all_reduce with the gloo
backend over TCP loopback, measured the same way (median over K iterations
of the slowest rank's time, busbw = 2(W-1)/W * bytes / time).
Prints: RESULT gloo n=W bytes=B median_s=T busbw_GBps=X
Usage: /usr/bin/python3 ring_bench_gloo.py [-n 2,4] [-s 16,100] [-k 10] [-w 2]"""
import argparse
import socket
import statistics
import sys
import time


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def worker(rank, world, port, nbytes, iters, warm, q):
    import torch
    import torch.distributed as dist
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}",
                            rank=rank, world_size=world)
    x = torch.rand(nbytes // 4, dtype=torch.float32)
    one = torch.ones(1)
    times = []
    for it in range(warm + iters):
        dist.all_reduce(one)  # line the ranks up, as ring_bench does
        t0 = time.perf_counter()
        dist.all_reduce(x)
        t = time.perf_counter() - t0
        if it >= warm:
            times.append(t)
    dist.destroy_process_group()
    q.put((rank, times))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("-n", default="2,4")
    ap.add_argument("-s", default="16,100")
    ap.add_argument("-k", type=int, default=10)
    ap.add_argument("-w", type=int, default=2)
    a = ap.parse_args()
    try:
        import torch.multiprocessing as mp
        import torch.distributed as dist
        if not dist.is_available() or not dist.is_gloo_available():
            raise ImportError("torch.distributed without gloo")
    except ImportError as e:
        print(f"# gloo peer skipped: {e}")
        return 77
    ctx = mp.get_context("spawn")
    for w in [int(v) for v in a.n.split(",")]:
        for mib in [float(v) for v in a.s.split(",")]:
            nbytes = int(mib * 1048576) // 4 * 4
            q = ctx.Queue()
            port = free_port()
            ps = [ctx.Process(target=worker, args=(r, w, port, nbytes, a.k, a.w, q))
                  for r in range(w)]
            for p in ps:
                p.start()
            res = [q.get(timeout=600) for _ in ps]
            for p in ps:
                p.join()
            tmax = [max(t[i] for _, t in res) for i in range(a.k)]
            med = statistics.median(tmax)
            busbw = 2.0 * (w - 1) / w * nbytes / med / 1e9
            print(f"RESULT gloo n={w} bytes={nbytes} median_s={med:.6f} busbw_GBps={busbw:.3f}",
                  flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
