"""Writes scripts/gpu-check.sh's report from its state directory: REPORT/gpu-check-report.md
(the stages' lines and the benchmark figures against their targets) and the logs and JSON
beside it (at most 7 files, so that the device tool brings them all back).

Usage: python scripts/gpu_report.py STATE_DIR REPORT_DIR   (standard library only)
"""
import json
import os
import shutil
import sys

TARGETS = ("256 MiB allreduce within 5% of raw NCCL; the fused 161 tensors within 1.2x of one raw call of "
           "their total size; the training step no slower than DDP")


def read(path, default=""):
    try:
        with open(path) as f:
            return f.read().strip()
    except OSError:
        return default


def state_values(state_dir):
    values = {}
    for line in read(os.path.join(state_dir, "state")).splitlines():
        if "=" in line:
            key, value = line.split("=", 1)
            values[key] = value
    return values


def ratio_line(label, ours, theirs, target, lower_is_better=True):
    if ours is None or theirs is None:
        return f"  - {label}: not measured"
    r = ours / theirs
    ok = r <= target if lower_is_better else r >= target
    return f"  - {label}: {r:.3f}x (target {'<=' if lower_is_better else '>='} {target}) {'met' if ok else 'NOT MET'}"


def bench_lines(r):
    """The figures of one gpu_bench.py run (its JSON), and the issue's ratios."""
    ms = lambda k: f"{r[k] * 1e3:.2f} ms" if r.get(k) is not None else "-"  # noqa: E731
    out = [f"- {r['ranks']} rank(s) on {r.get('device', '?')}{' (shared GPU)' if r.get('shared_gpu') else ''}, "
           f"NCCL {r.get('nccl_version')}, medians of {r.get('iters')}"]
    out.append(f"  - 256 MiB: device copy {ms('copy_256MiB_s')}; collectives allreduce {ms('allreduce_256MiB_s')} "
               f"(busbw {r.get('allreduce_busbw_GBps', 0):.1f} GB/s); raw NCCL {ms('raw_allreduce_256MiB_s')} "
               f"({r.get('raw_backend', '-')})")
    out.append(ratio_line("256 MiB collectives / raw NCCL", r.get("allreduce_256MiB_s"),
                          r.get("raw_allreduce_256MiB_s"), 1.05))
    out.append(f"  - 161 ResNet-50 gradients ({r.get('resnet50_MB', 0):.0f} MB): fused {ms('fused_161_s')}; "
               f"one collectives call {ms('one_call_flat_s')}; one raw NCCL call {ms('raw_flat_s')}")
    out.append(ratio_line("fused 161 / one raw NCCL call", r.get("fused_161_s"), r.get("raw_flat_s"), 1.2))
    if r.get("train_ours_s") is not None or r.get("train_skipped"):
        out.append(f"  - ResNet-50 training step (batch {r.get('train_batch', '?')} per rank): DistributedOptimizer "
                   f"{ms('train_ours_s')}, DDP {ms('train_ddp_s')}"
                   + (f" ({r['train_skipped']})" if r.get("train_skipped") else ""))
        out.append(ratio_line("DistributedOptimizer / DDP step", r.get("train_ours_s"), r.get("train_ddp_s"), 1.0))
    out.append(f"  - 8-byte allreduce latency {r['latency_8B_s'] * 1e6:.1f} us"
               + (f" (raw NCCL {r['raw_latency_8B_s'] * 1e6:.1f} us)" if r.get("raw_latency_8B_s") else "")
               if r.get("latency_8B_s") else
               "  - 8-byte latency: not measured")
    if r.get("notes"):
        out += [f"  - note: {n}" for n in r["notes"]]
    return out


def nowait_lines(state_dir):
    """The fused section again with COLLECTIVES_GPU_FUSION_WAIT=0 (gpu-check.sh), beside the
    main run's figure of the same number of ranks: what waiting for a busy GPU changes."""
    try:
        off = json.load(open(os.path.join(state_dir, "bench-nowait.json")))
        on = json.load(open(os.path.join(state_dir, f"bench-np{off['ranks']}.json")))
    except (OSError, ValueError, KeyError):
        return []
    ms = lambda r: f"{r['fused_161_s'] * 1e3:.2f} ms" if r.get("fused_161_s") else "-"  # noqa: E731
    return [f"- 161 ResNet-50 gradients at {off['ranks']} rank(s): {ms(on)} waiting for the busy GPU "
            f"(COLLECTIVES_GPU_FUSION_WAIT=1), {ms(off)} without (=0, a later launch)", ""]


