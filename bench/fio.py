#!/usr/bin/env python3
"""File data through the mount, side by side: kernel ext4 and dxfs, with fio.

    python3 bench/fio.py [--targets ext4,dxfs,dxfs-wb] [--runtime 8] [--size-mib 1024]
                         [--dxfs-bin target/release/dxfs] [--transport uring]
                         [--volume-gib 4] [--dxfs-opts flush_from=0] [--jobs 1,6] [--stats]
                         [--preallocate]

Each target gets a fresh volume (4 GiB unless --volume-gib says) on a loop device over a
sparse file in /dev/shm (allocated up front with --preallocate).
Jobs: sequential write and read of SIZE (buffered and O_DIRECT, 1 MiB requests, cold
read after dropping the page cache), random 4 KiB write and read over 256 MiB (1 job and
4 jobs), random write with an fsync every 1,000 writes and after every write. Prints
IOPS, MB/s and completion latency (mean, p99, p99.9, max) per job, and the ratio to
ext4. `dxfs` mounts with `--writeback-cache off`, `dxfs-wb` with it on. Needs root and
fio. A benchmark, not a test: it asserts nothing.
"""
import argparse, json, os, platform, sys, time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from loopvol import LoopVolume, run  # noqa: E402


def drop_page_cache():
    with open("/proc/sys/vm/drop_caches", "w") as f:
        f.write("3\n")


JOBS = [
    # (label, fio arguments)
    ("seq write 1 MiB, buffered", ["--rw=write", "--bs=1M", "--end_fsync=1", "SIZE"]),
    ("seq read 1 MiB, buffered, cold", ["--rw=read", "--bs=1M", "SIZE", "COLD"]),
    ("seq write 1 MiB, O_DIRECT", ["--rw=write", "--bs=1M", "--direct=1", "--end_fsync=1", "SIZE"]),
    ("seq read 1 MiB, O_DIRECT", ["--rw=read", "--bs=1M", "--direct=1", "SIZE", "COLD"]),
    ("rand write 4 KiB, 1 job", ["--rw=randwrite", "--bs=4k", "--size=256M", "TIMED"]),
    ("rand write 4 KiB, 4 jobs", ["--rw=randwrite", "--bs=4k", "--size=256M", "--numjobs=4", "TIMED"]),
    ("rand read 4 KiB, 1 job", ["--rw=randread", "--bs=4k", "--size=256M", "TIMED"]),
    ("rand read 4 KiB, 4 jobs", ["--rw=randread", "--bs=4k", "--size=256M", "--numjobs=4", "TIMED"]),
    ("rand write 4 KiB, fsync every 1,000", ["--rw=randwrite", "--bs=4k", "--size=256M", "--fsync=1000", "TIMED"]),
    ("rand write 4 KiB, fsync every write", ["--rw=randwrite", "--bs=4k", "--size=256M", "--fsync=1", "TIMED"]),
]


