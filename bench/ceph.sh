#!/usr/bin/env bash
# A single-node Ceph (one monitor, one OSD on memstore, no manager, auth none) on this
# machine, an RBD image served by qemu-nbd through qemu's rbd driver, and dxfs on it:
# mkfs, mount, a real tree copied in and compared, unmount, fsck. Everything it starts is
# stopped by pid on exit, and its directory removed.
#
#   apt-get install ceph-mon ceph-osd ceph-common qemu-block-extra qemu-utils
#   cargo build --release
#   sudo bash bench/ceph.sh [TREE_TO_COPY]          # default: /usr/share/doc
#
# Environment: DXFS (default target/release/dxfs), IMAGE_MB (default 1024),
# OSD_MB (memstore size, default 3072), KEEP=1 to leave the cluster running for more
# experiments (it prints how to stop it).
set -euo pipefail
cd "$(dirname "$0")/.."

DXFS=${DXFS:-target/release/dxfs}
TREE=${1:-/usr/share/doc}
IMAGE_MB=${IMAGE_MB:-1024}
OSD_MB=${OSD_MB:-3072}
for t in ceph-mon ceph-osd ceph rbd monmaptool qemu-nbd fusermount3; do
  command -v "$t" >/dev/null || { echo "ceph.sh: $t not found (apt-get install ceph-mon ceph-osd ceph-common qemu-block-extra qemu-utils fuse3)"; exit 2; }
done
[ -x "$DXFS" ] || { echo "ceph.sh: $DXFS not found (cargo build --release)"; exit 2; }

OSD_STORE=${OSD_STORE:-memstore}
. bench/ceph_cluster.sh

SOCK=$DIR/nbd.sock
qemu-nbd -k "$SOCK" -x dxfs -f raw --cache=none -t "rbd:rbd/dxfs:conf=$CONF" & PIDS+=($!)
for _ in $(seq 100); do [ -S "$SOCK" ] && break; sleep 0.1; done
URI="nbd+unix:///dxfs?socket=$SOCK"

"$DXFS" mkfs "$URI"
"$DXFS" mount "$URI" "$MNT" & MOUNT_PID=$!
for _ in $(seq 100); do mountpoint -q "$MNT" && break; sleep 0.1; done
t1=$(date +%s.%N)
cp -a "$TREE" "$MNT/tree"
echo "ceph.sh: copied $(du -sh "$TREE" | cut -f1) ($(find "$TREE" | wc -l) entries) in $(python3 -c "print(round($(date +%s.%N) - $t1, 1))") s"
fusermount3 -u "$MNT"
wait "$MOUNT_PID"
"$DXFS" mount "$URI" "$MNT" & MOUNT_PID=$!
for _ in $(seq 100); do mountpoint -q "$MNT" && break; sleep 0.1; done
t1=$(date +%s.%N)
diff -r --no-dereference "$TREE" "$MNT/tree"
echo "ceph.sh: cold compare identical in $(python3 -c "print(round($(date +%s.%N) - $t1, 1))") s"
fusermount3 -u "$MNT"
wait "$MOUNT_PID"
"$DXFS" fsck -n "$URI"
echo "ceph.sh: ok"
