"""Runs benchmarks/hierarchical_bench.py on 2 simulated hosts x 2 ranks (tests/support/simhosts.py: network
namespaces joined by a bridge; needs root), each host's egress shaped to RATE with tc tbf and
UCX kept to TCP (UCX_TLS=tcp,self, set by SimHosts.env) so that the traffic between hosts
crosses the shaped links. The namespaces are removed afterwards, whatever happens.

    sudo .venv/bin/python benchmarks/hierarchical_bench_hosts.py [--rate 1gbit] [--cycle-time-ms MS] [-- BENCH ARGS]
"""
import argparse
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, os.path.join(ROOT, "tests", "support"))
import simhosts  # noqa: E402 - the tests' helper, found through the path above


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--rate", default="1gbit", help="tc rate of each host's egress (default 1gbit)")
    p.add_argument("--cycle-time-ms", help="collectivesrun's --cycle-time-ms (default: the engine's)")
    p.add_argument("--timeout", type=float, default=1800)
    p.add_argument("bench_args", nargs=argparse.REMAINDER)
    args = p.parse_args()
    reason = simhosts.unavailable_reason()
    if reason:
        sys.exit(f"hierarchical_bench_hosts: {reason}")
    gbit = float(args.rate[:-4]) if args.rate.endswith("gbit") else float(args.rate[:-4]) / 1000
    extra = [a for a in args.bench_args if a != "--"]
    with simhosts.SimHosts(["hosta", "hostb"]) as sim:
        for host in sim.hosts:
            sim.shape(host, args.rate)
        py = sys.executable
        knobs = ["--cycle-time-ms", args.cycle_time_ms] if args.cycle_time_ms else []
        run = sim.run("hosta", [py, "-m", "collectives.run", "-np", "4", "-H", "hosta:2,hostb:2", *knobs, py,
                                os.path.join(HERE, "hierarchical_bench.py"), "--rate-gbit", str(gbit), *extra],
                      timeout=args.timeout)
        sys.stdout.write(run.stdout)
        sys.stderr.write(run.stderr)
        return run.returncode


if __name__ == "__main__":
    sys.exit(main())