def fio(mnt, name, args, size_mib, runtime):
    cmd = ["fio", f"--name={name}", f"--directory={mnt}", "--ioengine=psync", "--group_reporting",
           "--output-format=json", "--filename_format=f.$jobnum"]
    for a in args:
        if a == "SIZE":
            cmd.append(f"--size={size_mib}M")
        elif a == "TIMED":
            cmd += [f"--runtime={runtime}", "--time_based"]
        elif a != "COLD":
            cmd.append(a)
    if "COLD" in args:
        # Lay the file out first (untimed), then read it with a cold page cache.
        run([c for c in cmd if not c.startswith("--rw=") and c != "--direct=1"] + ["--rw=write", "--end_fsync=1"])
        drop_page_cache()
    out = json.loads(run(cmd).stdout)["jobs"][0]
    side = out["write"] if out["write"]["io_bytes"] > 0 else out["read"]
    clat = side["clat_ns"]
    pct = clat.get("percentile", {})
    sync = out.get("sync", {}).get("lat_ns", {})
    return {
        "iops": side["iops"],
        "mbs": side["bw_bytes"] / 1e6,
        "mean_us": clat["mean"] / 1e3,
        "p99_us": pct.get("99.000000", 0) / 1e3,
        "p999_us": pct.get("99.900000", 0) / 1e3,
        "max_us": clat["max"] / 1e3,
        "fsync_mean_ms": sync.get("mean", 0) / 1e6,
        "fsync_max_ms": sync.get("max", 0) / 1e6,
    }


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--targets", default="ext4,dxfs,dxfs-wb")
    ap.add_argument("--runtime", type=int, default=8)
    ap.add_argument("--size-mib", type=int, default=1024)
    ap.add_argument("--volume-gib", type=int, default=4, help="size of each fresh volume (default 4)")
    ap.add_argument("--transport", default="uring")
    ap.add_argument("--dxfs-opts", default="", help="extra dxfs mount options, comma-separated (e.g. flush_from=0)")
    ap.add_argument("--jobs", default="", help="comma-separated job numbers (1-based) to run; default all")
    ap.add_argument("--preallocate", action="store_true",
                    help="allocate each image's memory up front (no tmpfs page allocation at first writes)")
    ap.add_argument("--stats", action="store_true",
                    help="print each dxfs job's requests by kind: count, daemon time mean and total")
    ap.add_argument("--dxfs-bin", default=os.path.join(os.path.dirname(__file__), "..", "target", "release", "dxfs"))
    a = ap.parse_args()
    dxfs = os.path.abspath(a.dxfs_bin)
    targets = a.targets.split(",")
    jobs = [JOBS[int(i) - 1] for i in a.jobs.split(",")] if a.jobs else JOBS
    res = {}
    for t in targets:
        for label, args in jobs:
            # A fresh volume per job, so no job finds another's files or fragmentation.
            fs = "ext4" if t == "ext4" else "dxfs"
            wb = ["--writeback-cache", "on" if t == "dxfs-wb" else "off"]
            if a.dxfs_opts:
                wb += ["-o", a.dxfs_opts]
            with LoopVolume(fs, a.volume_gib, dxfs, a.transport, wb, preallocate=a.preallocate) as tg:
                res[(t, label)] = fio(tg.mnt, "j", args, a.size_mib, a.runtime)
                if a.stats and fs == "dxfs":
                    st = tg.stats()
                    ops = st.get("ops", {})
                    print(f"{t}: {label}: " + json.dumps({k: v for k, v in st.items() if k != "ops"}), file=sys.stderr)
                    busiest = sorted(ops.items(), key=lambda kv: -kv[1]["total_us"])[:4]
                    print(f"{t}: {label}: " + ", ".join(
                        f"{k} {v['count']:,} × {v['mean_us']:.1f} µs = {v['total_us'] / 1e6:.2f} s (longest {v.get('max_us', 0) / 1e3:.1f} ms)"
                        for k, v in busiest),
                        file=sys.stderr)
            print(f"{t}: {label} done", file=sys.stderr)
    cpu = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), "?")
    print(f"{time.strftime('%Y-%m-%d')}, {platform.release()}, {os.cpu_count()} vCPUs ({cpu}), load average "
          f"{os.getloadavg()[0]:.2f} at the end; dxfs transport {a.transport}; loop devices over /dev/shm"
          f"{' (preallocated)' if a.preallocate else ''}\n")
    print("| job | target | IOPS | MB/s | × ext4 | clat mean / p99 / p99.9 / max µs | fsync mean / max ms |")
    print("|---|---|---|---|---|---|---|")
    for label, _ in jobs:
        for t in targets:
            r = res[(t, label)]
            base = res.get(("ext4", label))
            ratio = f"{r['iops'] / base['iops']:.2f}×" if base and t != "ext4" and base["iops"] else ""
            sync = f"{r['fsync_mean_ms']:.2f} / {r['fsync_max_ms']:.1f}" if r["fsync_mean_ms"] else ""
            print(f"| {label} | {t} | {r['iops']:,.0f} | {r['mbs']:,.0f} | {ratio} | {r['mean_us']:.1f} / "
                  f"{r['p99_us']:.0f} / {r['p999_us']:.0f} / {r['max_us']:,.0f} | {sync} |")


if __name__ == "__main__":
    sys.exit(main())
