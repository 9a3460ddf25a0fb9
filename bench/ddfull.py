#!/usr/bin/env python3
"""dd until ENOSPC onto a 320 MiB volume (issue 15's table): kernel ext4 or dxfs.

    python3 bench/ddfull.py ext4
    python3 bench/ddfull.py dxfs [-o no_writeback_cache]

A 320 MiB sparse file in /dev/shm on a loop device; `dd if=/dev/zero bs=1M` until it
fails; prints the time, the size reached, the time of an fsync after it and dd's error.
Needs root and a release build (target/release/dxfs). Cleans up what it made.
"""
import os, subprocess, sys, time

DXFS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "target", "release", "dxfs")
fs = sys.argv[1]
opts = sys.argv[2:]
tmp = "/dev/shm/dxfs-ddfull"
os.makedirs(tmp, exist_ok=True)
img, mnt = tmp + "/img", tmp + "/mnt"; os.makedirs(mnt, exist_ok=True)
with open(img, "wb") as f:
    f.truncate(320 << 20)
dev = subprocess.run(["losetup", "--find", "--show", img], capture_output=True, text=True, check=True).stdout.strip()
p = None
try:
    if fs == "ext4":
        subprocess.run(["mkfs.ext4", "-F", "-q", dev], check=True)
        subprocess.run(["mount", dev, mnt], check=True)
        p = None
    else:
        subprocess.run([DXFS, "mkfs", "-f", dev], check=True, capture_output=True)
        p = subprocess.Popen([DXFS, "mount", dev, mnt] + opts)
        for _ in range(500):
            if os.path.ismount(mnt):
                break
            time.sleep(0.01)
    t = time.time()
    r = subprocess.run(["dd", "if=/dev/zero", f"of={mnt}/f", "bs=1M"], capture_output=True, text=True)
    el = time.time() - t
    size = os.path.getsize(f"{mnt}/f")
    t2 = time.time()
    fd = os.open(f"{mnt}/f", os.O_RDONLY)
    os.fsync(fd)
    os.close(fd)
    print(fs, opts, f"dd until ENOSPC {el:.2f} s, {size>>20} MiB, fsync after {time.time()-t2:.3f} s;", r.stderr.strip().splitlines()[0])
finally:
    subprocess.run(["umount", mnt])
    if p is not None:
        p.wait()
    subprocess.run(["losetup", "-d", dev])
    os.unlink(img)
    os.rmdir(mnt)
    os.rmdir(tmp)
