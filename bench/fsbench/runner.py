"""The run: check and install tools, probe each filesystem, run every selected workload
on every available filesystem with a fresh volume, and collect the results."""

import datetime
import os
import shlex
import shutil
import tempfile
import time
import traceback

from . import system
from .cleanup import Teardown, Watchdog
from .context import Ctx, PhaseTimeout, Progress
from .datagen import Inputs
from .filesystems import MIB, Volume, device_placeholder, storage
from .floor import python_floor
from .report import add_ratios
from .workloads import WORKLOADS

SCHEMA = "fsbench/1"


def repo_root():
    return os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def git_describe(repo):
    """Commit and whether src/ has uncommitted changes, for the report."""
    try:
        head = system.run(["git", "-C", repo, "rev-parse", "--short", "HEAD"]).stdout.strip()
        dirty = system.run(["git", "-C", repo, "status", "--porcelain", "--", "src"]).stdout.strip()
        return f"{head}{' + uncommitted changes in src/' if dirty else ''}"
    except (OSError, system.CommandError):
        return None


def host_unavailable_reason():
    """Why no filesystem at all can run here, or None."""
    if os.geteuid() != 0:
        return "not running as root (loop devices, mount and drop_caches need root)"
    if not os.path.exists("/dev/loop-control"):
        return "/dev/loop-control missing (no loop device support)"
    if not os.path.isdir("/dev/shm"):
        return "/dev/shm (tmpfs) missing"
    return None


