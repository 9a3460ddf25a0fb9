"""The filesystems under test, and volumes: a sparse file on tmpfs, attached to a loop
device, formatted, mounted, checked and torn down.

Every filesystem, dxfs included, sits on a loop device so that /sys/block/loopN/stat
counts its I/O the same way. With a delay (storage with latency) the file is served by
nbdkit's delay filter instead: kernel filesystems and fuse2fs sit on a loop device over
nbdfuse's view of the export, dxfs uses its own NBD client and so has no loop device
(no counters).
"""

import os
import signal
import subprocess
import time
from pathlib import Path

from . import cleanup, system
from .system import CommandError, run

MIB = 1 << 20


class Filesystem:
    """How to make, mount and check one kind of filesystem."""

    name = ""
    kind = ""  # "kernel" or "fuse"
    tools = ()
    nbd_client = False  # takes an nbd+unix:// URI wherever it takes a device

    def mkfs_cmd(self, dev):
        raise NotImplementedError

    def fsck_cmd(self, dev):
        raise NotImplementedError

    def mount(self, dev, mnt, log_path):
        """Mount `dev` on `mnt` and return a mount handle with .unmount()."""
        raise NotImplementedError

    def mount_cmd(self, dev, mnt):
        raise NotImplementedError

    def unavailable_reason(self):
        """Why this filesystem cannot run here (missing tools), or None."""
        missing = system.missing_tools(self.tools)
        return f"{', '.join(missing)} not installed" if missing else None

    def describe(self, dev="DEV"):
        """The exact commands used, with placeholders, for the report."""
        return {
            "kind": self.kind,
            "mkfs": " ".join(self.mkfs_cmd(dev)),
            "mount": " ".join(self.mount_cmd(dev, "DIR")),
            "fsck": " ".join(self.fsck_cmd(dev)),
        }


class KernelFs(Filesystem):
    kind = "kernel"

    def __init__(self, name, fstype, mkfs, fsck, tools):
        self.name, self._fstype, self._mkfs, self._fsck, self.tools = name, fstype, mkfs, fsck, tools

    def mkfs_cmd(self, dev):
        return [*self._mkfs, dev]

    def fsck_cmd(self, dev):
        return [*self._fsck, dev]

    def mount_cmd(self, dev, mnt):
        return ["mount", "-t", self._fstype, dev, mnt]

    def mount(self, dev, mnt, log_path):
        try:
            run(self.mount_cmd(dev, mnt), timeout=120)
        except BaseException:
            # Stopped half way (a signal, a timeout): the kernel may have mounted all the same.
            if system.mount_entry(mnt) is not None:
                run(["umount", "-l", mnt], check=False, timeout=60)
            raise
        return KernelMount(mnt)


class FuseFs(Filesystem):
    """A filesystem served by a daemon that the runner starts in the foreground, so
    that its pid is known (for CPU time) and it is the runner's own child."""

    kind = "fuse"

    def __init__(self, name, daemon, mkfs, fsck, tools):
        self.name, self._daemon, self._mkfs, self._fsck, self.tools = name, daemon, mkfs, fsck, tools

    def mkfs_cmd(self, dev):
        return [*self._mkfs, dev]

    def fsck_cmd(self, dev):
        return [*self._fsck, dev]

    def mount_cmd(self, dev, mnt):
        return self._daemon(dev, mnt)

    def mount(self, dev, mnt, log_path):
        log = open(log_path, "ab")
        try:
            proc = subprocess.Popen(
                [str(c) for c in self.mount_cmd(dev, mnt)],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=log,
                start_new_session=True,  # Ctrl-C must reach the runner, not kill the daemon under a live mount
            )
        finally:
            log.close()
        try:
            system.wait_until(lambda: proc.poll() is not None or system.mount_entry(mnt), timeout=60)
        except BaseException:
            # A stop signal while it starts (long on slow storage): nothing has registered
            # this daemon yet, so stop it here rather than leave it behind.
            if system.mount_entry(mnt) is not None:
                run(["umount", "-l", mnt], check=False, timeout=60)
            _stop_process(proc)
            raise
        entry = system.mount_entry(mnt)
        if entry is None:
            if proc.poll() is None:
                _stop_process(proc)
                raise CommandError(f"{self.name} mount did not become live within 60 s")
            text = Path(log_path).read_text(errors="replace")
            raise CommandError(f"{self.name} daemon exited {proc.returncode} before mounting: {system.tail(text)}")
        return FuseMount(mnt, proc, entry["device_number"])


