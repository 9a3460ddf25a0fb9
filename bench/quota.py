#!/usr/bin/env python3
"""dd into a directory under a quota until it fails: dxfs's directory quota beside
kernel btrfs's qgroup limit on a subvolume (and XFS and ext4 project quotas, where the
kernel has CONFIG_QUOTA and XFS quota support), each on a 2 GiB loop device over
/dev/shm.

    python3 bench/quota.py [--targets btrfs,dxfs,xfs,ext4] [--limits 64M,1G,none]
        [--bs 1M,4k] [--runs N]

For each target, limit and block size a fresh volume is made, a directory `q` gets the
limit (btrfs: `quota enable`, `q` a subvolume, `qgroup limit`; XFS: `xfs_quota
project` + `limit -p bhard`; ext4: `-O quota,project`, `chattr +P -p`, `setquota -P`;
dxfs: `dxfs quota`), and `dd if=/dev/zero of=q/f bs=BS`
runs until write() fails (with limit `none`: 512 MiB). Printed: the bytes write()
accepted and their share of the limit, the time and rate, the time of an fsync after it
(whether what write() accepted lands), dd's error, and what `df q` says the size is.
Needs root and a release build (target/release/dxfs). Unmounts and detaches what it made.
"""
import argparse, os, subprocess, sys, time

DXFS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "target", "release", "dxfs")
TMP = "/dev/shm/dxfs-quota-bench"


def size(s):
    units = {"k": 1 << 10, "m": 1 << 20, "g": 1 << 30}
    return int(s[:-1]) * units[s[-1].lower()] if s[-1].lower() in units else int(s)


def run(cmd, **kw):
    return subprocess.run(cmd, check=True, capture_output=True, text=True, **kw)


def one(target, limit, bs):
    os.makedirs(TMP + "/mnt", exist_ok=True)
    img, mnt = TMP + "/img", TMP + "/mnt"
    with open(img, "wb") as f:
        f.truncate(2 << 30)
    dev = run(["losetup", "--find", "--show", img]).stdout.strip()
    daemon = None
    try:
        q = mnt + "/q"
        if target == "btrfs":
            run(["mkfs.btrfs", "-f", "-q", dev])
            run(["mount", dev, mnt])
            run(["btrfs", "subvolume", "create", q])
            if limit:
                run(["btrfs", "quota", "enable", mnt])
                run(["btrfs", "qgroup", "limit", str(limit), q])
        elif target == "xfs":
            run(["mkfs.xfs", "-f", "-q", dev])
            run(["mount", "-o", "prjquota", dev, mnt])
            os.mkdir(q)
            if limit:
                run(["xfs_quota", "-x", "-c", f"project -s -p {q} 42", mnt])
                run(["xfs_quota", "-x", "-c", f"limit -p bhard={limit} 42", mnt])
        elif target == "ext4":
            run(["mkfs.ext4", "-F", "-q", "-O", "quota,project", dev])
            run(["mount", "-o", "prjquota", dev, mnt])
            os.mkdir(q)
            if limit:
                run(["chattr", "+P", "-p", "42", q])
                run(["setquota", "-P", "42", "0", str(limit // 1024), "0", "0", mnt])
        else:
            run([DXFS, "mkfs", "-f", dev])
            daemon = subprocess.Popen([DXFS, "mount", dev, mnt])
            for _ in range(500):
                if os.path.ismount(mnt):
                    break
                time.sleep(0.01)
            os.mkdir(q)
            if limit:
                run([DXFS, "quota", q, str(limit)])
        st = os.statvfs(q)
        df = st.f_blocks * st.f_frsize
        dd = ["dd", "if=/dev/zero", f"of={q}/f", f"bs={bs}"]
        if not limit:
            dd.append(f"count={(512 << 20) // size(bs)}")
        t = time.time()
        r = subprocess.run(dd, capture_output=True, text=True)
        el = time.time() - t
        got = os.path.getsize(f"{q}/f")
        t2 = time.time()
        fd = os.open(f"{q}/f", os.O_RDONLY)
        try:
            os.fsync(fd)
            synced = "ok"
        except OSError as e:
            synced = e.strerror
        os.close(fd)
        fs_el = time.time() - t2
        err = next((l.split(": ", 2)[-1] for l in r.stderr.splitlines() if "error" in l or "exceeded" in l), "-")
        return got, el, fs_el, synced, err, df
    finally:
        subprocess.run(["umount", mnt], capture_output=True)
        if daemon:
            daemon.wait(timeout=30)
        subprocess.run(["losetup", "-d", dev], capture_output=True)
        os.unlink(img)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--targets", default="btrfs,dxfs")
    ap.add_argument("--limits", default="64M,1G,none")
    ap.add_argument("--bs", default="1M,4k")
    ap.add_argument("--runs", type=int, default=1)
    a = ap.parse_args()
    print(f"{'target':6} {'limit':>6} {'bs':>4} {'accepted':>12} {'of limit':>8} {'s':>7} {'MiB/s':>7} "
          f"{'fsync s':>7} {'fsync':>6} {'df q (MiB)':>10}  dd's error")
    for _ in range(a.runs):
        for limit_s in a.limits.split(","):
            limit = 0 if limit_s == "none" else size(limit_s)
            for bs in a.bs.split(","):
                for target in a.targets.split(","):
                    got, el, fs_el, synced, err, df = one(target, limit, bs)
                    share = f"{100 * got / limit:.1f}%" if limit else "-"
                    print(f"{target:6} {limit_s:>6} {bs:>4} {got:>12} {share:>8} {el:7.3f} {got / el / 2**20:7.0f} "
                          f"{fs_el:7.3f} {synced:>6} {df / 2**20:10.0f}  {err}", flush=True)


if __name__ == "__main__":
    sys.exit(main())
