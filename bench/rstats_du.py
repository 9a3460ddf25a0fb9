#!/usr/bin/env python3
"""`du -s` of a large tree: kernel ext4's `du -s` against `dxfs du -s` on a dxfs mount,
which reads the directory's recursive statistics (three GETXATTRs) instead of walking.

    sudo python3 bench/rstats_du.py [--files 1000000] [--dirs 1000] [--runs 5]
                                    [--dxfs-bin target/release/dxfs]

Each filesystem gets one fresh volume on a loop device over a sparse file in /dev/shm and
one tree of empty files spread over --dirs directories. Then, warm (right after the build)
and cold (unmounted, caches dropped, mounted again), the median over --runs of: the
command's wall time (a process start included), and for dxfs the three counter reads
alone, timed inside this process (`os.getxattr`). Prints the sizes each printed, which
must agree. A benchmark, not a test.
"""
import argparse, os, platform, statistics, subprocess, sys, time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from loopvol import LoopVolume  # noqa: E402


def build(root, files, dirs):
    os.mkdir(root)
    per = files // dirs
    for d in range(dirs):
        p = os.path.join(root, f"d{d:04}")
        os.mkdir(p)
        for f in range(per):
            os.close(os.open(os.path.join(p, f"f{f:06}"), os.O_CREAT | os.O_WRONLY, 0o644))


def timed(cmd):
    start = time.perf_counter()
    p = subprocess.run(cmd, check=True, capture_output=True, text=True)
    return time.perf_counter() - start, p.stdout.split()[0]


def counters(root):
    start = time.perf_counter()
    for n in ("rallocated", "rbytes", "rhardlinks"):
        os.getxattr(root, f"dxfs.dir.{n}")
    return time.perf_counter() - start


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--files", type=int, default=1_000_000)
    ap.add_argument("--dirs", type=int, default=1000)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--dxfs-bin", default=os.path.join(os.path.dirname(__file__), "..", "target", "release", "dxfs"))
    a = ap.parse_args()
    dxfs = os.path.abspath(a.dxfs_bin)
    # ext4 makes an inode per 16 KiB: room for every file.
    size = max(2, a.files * 20_000 // (1 << 30) + 2)
    rows = []
    for fs, cmd in (("ext4", ["du", "-s"]), ("dxfs", [dxfs, "du", "-s"])):
        with LoopVolume(fs, size, dxfs, "auto", fsck=True) as v:
            root = os.path.join(v.mnt, "tree")
            t = time.perf_counter()
            build(root, a.files, a.dirs)
            os.sync()
            if fs == "dxfs":
                subprocess.run([dxfs, "sync", v.mnt], check=True)
            built = time.perf_counter() - t
            for state in ("warm", "cold"):
                secs, reads, printed = [], [], None
                for _ in range(a.runs):
                    if state == "cold":
                        v.remount()
                    s, printed = timed(cmd + [root])
                    secs.append(s)
                    if fs == "dxfs":
                        if state == "cold":
                            v.remount()
                        reads.append(counters(root))
                rows.append((fs, state, statistics.median(secs), statistics.median(reads) if reads else None, printed, built))
        code, text = v.fsck_result
        if code != 0:
            print(f"fsck of the {fs} volume: exit {code}\n{text}", file=sys.stderr)
    cpu = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), "?")
    print(f"{time.strftime('%Y-%m-%d')}, {platform.release()}, {os.cpu_count()} vCPUs ({cpu}); "
          f"{a.files:,} empty files in {a.dirs} directories; median of {a.runs} runs\n")
    print("| filesystem | state | `du -s` command (ms) | × ext4 | the counter reads alone (ms) | printed (KiB) | tree built in (s) |")
    print("|---|---|---|---|---|---|---|")
    base = {r[1]: r[2] for r in rows if r[0] == "ext4"}
    for fs, state, s, reads, printed, built in rows:
        rd = f"{reads * 1e3:.3f}" if reads is not None else "–"
        print(f"| {fs} | {state} | {s * 1e3:.2f} | {s / base[state]:.4f} | {rd} | {printed} | {built:.0f} |")


if __name__ == "__main__":
    sys.exit(main())
