#!/usr/bin/env python3
"""Metadata operations side by side: kernel ext4 and dxfs on each FUSE transport.

    python3 bench/metadata.py [--n 100000] [--runs 3] [--targets ext4,classic,uring,uring-nowb]
                              [--dxfs-bin target/release/dxfs]

A target `T-nowb` is transport T with the writeback cache off (`-o no_writeback_cache`),
`T-plain` a plain fuse mount rather than fuseblk (`-o noblkdev`), `T-keep` with keepers
(`-o keep_awake_us=1000`: idle CPUs kept from halting between requests).
Each target gets a fresh volume on a loop device over a sparse file in /dev/shm (the
same kind of device for all); the operations of bench/metaops.py run N times each, in
one directory, from this process. Prints µs per operation (median over the runs), the
ratio to ext4, and for dxfs the FUSE requests per operation from the mount's counters.
The io_uring target turns the fuse module's enable_uring parameter on for its run and
puts back what it found. Needs root. A benchmark, not a test: it asserts nothing.
"""
import argparse, os, platform, statistics, sys, time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import metaops  # noqa: E402

from loopvol import URING_PARAM, LoopVolume  # noqa: E402


def requests(v):
    return {k: c["count"] for k, c in v.stats().get("ops", {}).items()}


def daemon_cpu_us(v):
    """CPU time of every thread of the dxfs daemon so far, in µs (0 for ext4)."""
    d = getattr(v, "daemon", None)
    if d is None:
        return 0.0
    total = 0
    for tid in os.listdir(f"/proc/{d.pid}/task"):
        try:
            total += int(open(f"/proc/{d.pid}/task/{tid}/schedstat").read().split()[0])
        except (OSError, ValueError, IndexError):
            pass
    return total / 1000


def one_run(kind, dxfs, n, size_gib):
    """{op label: (µs per op, {opcode: requests per op}, daemon CPU µs per op)} for one
    fresh volume."""
    out = {}
    # "uring-nowb": the io_uring transport with the writeback cache off; "uring-plain": a
    # plain fuse mount instead of fuseblk (the default as root over a block device).
    transport, _, variant = kind.partition("-")
    fs, transport = ("ext4", None) if kind == "ext4" else ("dxfs", transport)
    options = {"nowb": ["-o", "no_writeback_cache"], "plain": ["-o", "noblkdev"],
               "keep": ["-o", "keep_awake_us=1000"]}.get(variant, [])
    with LoopVolume(fs, size_gib, dxfs, transport, options) as t:
        d = os.path.join(t.mnt, "d")
        os.mkdir(d)
        names = [os.path.join(d, f"f{i:07}") for i in range(n)]
        for label, fn, setup, teardown, count in metaops.make_ops(d, names):
            if setup:
                setup()
            before, cpu_before = requests(t), daemon_cpu_us(t)
            start = time.perf_counter()
            fn()
            us = (time.perf_counter() - start) * 1e6 / count
            cpu = (daemon_cpu_us(t) - cpu_before) / count
            after = requests(t)
            if teardown:
                teardown()
            reqs = {k: (after.get(k, 0) - before.get(k, 0)) / count for k in after}
            reqs["GETXATTR"] = reqs.get("GETXATTR", 0) - 1 / count  # the stats read itself
            out[label] = (us, {k: v for k, v in reqs.items() if v > 0.005}, cpu)
        out["transport"] = t.stats().get("transport", "kernel")
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, default=100_000)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--targets", default="ext4,classic,uring")
    ap.add_argument("--size-gib", type=int, default=0, help="volume size (default: by N)")
    ap.add_argument("--dxfs-bin", default=os.path.join(os.path.dirname(__file__), "..", "target", "release", "dxfs"))
    a = ap.parse_args()
    dxfs = os.path.abspath(a.dxfs_bin)
    targets = a.targets.split(",")
    size = a.size_gib or max(2, a.n * 8 // 1_000_000 + 2)
    if "uring" in targets and not os.path.exists(URING_PARAM):
        print(f"skipping the io_uring target: {URING_PARAM} missing (kernel without CONFIG_FUSE_IO_URING)")
        targets.remove("uring")
    results = {t: [] for t in targets}
    for r in range(a.runs):
        for t in targets:
            results[t].append(one_run(t, dxfs, a.n, size))
            print(f"run {r + 1}/{a.runs}: {t} done", file=sys.stderr)
    labels = [label for label, *_ in metaops.make_ops("", [])]
    cpu = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), "?")
    print(f"{time.strftime('%Y-%m-%d')}, {platform.release()}, {os.cpu_count()} vCPUs ({cpu}), load average "
          f"{os.getloadavg()[0]:.2f} at the end; N = {a.n:,} in one directory, median of {a.runs} runs; "
          f"µs per operation (× ext4)\n")
    for t in targets:
        if t != "ext4":
            print(f"- {t}: {results[t][0]['transport']}")
    print()
    print("| operation | " + " | ".join(targets) + " | dxfs requests per operation |")
    print("|---|" + "---|" * len(targets) + "---|")
    for label in labels:
        med = {t: statistics.median(run[label][0] for run in results[t]) for t in targets}
        cells = []
        for t in targets:
            ratio = f" ({med[t] / med['ext4']:.2f}×)" if "ext4" in med and t != "ext4" else ""
            cells.append(f"{med[t]:.1f}{ratio}")
        dx = next((t for t in targets if t != "ext4"), None)
        reqs = results[dx][0][label][1] if dx else {}
        req_text = ", ".join(f"{k} {v:.2f}" for k, v in sorted(reqs.items(), key=lambda kv: -kv[1]))
        print(f"| {label} | " + " | ".join(cells) + f" | {req_text or 'none'} |")
    dxfs_targets = [t for t in targets if t != "ext4"]
    if dxfs_targets:
        print("\nThe daemon's CPU time per operation, µs (every thread, keepers included; median):\n")
        print("| operation | " + " | ".join(dxfs_targets) + " |")
        print("|---|" + "---|" * len(dxfs_targets))
        for label in labels:
            cells = [f"{statistics.median(run[label][2] for run in results[t]):.1f}" for t in dxfs_targets]
            print(f"| {label} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    sys.exit(main())
