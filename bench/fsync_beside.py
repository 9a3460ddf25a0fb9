#!/usr/bin/env python3
"""Latency of a request made beside an fsync loop on the same CPU.

    python3 bench/fsync_beside.py MOUNTPOINT

One process writes 8 MiB and fsyncs in a loop; another, pinned to the same CPU (0),
times `getxattr` of a missing name for 4 s and prints median, p99, p99.9 and max. With
FUSE over io_uring both land on CPU 0's queue: this shows whether a request waits behind
the fsync's commit. A benchmark, not a test.
"""
import os, sys, time, multiprocessing as mp
mnt = sys.argv[1]
def writer(stop):
    os.sched_setaffinity(0, {0})
    fd = os.open(mnt + "/big", os.O_CREAT | os.O_WRONLY, 0o644)
    buf = os.urandom(1 << 20)
    while not stop.is_set():
        for _ in range(8):
            os.write(fd, buf)
        os.fsync(fd)
    os.close(fd)
def reader(q):
    os.sched_setaffinity(0, {0})
    open(mnt + "/f", "w").close()
    lat = []
    end = time.perf_counter() + 4
    while time.perf_counter() < end:
        t = time.perf_counter()
        try: os.getxattr(mnt + "/f", "user.none")
        except OSError: pass
        lat.append(time.perf_counter() - t)
    lat.sort()
    q.put((len(lat), lat[len(lat)//2]*1e6, lat[int(len(lat)*0.99)]*1e6, lat[int(len(lat)*0.999)]*1e6, lat[-1]*1e3))
stop = mp.Event(); q = mp.Queue()
w = mp.Process(target=writer, args=(stop,)); r = mp.Process(target=reader, args=(q,))
w.start(); time.sleep(0.5); r.start(); res = q.get(); stop.set(); r.join(); w.join()
print("getxattr beside fsync, same CPU: n=%d median %.1f us p99 %.1f us p99.9 %.1f us max %.1f ms" % res)
