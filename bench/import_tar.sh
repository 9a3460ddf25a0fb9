#!/bin/bash
# Unpacking a tar archive of small files: `tar -x` onto kernel ext4 (loop device over
# /dev/shm, then `sync -f`) against `dxfs mkfs -d ARCHIVE` into an image on /dev/shm
# (which ends with the volume committed and flushed). Root. A benchmark: asserts nothing.
#
#   sudo bash bench/import_tar.sh [RUNS] [FILES] [DXFS_BIN]
set -euo pipefail
RUNS=${1:-2}
FILES=${2:-100000}
B=${3:-target/release/dxfs}
TAR=/dev/shm/dxfs-bench-import.tar
MNT=$(mktemp -d)
trap 'mountpoint -q "$MNT" && umount "$MNT"; rm -rf "$MNT" "$TAR" /dev/shm/dxfs-bench-e4.img /dev/shm/dxfs-bench-dx.img' EXIT
python3 - "$TAR" "$FILES" <<'PY'
import io, random, sys, tarfile
path, files = sys.argv[1], int(sys.argv[2])
random.seed(1)
with tarfile.open(path, "w", format=tarfile.PAX_FORMAT) as tf:
    per = 1000
    for d in range((files + per - 1) // per):
        ti = tarfile.TarInfo(f"d{d:03}"); ti.type = tarfile.DIRTYPE; ti.mode = 0o755; ti.mtime = 1700000000
        tf.addfile(ti)
        for f in range(min(per, files - d * per)):
            data = random.randbytes(random.randint(1024, 16384))
            ti = tarfile.TarInfo(f"d{d:03}/f{f:04}"); ti.size = len(data); ti.mode = 0o644; ti.mtime = 1700000000
            tf.addfile(ti, io.BytesIO(data))
PY
echo "$(date -Is) $(uname -r) $(nproc) CPUs; $FILES files of 1-16 KiB in $(stat -c %s $TAR) bytes of archive"
secs() { python3 -c "import sys; print(f'{float(sys.argv[2]) - float(sys.argv[1]):.3f}')" "$1" "$2"; }
for run in $(seq "$RUNS"); do
    truncate -s 4G /dev/shm/dxfs-bench-e4.img
    L=$(losetup -f --show /dev/shm/dxfs-bench-e4.img)
    mkfs.ext4 -q "$L"; mount "$L" "$MNT"; sync; echo 3 > /proc/sys/vm/drop_caches
    s=$(date +%s.%N); tar -xf "$TAR" -C "$MNT"; sync -f "$MNT"; e=$(date +%s.%N)
    ext4=$(secs "$s" "$e")
    umount "$MNT"; losetup -d "$L"; rm -f /dev/shm/dxfs-bench-e4.img
    echo 3 > /proc/sys/vm/drop_caches
    s=$(date +%s.%N); "$B" mkfs /dev/shm/dxfs-bench-dx.img --size 4G -d "$TAR" >/dev/null; e=$(date +%s.%N)
    dx=$(secs "$s" "$e")
    "$B" fsck -n /dev/shm/dxfs-bench-dx.img >/dev/null || echo "fsck: not clean"
    rm -f /dev/shm/dxfs-bench-dx.img
    echo "run $run: ext4 tar -x + sync ${ext4} s; dxfs mkfs -d ARCHIVE ${dx} s ($(python3 -c "print(f'{$dx/$ext4:.2f}')")x)"
done
