#!/usr/bin/env python3
"""Negative getxattr through the dxfs FUSE mount, xattr-name filter on and off (seed 001).

Run as root:

    python3 bench/xattr_mount.py [--dxfs-bin BIN] [--files N] [--workdir DIR] [--repeat R]
                                 [--mount-opts OPTS] [--cpu C]

For each mode (filter on; `-o noxattrfilter`) it makes a fresh 2 GiB image
(`dxfs mkfs -f IMAGE --size 2G`), mounts it (`dxfs mount IMAGE DIR`, foreground), builds the
population of examples/xattr_bench.rs through the mount (N files in directories of 1000;
10% with a POSIX access ACL naming a user, 5% with a 200-byte `user.comment`, whose list
lives in an xattr block, the rest none) and unmounts. Then, --repeat times, alternating the
modes: drop the kernel caches, mount, time `os.getxattr(path, "security.selinux")` (ENODATA
for every file) over all files cold, then warm (best of 3 passes), then over just the files
with a block-resident list warm; unmount, drop caches, mount again and time those files
cold. Prints the minimum and median µs per getxattr and the daemon's CPU time per getxattr
(summed per-thread run time from /proc/PID/task/*/schedstat) per phase.

"Cold" means a fresh daemon (empty metadata cache) and fresh kernel dentries and inodes, so
a cold getxattr by path also pays a FUSE LOOKUP per file; warm passes may too, once the
entry timeout (1 s by default; see --mount-opts) has expired. On a VM with idle vCPUs each
request's wake-up of the daemon on another CPU (and of the caller on the way back) costs
several µs; --cpu pins both to one CPU to take that out.

Only the daemons this script started are stopped, by pid, in a finally block.
"""

import argparse
import errno
import os
import struct
import subprocess
import sys
import time
from statistics import median

FILES_PER_DIR = 1000
PROBE = "security.selinux"
WARM_ROUNDS = 3
MODES = (("on", ""), ("off", "noxattrfilter"))
PHASES = ("cold, all files", "warm, all files", "cold, block-list files", "warm, block-list files")
CLK_TCK = os.sysconf("SC_CLK_TCK")


def kind_of(i):
    """Same population as examples/xattr_bench.rs (disjoint: 10% ACL, 5% comment)."""
    if i % 10 == 3:
        return "acl"
    if i % 20 == 7:
        return "comment"
    return "plain"


def acl_value():
    """Linux's xattr encoding of owner rw, user 1000 rw, group r, mask rw, other r:
    version 2, then (tag u16, perm u16, id u32) little-endian; unnamed entries carry
    ACL_UNDEFINED_ID."""
    undef = 0xFFFFFFFF
    entries = [(0x01, 6, undef), (0x02, 6, 1000), (0x04, 4, undef), (0x10, 6, undef), (0x20, 4, undef)]
    return struct.pack("<I", 2) + b"".join(struct.pack("<HHI", t, p, i) for t, p, i in entries)


def comment_value(i):
    v = bytearray(f"file {i}: reviewed, keep until the next audit; ".encode())
    filler = b"lorem ipsum dolor sit amet consectetur adipiscing elit "
    while len(v) < 200:
        v.append(filler[len(v) % len(filler)])
    return bytes(v)


def mounted(mnt):
    with open("/proc/self/mounts") as f:
        return any(line.split()[1] == mnt for line in f)


def cpu_seconds(pid):
    """CPU time of a process so far, in seconds: the sum of its threads' schedstat run
    times (ns resolution), else utime + stime from /proc/PID/stat (clock ticks)."""
    try:
        total = 0
        for tid in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{tid}/schedstat") as f:
                total += int(f.read().split()[0])
        return total / 1e9
    except (OSError, ValueError, IndexError):
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / CLK_TCK