def hold_runs(state_dir):
    """The holds stage's launches (gpu-check.sh), in launch order: (file name, its JSON or None
    when unreadable)."""
    def launch_order(name):  # bench-hold-<launch>-<ms>.json
        part = name.split("-")[2] if name.count("-") >= 3 else ""
        return int(part) if part.isdigit() else 0

    names = [n for n in os.listdir(state_dir) if n.startswith("bench-hold-") and n.endswith(".json")]
    runs = []
    for name in sorted(names, key=launch_order):
        try:
            runs.append((name, json.load(open(os.path.join(state_dir, name)))))
        except (OSError, ValueError):
            runs.append((name, None))
    return runs


def holds_lines(named_runs):
    """The fused gradients and the training step for each COLLECTIVES_GPU_FUSION_WAIT_MS of the
    holds stage, with the NCCL allreduce calls each took."""
    runs = [r if r is not None else {"gpu_fusion_wait_ms": name[:-5].split("-")[-1], "notes": ["unreadable"]}
            for name, r in named_runs]
    if not runs:
        return []
    key = lambda r: float(r["gpu_fusion_wait_ms"]) if str(r.get("gpu_fusion_wait_ms")).replace(".", "").isdigit() else 0
    ms = lambda r, k: f"{r[k] * 1e3:.1f}" if r.get(k) is not None else "-"  # noqa: E731
    num = lambda v: "-" if v is None else (f"{v:.1f}" if not isinstance(v, list) else "/".join(f"{x:.1f}" for x in v if x is not None))  # noqa: E731
    rounds = lambda r, k: "/".join(f"{x * 1e3:.1f}" for x in r.get(k) or []) or "-"  # noqa: E731
    out = ["| wait at most (ms) | 161 gradients (ms) | their NCCL calls | training step, each round (ms) | DDP, each round (ms) | best / best | NCCL calls per step |",
           "|---|---|---|---|---|---|---|"]
    for r in sorted(runs, key=key):  # stable: a value's launches stay in their order
        ratio = (f"{r['train_ours_s'] / r['train_ddp_s']:.2f}x" if r.get("train_ours_s") and r.get("train_ddp_s") else "-")
        out.append(f"| {r.get('gpu_fusion_wait_ms')} | {ms(r, 'fused_161_s')} | {num(r.get('fused_161_launches'))} | "
                   f"{rounds(r, 'train_ours_rounds_s')} | {rounds(r, 'train_ddp_rounds_s')} | {ratio} | "
                   f"{num(r.get('train_ours_launches_per_step'))} |")
    ranks = runs[0].get("ranks", "?")
    return [f"- {ranks} rank(s), each value a launch of its own:", ""] + out + [""]


def main():
    state_dir, report = sys.argv[1], sys.argv[2]
    os.makedirs(report, exist_ok=True)
    values = state_values(state_dir)
    out = ["# collectives GPU check", "", f"Started {values.get('started', '?')}, report written "
           f"{values.get('finished', '(in progress)')}; GPUs seen by PyTorch: {values.get('gpus', '?')}.", ""]
    for stage, title in (("setup", "Setup"), ("tests", "Tests"), ("bench", "Benchmarks")):
        text = read(os.path.join(state_dir, f"part-{stage}.md"), "- not run on this machine")
        out += [f"## {title}", "", text or "- (in progress)", ""]
        if stage == "bench":
            for name in ("bench-np2.json", "bench-np1.json"):
                path = os.path.join(state_dir, name)
                if os.path.exists(path):
                    try:
                        out += bench_lines(json.load(open(path))) + [""]
                    except (ValueError, KeyError) as e:
                        out += [f"- {name} unreadable: {e}", ""]
            out += nowait_lines(state_dir)
            out += [f"Targets: {TARGETS}.", ""]
    zero_part = read(os.path.join(state_dir, "part-zero.md"))
    if zero_part:
        out += ["## Sharded optimizer state (benchmarks/zero_bench.py)", "", zero_part, ""]
    runs = hold_runs(state_dir)
    holds_part = read(os.path.join(state_dir, "part-holds.md"))
    if holds_part:
        out += ["## How long GPU work waits for a busy GPU", "", holds_part, ""] + holds_lines(runs)
    out += ["Logs: setup.log, tests.log, bench.log (failures are listed at the end of each pytest run)."]
    with open(os.path.join(report, "gpu-check-report.md"), "w") as f:
        f.write("\n".join(out) + "\n")
    holds = {name: r for name, r in runs if r is not None}
    if holds:  # one file for all of them: the device tool brings back at most 8
        with open(os.path.join(report, "bench-holds.json"), "w") as f:
            json.dump(holds, f, indent=1)
    for name in ("setup.log", "tests.log", "bench.log", "bench-np2.json", "bench-np1.json", "bench-nowait.json"):
        src = os.path.join(state_dir, name)
        if os.path.exists(src) and os.path.abspath(src) != os.path.abspath(os.path.join(report, name)):
            shutil.copyfile(src, os.path.join(report, name))
    print("\n".join(out))


if __name__ == "__main__":
    main()
