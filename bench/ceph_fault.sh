#!/usr/bin/env bash
# The store failing under a mounted dxfs volume on Ceph (issue 16). A single-node Ceph as in
# bench/ceph.sh, but its OSD on BlueStore in a file (memstore loses the image with the
# OSD); qemu-nbd serves the RBD image; dxfs mounts it with `timeout=TIMEOUT_S`. The OSD is
# killed (SIGKILL) half a second into a `cp -a` of a real tree into the mount, and
#   1. started again DOWN_S seconds later (DOWN_S < TIMEOUT_S): the NBD client only waits,
#      the copy and a sync of the mount succeed, and after a remount the tree compares
#      identical; fsck clean;
#   2. left down: the sync fails with EIO within about TIMEOUT_S, the daemon exits. Then
#      qemu-nbd is stopped (SIGKILL: with I/O pending it ignores SIGTERM, and its queued
#      requests must die with it rather than land after a later mount's writes), the OSD
#      started again and qemu-nbd too: the volume mounts (recovery replays its log; the
#      first write waits ~30 s for the dead qemu-nbd's RBD exclusive lock to be broken,
#      so that mount uses timeout=90), and fsck is clean.
# Everything it starts is stopped by pid on exit, and its directory removed.
#
#   apt-get install ceph-mon ceph-osd ceph-common qemu-block-extra qemu-utils
#   cargo build --release
#   sudo bash bench/ceph_fault.sh [TREE (default /usr/share/doc)] [DOWN_S (5)] [TIMEOUT_S (10)]
set -euo pipefail
cd "$(dirname "$0")/.."

DXFS=${DXFS:-target/release/dxfs}
TREE=${1:-/usr/share/doc}
DOWN_S=${2:-5}
TIMEOUT_S=${3:-10}
IMAGE_MB=${IMAGE_MB:-1024}
OSD_MB=${OSD_MB:-3072}
OSD_STORE=bluestore
for t in ceph-mon ceph-osd ceph rbd monmaptool qemu-nbd fusermount3; do
  command -v "$t" >/dev/null || { echo "ceph_fault.sh: $t not found (apt-get install ceph-mon ceph-osd ceph-common qemu-block-extra qemu-utils fuse3)"; exit 2; }
done
[ -x "$DXFS" ] || { echo "ceph_fault.sh: $DXFS not found (cargo build --release)"; exit 2; }

. bench/ceph_cluster.sh

SOCK=$DIR/nbd.sock
URI="nbd+unix:///dxfs?socket=$SOCK&timeout=$TIMEOUT_S"
say() { echo "ceph_fault.sh: [$(python3 -c "print(round($(date +%s.%N) - $T0, 1))") s] $*"; }
nbd_start() {
  rm -f "$SOCK"
  qemu-nbd -k "$SOCK" -x dxfs -f raw --cache=none -t "rbd:rbd/dxfs:conf=$CONF" >>"$DIR/log/qemu-nbd.log" 2>&1 </dev/null &
  QEMU_PID=$!
  PIDS+=($QEMU_PID)
  for _ in $(seq 100); do [ -S "$SOCK" ] && break; sleep 0.1; done
}
nbd_stop() {
  kill "$QEMU_PID" 2>/dev/null || true
  for _ in $(seq 20); do kill -0 "$QEMU_PID" 2>/dev/null || break; sleep 0.1; done
  kill -9 "$QEMU_PID" 2>/dev/null && say "qemu-nbd ignored SIGTERM (I/O pending): killed"
  wait "$QEMU_PID" 2>/dev/null || true
  forget "$QEMU_PID"
}
mount_it() {
  "$DXFS" mount "${1:-$URI}" "$MNT" >>"$DIR/log/dxfs.log" 2>&1 </dev/null &
  MOUNT_PID=$!
  for _ in $(seq 600); do
    mountpoint -q "$MNT" && return 0
    kill -0 "$MOUNT_PID" 2>/dev/null || { say "mount failed:"; tail -3 "$DIR/log/dxfs.log"; return 1; }
    sleep 0.1
  done
  say "not mounted after 60 s"
  return 1
}
unmount_it() {
  fusermount3 -u "$MNT" 2>/dev/null || umount -l "$MNT" 2>/dev/null || true
  local rc=0
  wait "$MOUNT_PID" || rc=$?
  say "daemon exited with $rc"
}
# The workload: a copy of the tree into the mount, then a sync of the mount (the copy
# mostly lands in the kernel's and the volume's caches; the sync is what waits for the
# store). Its result: "cp exit N, sync exit N at T s" and the commonest errors.
work_in_background() {
  rm -f "$DIR/cp.err" "$DIR/work.rc"
  (
    set +e
    cp -a "$TREE" "$MNT/tree" 2>"$DIR/cp.err"
    c=$?
    sync -f "$MNT" 2>>"$DIR/cp.err"
    echo "$c $? $(date +%s.%N)" >"$DIR/work.rc"
  ) &
  WORK_PID=$!
}
# Wait for the workload, say how it ended, and stop unless it ended as expected: step
# $1, $2 = 1 when it must succeed, 0 when it must fail, $3 what was expected.
expect_work() {
  local c s t errs
  wait "$WORK_PID" || true
  read -r c s t <"$DIR/work.rc"
  errs=$(sed 's/.*: //' "$DIR/cp.err" | sort | uniq -c | sort -rn | head -2 | tr -s ' ' | tr '\n' ';')
  say "$1: cp exit $c, sync exit $s at $(python3 -c "print(round($t - $T0, 1))") s${errs:+; errors:$errs}"
  [ "$([ "$c$s" = 00 ] && echo 1 || echo 0)" = "$2" ] || { say "$1: FAILED: $3"; exit 1; }
}
# A fresh volume, mounted, the copy running, and the OSD killed half a second into it.
kill_osd_under_work() {
  "$DXFS" mkfs -f "$URI" >/dev/null
  mount_it
  T0=$(date +%s.%N)
  work_in_background
  sleep 0.5
  osd_kill
}

echo "ceph_fault.sh: OSD down ${DOWN_S} s, then for good; timeout=${TIMEOUT_S} s; tree $TREE ($(find "$TREE" | wc -l) entries)"
nbd_start

# 1. The OSD comes back before the timeout.
kill_osd_under_work
say "1: OSD killed"
sleep "$DOWN_S"
osd_start
say "1: OSD started again"
expect_work 1 1 "the workload should have ridden out the outage"
unmount_it
mount_it
diff -r --no-dereference "$TREE" "$MNT/tree" >/dev/null || { say "1: FAILED: the tree differs"; exit 1; }
say "1: remounted, the tree compares identical"
unmount_it
"$DXFS" fsck -n "$URI"

# 2. The OSD stays down past the timeout.
kill_osd_under_work
say "2: OSD killed, left down"
expect_work 2 0 "the workload should have failed"
unmount_it
nbd_stop
osd_start
osd_wait
say "2: OSD started again, image answers"
nbd_start
# The killed qemu-nbd still holds the image's exclusive lock until its watch times out
# (osd_client_watch_timeout, 30 s): the new one's first write waits for that, longer
# than TIMEOUT_S. Hence a longer timeout for this mount.
mount_it "nbd+unix:///dxfs?socket=$SOCK&timeout=90"
say "2: remounted (log replayed): $(find "$MNT/tree" 2>/dev/null | wc -l) entries of the tree"
unmount_it
"$DXFS" fsck -n "$URI"
grep -hE "ERROR|WARN" "$DIR/log/dxfs.log" | sed 's/^[^ ]* *//' | cut -c1-160 | sort | uniq -c | head -12
echo "ceph_fault.sh: ok"
