#!/bin/bash
# Looks for a leaked block after a direct-I/O, AIO workload is killed (issue 42 item 8:
# xfstests generic/551 killed mid-run left "block N is marked in use but owned by
# nothing"). Each round mounts a fresh 1 GiB image, runs fio (libaio, O_DIRECT, 3 jobs,
# unaligned 512 B–1 MiB random writes, into holes or into fio's preallocation),
# SIGKILLs either the writer (then, every other round, removes its files and unmounts
# cleanly) or the daemon (then detaches the mount),
# and runs `dxfs fsck -n`. A failing image is kept as bad-N.img. Root. Not a test:
# it stops at nothing, and prints one line per round.
#
#   sudo bash bench/aio_kill.sh [ROUNDS] [DXFS_BIN]
set -uo pipefail
ROUNDS=${1:-10}
B=$(realpath "${2:-target/release/dxfs}")
D=$(mktemp -d /tmp/dxfs-aio-kill.XXXXXX)
mkdir -p "$D/mnt"
cleanup() {
    # (A mount whose daemon was killed is not a mount point to mountpoint(1): stat fails.)
    grep -q " $D/mnt " /proc/mounts && umount -l "$D/mnt"
    for l in $(losetup -j "$D/img" | cut -d: -f1); do losetup -d "$l"; done
}
trap cleanup EXIT
for i in $(seq 1 "$ROUNDS"); do
    rm -f "$D/img"
    "$B" mkfs --size 1G "$D/img" >/dev/null
    "$B" mount --daemon "$D/img" "$D/mnt" || { echo "mount failed"; exit 1; }
    daemon=$(pgrep -f "dxfs mount --daemon $D/img" | head -1)
    # Half the rounds write into holes (every write allocates: no fallocate, and no
    # layout, which create_on_open skips), half into fio's preallocation (every write
    # converts unwritten extents).
    fa=$([ $((i % 4)) -lt 2 ] && echo none || echo native)
    fio --name=w --directory="$D/mnt" --ioengine=libaio --direct=1 --rw=randwrite --bsrange=512-1M \
        --fallocate="$fa" --create_on_open="$([ "$fa" = none ] && echo 1 || echo 0)" --bs_unaligned=1 --iodepth=32 --numjobs=3 --size=96M --time_based --runtime=30 >/dev/null 2>&1 &
    fio=$!
    sleep "$((RANDOM % 3 + 1)).$((RANDOM % 10))"
    if [ $((i % 3)) = 0 ]; then
        victim=daemon
        kill -9 "$daemon"
        wait "$fio" 2>/dev/null
    else
        victim=writer
        pkill -9 -P "$fio"; kill -9 "$fio"
        wait "$fio" 2>/dev/null
        [ $((i % 2)) = 0 ] && rm -f "$D"/mnt/w.*
        # The killed writer's AIO may still hold the files for a moment.
        for _ in $(seq 50); do umount "$D/mnt" 2>/dev/null && break; sleep 0.2; done
        # The daemon has finished once it lets go of the image.
        while pgrep -f "dxfs mount --daemon $D/img" >/dev/null; do sleep 0.1; done
    fi
    cleanup
    sleep 0.3
    out=$("$B" fsck -n "$D/img" 2>&1); rc=$?
    echo "round $i ($victim killed, fallocate=$fa): fsck exit $rc: $(echo "$out" | tail -1)"
    [ $rc -ne 0 ] && cp "$D/img" "$D/bad-$i.img" && echo "$out" | head -20
done
rm -f "$D/img"