class Dxfs(FuseFs):
    """dxfs through its FUSE mount (`dxfs mount DEV DIR`, foreground)."""

    nbd_client = True

    def __init__(self, binary, name="dxfs", options=()):
        self.binary = binary
        opts = ["-o", ",".join(options)] if options else []
        super().__init__(
            name,
            daemon=lambda dev, mnt: [binary, "mount", dev, mnt, *opts],
            mkfs=[binary, "mkfs", "-f"],
            fsck=[binary, "fsck", "-n"],
            tools=("fusermount3",),
        )

    def unavailable_reason(self):
        if not self.binary or not os.access(self.binary, os.X_OK):
            return f"dxfs binary not found ({self.binary or 'none given'}); build it or pass --dxfs-bin"
        return super().unavailable_reason()

    def describe(self, dev="DEV"):
        d = super().describe(dev)
        d["note"] = "the runner starts the daemon in the foreground (same as --daemon minus the fork) to know its pid"
        return d


EXT4_MKFS = ["mkfs.ext4", "-F", "-q", "-T", "default", "-E", "lazy_itable_init=0,lazy_journal_init=0"]


def all_filesystems(dxfs_binary):
    """Every filesystem the runner knows, in report order."""
    return {
        "ext4": KernelFs("ext4", "ext4", EXT4_MKFS, ["e2fsck", "-fn"], ("mkfs.ext4", "e2fsck")),
        "xfs": KernelFs("xfs", "xfs", ["mkfs.xfs", "-f", "-q"], ["xfs_repair", "-n"], ("mkfs.xfs", "xfs_repair")),
        "btrfs": KernelFs(
            "btrfs", "btrfs", ["mkfs.btrfs", "-f", "-q"], ["btrfs", "check", "--readonly"], ("mkfs.btrfs", "btrfs")
        ),
        "fuse2fs": FuseFs(
            "fuse2fs",
            daemon=lambda dev, mnt: ["fuse2fs", dev, mnt, "-f"],
            mkfs=EXT4_MKFS,
            fsck=["e2fsck", "-fn"],
            tools=("fuse2fs", "mkfs.ext4", "e2fsck", "fusermount3"),
        ),
        "dxfs": Dxfs(dxfs_binary),
        # A/B variants: the same build and format with one design choice switched off.
        **{name: Dxfs(dxfs_binary, name, opts) for name, opts in DXFS_VARIANTS.items()},
    }


# Each seed feature switched off by a mount option, for side-by-side runs on one build.
DXFS_VARIANTS = {
    "dxfs-noreserve": ("noreserve",),  # seed 002: no per-directory inode regions
    "dxfs-noprefetch": ("noprefetch",),  # seed 004: no sorted inode sweep, no directory readahead
    "dxfs-noxattrfilter": ("noxattrfilter",),  # seed 001: getxattr ignores the bloom filter
    "dxfs-noaccounting": ("noaccounting",),  # seed 003: no space check before an operation
    "dxfs-rdplus-auto": ("readdirplus=auto",),  # the kernel's READDIRPLUS heuristic instead of always
    # The FUSE transport A/B (issue 13). `uring` needs the fuse module's enable_uring set to
    # Y by root first; without it the mount serves through /dev/fuse and logs why.
    "dxfs-classic": ("transport=classic",),
    "dxfs-uring": ("transport=uring",),
}


class KernelMount:
    daemon_pid = None

    def __init__(self, mnt):
        self.mnt = mnt

    def unmount(self):
        if system.mount_entry(self.mnt) is None:
            return
        done = run(["umount", self.mnt], check=False, timeout=300)
        if done.returncode != 0:
            run(["umount", "-l", self.mnt], check=False, timeout=60)
            raise CommandError(f"umount {self.mnt}: {system.tail(done.stderr)} (detached lazily)")

    def abort(self):
        pass


