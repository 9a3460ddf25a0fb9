#!/usr/bin/env bash
# `dxfs mkfs -d` of a real tree against `mke2fs -d` of the same tree (issue 17).
#
#   sudo bash bench/mkfs_d.sh [RUNS]        (default 3 runs of each; run by hand, not in CI)
#
# Builds a source tree from /usr/share/doc and /usr/include plus hard links, symlinks,
# user xattrs (one of 400 bytes per 50 files: mke2fs 1.47.0 -d fails with "Insufficient space" on a 1000-byte value), POSIX ACLs, a device node, a fifo, sparse files and odd names; times
# `dxfs mkfs -d` and `mke2fs -t ext4 -d` onto images of the same size (medians); checks
# both images (fsck); mounts the dxfs image and compares it with the source byte for byte
# and in metadata (bench/tree_compare.py); exports it (`dxfs export`) and compares that
# too. Prints a Markdown table. Needs root, setfattr/setfacl (attr, acl), e2fsprogs.
set -euo pipefail
RUNS=${1:-3}
HERE=$(cd "$(dirname "$0")" && pwd)
DXFS=${DXFS:-$HERE/../target/release/dxfs}
[ -x "$DXFS" ] || { echo "build first: cargo build --release (or set DXFS)" >&2; exit 2; }
for t in mke2fs e2fsck setfattr setfacl python3; do
  command -v $t >/dev/null || { echo "missing $t (apt-get install e2fsprogs attr acl)" >&2; exit 2; }
done
WORK=$(mktemp -d /dev/shm/mkfs_d.XXXXXX)
MNT=$WORK/mnt
cleanup() {
  mountpoint -q "$MNT" 2>/dev/null && umount "$MNT" || true
  rm -rf "$WORK"
}
trap cleanup EXIT
[ -n "${KEEP:-}" ] && trap - EXIT
SRC=$WORK/src
mkdir -p "$SRC" "$MNT"
cp -a /usr/share/doc "$SRC/doc"
cp -a /usr/include "$SRC/include"
# Hard links (some across directories), symlinks, xattrs, ACLs, special files, holes.
mkdir -p "$SRC/extra/links" "$SRC/extra/odd"
i=0
while IFS= read -r f; do
  i=$((i + 1))
  ln "$f" "$SRC/extra/links/link$i"
  [ $((i % 4)) -eq 0 ] && ln "$f" "$f.hardlink$i"
done < <(find "$SRC/include" -type f -name '*.h' | head -200)
ln -s ../doc "$SRC/extra/rel-dir-link"
ln -s /usr/include/stdio.h "$SRC/extra/abs-link"
ln -s does/not/exist "$SRC/extra/dangling"
ln -s "$(printf 'x%.0s' $(seq 1 300))" "$SRC/extra/long-target"
i=0
while IFS= read -r f; do
  i=$((i + 1))
  setfattr -n user.origin -v "file $i" "$f"
  [ $((i % 50)) -eq 0 ] && setfattr -n user.big -v "0x$(head -c 400 /dev/urandom | od -An -tx1 | tr -d ' \n')" "$f"
done < <(find "$SRC/doc" -type f | head -500)
i=0
while IFS= read -r f; do
  i=$((i + 1))
  setfacl -m u:1234:rw,g:55:r "$f"
done < <(find "$SRC/include" -type f | tail -200)
while IFS= read -r d; do setfacl -d -m u:1234:rwx "$d"; done < <(find "$SRC/doc" -mindepth 1 -maxdepth 1 -type d | head -5)
mknod "$SRC/extra/null" c 1 3
mkfifo "$SRC/extra/fifo"
truncate -s 10M "$SRC/extra/sparse"; printf 'middle' | dd of="$SRC/extra/sparse" bs=1 seek=5000000 conv=notrunc status=none
touch "$SRC/extra/odd/with space" "$SRC/extra/odd/ünïcødé ✓" "$SRC/extra/odd/$(printf 'n%.0s' $(seq 1 255))"
chown -R 1000:1000 "$SRC/extra/odd"

bytes=$(du -sb --apparent-size "$SRC" | cut -f1)
size_mib=$(( bytes * 2 / 1048576 + 64 ))
median() { sort -n | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }
time_of() { local s e; s=$(date +%s.%N); "$@" >/dev/null 2>&1; e=$(date +%s.%N); printf '%.3f\n' "$(echo "$e - $s" | bc)"; }

DIMG=$WORK/dxfs.img; EIMG=$WORK/ext4.img
dx=(); e4=()
for r in $(seq 1 "$RUNS"); do
  rm -f "$DIMG" "$EIMG"
  truncate -s ${size_mib}M "$DIMG"; truncate -s ${size_mib}M "$EIMG"
  sync; echo 3 > /proc/sys/vm/drop_caches
  dx+=("$(time_of "$DXFS" mkfs -f -d "$SRC" "$DIMG")")
  sync; echo 3 > /proc/sys/vm/drop_caches
  e4+=("$(time_of mke2fs -q -F -t ext4 -d "$SRC" "$EIMG")")
done
dx_med=$(printf '%s\n' "${dx[@]}" | median)
e4_med=$(printf '%s\n' "${e4[@]}" | median)
"$DXFS" fsck -n "$DIMG" >/dev/null || { echo "dxfs fsck failed" >&2; exit 1; }
e2fsck -fn "$EIMG" >/dev/null || { echo "e2fsck failed" >&2; exit 1; }
# Blocks the image files really hold (both are sparse files on tmpfs).
dx_used=$(du -s --block-size=1 "$DIMG" | cut -f1); e4_used=$(du -s --block-size=1 "$EIMG" | cut -f1)

"$DXFS" mount "$DIMG" "$MNT" --daemon
mount_cmp=$(python3 "$HERE/tree_compare.py" "$SRC" "$MNT" | tail -1); mount_rc=${PIPESTATUS[0]}
umount "$MNT"
for _ in $(seq 1 100); do fuser -s "$DIMG" 2>/dev/null || break; sleep 0.1; done
OUT=$WORK/export
ex_t=$(time_of "$DXFS" export "$DIMG" "$OUT")
export_cmp=$(python3 "$HERE/tree_compare.py" "$SRC" "$OUT" | tail -1); export_rc=${PIPESTATUS[0]}

echo
echo "Source: /usr/share/doc + /usr/include + extras, $(find "$SRC" | wc -l) paths, $((bytes / 1048576)) MiB; images of ${size_mib} MiB on /dev/shm; $RUNS runs, medians; $(nproc) CPUs, $(uname -r)"
echo
echo "| | dxfs mkfs -d | mke2fs -t ext4 -d | dxfs / ext4 |"
echo "|---|---|---|---|"
echo "| seconds (runs: ${dx[*]} / ${e4[*]}) | $dx_med | $e4_med | $(echo "scale=2; $dx_med / $e4_med" | bc) |"
echo "| MiB the image holds | $((dx_used / 1048576)) | $((e4_used / 1048576)) | $(echo "scale=2; $dx_used / $e4_used" | bc) |"
echo
echo "- through the mount: $mount_cmp"
echo "- dxfs export (${ex_t} s): $export_cmp"
[ "$mount_rc" -eq 0 ] && [ "$export_rc" -eq 0 ]
