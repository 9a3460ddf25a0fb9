"""The cost of the workload code itself: the same per-file loops on tmpfs, where the
filesystem does almost nothing, so the report can say how much of each µs/op is Python."""

import os
import shutil
import tempfile
import time

from .datagen import numbered_names

CREATE_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC


def _timed_per_op(fn, names):
    t0 = time.perf_counter()
    fn(names)
    return round((time.perf_counter() - t0) * 1e6 / len(names), 3)


def python_floor(count=20_000, where="/dev/shm"):
    """µs per operation of the runner's create, stat, unlink and bare loops on tmpfs."""
    top = tempfile.mkdtemp(prefix="fsbench-floor-", dir=where)
    try:
        names = numbered_names("file_name_", count)
        dfd = os.open(top, os.O_RDONLY | os.O_DIRECTORY)
        try:

            def bare(ns):
                for _ in ns:
                    pass

            def create(ns):
                for n in ns:
                    os.close(os.open(n, CREATE_FLAGS, 0o644, dir_fd=dfd))

            def stat(ns):
                for n in ns:
                    os.stat(n, dir_fd=dfd, follow_symlinks=False)

            def unlink(ns):
                for n in ns:
                    os.unlink(n, dir_fd=dfd)

            return {
                "filesystem": "tmpfs",
                "files": count,
                "loop_us": _timed_per_op(bare, names),
                "create_us": _timed_per_op(create, names),
                "stat_us": _timed_per_op(stat, names[::-1]),
                "unlink_us": _timed_per_op(unlink, names),
            }
        finally:
            os.close(dfd)
    finally:
        shutil.rmtree(top, ignore_errors=True)
