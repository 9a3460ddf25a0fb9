#!/usr/bin/env python3
"""Processes side by side through one mount: operations per second with 1..P processes.

    python3 bench/scaling.py [--files 5000] [--procs 1,2] [--shared] [--runs 2]
                             [-o OPTS] [--dxfs-bin target/release/dxfs] [--ext4]

Each process creates FILES empty files in a directory of its own (or, with --shared, all
in one directory), stats them and unlinks them; the table gives the aggregate operations
per second of each phase and the speed-up over one process. The volume is a fresh 1 GiB
image in /dev/shm mounted with OPTS (e.g. `transport=uring`, `transport=classic`);
--ext4 measures kernel ext4 on a loop device instead. Needs root. Asserts nothing.
"""
import argparse, multiprocessing as mp, os, subprocess, sys, tempfile, time


def worker(d, files, barrier, out):
    names = [os.path.join(d, f"f{os.getpid()}-{i}") for i in range(files)]
    res = []
    barrier.wait()
    for phase in ("create", "stat", "unlink"):
        t = time.perf_counter()
        for p in names:
            if phase == "create":
                os.close(os.open(p, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644))
            elif phase == "stat":
                os.stat(p)
            else:
                os.unlink(p)
        res.append(time.perf_counter() - t)
        barrier.wait()
    out.put(res)


def run(mnt, procs, files, shared):
    barrier = mp.Barrier(procs)
    out = mp.Queue()
    ps = []
    for k in range(procs):
        d = os.path.join(mnt, "shared" if shared else f"p{k}")
        os.makedirs(d, exist_ok=True)
        ps.append(mp.Process(target=worker, args=(d, files, barrier, out)))
    for p in ps:
        p.start()
    times = [out.get() for _ in ps]
    for p in ps:
        p.join()
    # Aggregate rate of each phase: all operations over the slowest process's time.
    return [procs * files / max(t[i] for t in times) for i in range(3)]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--files", type=int, default=5000)
    ap.add_argument("--procs", default="1,2")
    ap.add_argument("--runs", type=int, default=2)
    ap.add_argument("--shared", action="store_true")
    ap.add_argument("--ext4", action="store_true")
    ap.add_argument("-o", dest="opts", default="")
    ap.add_argument("--dxfs-bin", default=os.path.join(os.path.dirname(__file__), "..", "target", "release", "dxfs"))
    a = ap.parse_args()
    tmp = tempfile.mkdtemp(dir="/dev/shm", prefix="dxfs-scale-")
    img, mnt = os.path.join(tmp, "img"), os.path.join(tmp, "mnt")
    os.mkdir(mnt)
    dev = None
    if a.ext4:
        with open(img, "wb") as f:
            f.truncate(1 << 30)
        dev = subprocess.run(["losetup", "--find", "--show", img], check=True, capture_output=True, text=True).stdout.strip()
        subprocess.run(["mkfs.ext4", "-F", "-q", dev], check=True)
        subprocess.run(["mount", dev, mnt], check=True)
        daemon = None
    else:
        dxfs = os.path.abspath(a.dxfs_bin)
        subprocess.run([dxfs, "mkfs", "--size", "1G", img], check=True, capture_output=True)
        daemon = subprocess.Popen([dxfs, "mount", img, mnt] + (["-o", a.opts] if a.opts else []),
                                  stderr=subprocess.DEVNULL)
        while not os.path.ismount(mnt):
            time.sleep(0.01)
    try:
        print(f"| processes | create/s | stat/s | unlink/s | speed-up (create, unlink) |   "
              f"({'ext4' if a.ext4 else 'dxfs -o ' + (a.opts or 'defaults')}, "
              f"{'one shared directory' if a.shared else 'private directories'}, {a.files} files each)")
        print("|---|---|---|---|---|")
        base = None
        for procs in [int(x) for x in a.procs.split(",")]:
            rates = [run(mnt, procs, a.files, a.shared) for _ in range(a.runs)]
            best = [max(r[i] for r in rates) for i in range(3)]
            base = base or best
            print(f"| {procs} | {best[0]:,.0f} | {best[1]:,.0f} | {best[2]:,.0f} | "
                  f"{best[0] / base[0]:.2f}×, {best[2] / base[2]:.2f}× |")
    finally:
        subprocess.run(["umount", mnt], capture_output=True)
        if daemon:
            daemon.wait(timeout=60)
        if dev:
            subprocess.run(["losetup", "-d", dev], capture_output=True)
        os.unlink(img)
        os.rmdir(mnt)
        os.rmdir(tmp)


if __name__ == "__main__":
    sys.exit(main())
