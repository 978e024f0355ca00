"""Two builds of collectives side by side on the peer kit's cases (../shared/peer/peer_bench.py): is a
change (a restructuring, say) slower anywhere beyond the run-to-run spread?

    bash benchmarks/compare_builds.sh BEFORE_VENV AFTER_VENV [ROUNDS]    runs both, interleaved, then this
    python benchmarks/compare_builds.py --kit ../shared/peer DIR         the table of DIR's before.*.json, after.*.json

Per case: the median over rounds of the slowest rank's median for each build, after / before, and each
build's spread over its rounds (max / min - 1). A case is flagged when after is more than 5 % slower than
before and the difference is larger than the larger of the two spreads.
"""
import argparse
import glob
import json
import os
import statistics
import sys


def load(directory, build, derive):
    runs, loads = [], []
    for path in sorted(glob.glob(os.path.join(directory, f"{build}.*.json"))):
        with open(path) as f:
            d = json.load(f)
        runs.append(derive(d["results"]))
        loads.append(d["meta"].get("loadavg_start", float("nan")))
    return runs, loads


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--kit", required=True, help="the folder of peer_bench.py")
    p.add_argument("directory")
    args = p.parse_args()
    sys.path.insert(0, args.kit)
    import peer_bench

    before, before_loads = load(args.directory, "before", peer_bench.derive)
    after, after_loads = load(args.directory, "after", peer_bench.derive)
    if not before or not after:
        print(f"no before.*.json or after.*.json in {args.directory}")
        return 1
    print(f"rounds: before {len(before)}, after {len(after)}; median of the slowest rank's median per round")
    head = f"{'measure':30s} {'unit':4s} {'before':>10s} {'after':>10s} {'after/before':>13s} " \
           f"{'spread b':>9s} {'spread a':>9s}"
    print(head)
    print("-" * len(head))
    flagged = []
    for key, label in peer_bench.ROWS:
        b = [r[key]["median"] for r in before if key in r]
        a = [r[key]["median"] for r in after if key in r]
        if not a or not b:
            continue
        unit = before[0][key]["unit"]
        mb, ma = statistics.median(b), statistics.median(a)
        ratio = ma / mb if mb > 0 else float("nan")
        sb = (max(b) / min(b) - 1) * 100 if min(b) > 0 else float("nan")
        sa = (max(a) / min(a) - 1) * 100 if min(a) > 0 else float("nan")
        derived = key.endswith("_overhead")
        mark = ""
        if not derived and ratio > 1.05 and (ratio - 1) * 100 > max(sb, sa):
            mark = "  <- slower beyond the spread"
            flagged.append(label)
        spreads = f"{'-':>9s} {'-':>9s}" if derived else f"{sb:8.0f}% {sa:8.0f}%"
        print(f"{label:30s} {unit:4s} {mb:10.1f} {ma:10.1f} {ratio:13.2f} {spreads}{mark}")
    print("\n1-min load at the start of each run: before " + "/".join(f"{x:.1f}" for x in before_loads)
          + ", after " + "/".join(f"{x:.1f}" for x in after_loads))
    print("derived rows (dist - nocomm) have no spread of their own; read them with the step rows")
    print("flagged: " + (", ".join(flagged) if flagged else "none"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
