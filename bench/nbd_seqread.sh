#!/usr/bin/env bash
# Sequential read of a 1 GiB export through dxfs's NBD client alone (examples/nbd_seqread:
# 128 KiB reads, the client's readahead), with 1 and 4 connections, against nbdcopy of the
# same export (libnbd: 4 connections x 64 requests), behind nbdkit's delay filter; then
# a sequential write of it (1 MiB writes, 64 in flight, then a flush) with 1 and 4.
# Each figure is the median of RUNS runs (MiB/s).
#
#     cargo build --release --example nbd_seqread
#     bench/nbd_seqread.sh [DELAYS_MS (default "0 1 5")] [RUNS (default 3)]
set -euo pipefail
cd "$(dirname "$0")/.."
bin=${CARGO_TARGET_DIR:-target}/release/examples/nbd_seqread
delays=${1:-0 1 5}
runs=${2:-3}
tmp=$(mktemp -d /dev/shm/dxfs-nbdseq-XXXXXX)
pid=
cleanup() {
  if [ -n "$pid" ]; then kill "$pid" 2>/dev/null || true; wait "$pid" 2>/dev/null || true; fi
  rm -rf "$tmp"
}
trap cleanup EXIT
dd if=/dev/urandom of="$tmp/img" bs=1M count=1024 status=none
median() { sort -n | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }
echo "| delay per request | read, conns=1 | read, conns=4 | nbdcopy read | conns=4 / nbdcopy | write, conns=1 | write, conns=4 |"
echo "|---|---|---|---|---|---|---|"
for d in $delays; do
  sock="$tmp/s"
  rm -f "$sock"
  if [ "$d" = 0 ]; then
    nbdkit -f -U "$sock" file file="$tmp/img" & pid=$!
  else
    nbdkit -f -U "$sock" --filter=delay file file="$tmp/img" delay-read="${d}ms" delay-write="${d}ms" & pid=$!
  fi
  for _ in $(seq 200); do [ -S "$sock" ] && break; sleep 0.05; done
  uri="nbd+unix:///?socket=$sock"
  c1=$(for _ in $(seq "$runs"); do "$bin" "$uri&conns=1" 1024 | sed 's/.*: \([0-9]*\) MiB\/s/\1/'; done | median)
  c4=$(for _ in $(seq "$runs"); do "$bin" "$uri&conns=4" 1024 | sed 's/.*: \([0-9]*\) MiB\/s/\1/'; done | median)
  nc=$(for _ in $(seq "$runs"); do
    t0=$(date +%s.%N); nbdcopy --no-extents "$uri" null:; t1=$(date +%s.%N)
    echo "1024 / ($t1 - $t0)" | bc -l | xargs printf '%.0f\n'
  done | median)
  w1=$(for _ in $(seq "$runs"); do "$bin" "$uri&conns=1" 1024 1024 write | sed 's/.*: \([0-9]*\) MiB\/s/\1/'; done | median)
  w4=$(for _ in $(seq "$runs"); do "$bin" "$uri&conns=4" 1024 1024 write | sed 's/.*: \([0-9]*\) MiB\/s/\1/'; done | median)
  echo "| $d ms | $c1 | $c4 | $nc | $(echo "100 * $c4 / $nc" | bc)% | $w1 | $w4 |"
  kill "$pid"; wait "$pid" 2>/dev/null || true; pid=
done
