#!/usr/bin/env python3
"""Compare two directory trees in content and metadata: what `dxfs mkfs -d` and
`dxfs export` must preserve.

    python3 bench/tree_compare.py SOURCE COPY

Compares, for every path: type, mode, uid, gid, size, mtime (ns), rdev, symlink target,
file contents (SHA-256), xattrs (every namespace the caller may read, including the
POSIX ACLs in system.posix_acl_*), and the hard-link structure (paths that share an
inode in one tree share one in the other). Not compared: atime, ctime, directory sizes,
inode numbers. Prints every difference and a summary; exits 1 if there is any.
"""

import hashlib
import os
import stat
import sys


def walk(root):
    """path relative to root -> lstat result, for root and everything below it."""
    out = {"": os.lstat(root)}
    for dirpath, dirnames, filenames in os.walk(root):
        for n in dirnames + filenames:
            p = os.path.join(dirpath, n)
            out[os.path.relpath(p, root)] = os.lstat(p)
    return out


def xattrs(path):
    try:
        names = os.listxattr(path, follow_symlinks=False)
    except OSError:
        return {}
    got = {}
    for n in names:
        try:
            got[n] = os.getxattr(path, n, follow_symlinks=False)
        except OSError as e:
            got[n] = f"<error {e.errno}>"
    return got


def digest(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def main():
    if len(sys.argv) != 3:
        print(__doc__)
        return 2
    a_root, b_root = sys.argv[1], sys.argv[2]
    a, b = walk(a_root), walk(b_root)
    diffs = []
    for p in sorted(set(a) - set(b)):
        diffs.append(f"missing in copy: {p}")
    for p in sorted(set(b) - set(a)):
        diffs.append(f"extra in copy: {p}")
    counts = {"files": 0, "dirs": 0, "symlinks": 0, "special": 0, "xattrs": 0, "acls": 0, "bytes": 0}
    links_a, links_b = {}, {}
    for p in sorted(set(a) & set(b)):
        sa, sb = a[p], b[p]
        pa, pb = os.path.join(a_root, p), os.path.join(b_root, p)
        if stat.S_IFMT(sa.st_mode) != stat.S_IFMT(sb.st_mode):
            diffs.append(f"{p}: type {stat.S_IFMT(sa.st_mode):o} vs {stat.S_IFMT(sb.st_mode):o}")
            continue
        for field in ("st_mode", "st_uid", "st_gid"):
            if getattr(sa, field) != getattr(sb, field):
                diffs.append(f"{p}: {field} {getattr(sa, field)} vs {getattr(sb, field)}")
        if sa.st_mtime_ns != sb.st_mtime_ns:
            diffs.append(f"{p}: mtime {sa.st_mtime_ns} vs {sb.st_mtime_ns}")
        xa, xb = xattrs(pa), xattrs(pb)
        if xa != xb:
            diffs.append(f"{p}: xattrs {sorted(xa)} vs {sorted(xb)}")
        counts["xattrs"] += len([n for n in xa if not n.startswith("system.posix_acl")])
        counts["acls"] += len([n for n in xa if n.startswith("system.posix_acl")])
        if stat.S_ISREG(sa.st_mode):
            counts["files"] += 1
            counts["bytes"] += sa.st_size
            if sa.st_size != sb.st_size:
                diffs.append(f"{p}: size {sa.st_size} vs {sb.st_size}")
            elif digest(pa) != digest(pb):
                diffs.append(f"{p}: contents differ")
            if sa.st_nlink > 1:
                links_a.setdefault(sa.st_ino, set()).add(p)
                links_b.setdefault(sb.st_ino, set()).add(p)
        elif stat.S_ISDIR(sa.st_mode):
            counts["dirs"] += 1
        elif stat.S_ISLNK(sa.st_mode):
            counts["symlinks"] += 1
            if os.readlink(pa) != os.readlink(pb):
                diffs.append(f"{p}: symlink {os.readlink(pa)!r} vs {os.readlink(pb)!r}")
        else:
            counts["special"] += 1
            if sa.st_rdev != sb.st_rdev:
                diffs.append(f"{p}: rdev {sa.st_rdev} vs {sb.st_rdev}")
        if not stat.S_ISDIR(sa.st_mode) and sa.st_nlink != sb.st_nlink:
            diffs.append(f"{p}: nlink {sa.st_nlink} vs {sb.st_nlink}")
    groups_a = sorted(sorted(g) for g in links_a.values())
    groups_b = sorted(sorted(g) for g in links_b.values())
    if groups_a != groups_b:
        diffs.append(f"hard-link groups differ: {len(groups_a)} vs {len(groups_b)}")
    counts["hardlink_groups"] = len(groups_a)
    for d in diffs[:200]:
        print(d)
    if len(diffs) > 200:
        print(f"... and {len(diffs) - 200} more")
    print("compared: " + ", ".join(f"{k} {v}" for k, v in counts.items()) + f"; differences: {len(diffs)}")
    return 1 if diffs else 0


if __name__ == "__main__":
    sys.exit(main())