class Daemon:
    """One `dxfs mount` in the foreground."""

    def __init__(self, binary, image, mnt, opts, log_path):
        self.mnt = mnt
        cmd = [binary, "mount", image, mnt] + (["-o", opts] if opts else [])
        self.log_path = log_path
        with open(log_path, "ab") as log:
            self.proc = subprocess.Popen(
                cmd, stdin=subprocess.DEVNULL, stdout=log, stderr=log, start_new_session=True
            )
        deadline = time.monotonic() + 30
        while not mounted(mnt):
            if self.proc.poll() is not None:
                raise RuntimeError(f"{' '.join(cmd)} exited {self.proc.returncode}: see {log_path}")
            if time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"{' '.join(cmd)}: not mounted after 30 s")
            time.sleep(0.02)

    def cpu(self):
        return cpu_seconds(self.proc.pid)

    def stop(self):
        """Unmount and wait for this daemon to exit; signal it (by pid) only if it will not."""
        if self.proc.poll() is not None:
            return
        if mounted(self.mnt):
            subprocess.run(["fusermount3", "-u", self.mnt], check=False)
        try:
            self.proc.wait(timeout=120)
            return
        except subprocess.TimeoutExpired:
            pass
        self.proc.terminate()
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        if mounted(self.mnt):
            subprocess.run(["fusermount3", "-u", "-z", self.mnt], check=False)


def drop_caches():
    os.sync()
    with open("/proc/sys/vm/drop_caches", "w") as f:
        f.write("3\n")


def build(mnt, n):
    acl = acl_value()
    paths, block_paths = [], []
    for i in range(n):
        if i % FILES_PER_DIR == 0:
            d = os.path.join(mnt, f"d{i // FILES_PER_DIR:04}")
            os.mkdir(d, 0o755)
        p = os.path.join(d, f"f{i:07}")
        os.close(os.open(p, os.O_CREAT | os.O_WRONLY | os.O_EXCL, 0o644))
        k = kind_of(i)
        if k == "acl":
            os.setxattr(p, "system.posix_acl_access", acl)
        elif k == "comment":
            os.setxattr(p, "user.comment", comment_value(i))
            block_paths.append(p)
        paths.append(p)
    return paths, block_paths


def check(paths, block_paths):
    """The xattrs really are there (first of each kind)."""
    first_acl = next(p for i, p in enumerate(paths) if kind_of(i) == "acl")
    assert os.getxattr(first_acl, "system.posix_acl_access") == acl_value(), "ACL lost"
    assert len(os.getxattr(block_paths[0], "user.comment")) == 200, "comment lost"


