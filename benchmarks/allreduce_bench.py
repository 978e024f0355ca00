"""Allreduce benchmark: raw mpi4py, collectives, and torch.distributed (gloo), side by side.

Run with:  mpirun -np 2 python benchmarks/allreduce_bench.py [--quick] [--json PATH] [--no-gloo]
                                                            [--cases sizes,latency,resnet50]

Method (see shared/DESIGN.md, "Measuring"): every timed repetition starts after an MPI barrier;
a repetition's time is the slowest rank's; we report the median over the repetitions that follow
a few untimed warm-up ones. Bandwidth is algorithmic: bytes of the tensor / time per op.
Absolute figures on a shared machine mean little; compare columns within one run.

Cases:
  1. float32 allreduce (Sum) over sizes from 4 KiB to 256 MiB.
       mpi4py   COMM_WORLD.Allreduce(send, recv): out of place, into a preallocated buffer
       ours     collectives.allreduce(x, op=Sum, name=...): out of place, a new array per call
       mpi4py_  COMM_WORLD.Allreduce(MPI.IN_PLACE, x): in place (MPICH's out-of-place first
                copies send to recv, so in place is faster for large tensors)
       ours_    collectives.allreduce_(x, ...): in place, no allocation
       (above 16 MiB also mpi4py_ in 16 MiB pieces, which avoids MPICH's per-call page faults)
       gloo     torch.distributed.all_reduce on gloo (in place on a torch tensor)
  2. Latency of an 8-byte allreduce (2 float32).
  3. 161 tensors with ResNet-50's parameter shapes (~25.6M floats, ~102 MB), submitted in
     backward order (last layer first), as gradients arrive.
"""
import argparse
import json
import os
import socket
import sys
import time

import numpy as np
from mpi4py import MPI

import collectives as hvd
from collectives import config as hvd_config

comm = MPI.COMM_WORLD
RANK, SIZE = comm.Get_rank(), comm.Get_size()
KiB, MiB = 1024, 1024 * 1024
CHUNK = 16 * MiB  # piece size of the "mpi4py_ chunked" variant for large tensors
EXPECTED = SIZE * (SIZE + 1) / 2  # rank r contributes r + 1 everywhere


# ----------------------------------------------------------------- ResNet-50 parameter shapes

def resnet50_shapes():
    """Shapes of torchvision's resnet50() parameters, in named_parameters() order."""
    shapes = [(64, 3, 7, 7), (64,), (64,)]  # conv1, bn1 weight, bn1 bias
    in_ch = 64
    for width, blocks in ((64, 3), (128, 4), (256, 6), (512, 3)):  # layer1..layer4 (Bottleneck)
        out_ch = width * 4
        for b in range(blocks):
            shapes += [(width, in_ch, 1, 1), (width,), (width,),      # conv1 1x1, bn1
                       (width, width, 3, 3), (width,), (width,),      # conv2 3x3, bn2
                       (out_ch, width, 1, 1), (out_ch,), (out_ch,)]   # conv3 1x1, bn3
            if b == 0:
                shapes += [(out_ch, in_ch, 1, 1), (out_ch,), (out_ch,)]  # downsample conv, bn
            in_ch = out_ch
    shapes += [(1000, 2048), (1000,)]  # fc weight, fc bias
    return shapes


RESNET50 = resnet50_shapes()
assert len(RESNET50) == 161
assert sum(int(np.prod(s)) for s in RESNET50) == 25_557_032


# ----------------------------------------------------------------- timing

def measure(fn, reps, warmup, setup=None):
    """Times of ``fn`` over ``reps`` repetitions (slowest rank per repetition), after ``warmup``.

    ``setup`` runs before each repetition's barrier, untimed (e.g. refilling an in-place buffer).
    """
    times = np.empty(reps)
    for i in range(warmup + reps):
        if setup is not None:
            setup()
        comm.Barrier()
        t0 = time.perf_counter()
        fn()
        t1 = time.perf_counter()
        if i >= warmup:
            times[i - warmup] = t1 - t0
    comm.Allreduce(MPI.IN_PLACE, times, op=MPI.MAX)
    return {"median_s": float(np.median(times)), "min_s": float(times.min()),
            "p90_s": float(np.percentile(times, 90)), "reps": reps}