class Runner:
    def __init__(self, scale, fs_all, fs_names, workload_keys, install=True, progress=None, delay_ms=None):
        self.scale = scale
        self.delay_ms = delay_ms  # None: tmpfs; else every volume is served by nbdkit with this delay
        self.fs_all = fs_all
        self.fs_names = fs_names
        self.workloads = [WORKLOADS[k] for k in workload_keys]
        self.install = install
        self.progress = progress or Progress()
        self.log = self.progress.log
        self.teardown = Teardown(self.log)
        self.watchdog = Watchdog(self.log)
        self.workdir = None
        self.inputs = None
        self._volumes = 0

    # -- setup -----------------------------------------------------------------------
    def _prepare_tools(self):
        tools = {t for n in self.fs_names for t in self.fs_all[n].tools}
        tools |= {t for w in self.workloads for t in w.tools}
        tools |= {"losetup", "tar"}
        if self.delay_ms is not None:
            tools |= {"nbdkit", "nbdfuse", "fusermount3"}
        if self.install:
            system.install_tools(sorted(tools), self.log)

    def _tool_versions(self):
        versions = {
            "e2fsprogs": system.tool_version(["mkfs.ext4", "-V"]),
            "xfsprogs": system.tool_version(["mkfs.xfs", "-V"]),
            "btrfs-progs": system.tool_version(["btrfs", "--version"]),
            "fuse2fs": system.tool_version(["fuse2fs", "-V"]),
            "fuse3": system.tool_version(["fusermount3", "-V"]),
            "fio": system.tool_version(["fio", "--version"]),
            "tar": system.tool_version(["tar", "--version"]),
        }
        if self.delay_ms is not None:
            versions["nbdkit"] = system.tool_version(["nbdkit", "--version"])
            versions["nbdfuse"] = system.tool_version(["nbdfuse", "--version"])
        dxfs = self.fs_all.get("dxfs")
        if dxfs is not None and dxfs.binary and os.access(dxfs.binary, os.X_OK):
            versions["dxfs"] = system.tool_version([dxfs.binary, "--version"])
        return versions

    def _new_volume(self, fs, mib, tag):
        self._volumes += 1
        vol = Volume(fs, mib * MIB, self.workdir, self.teardown, f"{fs.name}-{tag}-{self._volumes}", self.delay_ms)
        try:
            vol.create()
            vol.mount()
        except BaseException:
            vol.destroy(check=False)
            raise
        return vol

    def _probe(self, fs):
        """Why `fs` cannot run (tools, mkfs, mount, a write, fsck), or None if it can."""
        reason = fs.unavailable_reason() or self._storage_unavailable_reason(fs)
        if reason:
            return reason
        vol = None
        try:
            vol = self._new_volume(fs, self.scale.small_volume_mib, "probe")
            with open(os.path.join(vol.mnt, "probe"), "wb") as f:
                f.write(b"x" * 65536)
                os.fsync(f.fileno())
            fsck = vol.destroy(check=True)
            if fsck and not fsck["clean"]:
                return f"fsck after a probe write is not clean: {fsck['output']}"
        except Exception as e:
            return f"{type(e).__name__}: {e}"
        finally:
            if vol is not None:
                vol.destroy(check=False)
        return None

    def _storage_unavailable_reason(self, fs):
        """Why the volumes of `fs` cannot be served with a delay (nbdkit, nbdfuse missing), or None."""
        if self.delay_ms is None:
            return None
        missing = system.missing_tools(("nbdkit",) if fs.nbd_client else ("nbdkit", "nbdfuse", "fusermount3"))
        return f"{', '.join(missing)} not installed (needed by --delay-ms)" if missing else None

    # -- the run ---------------------------------------------------------------------
    def run(self, command):
        started = datetime.datetime.now(datetime.timezone.utc)
        t0 = time.monotonic()
        run_deadline = t0 + self.scale.total_budget_min * 60
        self.teardown.install()
        try:
            return self._run(command, started, t0, run_deadline)
        finally:
            self.watchdog.stop()
            self.teardown.unwind()

    def _run(self, command, started, t0, run_deadline):
        self._prepare_tools()
        self.workdir = tempfile.mkdtemp(prefix="fsbench-", dir="/dev/shm")
        self.teardown.push(f"remove {self.workdir}", lambda: shutil.rmtree(self.workdir, ignore_errors=True))
        self.inputs = Inputs(self.workdir, self.scale, self.log)
        self.watchdog.start()
        results = {
            "schema": SCHEMA,
            "command": command,
            "started_at": started.isoformat(timespec="seconds"),
            "mode": self.scale.name,
            "scale": self.scale.as_dict(),
            "storage": storage(self.delay_ms),
            "machine": system.machine_info(),
            "tools": self._tool_versions(),
            "dxfs_source": git_describe(repo_root()),
            "filesystems": {},
            "workloads": {},
        }
        self.log("measuring the Python floor on tmpfs")
        results["python_floor"] = python_floor(min(20_000, max(2_000, self.scale.files)))
        available = self._probe_all(results["filesystems"])
        for i, wl in enumerate(self.workloads, 1):
            entry = {
                "title": wl.title,
                "seeds": wl.seeds,
                "volume_mib": self.scale.small_volume_mib if wl.volume == "small" else self.scale.volume_mib,
                "doc": wl.doc,
                "metrics": [{"key": m.key, "label": m.label, "ratio": m.ratio} for m in wl.metrics],
                "results": {},
            }
            results["workloads"][wl.key] = entry
            for name in self.fs_names:
                label = f"[{i}/{len(self.workloads)} {wl.key}] {name}"
                entry["results"][name] = self._run_or_skip(wl, name, available, run_deadline, label)
        results["elapsed_s"] = round(time.monotonic() - t0, 1)
        results["finished_at"] = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
        add_ratios(results)
        return results

    def _probe_all(self, out):
        host = host_unavailable_reason()
        available = set()
        for name in self.fs_names:
            fs = self.fs_all[name]
            self.log(f"probing {name}")
            reason = host or self._probe(fs)
            desc = fs.describe(device_placeholder(fs, self.delay_ms))
            out[name] = {"available": reason is None, "reason": reason, **desc}
            if reason:
                self.log(f"{name}: not available: {reason}")
            else:
                available.add(name)
        return available

    def _run_or_skip(self, wl, name, available, run_deadline, label):
        if name not in available:
            return {"status": "not available", "reason": "filesystem not available (see filesystems)"}
        missing = system.missing_tools(wl.tools)
        if missing:
            return {"status": "not available", "reason": f"{', '.join(missing)} not installed"}
        if time.monotonic() >= run_deadline:
            return {"status": "skipped", "reason": "the run's total time budget was used up"}
        return self._run_one(wl, self.fs_all[name], min(time.monotonic() + self.scale.budget_s, run_deadline), label)

    def _run_one(self, wl, fs, deadline, label):
        """One workload on one filesystem, on fresh volumes that are checked and removed after."""
        ctx = Ctx(
            fs,
            self.scale,
            lambda mib: self._new_volume(fs, mib, wl.key),
            deadline,
            self.progress,
            label,
            inputs=self.inputs,
            watchdog=self.watchdog,
        )
        t0 = time.monotonic()
        self.log(f"{label}: start ({wl.title})")
        try:
            ctx.open_volume(self.scale.small_volume_mib if wl.volume == "small" else None)
            wl.fn(ctx)
        except PhaseTimeout as e:
            ctx.result.update(status="timeout", reason=str(e))
        except (KeyboardInterrupt, SystemExit):
            raise
        except Exception as e:
            ctx.result.update(status="error", reason=f"{type(e).__name__}: {e}", traceback=traceback.format_exc())
        finally:
            try:
                ctx.close_volume()
            except Exception as e:
                if ctx.result["status"] == "ok":
                    ctx.result.update(status="error", reason=f"teardown: {e}")
        result = ctx.result
        result["seconds"] = round(time.monotonic() - t0, 2)
        result["fsck_clean"] = all(f["clean"] for f in result["fsck"]) if result["fsck"] else None
        if result["fsck_clean"] is False:
            result["notes"].append("fsck reported problems after this workload: " + result["fsck"][-1]["output"])
        if result["status"] != "ok":
            self.log(f"{label}: {result['status']}: {result.get('reason')}")
        return result


def command_line(argv):
    """The command as typed, for the report (the script path relative to the repository)."""
    script = os.path.relpath(os.path.abspath(argv[0]), repo_root())
    return shlex.join(["python3", script, *argv[1:]])
