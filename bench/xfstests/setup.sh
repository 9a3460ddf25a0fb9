#!/bin/bash
# One-time setup for running xfstests on dxfs (run after install.sh and build.sh).
# - installs the mount(8) helper /sbin/mount.fuse.dxfs (runs the copied /tmp/xfst/dxfs)
# - makes two fresh 2G images, attaches each to a loop device (so xfstests sees a block
#   device as TEST_DEV/SCRATCH_DEV and dxfs mounts it as fuseblk, its default as root)
# - writes xfstests/local.config
# - patches xfstests' _fs_type so that "fuse.dxfs"/"fuseblk.dxfs" count as FSTYP=fuse
# - patches _check_dev_fs (fuse) to log `dxfs fsck -n` of the scratch device after each
#   test that used it, when DXFS_FSCK_LOG is set (informational; never fails a test)
# - makes _scratch_mkfs really run `dxfs mkfs -f $SCRATCH_DEV` (stock xfstests only empties
#   the scratch fs for FSTYP=fuse, so a test that overwrites the device, e.g. generic/570
#   mkswap, would leave later tests on a destroyed volume)
set -e
X=/tmp/xfst
REPO=$(cd "$(dirname "$0")/../.." && pwd)
mkdir -p $X
# A copy: the build may change under a long run.
[ -x $X/dxfs ] || cp $REPO/target/release/dxfs $X/dxfs
install -m 644 "$(dirname "$0")/xfstests-dxfs.patch" $X/xfstests-dxfs.patch
install -m 755 "$(dirname "$0")/mount.fuse.dxfs" /sbin/mount.fuse.dxfs
mkdir -p /mnt/xfst-test /mnt/xfst-scratch $X/logs
for n in test scratch; do
  img=/var/tmp/xfst-$n.img
  $X/dxfs mkfs -f -s 2G $img
done
if [ ! -f $X/loops.env ]; then
  TL=$(losetup -f --show /var/tmp/xfst-test.img)
  SL=$(losetup -f --show /var/tmp/xfst-scratch.img)
  echo "TEST_LOOP=$TL" > $X/loops.env
  echo "SCRATCH_LOOP=$SL" >> $X/loops.env
fi
. $X/loops.env
cat > $X/xfstests/local.config <<EOC
export FSTYP=fuse
export FUSE_SUBTYP=.dxfs
export TEST_DEV=$TEST_LOOP
export TEST_DIR=/mnt/xfst-test
export SCRATCH_DEV=$SCRATCH_LOOP
export SCRATCH_MNT=/mnt/xfst-scratch
export MOUNT_OPTIONS="-oallow_other,default_permissions"
export TEST_FS_MOUNT_OPTS="-oallow_other,default_permissions"
EOC
cd $X/xfstests
grep -q '_dxfs_fsck_log' common/rc || patch -p1 < $X/xfstests-dxfs.patch
