"""The common metadata operations, each run over a list of names: shared by
bench/requests.py (requests per operation) and bench/metadata.py (time against ext4)."""
import os


def drop_caches():
    """Drop dentries and inodes (not the page cache): a cold lookup, not a cold disk."""
    with open("/proc/sys/vm/drop_caches", "w") as f:
        f.write("2\n")


SUBDIRS = 10_000


def tree_name(p):
    """Where `rm -rf` finds name `p`: in the subdirectory `tree`."""
    head, tail = os.path.split(p)
    return os.path.join(head, "tree", tail)


def make_ops(d, names):
    """(label, function, setup, teardown, count) for each operation, in an order where
    each finds what the one before left: the files exist from `create` until `unlink`.
    Setup and teardown (None, or untimed functions) run before and after; `count` is the
    number of operations the function does."""

    def create():
        for p in names:
            os.close(os.open(p, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644))

    def open_close():
        for p in names:
            os.close(os.open(p, os.O_RDONLY))

    def stat_warm():
        for p in names:
            os.stat(p)

    def stat_cold():
        drop_caches()
        for p in names:
            os.stat(p)

    def chmod():
        for p in names:
            os.chmod(p, 0o600)

    def setxattr():
        for p in names:
            os.setxattr(p, "user.foo", b"bar")

    def getxattr_missing():
        for p in names:
            try:
                os.getxattr(p, "user.missing")
            except OSError:
                pass

    def ls_l():
        drop_caches()
        for e in os.scandir(d):
            e.stat(follow_symlinks=False)

    def rename():
        for p in names:
            os.rename(p, p + ".r")

    def unlink():
        for p in names:
            os.unlink(p + ".r")

    def rm_rf_fill():
        os.mkdir(os.path.join(d, "tree"))
        for p in names:
            os.close(os.open(tree_name(p), os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644))
        drop_caches()

    def rm_rf():
        # As `rm -rf` does it: read the directory, unlink each entry, remove it.
        tree = os.path.join(d, "tree")
        for e in os.scandir(tree):
            os.unlink(e.path)
        os.rmdir(tree)

    half = len(names) // 2

    def steady_fill():
        for p in names[:half]:
            os.close(os.open(p, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644))

    def steady():
        # Seed 000's steady state: create one, delete the oldest, at a fixed population
        # of half the names (made by `steady_fill`, untimed).
        for i in range(len(names)):
            os.close(os.open(names[(half + i) % len(names)], os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644))
            os.unlink(names[i])

    def steady_drain():
        for i in range(len(names), len(names) + half):
            os.unlink(names[i % len(names)])

    # dxfs allows 65,000 subdirectories per directory (LINK_MAX), ext4 more (dir_nlink).
    subdirs = names[:SUBDIRS]

    def mkdir():
        for p in subdirs:
            os.mkdir(p)

    def rmdir():
        for p in subdirs:
            os.rmdir(p)

    timed = [
        ("create (O_CREAT|O_EXCL + close)", create),
        ("open + close", open_close),
        ("stat, warm", stat_warm),
        ("stat, cold (dentries dropped)", stat_cold),
        ("chmod", chmod),
        ("setxattr user.foo", setxattr),
        ("getxattr of a missing name", getxattr_missing),
        ("ls -l, cold (per entry)", ls_l),
        ("rename", rename),
        ("unlink", unlink),
    ]
    n = len(names)
    return [(label, fn, None, None, n) for label, fn in timed] + [
        ("rm -rf, cold (per entry)", rm_rf, rm_rf_fill, None, n),
        ("steady state: create + unlink, per cycle", steady, steady_fill, steady_drain, n),
        ("mkdir", mkdir, None, None, len(subdirs)),
        ("rmdir", rmdir, None, None, len(subdirs)),
    ]