class FuseMount:
    """A live FUSE mount and the daemon serving it."""

    def __init__(self, mnt, proc, device_number):
        self.mnt, self.proc = mnt, proc
        self.connection = device_number.split(":")[1]  # /sys/fs/fuse/connections/<minor>
        self.daemon_pid = proc.pid
        self.daemon_exit = None

    def unmount(self, wait=300, idle=15):
        """Unmount, then wait for the daemon to finish writing and exit. It is stopped (by
        its pid) if it is still there after `wait` s, or once it has used no CPU for `idle` s
        (hung), or at once after a stop signal."""
        problem = None
        if system.mount_entry(self.mnt) is not None:
            done = run(["fusermount3", "-u", self.mnt], check=False, timeout=120)
            if done.returncode != 0:
                problem = f"fusermount3 -u {self.mnt}: {system.tail(done.stderr)}"
                self.abort()
                run(["umount", "-l", self.mnt], check=False, timeout=60)
        hung = self._wait_for_exit(2 if cleanup.stopping() else wait, idle)
        if hung:
            problem = problem or f"{hung}; stopped it"
            self.daemon_exit = _stop_process(self.proc)
        if problem:
            raise CommandError(problem)

    def _wait_for_exit(self, wait, idle):
        """None once the daemon has exited, else why we gave up waiting."""
        end = time.monotonic() + wait
        last_cpu, still_since = None, time.monotonic()
        while time.monotonic() < end:
            try:
                self.daemon_exit = self.proc.wait(timeout=1.0)
                return None
            except subprocess.TimeoutExpired:
                pass
            cpu = system.process_cpu_seconds(self.daemon_pid)
            if cpu != last_cpu:
                last_cpu, still_since = cpu, time.monotonic()
            elif time.monotonic() - still_since >= idle:
                return f"daemon {self.daemon_pid} idle and still running {idle} s after unmount"
        return f"daemon {self.daemon_pid} still running {wait} s after unmount"

    def abort(self):
        path = f"/sys/fs/fuse/connections/{self.connection}/abort"
        if os.path.exists(path):
            with open(path, "w") as f:
                f.write("1\n")


def _start_daemon(cmd, log_path):
    """Start a server of the volume in the foreground, its output in the volume's log, in its
    own session (Ctrl-C must reach the runner, not pull the storage from under a mount)."""
    with open(log_path, "ab") as log:
        return subprocess.Popen(
            [str(c) for c in cmd], stdin=subprocess.DEVNULL, stdout=log, stderr=log, start_new_session=True
        )


def _wait_for_pidfile(proc, pidfile, what, log_path, timeout=30):
    """Wait until `proc` has written its pid file (it serves from then on)."""
    system.wait_until(lambda: proc.poll() is not None or (pidfile.exists() and pidfile.stat().st_size > 0), timeout)
    if proc.poll() is not None:
        text = Path(log_path).read_text(errors="replace")
        raise CommandError(f"{what} exited {proc.returncode} before serving: {system.tail(text)}")
    if not (pidfile.exists() and pidfile.stat().st_size > 0):
        raise CommandError(f"{what} did not start serving within {timeout} s")


def _stop_process(proc):
    """SIGTERM, then SIGKILL, one child process of ours (by its pid); return its exit code."""
    for sig, wait in ((signal.SIGTERM, 10), (signal.SIGKILL, 10)):
        if proc.poll() is not None:
            break
        proc.send_signal(sig)
        try:
            proc.wait(timeout=wait)
        except subprocess.TimeoutExpired:
            continue
    return proc.poll()


