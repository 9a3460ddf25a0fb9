#!/bin/bash
# Install xfstests build/run deps (Debian). Unavailable packages are skipped and listed.
export DEBIAN_FRONTEND=noninteractive
apt-get update -q >/dev/null 2>&1
PKGS="acl attr automake bc dbench dump e2fsprogs fio gawk gcc indent libacl1-dev libaio-dev libcap-dev libgdbm-dev libtool libtool-bin liburing-dev lvm2 make psmisc python3 quota sed uuid-dev uuid-runtime xfsprogs xfslibs-dev sqlite3 libgdbm-compat-dev pkg-config xfsdump"
avail=""; missing=""
for p in $PKGS; do
  if apt-cache show "$p" >/dev/null 2>&1; then avail="$avail $p"; else missing="$missing $p"; fi
done
echo "unavailable:$missing"
apt-get install -y -q --no-install-recommends $avail
# users/groups per xfstests README
id fsgqa >/dev/null 2>&1 || useradd -m fsgqa
id 123456-fsgqa >/dev/null 2>&1 || useradd 123456-fsgqa
id fsgqa2 >/dev/null 2>&1 || useradd fsgqa2
getent group fsgqa >/dev/null || groupadd fsgqa
