#!/usr/bin/env python3
"""Removing a tree: `rm -rf` on kernel ext4 against `dxfs rm -r` (and `rm -rf`) on a dxfs
mount, each on a fresh volume on a loop device over a sparse file in /dev/shm.

    python3 bench/rm_tree.py [--files 100000] [--dirs 100] [--runs 3] [--bytes 16]
                             [--dxfs-bin target/release/dxfs] [--transport auto]

Each run builds the tree (files of --bytes bytes, spread over --dirs directories), then
removes it warm (right after building: the kernel holds every dentry, so dxfs must tell
it to drop each name) and, on a second tree, cold (unmounted, caches dropped, mounted
again). Prints seconds (median over the runs), the ratio to ext4, and for dxfs the FUSE
requests the removal took. Every volume is checked afterwards (e2fsck -fn, dxfs fsck -n).
Needs root. A benchmark, not a test: it asserts nothing.
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


def remove(v, how, root, dxfs):
    before = counts(v)
    start = time.perf_counter()
    cmd = [dxfs, "rm", "-r", root] if how == "dxfs rm -r" else ["rm", "-rf", root]
    subprocess.run(cmd, check=True)
    secs = time.perf_counter() - start
    after = counts(v)
    reqs = {k: after[k] - before.get(k, 0) for k in after if after[k] - before.get(k, 0) > 0}
    reqs.pop("GETXATTR", None)  # the stats reads themselves
    assert not os.path.exists(root), f"{root} still there after {how}"
    return secs, reqs


def one_run(target, a, dxfs):
    """{(how, warm|cold): (seconds, requests)} for one fresh volume."""
    fs, how = ("ext4", "rm -rf") if target == "ext4" else ("dxfs", target.removeprefix("dxfs: "))
    out = {}
    size = max(2, a.files * (4096 + 512) // (1 << 30) + 2)
    with LoopVolume(fs, size, dxfs, a.transport, fsck=True) as v:
        for state in ("warm", "cold"):
            root = os.path.join(v.mnt, f"tree-{state}")
            build(root, a.files, a.dirs, a.bytes)
            os.sync()
            if fs == "dxfs":
                subprocess.run([dxfs, "sync", v.mnt], check=True)
            if state == "cold":
                v.remount()
            out[state] = remove(v, how, root, dxfs)
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
    ap.add_argument("--dxfs-bin", default=os.path.join(os.path.dirname(__file__), "..", "target", "release", "dxfs"))
    a = ap.parse_args()
    dxfs = os.path.abspath(a.dxfs_bin)
    targets = ["ext4", "dxfs: dxfs rm -r", "dxfs: rm -rf"]
    results = {t: [] for t in targets}
    for r in range(a.runs):
        for t in targets:
            results[t].append(one_run(t, a, dxfs))
            print(f"run {r + 1}/{a.runs}: {t} done", file=sys.stderr)
    cpu = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), "?")
    print(f"{time.strftime('%Y-%m-%d')}, {platform.release()}, {os.cpu_count()} vCPUs ({cpu}); "
          f"{a.files:,} files of {a.bytes} B in {a.dirs} directories; dxfs transport {a.transport}; "
          f"median of {a.runs} runs; seconds (× ext4's rm -rf)\n")
    print("| removal | warm | cold | dxfs requests (cold) |")
    print("|---|---|---|---|")
    for t in targets:
        cells = []
        for state in ("warm", "cold"):
            med = statistics.median(run[state][0] for run in results[t])
            base = statistics.median(run[state][0] for run in results["ext4"])
            cells.append(f"{med:.3f} ({med / base:.2f}×)" if t != "ext4" else f"{med:.3f}")
        reqs = results[t][0]["cold"][1]
        text = ", ".join(f"{k} {n}" for k, n in sorted(reqs.items(), key=lambda kv: -kv[1])) or "—"
        print(f"| {t} | {cells[0]} | {cells[1]} | {text} |")


if __name__ == "__main__":
    sys.exit(main())