def storage(delay_ms):
    """What every volume of a run sits on, for the results and the report."""
    if delay_ms is None:
        return {"kind": "tmpfs", "delay_ms": None, "text": "sparse file on /dev/shm behind a loop device"}
    detail = "a sparse file on /dev/shm served by `nbdkit file` on a Unix socket"
    if delay_ms:
        detail += (
            f" behind its delay filter (`rdelay={delay_ms}ms wdelay={delay_ms}ms`: every read, write, zero and "
            "trim waits that long, flushes do not)"
        )
    detail += (
        ", one nbdkit per volume; kernel filesystems and fuse2fs on a loop device over nbdfuse's file of the "
        "export, dxfs on the export itself through its own NBD client (`nbd+unix:///?socket=SOCK`)"
    )
    return {
        "kind": "nbdkit-delay" if delay_ms else "nbdkit",
        "delay_ms": delay_ms,
        "text": f"nbdkit delay filter, {delay_ms} ms a request" if delay_ms else "nbdkit, no delay added",
        "detail": detail,
    }


def device_placeholder(fs, delay_ms):
    """What stands for the device in the commands the report shows."""
    return "nbd+unix:///?socket=SOCK" if delay_ms is not None and fs.nbd_client else "DEV"


class Volume:
    """One filesystem on one loop device backed by a sparse file on tmpfs.

    `delay_ms=D`: storage with latency instead: the file is served on a Unix socket by
    `nbdkit file` behind its delay filter (D ms on every read and write, zero and trim
    included, flushes not delayed; D=0: no filter). Kernel filesystems and fuse2fs go on
    a loop device over nbdfuse's view of the export; dxfs gets the export's URI (`dev`)
    and no loop device (`devname` None: no block counters)."""

    def __init__(self, fs, size, workdir, teardown, label, delay_ms=None):
        self.fs, self.size, self.teardown = fs, size, teardown
        self.delay_ms = delay_ms
        self.image = Path(workdir) / f"{label}.img"
        self.mnt = Path(workdir) / f"mnt-{label}"
        self.log_path = Path(workdir) / f"{label}.log"
        self.nbd_log_path = Path(workdir) / f"{label}-nbd.log"  # apart: log_path is the FUSE daemon's, reported
        self.socket = Path(workdir) / f"{label}.sock"
        self.nbdfuse_dir = Path(workdir) / f"nbdfuse-{label}"
        self.dev = None
        self.devname = None
        self.mounted = None
        self._nbdkit = None
        self._nbdfuse = None
        self._undo = []  # (teardown token, action) of what create() made, oldest first
        self._mount_token = None

    # -- lifecycle -------------------------------------------------------------------
    def create(self):
        """Backing file, what the filesystem goes on (loop device or NBD URI), and mkfs."""
        self.mnt.mkdir(parents=True, exist_ok=True)
        with open(self.image, "wb") as f:
            f.truncate(self.size)
        self._push(f"remove {self.image}", self._remove_files)
        backing = self.image
        if self.delay_ms is not None:
            uri = self._serve_nbd()
            if self.fs.nbd_client:
                self.dev = uri
            else:
                backing = self._nbdfuse_file(uri)
        if self.dev is None:
            self.dev = run(["losetup", "--find", "--show", backing]).stdout.strip()
            self.devname = os.path.basename(self.dev)
            self._push(f"detach {self.dev}", self._detach)
        run(self.fs.mkfs_cmd(self.dev), timeout=300)

    def _push(self, label, action):
        """Register an undo step with the run's teardown and remember it for destroy()."""
        self._undo.append((self.teardown.push(label, action), action))

    def _serve_nbd(self):
        """Start nbdkit on the image (behind the delay filter); return the export's URI."""
        pidfile = self.socket.with_suffix(".nbdkit.pid")
        cmd = ["nbdkit", "-f", "-U", self.socket, "-P", pidfile]
        if self.delay_ms:
            cmd += ["--filter=delay"]
        cmd += ["file", f"file={self.image}"]
        if self.delay_ms:
            cmd += [f"rdelay={self.delay_ms}ms", f"wdelay={self.delay_ms}ms"]
        self._nbdkit = _start_daemon(cmd, self.nbd_log_path)
        self._push(f"stop nbdkit {self._nbdkit.pid}", self._stop_nbdkit)
        _wait_for_pidfile(self._nbdkit, pidfile, "nbdkit", self.nbd_log_path)  # written once it listens
        return f"nbd+unix:///?socket={self.socket}"

    def _nbdfuse_file(self, uri):
        """Mount nbdfuse's view of the export; return the file a loop device goes on."""
        self.nbdfuse_dir.mkdir(exist_ok=True)
        pidfile = self.socket.with_suffix(".nbdfuse.pid")
        self._nbdfuse = _start_daemon(["nbdfuse", "-P", pidfile, self.nbdfuse_dir, uri], self.nbd_log_path)
        self._push(f"stop nbdfuse {self._nbdfuse.pid}", self._stop_nbdfuse)
        _wait_for_pidfile(self._nbdfuse, pidfile, "nbdfuse", self.nbd_log_path)  # written once it serves
        return self.nbdfuse_dir / "nbd"

    def mount(self):
        self.mounted = self.fs.mount(self.dev, str(self.mnt), self.log_path)
        self._mount_token = self.teardown.push(f"unmount {self.mnt}", self.mounted.unmount)

    def unmount(self):
        if self.mounted is None:
            return
        mounted, self.mounted = self.mounted, None
        self.teardown.forget(self._mount_token)
        mounted.unmount()

    def fsck(self):
        """Check the unmounted volume; {'command', 'exit', 'clean', 'output'}."""
        cmd = self.fs.fsck_cmd(self.dev)
        done = run(cmd, check=False, timeout=600)
        return {
            "command": " ".join(map(str, cmd)),
            "exit": done.returncode,
            "clean": done.returncode == 0,
            "output": system.tail(done.stdout + "\n" + done.stderr, 4),
        }

    def destroy(self, check=True):
        """Unmount, optionally fsck, detach, stop the NBD servers and delete the backing
        file; return the fsck result."""
        result = None
        try:
            self.unmount()
            if check and self.dev and not cleanup.stopping():
                result = self.fsck()
        finally:
            # Newest first: loop device, nbdfuse, nbdkit, then the files they used.
            while self._undo:
                token, action = self._undo.pop()
                self.teardown.forget(token)
                action()
        return result

    def _detach(self):
        if self.mounted is not None:
            try:
                self.unmount()
            except Exception:
                pass
        if self.devname:
            for _ in range(50):
                if run(["losetup", "-d", self.dev], check=False).returncode == 0:
                    break
                time.sleep(0.1)
            else:
                # Still busy: autoclear detaches it when the last user closes it.
                run(["losetup", "-d", self.dev], check=False)
            self.dev = self.devname = None

    def _stop_nbdfuse(self):
        """Unmount nbdfuse's view (it then exits); stop it by its pid if it will not."""
        if self._nbdfuse is None:
            return
        if os.path.ismount(self.nbdfuse_dir):
            run(["fusermount3", "-u", self.nbdfuse_dir], check=False, timeout=60)
        try:
            self._nbdfuse.wait(timeout=2 if cleanup.stopping() else 30)
        except subprocess.TimeoutExpired:
            _stop_process(self._nbdfuse)
            run(["umount", "-l", self.nbdfuse_dir], check=False, timeout=60)
        self._nbdfuse = None
        try:
            self.nbdfuse_dir.rmdir()
        except OSError:
            pass

    def _stop_nbdkit(self):
        if self._nbdkit is not None:
            _stop_process(self._nbdkit)
            self._nbdkit = None
        if self.dev and self.devname is None:
            self.dev = None  # the export's URI: nothing to detach

    def _remove_files(self):
        pidfiles = (self.socket.with_suffix(".nbdkit.pid"), self.socket.with_suffix(".nbdfuse.pid"))
        for path in (self.image, self.socket, *pidfiles):
            path.unlink(missing_ok=True)
        try:
            self.mnt.rmdir()
        except OSError:
            pass

    # -- measurement hooks -----------------------------------------------------------
    @property
    def daemon_pid(self):
        return self.mounted.daemon_pid if self.mounted else None

    def abort(self):
        if self.mounted:
            self.mounted.abort()

    def mount_options(self):
        entry = system.mount_entry(str(self.mnt))
        return entry and f"{entry['fstype']} {entry['options']},{entry['super_options']}"