class Check:
    """Collects wrong results (checked after timing) so the run reports rather than stops."""

    def __init__(self):
        self.failures = []

    def __call__(self, label, arrays):
        for a in arrays:
            a = np.asarray(a)
            if not np.all(a == EXPECTED):
                self.failures.append(f"rank {RANK}: {label}: expected {EXPECTED}, got e.g. {a.ravel()[:4]}")
                return


check = Check()


# ----------------------------------------------------------------- gloo (optional)

def setup_gloo(enabled):
    """torch.distributed on gloo, or None; every rank comes to the same answer."""
    dist, why = None, None
    if enabled:
        try:
            import torch
            import torch.distributed as dist_mod

            torch.set_num_threads(1)
        except ImportError as e:
            why = f"torch not importable ({e})"
    else:
        why = "disabled by --no-gloo"
    ok = comm.allreduce(why is None, op=MPI.LAND)
    if not ok:
        return None, why or "torch not importable on some rank"
    port = None
    if RANK == 0:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
    port = comm.bcast(port, root=0)
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    if len(set(comm.allgather(MPI.Get_processor_name()))) == 1:
        os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")  # one host: stay on loopback
    try:
        from datetime import timedelta

        dist_mod.init_process_group("gloo", rank=RANK, world_size=SIZE, timeout=timedelta(seconds=60))
        dist = dist_mod
    except Exception as e:  # noqa: BLE001 - report and go on without the column
        why = f"init_process_group failed: {e}"
    ok = comm.allreduce(why is None, op=MPI.LAND)
    if not ok:
        return None, why or "init_process_group failed on some rank"
    return dist, None


# ----------------------------------------------------------------- cases

