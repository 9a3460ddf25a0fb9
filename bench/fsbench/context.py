"""What a workload sees: its volume, measured phases, cold remounts, bounded loops with
progress, and places to put metrics and time series.
"""

import os
import re
import subprocess
import sys
import time
from contextlib import contextmanager

from . import system

SECTOR = 512
_ANSI = re.compile(r"\x1b\[[0-9;]*m")
MIB = 1 << 20


class PhaseTimeout(Exception):
    """A workload ran past its time budget."""


class Progress:
    """One status line on stderr, rewritten in place on a terminal, throttled otherwise."""

    def __init__(self, stream=sys.stderr):
        self._stream = stream
        self._tty = stream.isatty()
        self._last = 0.0
        self._pending = False

    def log(self, text):
        self._end_status()
        print(text, file=self._stream, flush=True)

    def status(self, text, force=False):
        now = time.monotonic()
        if not force and now - self._last < (0.25 if self._tty else 5.0):
            return
        self._last = now
        if self._tty:
            self._stream.write("\r\033[K" + text)
            self._pending = True
            self._stream.flush()
        else:
            print(text, file=self._stream, flush=True)

    def _end_status(self):
        if self._pending:
            self._stream.write("\r\033[K")
            self._pending = False


def _snapshot(vol):
    pid = vol.daemon_pid
    return {
        "t": time.monotonic(),
        "app_cpu": system.own_cpu_seconds(),
        "daemon_cpu": system.process_cpu_seconds(pid) if pid else None,
        "disk": _disk(vol),
    }


def _disk(vol):
    """The volume's block counters; None without a device of its own (dxfs on NBD)."""
    return system.block_stats(vol.devname) if vol.devname else None


def _disk_delta(before, after):
    """Counter differences; each None when the volume has no block device to count."""
    if before is None or after is None:
        return dict.fromkeys(system.BLOCK_STAT_KEYS)
    return {k: after[k] - before[k] for k in before}


def _mib(sectors):
    return None if sectors is None else round(sectors * SECTOR / MIB, 3)


def _measure(before, after):
    """Wall and CPU time and block-device counters between two snapshots."""
    disk = _disk_delta(before["disk"], after["disk"])
    daemon = None
    if before["daemon_cpu"] is not None and after["daemon_cpu"] is not None:
        daemon = round(after["daemon_cpu"] - before["daemon_cpu"], 3)
    app = round(after["app_cpu"] - before["app_cpu"], 3)
    return {
        "wall_s": round(after["t"] - before["t"], 6),
        "app_cpu_s": app,
        "daemon_cpu_s": daemon,
        "cpu_s": round(app + (daemon or 0.0), 3),
        **disk,
        "read_mib": _mib(disk["read_sectors"]),
        "write_mib": _mib(disk["write_sectors"]),
    }


def _count(value):
    return "-" if value is None else value


class Phase:
    """Filled in by the workload while its phase runs."""

    def __init__(self):
        self.ops = None
        self.extra = {}