def getxattr_round(daemon, paths):
    """Seconds, daemon CPU seconds, and ENODATA count of one pass."""
    c0 = daemon.cpu()
    nodata = 0
    getx = os.getxattr
    t = time.perf_counter()
    for p in paths:
        try:
            getx(p, PROBE)
        except OSError as e:
            if e.errno != errno.ENODATA:
                raise
            nodata += 1
    secs = time.perf_counter() - t
    return secs, daemon.cpu() - c0, nodata


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--dxfs-bin", default="/work/main/target/release/dxfs")
    ap.add_argument("--files", type=int, default=100_000)
    ap.add_argument("--workdir", default="/dev/shm/xattrbench")
    ap.add_argument("--repeat", type=int, default=3, help="measurement cycles per mode (alternating modes)")
    ap.add_argument(
        "--cpu",
        type=int,
        default=None,
        help="pin this script and the daemons it starts to one CPU (no cross-CPU wake-ups per request)",
    )
    ap.add_argument(
        "--mount-opts", default="", help="extra -o options for every mount, e.g. entry_timeout=600,attr_timeout=600"
    )
    a = ap.parse_args()
    if os.geteuid() != 0:
        sys.exit("run as root (mounts, drop_caches)")
    if a.cpu is not None:
        os.sched_setaffinity(0, {a.cpu})  # inherited by the daemons
    os.makedirs(a.workdir, exist_ok=True)
    mnt = os.path.join(a.workdir, "mnt")
    log = os.path.join(a.workdir, "daemon.log")
    os.makedirs(mnt, exist_ok=True)
    if mounted(mnt):
        sys.exit(f"{mnt} is already a mount point")

    print(
        f"dxfs xattr mount benchmark: {a.files} files in directories of {FILES_PER_DIR}, "
        f"images {a.workdir}/xattr-{{on,off}}.img (2 GiB), getxattr {PROBE!r}, {os.cpu_count()} CPUs, "
        f"extra mount options {a.mount_opts or '-'}, "
        f"{'pinned to CPU ' + str(a.cpu) if a.cpu is not None else 'not pinned'}"
    )
    images = {mode: os.path.join(a.workdir, f"xattr-{mode}.img") for mode, _ in MODES}
    opts = {mode: ",".join(x for x in (switch, a.mount_opts) if x) for mode, switch in MODES}
    results = {}  # (mode, phase) -> [(µs/op, daemon CPU s, ops)], one per repetition
    daemons = []

    def mount(mode):
        d = Daemon(a.dxfs_bin, images[mode], mnt, opts[mode], log)
        daemons.append(d)
        return d

    def phase(mode, name, d, ps, rounds=1):
        secs, cpu, nodata = min((getxattr_round(d, ps) for _ in range(rounds)), key=lambda r: r[0])
        assert nodata == len(ps), f"{len(ps) - nodata} getxattrs did not answer ENODATA"
        results.setdefault((mode, name), []).append((secs * 1e6 / len(ps), cpu, len(ps)))

    try:
        # Both images first (a fresh volume each), then the measurements alternate between
        # the modes, so that drift on a shared machine hits both alike.
        for mode, _ in MODES:
            if os.path.exists(images[mode]):
                os.unlink(images[mode])
            subprocess.run(
                [a.dxfs_bin, "mkfs", "-f", images[mode], "--size", "2G"], check=True, stdout=subprocess.DEVNULL
            )
            d = mount(mode)
            t = time.perf_counter()
            paths, block_paths = build(mnt, a.files)
            print(
                f"filter {mode}: built {len(paths)} files ({sum(kind_of(i) == 'acl' for i in range(a.files))} ACLs, "
                f"{len(block_paths)} block-resident lists) in {time.perf_counter() - t:.1f} s"
            )
            d.stop()
        for rep in range(a.repeat):
            for mode, _ in MODES:
                drop_caches()
                d = mount(mode)
                phase(mode, "cold, all files", d, paths)
                phase(mode, "warm, all files", d, paths, WARM_ROUNDS)
                phase(mode, "warm, block-list files", d, block_paths, WARM_ROUNDS)
                d.stop()
                drop_caches()
                d = mount(mode)
                phase(mode, "cold, block-list files", d, block_paths)
                if rep == 0:
                    check(paths, block_paths)
                d.stop()
    finally:
        for d in daemons:
            d.stop()
        for img in images.values():
            if os.path.exists(img):
                os.unlink(img)

    print()
    print(f"{a.repeat} repetitions; warm phases take the best of {WARM_ROUNDS} passes within each. On a shared")
    print("machine the minimum over repetitions is the least disturbed figure; the median is shown too.")
    print()
    print(
        "| filter | phase | getxattrs | µs/op min | µs/op median | µs/op (all runs) | daemon CPU µs/op min | median |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for name in PHASES:
        for mode, _ in MODES:
            runs = results[(mode, name)]
            us = sorted(r[0] for r in runs)
            cpu = sorted(r[1] * 1e6 / r[2] for r in runs)
            print(
                f"| {mode} | {name} | {runs[0][2]} | {us[0]:.2f} | {median(us):.2f} | "
                f"{' '.join(f'{u:.2f}' for u in us)} | {cpu[0]:.2f} | {median(cpu):.2f} |"
            )


if __name__ == "__main__":
    main()
