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

DIR=$(mktemp -d /dev/shm/dxfs-ceph.XXXXXX)
CONF=$DIR/ceph.conf
PIDS=()
MNT=$DIR/mnt
cleanup() {
  if [ "${KEEP:-0}" = 1 ]; then
    echo "ceph.sh: left running: kill ${PIDS[*]}; rm -rf $DIR"
    return
  fi
  mountpoint -q "$MNT" 2>/dev/null && fusermount3 -u "$MNT" || true
  local i
  for ((i=${#PIDS[@]}-1; i>=0; i--)); do
    kill "${PIDS[i]}" 2>/dev/null || true
    for _ in $(seq 50); do kill -0 "${PIDS[i]}" 2>/dev/null || break; sleep 0.1; done
    kill -9 "${PIDS[i]}" 2>/dev/null || true
  done
  rm -rf "$DIR"
}
trap cleanup EXIT

FSID=$(python3 -c 'import uuid; print(uuid.uuid4())')
mkdir -p "$DIR/run" "$DIR/log" "$DIR/mon-a" "$DIR/osd-0" "$MNT"
cat > "$CONF" <<EOF
[global]
fsid = $FSID
mon host = v2:127.0.0.1:3300
mon initial members = a
auth cluster required = none
auth service required = none
auth client required = none
auth allow insecure global id reclaim = false
ms bind ipv4 = true
ms bind ipv6 = false
public network = 127.0.0.0/8
osd pool default size = 1
osd pool default min size = 1
osd pool default pg autoscale mode = off
osd crush chooseleaf type = 0
mon allow pool size one = true
mon allow pool delete = true
mon warn on pool no redundancy = false
run dir = $DIR/run
admin socket = $DIR/run/\$name.asok
log file = $DIR/log/\$name.log
pid file = $DIR/run/\$name.pid
keyring = /dev/null
[mon]
mon data = $DIR/mon-\$id
[osd]
osd data = $DIR/osd-\$id
osd objectstore = memstore
memstore device bytes = $((OSD_MB << 20))
osd max object name len = 256
osd max object namespace len = 64
EOF

t0=$(date +%s.%N)
monmaptool --create --fsid "$FSID" --addv a "[v2:127.0.0.1:3300]" "$DIR/monmap" >/dev/null
ceph-mon -c "$CONF" --mkfs -i a --monmap "$DIR/monmap"
ceph-mon -c "$CONF" -i a -f & PIDS+=($!)
C=(ceph -c "$CONF" --connect-timeout 20)
"${C[@]}" -s >/dev/null
OSD_UUID=$(python3 -c 'import uuid; print(uuid.uuid4())')
ID=$("${C[@]}" osd new "$OSD_UUID")
ceph-osd -c "$CONF" -i "$ID" --mkfs --osd-uuid "$OSD_UUID" 2>/dev/null
ceph-osd -c "$CONF" -i "$ID" -f & PIDS+=($!)
for _ in $(seq 120); do
  timeout 10 "${C[@]}" osd stat 2>/dev/null | grep -q "1 up" && break
  sleep 0.5
done
"${C[@]}" osd pool create rbd 32 32 >/dev/null
"${C[@]}" osd pool application enable rbd rbd >/dev/null
# Without a manager, PG states cannot be listed; making the image waits until its PGs
# are active.
timeout 300 rbd -c "$CONF" create rbd/dxfs --size "$IMAGE_MB"
echo "ceph.sh: cluster up and image made in $(python3 -c "print(round($(date +%s.%N) - $t0, 1))") s"

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
