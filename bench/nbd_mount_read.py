#!/usr/bin/env python3
"""Cold sequential read of one file through dxfs mounts on NBD: binaries and mount options
side by side, run by run interleaved, with the CPU it cost.

For each per-request delay this serves a sparse image with `nbdkit file` (behind the delay
filter above 0 ms) on a Unix socket, writes one file of S MiB of random data through a
mount, then for RUNS rounds mounts each case in turn and times `dd if=FILE of=/dev/null
bs=1M` on a fresh mount (cold: the mount's page cache is new). A case is
`BINARY|MOUNT_OPTIONS|URI_QUERY` (the last two may be empty). Each line gives the MiB/s of
every run, the median, and the median CPU milliseconds per GiB of the daemon, nbdkit and dd
together (`/proc/PID/stat` and the children's rusage), then the daemon's and dd's. With
`--nbdcopy`, `nbdcopy --no-extents` of the whole export to null, the same way.

    sudo python3 bench/nbd_mount_read.py --delays 0,1,5 --seq-mib 1024 --runs 5 --nbdcopy \\
        --cases "target/release/dxfs||;target/release/dxfs|threads=1|"
"""

import argparse
import importlib.util
import os
import resource
import statistics
import subprocess
import sys
import time

spec = importlib.util.spec_from_file_location("nbdbench", os.path.join(os.path.dirname(__file__), "nbd.py"))
nb = importlib.util.module_from_spec(spec)
spec.loader.exec_module(nb)


def cpu_ms(pid):
    """User + system CPU of a process (its threads, living and ended), in ms."""
    f = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return (int(f[11]) + int(f[12])) * 1000 // os.sysconf("SC_CLK_TCK")


def children_ms():
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return (r.ru_utime + r.ru_stime) * 1000


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--delays", default="0,1,5", help="per-request delays in ms, comma-separated")
    p.add_argument("--seq-mib", type=int, default=1024)
    p.add_argument("--cases", required=True, help="';'-separated BINARY|MOUNT_OPTIONS|URI_QUERY")
    p.add_argument("--runs", type=int, default=5)
    p.add_argument("--nbdcopy", action="store_true")
    p.add_argument("--dir", default="/dev/shm", help="where the image lives")
    a = p.parse_args()
    cases = [(c.split("|") + ["", ""])[:3] for c in a.cases.split(";")]
    a.only, a.entries, a.dxfs = "seq", 0, cases[0][0]
    b = nb.Bench(a)
    try:
        for d in [int(x) for x in a.delays.split(",")]:
            size = (a.seq_mib * 5 // 4 + 512) << 20
            if os.path.exists(b.img):
                os.unlink(b.img)
            with open(b.img, "wb") as f:
                f.truncate(size)
            b.start_server(d)
            nb.run([a.dxfs, "mkfs", "-f", b.uri()], stdout=subprocess.DEVNULL)
            big = os.path.join(b.mnt, "big")
            b.mount()
            nb.run(["dd", "if=/dev/urandom", f"of={big}", "bs=1M", f"count={a.seq_mib}", "conv=fsync", "status=none"])
            b.unmount()
            rate = {i: [] for i in range(len(cases))}
            total, daemon, dd = ({i: [] for i in range(len(cases))} for _ in range(3))
            per_gib = 1024 / a.seq_mib
            for _ in range(a.runs):
                for i, (binary, opts, query) in enumerate(cases):
                    cmd = [binary, "mount", b.uri() + (f"&{query}" if query else ""), b.mnt]
                    b.mount_proc = subprocess.Popen(cmd + (["-o", opts] if opts else []), stdin=subprocess.DEVNULL)
                    t0 = time.time()
                    while not os.path.ismount(b.mnt):
                        if b.mount_proc.poll() is not None or time.time() - t0 > 30:
                            sys.exit(f"{cmd}: not mounted")
                        time.sleep(0.01)
                    d0, s0, c0 = cpu_ms(b.mount_proc.pid), cpu_ms(b.server.pid), children_ms()
                    t = b.timed(lambda: nb.run(["dd", f"if={big}", "of=/dev/null", "bs=1M", "status=none"]))
                    d1, s1, c1 = cpu_ms(b.mount_proc.pid), cpu_ms(b.server.pid), children_ms()
                    rate[i].append(round(a.seq_mib / t))
                    total[i].append(round((d1 - d0 + s1 - s0 + c1 - c0) * per_gib))
                    daemon[i].append(round((d1 - d0) * per_gib))
                    dd[i].append(round((c1 - c0) * per_gib))
                    b.unmount()
            for i, c in enumerate(cases):
                print(f"delay {d} ms | {'|'.join(c)} | MiB/s {rate[i]} median {statistics.median(rate[i])} | "
                      f"CPU ms/GiB {statistics.median(total[i])} (daemon {statistics.median(daemon[i])}, "
                      f"dd {statistics.median(dd[i])})", flush=True)
            if a.nbdcopy:
                r, cc = [], []
                for _ in range(a.runs):
                    s0, c0 = cpu_ms(b.server.pid), children_ms()
                    t = b.timed(lambda: nb.run(["nbdcopy", "--no-extents", b.uri(), "null:"]))
                    s1, c1 = cpu_ms(b.server.pid), children_ms()
                    r.append(round((size >> 20) / t))
                    cc.append(round((s1 - s0 + c1 - c0) * 1024 / (size >> 20)))
                print(f"delay {d} ms | nbdcopy of the {size >> 20} MiB export | MiB/s {r} median "
                      f"{statistics.median(r)} | CPU ms/GiB {statistics.median(cc)}", flush=True)
            b.fsck()
            b.stop_server()
    finally:
        b.cleanup()


if __name__ == "__main__":
    main()
