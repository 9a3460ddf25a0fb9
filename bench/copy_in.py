#!/usr/bin/env python3
"""Copying a tree in: `cp -a` and `tar -x` onto kernel ext4 against `dxfs cp -a` and
`dxfs import --tar` (and plain `cp -a` / `tar -x`) into a dxfs mount, each onto a fresh
volume on a loop device over a sparse file in /dev/shm, the final sync included.

    python3 bench/copy_in.py [--files 100000] [--dirs 100] [--min-kib 1] [--max-kib 16]
                             [--runs 3] [--dxfs-bin target/release/dxfs]
                             [--transport auto] [--delay-ms D]

The source tree (files of a size drawn evenly from [--min-kib, --max-kib] KiB, fixed
seed, spread over --dirs directories) and its tar archive are made once in /dev/shm.
Each job runs on a fresh volume: the copy, then a sync of that filesystem (`sync -f` on
ext4, `dxfs sync` on dxfs, which commits and waits for the device). Prints seconds
(median over the runs), the ratio to ext4's command in the same run, and the FUSE
requests dxfs served. Every copy is compared with the source (file count and bytes) and
every volume is checked afterwards (e2fsck -fn, dxfs fsck -n). `--delay-ms D`: storage
with latency (nbdkit's delay filter, see bench/loopvol.py). Needs root. A benchmark,
not a test.
"""
import argparse, os, platform, random, shutil, statistics, subprocess, sys, tempfile, time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from loopvol import LoopVolume  # noqa: E402


def build(root, files, dirs, lo, hi):
    rng = random.Random(42)
    blob = os.urandom(hi * 1024)
    total = 0
    for d in range(dirs):
        p = os.path.join(root, f"d{d:04}")
        os.makedirs(p)
        for f in range(files // dirs):
            n = rng.randint(lo * 1024, hi * 1024)
            with open(os.path.join(p, f"f{f:06}"), "wb") as fh:
                fh.write(blob[:n])
            total += n
    return total


def counts(v):
    return {k: c["count"] for k, c in v.stats().get("ops", {}).items()}


# (label, filesystem, command builder (dxfs, src, tar, dest) -> argv, what it copies from)
JOBS = [
    ("cp -a", "ext4", lambda x, s, t, d: ["cp", "-a", s, d]),
    ("tar -x", "ext4", lambda x, s, t, d: ["tar", "-xf", t, "-C", d]),
    ("dxfs cp -a", "dxfs", lambda x, s, t, d: [x, "cp", "-a", s, d]),
    ("dxfs import --tar", "dxfs", lambda x, s, t, d: [x, "import", "--tar", t, d]),
    ("cp -a", "dxfs", lambda x, s, t, d: ["cp", "-a", s, d]),
    ("tar -x", "dxfs", lambda x, s, t, d: ["tar", "-xf", t, "-C", d]),
]
BASE = {"dxfs cp -a": "cp -a", "dxfs import --tar": "tar -x", "cp -a": "cp -a", "tar -x": "tar -x"}


def one(job, a, dxfs, src, tar, want):
    label, fs, cmd = job
    size = max(2, (want[1] * 2 >> 30) + 2)
    with LoopVolume(fs, size, dxfs, a.transport, fsck=True, delay_ms=a.delay_ms) as v:
        dest = os.path.join(v.mnt, "in")
        os.mkdir(dest)
        before = counts(v) if fs == "dxfs" else {}
        start = time.perf_counter()
        subprocess.run(cmd(dxfs, src, tar, dest), check=True)
        sync = [dxfs, "sync", v.mnt] if fs == "dxfs" else ["sync", "-f", v.mnt]
        subprocess.run(sync, check=True)
        secs = time.perf_counter() - start
        reqs = {}
        if fs == "dxfs":
            after = counts(v)
            reqs = {k: after[k] - before.get(k, 0) for k in after if after[k] - before.get(k, 0) > 0}
            reqs.pop("GETXATTR", None)  # the stats reads themselves
        n, b = 0, 0
        for dp, _, fn in os.walk(dest):
            for f in fn:
                n += 1
                b += os.lstat(os.path.join(dp, f)).st_size
        assert (n, b) == want, f"{label} on {fs}: copied {(n, b)}, source {want}"
    code, text = v.fsck_result
    if code != 0:
        print(f"fsck after {label} on {fs}: exit {code}\n{text}", file=sys.stderr)
    return secs, reqs


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--files", type=int, default=100_000)
    ap.add_argument("--dirs", type=int, default=100)
    ap.add_argument("--min-kib", type=int, default=1)
    ap.add_argument("--max-kib", type=int, default=16)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--transport", default="auto")
    ap.add_argument("--delay-ms", type=float, default=None, help="storage with latency (nbdkit delay filter)")
    ap.add_argument("--dxfs-bin", default=os.path.join(os.path.dirname(__file__), "..", "target", "release", "dxfs"))
    a = ap.parse_args()
    dxfs = os.path.abspath(a.dxfs_bin)
    work = tempfile.mkdtemp(dir="/dev/shm", prefix="dxfs-copy-in-")
    try:
        src = os.path.join(work, "src")
        total = build(src, a.files, a.dirs, a.min_kib, a.max_kib)
        want = ((a.files // a.dirs) * a.dirs, total)
        tar = os.path.join(work, "src.tar")
        subprocess.run(["tar", "-cf", tar, "-C", work, "src"], check=True)
        results = {(j[0], j[1]): [] for j in JOBS}
        for r in range(a.runs):
            for j in JOBS:
                results[j[0], j[1]].append(one(j, a, dxfs, src, tar, want))
            print(f"run {r + 1}/{a.runs} done", file=sys.stderr)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    cpu = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), "?")
    print(f"{time.strftime('%Y-%m-%d')}, {platform.release()}, {os.cpu_count()} vCPUs ({cpu}); "
          f"{want[0]:,} files of {a.min_kib}-{a.max_kib} KiB ({want[1] / 2**20:.0f} MiB) in {a.dirs} directories; "
          f"dxfs transport {a.transport}; "
          f"{'storage: nbdkit, %g ms a request; ' % a.delay_ms if a.delay_ms is not None else ''}"
          f"copy + sync, median of {a.runs} runs; seconds (× ext4's)\n")
    print("| command | filesystem | seconds | × ext4 | dxfs requests (first run) |")
    print("|---|---|---|---|---|")
    for label, fs, _ in JOBS:
        med = statistics.median(s for s, _ in results[label, fs])
        base = statistics.median(s for s, _ in results[BASE[label], "ext4"])
        reqs = results[label, fs][0][1]
        text = ", ".join(f"{k} {n}" for k, n in sorted(reqs.items(), key=lambda kv: -kv[1])[:6]) or "—"
        ratio = "" if fs == "ext4" else f"{med / base:.2f}×"
        print(f"| `{label}` | {fs} | {med:.2f} | {ratio} | {text} |")


if __name__ == "__main__":
    sys.exit(main())
