#!/usr/bin/env python3
"""What each common operation costs in FUSE requests, from a live mount's counters.

    python3 bench/requests.py [--n 500] [--dxfs-bin target/release/dxfs] [-o OPTS]

Makes a volume in /dev/shm, mounts it, runs each operation N times, and reads the
per-opcode counters (`dxfs stats --json`) before and after: requests per operation by
opcode, and microseconds per operation. Needs root. Prints a Markdown table.
"""
import argparse, json, os, subprocess, sys, tempfile, time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import metaops  # noqa: E402

def stats(dxfs, mnt):
    out = subprocess.run([dxfs, "stats", "--json", mnt], check=True, capture_output=True).stdout
    return {k: v["count"] for k, v in json.loads(out)["ops"].items()}

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

        ops = metaops.make_ops(d, names)
        print(f"| operation ({n} each, -o {a.opts or 'defaults'}) | requests per operation | µs per operation |")
        print("|---|---|---|")
        for name, fn, setup, teardown, n in ops:
            if setup:
                setup()
            before = stats(dxfs, mnt)
            t = time.perf_counter()
            fn()
            us = (time.perf_counter() - t) * 1e6 / n
            after = stats(dxfs, mnt)
            if teardown:
                teardown()
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
