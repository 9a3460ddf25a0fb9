# Sourced by bench/ceph.sh and bench/ceph_fault.sh: a single-node Ceph (one monitor, one
# OSD, no manager, auth none) in a fresh directory under /dev/shm and a 1 GiB RBD image
# "rbd/dxfs" on it. Sets DIR, CONF, MNT, PIDS and C (the ceph command); `cleanup` (run on
# exit) stops what was started by pid, in reverse order, and removes DIR. OSD_STORE is
# memstore (default: fast, but the image dies with the OSD) or bluestore (a file in DIR
# that survives a killed OSD). osd_start and osd_wait start the OSD and wait until the
# image answers.

osd_store_conf() {
  if [ "${OSD_STORE:-memstore}" = bluestore ]; then
    printf '%s\n' "osd objectstore = bluestore" "bluestore block size = $((OSD_MB << 20))" \
      "osd memory target = 1073741824" "bluestore cache autotune = false" "bluestore cache size = 268435456"
  else
    printf '%s\n' "osd objectstore = memstore" "memstore device bytes = $((OSD_MB << 20))"
  fi
}
# Start OSD $ID (its pid: OSD_PID, also in PIDS) and wait until the monitor sees it up.
osd_start() {
  ceph-osd -c "$CONF" -i "$ID" -f >>"$DIR/log/osd-stdout.log" 2>&1 </dev/null & OSD_PID=$!
  PIDS+=($OSD_PID)
  for _ in $(seq 120); do
    timeout 10 "${C[@]}" osd stat 2>/dev/null | grep -q "1 up" && break
    sleep 0.5
  done
}
# SIGKILL the OSD and forget its pid.
osd_kill() {
  kill -9 "$OSD_PID"
  wait "$OSD_PID" 2>/dev/null || true
  forget "$OSD_PID"
}
# Drop a pid that ended from PIDS, so the cleanup never signals a reused one.
forget() {
  local keep=() p
  for p in "${PIDS[@]}"; do [ "$p" = "$1" ] || keep+=("$p"); done
  PIDS=("${keep[@]}")
}
# Wait until the image answers (its placement groups are active again).
osd_wait() {
  for _ in $(seq 120); do
    timeout 5 rbd -c "$CONF" info rbd/dxfs >/dev/null 2>&1 && return 0
    sleep 0.5
  done
  echo "ceph: the image did not come back" >&2
  return 1
}

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
$(osd_store_conf)
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
osd_start
"${C[@]}" osd pool create rbd 32 32 >/dev/null
"${C[@]}" osd pool application enable rbd rbd >/dev/null
# Without a manager, PG states cannot be listed; making the image waits until its PGs
# are active.
timeout 300 rbd -c "$CONF" create rbd/dxfs --size "$IMAGE_MB"
echo "ceph: cluster up and image made in $(python3 -c "print(round($(date +%s.%N) - $t0, 1))") s"

