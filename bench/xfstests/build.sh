#!/bin/bash
# Build xfstests in /tmp/xfst/xfstests (XFSTESTS_GIT: where to clone it from; the runs
# of 2026-11-30 used a mirror of kdave/xfstests at 63a29724).
set -e
mkdir -p /tmp/xfst && cd /tmp/xfst
[ -d xfstests ] || git clone "${XFSTESTS_GIT:-https://git.kernel.org/pub/scm/fs/xfs/xfstests-dev.git}" /tmp/xfst/xfstests
cd xfstests
nice -n 10 make -j2
