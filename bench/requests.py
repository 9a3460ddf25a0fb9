#!/usr/bin/env python3
"""What each common operation costs in FUSE requests, from a live mount's counters.

    python3 bench/requests.py [--n 500] [--dxfs-bin target/release/dxfs] [-o OPTS]

Makes a volume in /dev/shm, mounts it, runs each operation N times, and reads the
per-opcode counters (`dxfs stats --json`) before and after: requests per operation by
opcode, and microseconds per operation. Needs root. Prints a Markdown table.
"""
import argparse, json, os, subprocess, sys, tempfile, time

def stats(dxfs, mnt):
    out = subprocess.run([dxfs, "stats", "--json", mnt], check=True, capture_output=True).stdout
    return {k: v["count"] for k, v in json.loads(out)["ops"].items()}

def drop_caches():
    with open("/proc/sys/vm/drop_caches", "w") as f:
        f.write("2\n")

def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, default=500)
    ap.add_argument("--dxfs-bin", default=os.path.join(os.path.dirname(__file__), "..", "target", "release", "dxfs"))
    ap.add_argument("-o", dest="opts", default="")
    a = ap.parse_args()
    dxfs, n = os.path.abspath(a.dxfs_bin), a.n
    tmp = tempfile.mkdtemp(dir="/dev/shm", prefix="dxfs-req-")
    img, mnt = os.path.join(tmp, "img"), os.path.join(tmp, "mnt")
    os.mkdir(mnt)
    subprocess.run([dxfs, "mkfs", "--size", "1G", img], check=True, capture_output=True)
    args = [dxfs, "mount", img, mnt] + (["-o", a.opts] if a.opts else [])
    daemon = subprocess.Popen(args, stderr=subprocess.DEVNULL)
    try:
        for _ in range(500):
            if os.path.ismount(mnt):
                break
            time.sleep(0.01)
        d = os.path.join(mnt, "d")
        os.mkdir(d)
        names = [os.path.join(d, f"f{i:06}") for i in range(n)]

        def create():
            for p in names:
                os.close(os.open(p, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644))
        def open_close():
            for p in names:
                os.close(os.open(p, os.O_RDONLY))
        def stat_warm():
            for p in names:
                os.stat(p)
        def stat_cold():
            drop_caches()
            for p in names:
                os.stat(p)
        def chmod():
            for p in names:
                os.chmod(p, 0o600)
        def setxattr():
            for p in names:
                os.setxattr(p, "user.foo", b"bar")
        def getxattr_missing():
            for p in names:
                try:
                    os.getxattr(p, "user.missing")
                except OSError:
                    pass
        def ls_l():
            drop_caches()
            for e in os.scandir(d):
                e.stat(follow_symlinks=False)
        def rename():
            for p in names:
                os.rename(p, p + ".r")
        def unlink():
            for p in names:
                os.unlink(p + ".r")
        def mkdir():
            for p in names:
                os.mkdir(p)
        def rmdir():
            for p in names:
                os.rmdir(p)
        ops = [("create (O_CREAT|O_EXCL + close)", create), ("open + close", open_close),
               ("stat, warm", stat_warm), ("stat, cold (dentries dropped)", stat_cold),
               ("chmod", chmod), ("setxattr user.foo", setxattr),
               ("getxattr of a missing name", getxattr_missing), ("ls -l, cold (per entry)", ls_l),
               ("rename", rename), ("unlink", unlink), ("mkdir", mkdir), ("rmdir", rmdir)]
        print(f"| operation ({n} each, -o {a.opts or 'defaults'}) | requests per operation | µs per operation |")
        print("|---|---|---|")
        for name, fn in ops:
            before = stats(dxfs, mnt)
            t = time.perf_counter()
            fn()
            us = (time.perf_counter() - t) * 1e6 / n
            after = stats(dxfs, mnt)
            delta = {k: after.get(k, 0) - before.get(k, 0) for k in after}
            # The stats reads themselves cost one GETXATTR each on the root.
            delta["GETXATTR"] = delta.get("GETXATTR", 0) - 1
            parts = [f"{k} {v / n:.2f}" for k, v in sorted(delta.items(), key=lambda kv: -kv[1]) if v > 0]
            total = sum(v for v in delta.values() if v > 0) / n
            print(f"| {name} | {total:.2f}: {', '.join(parts) or 'none'} | {us:.1f} |")
    finally:
        subprocess.run(["fusermount3", "-u", mnt], capture_output=True)
        daemon.wait(timeout=30)
        os.unlink(img)
        os.rmdir(mnt)
        os.rmdir(tmp)

if __name__ == "__main__":
    sys.exit(main())