class Ctx:
    """The environment of one workload on one filesystem."""

    def __init__(self, fs, scale, new_volume, deadline, progress, label, inputs=None, watchdog=None):
        self.fs = fs
        self.inputs = inputs
        self.scale = scale
        self._new_volume = new_volume
        self.deadline = deadline
        self._progress = progress
        self._label = label
        self._watchdog = watchdog
        self.vol = None
        self._phase = None
        self._at_mount = None
        self._last_writer = None
        self.result = {"status": "ok", "phases": [], "metrics": {}, "series": {}, "fsck": [], "notes": []}

    # -- volumes -----------------------------------------------------------------------
    def open_volume(self, mib=None):
        """Replace the current volume (checked on the way out) by a fresh, mounted one of `mib` MiB."""
        self.close_volume()
        self.vol = self._new_volume(mib or self.scale.volume_mib)
        if self._watchdog:
            self._watchdog.arm(self.deadline, self.vol.abort)
        self.result.setdefault("mount", self.vol.mount_options())
        return self.vol

    def close_volume(self):
        if self.vol is None:
            return
        vol, self.vol = self.vol, None
        if self._watchdog:
            self._watchdog.disarm()
        try:
            self._unmount_measured(vol)
            fsck = vol.destroy(check=True)
        finally:
            self._keep_daemon_log(vol)
        if fsck:
            self.result["fsck"].append(fsck)

    def _unmount_measured(self, vol):
        """Unmount; the I/O the unmount itself does is added, as `after_unmount`, to the last
        writing phase since the volume was mounted (the one whose data it most likely is)."""
        if vol.mounted is None:
            return
        before = _disk(vol)
        t0 = time.monotonic()
        vol.unmount()
        unmount_s = time.monotonic() - t0
        after = _disk(vol)
        target = self._last_writer
        if target is not None and "after_unmount" not in target:
            spill = _disk_delta(before, after)
            spill["wall_s"] = round(unmount_s, 3)
            target["after_unmount"] = spill
        self._last_writer = None

    def _keep_daemon_log(self, vol):
        """What a FUSE daemon said on stderr, if anything (its last lines)."""
        try:
            text = vol.log_path.read_text(errors="replace")
        except OSError:
            return
        lines = [_ANSI.sub("", line) for line in text.splitlines() if line.strip()]
        if lines:
            self.result.setdefault("daemon_log", []).append({"lines": len(lines), "tail": lines[-5:]})

    @property
    def mnt(self):
        return str(self.vol.mnt)

    def path(self, *parts):
        return os.path.join(self.mnt, *parts)

    def cold(self):
        """Unmount, drop every cache, mount again; I/O done by the unmount goes to the last phase."""
        self._unmount_measured(self.vol)
        system.drop_caches()
        before = _disk(self.vol)
        t0 = time.monotonic()
        self.vol.mount()
        self._at_mount = _disk_delta(before, _disk(self.vol))
        self._at_mount["wall_s"] = round(time.monotonic() - t0, 3)

    def flush(self):
        """Make the phase's writes reach the loop device: syncfs the mount, fsync the device
        (dxfs on NBD has none: its commit flushes the export itself).

        Returns None, or the error syncfs reported (kept in the phase and the notes, since a
        filesystem that cannot sync is a finding, not a reason to stop measuring).
        """
        error = None
        try:
            system.syncfs(self.mnt)
            if self.vol.fs.kind == "fuse":
                # FUSE has no request for syncfs (the kernel only writes back its own
                # dirty pages), so also fsync the mount's root directory: FSYNCDIR
                # reaches the daemon, which for dxfs commits the whole delta.
                dfd = os.open(self.mnt, os.O_RDONLY | os.O_DIRECTORY)
                try:
                    os.fsync(dfd)
                finally:
                    os.close(dfd)
        except OSError as e:
            error = f"sync: {e.strerror} (errno {e.errno})"
            self.note(error)
        if self.vol.devname is None:
            return error
        fd = os.open(self.vol.dev, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
        return error

    # -- phases ------------------------------------------------------------------------
    @contextmanager
    def phase(self, name, *, cold=False, sync=True):
        """Measure the body: wall, CPU (runner + daemon), loop-device requests and sectors.

        `cold` remounts with dropped caches first; `sync` flushes to the device at the end,
        inside the measurement, so that deferred writes are counted.
        """
        self.check_deadline()
        if cold:
            self.cold()
        ph = self._phase = Phase()
        outcome = "ok"
        self._progress.status(f"{self._label}: {name}", force=True)
        before = _snapshot(self.vol)
        try:
            yield ph
        except PhaseTimeout:
            outcome = "timeout"
            raise
        except BaseException:
            outcome = "error"
            raise
        finally:
            self._phase = None
            ops_end = time.monotonic()
            if sync and outcome == "ok":
                ph.extra["flush_error"] = self.flush()
            after = _snapshot(self.vol)
            rec = self._record(name, cold, ph, outcome, before, after, ops_end)
            if sync:
                self._last_writer = rec

    def _record(self, name, cold, ph, outcome, before, after, ops_end):
        rec = {"name": name, "cold": cold, "outcome": outcome, **_measure(before, after)}
        rec["sync_s"] = round(after["t"] - ops_end, 6)
        rec["ops"] = ph.ops
        rec["us_per_op"] = round((ops_end - before["t"]) * 1e6 / ph.ops, 2) if ph.ops else None
        rec["extra"] = ph.extra
        if cold and self._at_mount is not None:
            rec["at_mount"], self._at_mount = self._at_mount, None
        self.result["phases"].append(rec)
        self._progress.log(
            f"{self._label}: {name:<22} {rec['wall_s']:9.3f} s  cpu {rec['cpu_s']:7.3f} s  "
            f"rd {_count(rec['read_requests']):>7}  wr {_count(rec['write_requests']):>7}"
            + (f"  {rec['us_per_op']:.1f} us/op" if rec["us_per_op"] else "")
            + ("" if outcome == "ok" else f"  [{outcome}]")
        )
        return rec

    # -- time budget and progress ----------------------------------------------------
    def remaining(self):
        return self.deadline - time.monotonic()

    def check_deadline(self):
        if self.remaining() <= 0:
            raise PhaseTimeout(f"time budget of {self.scale.budget_s:g} s used up")

    def loop(self, items, label, total=None):
        """Yield `items` with a running count on the status line, stopping at the deadline.

        The count of items handed out so far becomes the current phase's `ops`.
        """
        total = len(items) if total is None else total
        ph = self._phase
        done = 0
        for item in items:
            if done & 127 == 0:
                if ph is not None:
                    ph.ops = done
                self.check_deadline()
                self._progress.status(f"{self._label}: {label} {done}/{total}")
            yield item
            done += 1
        if ph is not None:
            ph.ops = done

    def status(self, text):
        self._progress.status(f"{self._label}: {text}")

    def run_cmd(self, cmd, *, cwd=None, check=True):
        """Run a command within the time budget; PhaseTimeout (child killed) if it overruns."""
        try:
            done = subprocess.run(
                [str(c) for c in cmd],
                cwd=cwd,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
                timeout=max(self.remaining(), 1.0),
            )
        except subprocess.TimeoutExpired:
            raise PhaseTimeout(f"{cmd[0]} overran the time budget") from None
        if check and done.returncode != 0:
            raise system.CommandError(f"{' '.join(map(str, cmd))}: exit {done.returncode}: {system.tail(done.stderr)}")
        return done

    # -- results -----------------------------------------------------------------------
    def last_phase(self):
        return self.result["phases"][-1]

    def metric(self, key, value):
        self.result["metrics"][key] = value

    def series(self, key, points):
        self.result["series"][key] = points

    def note(self, text):
        if text not in self.result["notes"]:
            self.result["notes"].append(text)


def dir_size(path):
    """st_size and allocated bytes (st_blocks * 512) of a directory."""
    st = os.stat(path)
    return st.st_size, st.st_blocks * 512


def df(path):
    """What statvfs (df) says: total, free, available and used bytes, and used %."""
    st = os.statvfs(path)
    total = st.f_blocks * st.f_frsize
    free = st.f_bfree * st.f_frsize
    avail = st.f_bavail * st.f_frsize
    used = total - free
    return {
        "total_bytes": total,
        "free_bytes": free,
        "avail_bytes": avail,
        "used_bytes": used,
        "used_percent": round(100.0 * used / total, 2) if total else None,
    }