def bench_sizes(sizes, reps_for, dist):
    rows = []
    for nbytes in sizes:
        n = nbytes // 4
        reps, warmup = reps_for(nbytes)
        x = np.full(n, RANK + 1, dtype=np.float32)
        row = {"bytes": nbytes}

        recv = np.empty_like(x)
        row["mpi4py"] = measure(lambda: comm.Allreduce(x, recv, op=MPI.SUM), reps, warmup)
        check(f"mpi4py {nbytes} B", [recv])
        del recv

        name = f"bench.{nbytes}"
        last = [None]

        def ours():
            last[0] = None  # drop the previous result first, as a training loop would
            last[0] = hvd.allreduce(x, op=hvd.Sum, name=name)

        row["ours"] = measure(ours, reps, warmup)
        check(f"ours {nbytes} B", [last[0]])
        last[0] = None

        y = np.empty_like(x)
        row["mpi4py_"] = measure(lambda: comm.Allreduce(MPI.IN_PLACE, y, op=MPI.SUM), reps, warmup,
                                 setup=lambda: np.copyto(y, x))
        check(f"mpi4py_ {nbytes} B", [y])
        if nbytes > CHUNK:
            # MPICH allocates a temporary of half the message per Allreduce; above glibc's mmap
            # threshold (32 MiB at most) that is a fresh mapping, page-faulted on every call.
            # Pieces of CHUNK bytes avoid it: this column shows what that is worth.
            def chunked():
                for off in range(0, n, CHUNK // 4):
                    comm.Allreduce(MPI.IN_PLACE, y[off:off + CHUNK // 4], op=MPI.SUM)

            row["mpi4py_chunked"] = measure(chunked, reps, warmup, setup=lambda: np.copyto(y, x))
            check(f"mpi4py_ chunked {nbytes} B", [y])
        row["ours_"] = measure(lambda: hvd.allreduce_(y, op=hvd.Sum, name=name + "_"), reps, warmup,
                               setup=lambda: np.copyto(y, x))
        check(f"ours_ {nbytes} B", [y])
        del y

        if dist is not None:
            import torch

            t = torch.empty(n, dtype=torch.float32)
            tn = t.numpy()
            row["gloo"] = measure(lambda: dist.all_reduce(t), reps, warmup, setup=lambda: np.copyto(tn, x))
            check(f"gloo {nbytes} B", [tn])
            del t, tn
        rows.append(row)
        del x
    return rows


def bench_latency(reps, dist):
    x = np.full(2, RANK + 1, dtype=np.float32)  # 8 bytes
    recv = np.empty_like(x)
    out = {"mpi4py": measure(lambda: comm.Allreduce(x, recv, op=MPI.SUM), reps, 50)}
    check("mpi4py latency", [recv])
    last = [None]

    def ours():
        last[0] = hvd.allreduce(x, op=hvd.Sum, name="bench.latency")

    out["ours"] = measure(ours, reps, 50)
    check("ours latency", [last[0]])
    if dist is not None:
        import torch

        t = torch.empty(2, dtype=torch.float32)
        tn = t.numpy()
        out["gloo"] = measure(lambda: dist.all_reduce(t), reps, 50, setup=lambda: np.copyto(tn, x))
        check("gloo latency", [tn])
    return out


def bench_resnet(reps, warmup, dist):
    order = list(reversed(range(len(RESNET50))))  # backward order: fc first
    grads = [np.full(RESNET50[i], RANK + 1, dtype=np.float32) for i in order]
    names = [f"resnet50.{i}" for i in order]
    sizes = [g.size for g in grads]
    total = sum(sizes)
    out = {"tensors": len(grads), "floats": total, "bytes": total * 4}
    results = {}

    recvs = [np.empty_like(g) for g in grads]

    def one_by_one():
        for g, r in zip(grads, recvs):
            comm.Allreduce(g, r, op=MPI.SUM)

    out["mpi4py one by one"] = measure(one_by_one, reps, warmup)
    check("resnet mpi4py one by one", recvs)

    flat = np.empty(total, dtype=np.float32)
    offsets = np.cumsum(sizes)[:-1]

    def flat_buffer():
        np.concatenate([g.ravel() for g in grads], out=flat)            # copy in
        comm.Allreduce(MPI.IN_PLACE, flat, op=MPI.SUM)
        for piece, r in zip(np.split(flat, offsets), recvs):            # copy out
            np.copyto(r.reshape(-1), piece)

    for r in recvs:
        r.fill(0)
    out["mpi4py flat buffer"] = measure(flat_buffer, reps, warmup)
    check("resnet mpi4py flat buffer", recvs)
    del flat, recvs

    def ours_async():
        results["r"] = None
        handles = [hvd.allreduce_async(g, op=hvd.Sum, name=nm) for g, nm in zip(grads, names)]
        results["r"] = [hvd.synchronize(h) for h in handles]

    out["ours async x161 + synchronize"] = measure(ours_async, reps, warmup)
    check("resnet ours async", results["r"])

    def ours_grouped():
        results["r"] = None
        results["r"] = hvd.grouped_allreduce(grads, op=hvd.Sum, name="resnet50.grouped")

    out["ours grouped_allreduce"] = measure(ours_grouped, reps, warmup)
    check("resnet ours grouped", results["r"])
    results.clear()

    work = [np.empty_like(g) for g in grads]

    def refill():
        for w, g in zip(work, grads):
            np.copyto(w, g)

    out["ours grouped_allreduce_ (in place)"] = measure(
        lambda: hvd.grouped_allreduce_(work, op=hvd.Sum, name="resnet50.grouped_"), reps, warmup, setup=refill)
    check("resnet ours grouped in place", work)
    del work

    if dist is not None:
        import torch

        tensors = [torch.empty(g.shape, dtype=torch.float32) for g in grads]
        views = [t.numpy() for t in tensors]

        def refill_t():
            for v, g in zip(views, grads):
                np.copyto(v, g)

        def gloo_one_by_one():
            for t in tensors:
                dist.all_reduce(t)

        out["gloo one by one"] = measure(gloo_one_by_one, reps, warmup, setup=refill_t)
        check("resnet gloo one by one", views)
    return out


# ----------------------------------------------------------------- printing

def fmt_time(s):
    if s is None:
        return "n/a"
    if s < 1e-3:
        return f"{s * 1e6:.1f} us"
    if s < 1:
        return f"{s * 1e3:.2f} ms"
    return f"{s:.2f} s"


def fmt_size(b):
    return f"{b // MiB} MiB" if b >= MiB else f"{b // KiB} KiB" if b >= KiB else f"{b} B"


def med(d, key):
    v = d.get(key)
    return None if v is None else v["median_s"]


def ratio(a, b):
    return "n/a" if a is None or b is None else f"{a / b:.2f}x"


def print_report(res):
    if "sizes" in res:
        print_sizes(res)
    if "latency" in res:
        print_latency(res)
    if "resnet50" in res:
        print_resnet(res)


def print_sizes(res):
    cols = ["mpi4py", "ours", "mpi4py_", "ours_", "gloo"]
    print(f"\n== float32 allreduce (Sum), np={SIZE}: median time per op (slowest rank), "
          f"ratios against mpi4py (>1 = slower)")
    print("   out of place: mpi4py Allreduce(send, recv) into a preallocated buffer; ours allreduce "
          "(new output array each call)\n   in place:     mpi4py_ Allreduce(IN_PLACE, x); ours_ allreduce_; "
          "gloo torch.distributed.all_reduce\n   ours/mpi compares out of place, ours_/mpi_ and gloo/mpi_ "
          "in place")
    hdr = f"{'size':>8} | {'mpi4py':>10} {'ours':>10} {'ours/mpi':>8} | {'mpi4py_':>10} {'ours_':>10} " \
          f"{'ours_/mpi_':>10} | {'gloo':>10} {'gloo/mpi_':>9}"
    print(hdr)
    print("-" * len(hdr))
    for row in res["sizes"]:
        m, o = med(row, "mpi4py"), med(row, "ours")
        mi, oi, g = med(row, "mpi4py_"), med(row, "ours_"), med(row, "gloo")
        print(f"{fmt_size(row['bytes']):>8} | {fmt_time(m):>10} {fmt_time(o):>10} {ratio(o, m):>8} | "
              f"{fmt_time(mi):>10} {fmt_time(oi):>10} {ratio(oi, mi):>10} | {fmt_time(g):>10} {ratio(g, mi):>9}")

    large = [row for row in res["sizes"] if "mpi4py_chunked" in row]
    if large:
        print(f"\n   in place, large tensors: one Allreduce vs Allreduces of {CHUNK // MiB} MiB pieces")
        for row in large:
            mi, mc, oi = med(row, "mpi4py_"), med(row, "mpi4py_chunked"), med(row, "ours_")
            print(f"{fmt_size(row['bytes']):>8} | mpi4py_ {fmt_time(mi):>10} | chunked {fmt_time(mc):>10} "
                  f"{ratio(mc, mi):>7} | ours_ vs chunked {ratio(oi, mc):>7}")

    print("\n   algorithmic bandwidth (tensor bytes / median time), GB/s")
    hdr = f"{'size':>8} | " + " | ".join(f"{c:>8}" for c in cols)
    print(hdr)
    print("-" * len(hdr))
    for row in res["sizes"]:
        cells = []
        for c in cols:
            t = med(row, c)
            cells.append(f"{'n/a' if t is None else format(row['bytes'] / t / 1e9, '.2f'):>8}")
        print(f"{fmt_size(row['bytes']):>8} | " + " | ".join(cells))



def print_latency(res):
    lat = res["latency"]
    m = med(lat, "mpi4py")
    print(f"\n== 8-byte allreduce latency, median of {lat['mpi4py']['reps']} (slowest rank; p90 in brackets)")
    for c in ("mpi4py", "ours", "gloo"):
        t = med(lat, c)
        p90 = "" if t is None else f"[p90 {fmt_time(lat[c]['p90_s'])}]"
        print(f"   {c:<8} {fmt_time(t):>10} {p90:<18} {ratio(t, m):>8} vs mpi4py")



def print_resnet(res):
    rn = res["resnet50"]
    base = med(rn, "mpi4py one by one")
    print(f"\n== {rn['tensors']} tensors with ResNet-50 parameter shapes ({rn['floats']:,} floats, "
          f"{rn['bytes'] / 1e6:.0f} MB), median of {rn['mpi4py one by one']['reps']}; "
          f"fusion threshold {res['fusion_threshold'] / MiB:g} MiB")
    for key in ("mpi4py one by one", "mpi4py flat buffer", "ours async x161 + synchronize",
                "ours grouped_allreduce", "ours grouped_allreduce_ (in place)", "gloo one by one"):
        t = med(rn, key)
        bw = "" if t is None else f"{rn['bytes'] / t / 1e9:6.2f} GB/s"
        print(f"   {key:<36} {fmt_time(t):>10}  {bw:>11}  {ratio(t, base):>7} vs mpi4py one by one")
    print("   (flat buffer: pack copy + in-place Allreduce + unpack copy, all timed)")


# ----------------------------------------------------------------- main

def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="sizes up to 16 MiB, fewer repetitions")
    parser.add_argument("--json", metavar="PATH", help="also write the numbers to PATH (rank 0)")
    parser.add_argument("--no-gloo", action="store_true", help="skip torch.distributed/gloo")
    parser.add_argument("--cases", default="sizes,latency,resnet50",
                        help="comma-separated subset of sizes,latency,resnet50 (default: all)")
    args = parser.parse_args()
    cases = set(args.cases.split(","))
    unknown = cases - {"sizes", "latency", "resnet50"}
    if unknown:
        parser.error(f"unknown case(s): {', '.join(sorted(unknown))}")

    started = time.perf_counter()
    hvd.init()
    dist, why_no_gloo = setup_gloo(not args.no_gloo)
    if RANK == 0:
        print(f"allreduce benchmark: np={SIZE}, mpi4py {MPI.Get_library_version().splitlines()[0].strip()}, "
              f"collectives {hvd.__version__}, gloo: {'yes' if dist else 'n/a (' + why_no_gloo + ')'}",
              flush=True)

    if args.quick:
        sizes = [4 * KiB, 64 * KiB, 1 * MiB, 16 * MiB]
        reps_for = lambda b: (100, 10) if b <= 64 * KiB else (30, 3) if b <= MiB else (8, 2)  # noqa: E731
        lat_reps, rn_reps, rn_warm = 300, 3, 1
    else:
        sizes = [4 * KiB, 64 * KiB, 1 * MiB, 16 * MiB, 64 * MiB, 256 * MiB]
        reps_for = lambda b: ((300, 20) if b <= 64 * KiB else (100, 5) if b <= MiB  # noqa: E731
                              else (25, 3) if b <= 16 * MiB else (10, 2) if b <= 64 * MiB else (5, 1))
        lat_reps, rn_reps, rn_warm = 2000, 10, 2

    res = {"np": SIZE, "quick": args.quick, "gloo": dist is not None, "why_no_gloo": why_no_gloo}
    res["fusion_threshold"] = hvd_config.read("fusion_threshold")
    if "sizes" in cases:
        res["sizes"] = bench_sizes(sizes, reps_for, dist)
    if "latency" in cases:
        res["latency"] = bench_latency(lat_reps, dist)
    if "resnet50" in cases:
        res["resnet50"] = bench_resnet(rn_reps, rn_warm, dist)
    res["wall_s"] = time.perf_counter() - started

    failures = [f for per_rank in comm.gather(check.failures, root=0) or [] for f in per_rank]
    if RANK == 0:
        print_report(res)
        print(f"\nwall time {res['wall_s']:.1f} s")
        if failures:
            print("\nWRONG RESULTS:\n  " + "\n  ".join(failures))
        if args.json:
            res["failures"] = failures
            with open(args.json, "w") as f:
                json.dump(res, f, indent=2)
            print(f"numbers written to {args.json}")
    failed = comm.bcast(bool(failures), root=0)
    if dist is not None:
        dist.destroy_process_group()
    hvd.shutdown()
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
