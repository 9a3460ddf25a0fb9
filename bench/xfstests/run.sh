#!/bin/bash
# Run xfstests on dxfs with a per-test watchdog.
#   ./run.sh [-T SECS] [-D HH:MM] [-1] [-n] -- CHECK_ARGS...
#   e.g. ./run.sh -1 generic/003 generic/184     (each test in its own ./check run)
#        ./run.sh -T 240 -D 17:35 -g quick -x slow  (one ./check run)
# -T: per-test timeout (default 300 s): a test running longer is killed (its process
#     tree SIGKILLed; if processes stay stuck, the FUSE connections of our two mounts are
#     aborted and the mounts lazily unmounted).
# -D: UTC deadline: at that time the current test is killed and ./check is stopped.
# -n: do not re-mkfs the scratch and test volumes first (default: fresh volumes).
# Needs setup.sh to have run (loops.env, local.config, helper).
X=/tmp/xfst; XT=$X/xfstests
T=300; DEADLINE=""; ONE=0; FRESH=1
while [ $# -gt 0 ]; do
  case "$1" in
    -T) T=$2; shift 2;;
    -D) DEADLINE=$2; shift 2;;
    -1) ONE=1; shift;;
    -n) FRESH=0; shift;;
    --) shift; break;;
    *) break;;
  esac
done
. $X/loops.env
STAMP=$(date -u +%H%M%S)
LOG=$X/logs/run-$STAMP
mkdir -p $LOG
export DXFS_FSCK_LOG=$LOG/fsck-per-test.log
echo "logs in $LOG"

my_mounts() { awk '$2=="/mnt/xfst-test"||$2=="/mnt/xfst-scratch"{print $2}' /proc/mounts; }

abort_conns() {
  # Abort the FUSE connections of our mounts (dir name = kernel dev_t, major<<20|minor).
  awk '$5=="/mnt/xfst-test"||$5=="/mnt/xfst-scratch"{print $3}' /proc/self/mountinfo |
  while IFS=: read ma mi; do
    id=$(( (ma<<20) | mi ))
    [ -e /sys/fs/fuse/connections/$id/abort ] && { echo 1 > /sys/fs/fuse/connections/$id/abort; echo "aborted fuse conn $id"; }
  done
  for m in $(my_mounts); do umount -l $m && echo "lazy-unmounted $m"; done
}

unmount_all() {
  for m in $(my_mounts); do timeout 120 umount $m || { echo "umount $m failed"; abort_conns; }; done
  sleep 1
}

fresh_volumes() {
  unmount_all
  for d in $TEST_LOOP $SCRATCH_LOOP; do
    for i in $(seq 30); do $X/dxfs mkfs -f -s 2G $d >/dev/null 2>&1 && break; sleep 1; done
  done
}

descendants() { local p; for p in $(pgrep -P $1); do echo $p; descendants $p; done; }

watch_check() {
  # $1 = pid of ./check; kill tests running longer than $T; stop at $DEADLINE
  local cpid=$1 cur="" start=0 now tp
  while kill -0 $cpid 2>/dev/null; do
    sleep 5
    tp=$(for p in $(descendants $cpid); do { tr '\0' ' ' < /proc/$p/cmdline; } 2>/dev/null | grep -qE '^/bin/bash (\./|/tmp/xfst/xfstests/)?tests/[a-z]+/[0-9]+ ?$' && echo $p; done | head -1)
    now=$(date +%s)
    if [ -n "$tp" ] && [ "$tp" != "$cur" ]; then cur=$tp; start=$now; echo "$(date -u +%T) test pid $tp: $({ tr '\0' ' ' < /proc/$tp/cmdline; } 2>/dev/null)" >> $LOG/watchdog.log; fi
    local stop=0
    if [ -n "$DEADLINE" ] && [ "$(date -u +%H:%M)" \> "$DEADLINE" -o "$(date -u +%H:%M)" = "$DEADLINE" ]; then
      echo "$(date -u +%T) DEADLINE reached: stopping ./check" | tee -a $LOG/watchdog.log
      stop=1
    fi
    if [ -n "$cur" ] && kill -0 $cur 2>/dev/null && { [ $((now-start)) -gt $T ] || [ $stop = 1 ]; }; then
      echo "$(date -u +%T) TIMEOUT/STOP: $(tr '\0' ' ' < /proc/$cur/cmdline) after $((now-start))s" | tee -a $LOG/watchdog.log
      ps -o pid,stat,wchan:30,etimes,cmd $(descendants $cur) >> $LOG/watchdog.log 2>&1
      local d=$(descendants $cur)
      kill -9 $cur $d 2>/dev/null
      sleep 15
      local left=""; for p in $d $cur; do kill -0 $p 2>/dev/null && left="$left $p"; done
      if [ -n "$left" ]; then
        echo "still alive after SIGKILL:$left" >> $LOG/watchdog.log
        ps -o pid,stat,wchan:30,cmd $left >> $LOG/watchdog.log 2>&1
        abort_conns >> $LOG/watchdog.log 2>&1
      fi
      cur=""
    fi
    if [ $stop = 1 ]; then kill -TERM $cpid 2>/dev/null; sleep 20; kill -0 $cpid 2>/dev/null && kill -9 $cpid; break; fi
  done
}

run_check() {
  # one ./check run with args "$@"; output to $LOG/check-<name>.out
  local name=$1; shift
  echo "$(date -u +%T) start: ./check $*" | tee -a $LOG/runs.txt
  ( cd $XT && exec setsid ./check "$@" ) > $LOG/check-$name.out 2>&1 &
  local cpid=$!
  watch_check $cpid
  wait $cpid; local rc=$?
  echo "$(date -u +%T) end rc=$rc: ./check $*" | tee -a $LOG/runs.txt
  grep -E '^(Ran|Not run|Failures|Failed|Passed)' $LOG/check-$name.out | tee -a $LOG/runs.txt
}

[ $FRESH = 1 ] && fresh_volumes
if [ $ONE = 1 ]; then
  for t in "$@"; do
    [ -n "$DEADLINE" ] && [ ! "$(date -u +%H:%M)" \< "$DEADLINE" ] && { echo "deadline: not starting $t"; break; }
    run_check "${t//\//-}" "$t"
    unmount_all
  done
else
  run_check main "$@"
  unmount_all
fi
echo "fsck log: $DXFS_FSCK_LOG"
