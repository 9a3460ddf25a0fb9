"""Thin wrappers around the operating system: commands, /proc and /sys readers,
cache dropping, tool installation and a description of the machine.

Nothing in here knows about filesystems or workloads.
"""

import ctypes
import os
import platform
import re
import resource
import shutil
import subprocess
import sys
import time

_LIBC = ctypes.CDLL(None, use_errno=True)
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")

# Which Debian package brings which command.
APT_PACKAGES = {
    "mkfs.ext4": "e2fsprogs",
    "e2fsck": "e2fsprogs",
    "mkfs.xfs": "xfsprogs",
    "xfs_repair": "xfsprogs",
    "mkfs.btrfs": "btrfs-progs",
    "btrfs": "btrfs-progs",
    "fuse2fs": "fuse2fs",
    "fusermount3": "fuse3",
    "fio": "fio",
    "losetup": "mount",
    "tar": "tar",
    "nbdkit": "nbdkit",
    "nbdfuse": "libnbd-bin",
}


class CommandError(RuntimeError):
    """A command failed; the message carries its exit code and the end of its output."""


def run(cmd, *, check=True, timeout=None, input=None):
    """Run a command, capture its output, and raise CommandError on failure if `check`."""
    proc = subprocess.run(
        [str(c) for c in cmd],
        input=input,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        timeout=timeout,
    )
    if check and proc.returncode != 0:
        raise CommandError(f"{' '.join(map(str, cmd))}: exit {proc.returncode}: {tail(proc.stderr or proc.stdout)}")
    return proc


def tail(text, lines=3):
    """The last few non-empty lines of some output, joined for an error message."""
    kept = [line.strip() for line in (text or "").splitlines() if line.strip()]
    return " | ".join(kept[-lines:])


def missing_tools(tools):
    """The commands among `tools` that are not on PATH."""
    return [t for t in tools if shutil.which(t) is None]


def install_tools(tools, log):
    """apt-get install the packages that bring the missing `tools`; return what is still missing."""
    missing = missing_tools(tools)
    packages = sorted({APT_PACKAGES[t] for t in missing if t in APT_PACKAGES})
    if packages and os.geteuid() == 0 and shutil.which("apt-get"):
        log(f"installing {' '.join(packages)} with apt-get")
        env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
        for cmd in (["apt-get", "update", "-qq"], ["apt-get", "install", "-y", "-qq", *packages]):
            done = subprocess.run(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
            if done.returncode != 0:
                log(f"{' '.join(cmd)} failed: {tail(done.stderr)}")
                break
    return missing_tools(tools)


def ensure_matplotlib(log):
    """Import matplotlib with the Agg backend, pip-installing it once if missing; None if impossible."""
    try:
        import matplotlib
    except ImportError:
        log("installing matplotlib with pip")
        done = subprocess.run(
            [sys.executable, "-m", "pip", "install", "-q", "matplotlib"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        if done.returncode != 0:
            log(f"pip install matplotlib failed: {tail(done.stderr)}")
            return None
        import matplotlib
    matplotlib.use("Agg")
    return matplotlib


def syncfs(path):
    """syncfs(2) on the filesystem holding `path`."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        if _LIBC.syncfs(fd) != 0:
            err = ctypes.get_errno()
            raise OSError(err, os.strerror(err), path)
    finally:
        os.close(fd)


def drop_caches():
    """Write back everything, then drop the page cache, dentries and inodes."""
    os.sync()
    with open("/proc/sys/vm/drop_caches", "w") as f:
        f.write("3\n")


def process_cpu_seconds(pid):
    """user+sys CPU seconds of a process (all its threads) from /proc/PID/stat, or None if gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            stat = f.read()
    except OSError:
        return None
    # The command name may hold spaces and parentheses: split after the last ')'.
    fields = stat[stat.rindex(")") + 2 :].split()
    utime, stime = int(fields[11]), int(fields[12])
    return (utime + stime) / CLOCK_TICKS


def own_cpu_seconds():
    """user+sys CPU seconds of this process plus its waited-for children."""
    me = resource.getrusage(resource.RUSAGE_SELF)
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime


# Field positions in /sys/block/DEV/stat (Documentation/block/stat.rst).
_DISKSTAT_FIELDS = {
    "read_requests": 0,
    "read_sectors": 2,
    "write_requests": 4,
    "write_sectors": 6,
    "discard_requests": 11,
    "flush_requests": 15,
}
BLOCK_STAT_KEYS = tuple(_DISKSTAT_FIELDS)


def block_stats(devname):
    """The request and sector counters of a block device such as 'loop3'."""
    with open(f"/sys/block/{devname}/stat") as f:
        values = [int(v) for v in f.read().split()]
    return {key: (values[i] if i < len(values) else 0) for key, i in _DISKSTAT_FIELDS.items()}


def mount_entry(mountpoint):
    """The /proc/self/mountinfo entry for `mountpoint` as a dict, or None if nothing is mounted there."""
    target = os.path.realpath(mountpoint)
    with open("/proc/self/mountinfo") as f:
        for line in f:
            parts = line.split()
            point = parts[4].replace("\\040", " ")
            if point != target:
                continue
            sep = parts.index("-")
            return {
                "device_number": parts[2],
                "options": parts[5],
                "fstype": parts[sep + 1],
                "source": parts[sep + 2],
                "super_options": parts[sep + 3] if len(parts) > sep + 3 else "",
            }
    return None


def wait_until(predicate, timeout, interval=0.02):
    """Poll `predicate` until it is true or `timeout` seconds pass; return its last value."""
    end = time.monotonic() + timeout
    while True:
        value = predicate()
        if value or time.monotonic() >= end:
            return value
        time.sleep(interval)


def _cpu_model():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def _mem_total_gib():
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemTotal:"):
                return round(int(line.split()[1]) / 1024 / 1024, 1)
    return None


def _os_release():
    try:
        with open("/etc/os-release") as f:
            for line in f:
                if line.startswith("PRETTY_NAME="):
                    return line.split("=", 1)[1].strip().strip('"')
    except OSError:
        pass
    return "unknown"


def machine_info():
    """nproc, memory, kernel, CPU model, OS and Python version of this machine."""
    return {
        "nproc": os.cpu_count(),
        "memory_gib": _mem_total_gib(),
        "kernel": platform.release(),
        "cpu": _cpu_model(),
        "os": _os_release(),
        "python": platform.python_version(),
    }


def tool_version(cmd):
    """The first line a `--version`-style command prints, or None if it cannot run."""
    try:
        proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return None
    for line in proc.stdout.splitlines():
        line = line.strip()
        if line and re.search(r"\d", line):
            return line
    return None
