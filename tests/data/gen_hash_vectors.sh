#!/usr/bin/env bash
# Regenerate hash_vectors.txt (next to this script) from e2fsprogs' debugfs, the oracle
# for src/hash.rs. Output lines: "version seed_uuid name_hex major_hex minor_hex", with
# major/minor exactly as `debugfs -R "dx_hash -h N -s SEED NAME"` prints them.
#
# Names use only [A-Za-z0-9._+,=@] and bytes 0x80..0xff: debugfs splits its -R line with
# libss (space, tab and '"' are special), getopt would eat a leading '-', and the bytes
# travel through bash variables, so anything else is left to the live test in hash.rs.
# The names are deterministic (an LCG below), so reruns give the same file.
set -euo pipefail
export LC_ALL=C # sed must treat the raw high bytes as plain bytes

DEBUGFS=${DEBUGFS:-/usr/sbin/debugfs}
MKFS=${MKFS:-mkfs.ext4}
here=$(cd "$(dirname "$0")" && pwd)
out="$here/hash_vectors.txt"

img=$(mktemp /tmp/dxfs-hashvec.XXXXXX)
trap 'rm -f "$img" "$out.tmp"' EXIT
"$MKFS" -q -F "$img" 4M >/dev/null 2>&1

seeds=(
  00000000-0000-0000-0000-000000000000 # all zero: MD4 initial values
  6b1c5a3e-9d2f-4e7a-8c11-0f3b2a4d5e6f
  01234567-89ab-cdef-fedc-ba9876543210 # the MD4 IVs spelled out: same as all zero
  00000000-0000-0000-0000-000000000001 # mostly zero but used as-is
  ffffffff-ffff-ffff-ffff-ffffffffffff
  d4c3b2a1-0f1e-2d3c-4b5a-69788796a5b4
)
lengths=(1 2 3 4 5 7 8 15 16 17 31 32 33 63 64 100 200 254 255)
ascii='ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789._+,=@'

lcg=20240601
rand() { # next pseudo-random number in 0..32767, left in $r
  lcg=$(((lcg * 1103515245 + 12345) & 0x7fffffff))
  r=$((lcg >> 16))
}

# make_name LEN HIGH_PERCENT: hex of a name, in $hex
make_name() {
  local len=$1 high=$2 i c
  hex=
  for ((i = 0; i < len; i++)); do
    rand
    if ((r % 100 < high)); then
      rand
      c=$((0x80 + r % 128))
    else
      rand
      printf -v c '%d' "'${ascii:r % ${#ascii}:1}"
    fi
    hex+=$(printf '%02x' "$c")
  done
}

# emit SEED HEX: one line per hash version
emit() {
  local seed=$1 hex=$2 name v res
  name=$(printf "$(sed 's/../\\x&/g' <<<"$hex")")
  for v in 0 1 2 3 4 5; do
    res=$("$DEBUGFS" -R "dx_hash -h $v -s $seed $name" "$img" 2>/dev/null |
      sed -n 's/^Hash of .* is 0x\([0-9a-f]*\) (minor 0x\([0-9a-f]*\))$/\1 \2/p')
    [[ -n $res ]] || { echo "no answer for -h $v -s $seed $hex" >&2; exit 1; }
    read -r maj min <<<"$res"
    printf '%d %s %s %08x %08x\n' "$v" "$seed" "$hex" "0x$maj" "0x$min"
  done
}

{
  echo "# ext4 dirhash vectors from $("$DEBUGFS" -V 2>&1 | head -n1); made by gen_hash_vectors.sh"
  echo "# version seed_uuid name_hex major_hex minor_hex (as debugfs dx_hash prints them)"
  for seed in "${seeds[@]}"; do
    for len in "${lengths[@]}"; do
      make_name "$len" 0 && emit "$seed" "$hex"   # 7-bit only
      make_name "$len" 50 && emit "$seed" "$hex"  # about half bytes >= 0x80
    done
  done
  # Extras: the check value ("café"), all-high names, and legacy names whose
  # dx_hack_hash is 0xfffffffe, the EOF marker the kernel (not debugfs) remaps.
  for seed in "${seeds[@]:0:2}"; do
    emit "$seed" 636166c3a9
    make_name 255 100 && emit "$seed" "$hex"
    make_name 254 100 && emit "$seed" "$hex"
    emit "$seed" "$(printf 'c3a9%.0s' {1..127})"
  done
  emit "${seeds[1]}" 656f66615a4b6d5737 # eofaZKmW7
  emit "${seeds[1]}" 656f66626e43676858 # eofbnCghX
} >"$out.tmp"
mv "$out.tmp" "$out"
echo "wrote $(grep -vc '^#' "$out") vectors to $out"
