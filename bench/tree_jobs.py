#!/usr/bin/env python3
"""Whole-tree jobs: `du -s` and `rm -rf` on kernel ext4 against `dxfs du -s` / `dxfs rm -r`
(and plain `du -s` / `rm -rf`) on a dxfs mount, each on a fresh volume on a loop device
over a sparse file in /dev/shm.

    python3 bench/tree_jobs.py [--files 100000] [--dirs 100] [--runs 3] [--bytes 16]
                               [--dxfs-bin target/release/dxfs] [--transport auto]
                               [--delay-ms D]

`--delay-ms D`: on storage with latency: every volume sits on an nbdkit export with its
delay filter at D ms per read and write (ext4 through nbdfuse and a loop device, dxfs
through its own NBD client); see bench/loopvol.py.

Each run builds the tree (files of --bytes bytes, spread over --dirs directories), then
sums it (du -s) and removes it warm (right after building: the kernel holds every dentry,
so dxfs must tell it to drop each removed name) and, on a second tree, cold (unmounted,
caches dropped, mounted again before each job). Prints seconds (median over the runs),
the ratio to ext4's command, and for dxfs the FUSE requests the cold job took. Every
volume is checked afterwards (e2fsck -fn, dxfs fsck -n). Needs root. A benchmark, not a
test: it asserts nothing beyond the tree being gone.
"""
import argparse, os, platform, statistics, subprocess, sys, time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from loopvol import LoopVolume  # noqa: E402


def build(root, files, dirs, size):
    os.mkdir(root)
    data = b"x" * size
    per = files // dirs
    for d in range(dirs):
        p = os.path.join(root, f"d{d:04}")
        os.mkdir(p)
        for f in range(per):
            fd = os.open(os.path.join(p, f"f{f:06}"), os.O_CREAT | os.O_WRONLY, 0o644)
            if data:
                os.write(fd, data)
            os.close(fd)


def counts(v):
    return {k: c["count"] for k, c in v.stats().get("ops", {}).items()}


COMMANDS = {
    "du -s": lambda dxfs, root: ["du", "-s", root],
    "dxfs du -s": lambda dxfs, root: [dxfs, "du", "-s", root],
    "rm -rf": lambda dxfs, root: ["rm", "-rf", root],
    "dxfs rm -r": lambda dxfs, root: [dxfs, "rm", "-r", root],
}
# (target, filesystem, its du command, its removal)
TARGETS = [
    ("ext4", "ext4", "du -s", "rm -rf"),
    ("dxfs, its commands", "dxfs", "dxfs du -s", "dxfs rm -r"),
    ("dxfs, plain commands", "dxfs", "du -s", "rm -rf"),
]


def timed(v, cmd):
    before = counts(v)
    start = time.perf_counter()
    p = subprocess.run(cmd, check=True, capture_output=True, text=True)
    secs = time.perf_counter() - start
    after = counts(v)
    reqs = {k: after[k] - before.get(k, 0) for k in after if after[k] - before.get(k, 0) > 0}
    reqs.pop("GETXATTR", None)  # the stats reads themselves
    return secs, reqs, p.stdout.split()[0] if p.stdout else ""


def one_run(target, a, dxfs):
    """{(job, warm|cold): (seconds, requests)} for one fresh volume."""
    _, fs, du, rm = target
    out = {}
    size = max(2, a.files * (4096 + 512) // (1 << 30) + 2)
    with LoopVolume(fs, size, dxfs, a.transport, fsck=True, delay_ms=a.delay_ms) as v:
        for state in ("warm", "cold"):
            root = os.path.join(v.mnt, f"tree-{state}")
            build(root, a.files, a.dirs, a.bytes)
            os.sync()
            if fs == "dxfs":
                subprocess.run([dxfs, "sync", v.mnt], check=True)
            for job, name in (("du", du), ("rm", rm)):
                if state == "cold":
                    v.remount()
                secs, reqs, printed = timed(v, COMMANDS[name](dxfs, root))
                out[job, state] = (secs, reqs)
                if job == "du":
                    out["du output", state] = printed
            assert not os.path.exists(root), f"{root} still there after {rm}"
    code, text = v.fsck_result
    if code != 0:
        print(f"fsck of the {target} volume: exit {code}\n{text}", file=sys.stderr)
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--files", type=int, default=100_000)
    ap.add_argument("--dirs", type=int, default=100)
    ap.add_argument("--bytes", type=int, default=16)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--transport", default="auto")
    ap.add_argument("--delay-ms", type=float, default=None, help="storage with latency (nbdkit delay filter)")
    ap.add_argument("--dxfs-bin", default=os.path.join(os.path.dirname(__file__), "..", "target", "release", "dxfs"))
    a = ap.parse_args()
    dxfs = os.path.abspath(a.dxfs_bin)
    results = {t[0]: [] for t in TARGETS}
    for r in range(a.runs):
        for t in TARGETS:
            results[t[0]].append(one_run(t, a, dxfs))
            print(f"run {r + 1}/{a.runs}: {t[0]} done", file=sys.stderr)
    cpu = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), "?")
    print(f"{time.strftime('%Y-%m-%d')}, {platform.release()}, {os.cpu_count()} vCPUs ({cpu}); "
          f"{a.files:,} files of {a.bytes} B in {a.dirs} directories; dxfs transport {a.transport}; "
          f"{'storage: nbdkit, %g ms a request; ' % a.delay_ms if a.delay_ms is not None else ''}"
          f"median of {a.runs} runs; seconds (× ext4's)\n")
    for job, title in (("du", "sum (du -s)"), ("rm", "removal")):
        print(f"| {title} | command | warm | cold | dxfs requests (cold) |")
        print("|---|---|---|---|---|")
        for t in TARGETS:
            cells = []
            for state in ("warm", "cold"):
                med = statistics.median(run[job, state][0] for run in results[t[0]])
                base = statistics.median(run[job, state][0] for run in results["ext4"])
                cells.append(f"{med:.3f} ({med / base:.2f}×)" if t[0] != "ext4" else f"{med:.3f}")
            reqs = results[t[0]][0][job, "cold"][1]
            text = ", ".join(f"{k} {n}" for k, n in sorted(reqs.items(), key=lambda kv: -kv[1])) or "—"
            cmd = t[2] if job == "du" else t[3]
            print(f"| {t[0]} | `{cmd}` | {cells[0]} | {cells[1]} | {text} |")
        print()
    printed = {t[0]: results[t[0]][0]["du output", "cold"] for t in TARGETS}
    print("du -s printed (KiB, cold, first run): " + ", ".join(f"{k} {v}" for k, v in printed.items()))


if __name__ == "__main__":
    sys.exit(main())
