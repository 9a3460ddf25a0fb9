"""A fresh volume on a loop device over a sparse file in /dev/shm, mounted: kernel ext4,
or dxfs on a given FUSE transport (turning the fuse module's enable_uring on for an
io_uring mount and putting back what it found). Shared by bench/metadata.py,
bench/fio.py and bench/apps.py.

Teardown undoes whatever was done, also when mounting fails half way: unmount (retried
while busy, then a FUSE connection that no longer answers is aborted), the daemon (waited
for, and killed by its pid only if it will not exit), the loop device, the files."""
import json, os, subprocess, sys, tempfile, time

URING_PARAM = "/sys/module/fuse/parameters/enable_uring"


def run(cmd, **kw):
    return subprocess.run(cmd, check=True, capture_output=True, text=True, **kw)


class LoopVolume:
    """`with LoopVolume("ext4" | "dxfs", ...) as v:` mounts on `v.mnt`.

    `log`: a file for the dxfs daemon's stderr (default: discarded). The environment
    variable DXFS_MKFS_OPTS adds flags to `dxfs mkfs` (A/B runs of on-disk features).
    `fsck=True`: after unmounting, check the volume read-only (`e2fsck -fn`, `dxfs fsck
    -n`) and keep `(exit code, output)` in `v.fsck_result` for the caller to judge.
    `preallocate=True`: the image's memory is allocated up front, as a real device has
    every block; a sparse image makes each first write of a block allocate (and zero) a
    page of tmpfs, which a redirect-on-write filesystem pays far more often than one that
    overwrites in place.
    `delay_ms=D`: storage with latency instead: the image is served by `nbdkit file`
    behind its delay filter (D ms on every read and write, flushes not delayed) on a
    Unix socket; ext4 sits on a loop device over `nbdfuse`'s view of the export, dxfs
    uses its own NBD client on the same kind of export."""

    def __init__(self, fs, size_gib, dxfs=None, transport="auto", options=(), log=None, fsck=False,
                 preallocate=False, delay_ms=None):
        self.fs, self.size_gib, self.dxfs = fs, size_gib, dxfs
        self.transport, self.options = transport, list(options)
        self.log, self.fsck, self.preallocate = log, fsck, preallocate
        self.delay_ms = delay_ms
        self.nbdkit = self.nbdfuse = self.nbdfuse_dir = None
        self.fsck_result = None
        self.daemon = None
        self.old_param = None
        self.tmp = self.img = self.mnt = self.dev = None
        self.mounted = False

    def __enter__(self):
        try:
            return self._setup()
        except BaseException:
            self._teardown()
            raise

    def _setup(self):
        self.tmp = tempfile.mkdtemp(dir="/dev/shm", prefix="dxfs-bench-")
        self.img, self.mnt = os.path.join(self.tmp, "img"), os.path.join(self.tmp, "mnt")
        os.mkdir(self.mnt)
        with open(self.img, "wb") as f:
            f.truncate(self.size_gib << 30)
            if self.preallocate:
                os.posix_fallocate(f.fileno(), 0, self.size_gib << 30)
        backing = self.img
        if self.delay_ms is not None:
            backing = self._serve_nbd()
        if backing.startswith("nbd"):
            self.dev = backing
        else:
            self.dev = run(["losetup", "--find", "--show", backing]).stdout.strip()
        if self.fs == "ext4":
            run(["mkfs.ext4", "-F", "-q", "-E", "lazy_itable_init=0,lazy_journal_init=0", self.dev])
            run(["mount", self.dev, self.mnt])
            self.mounted = True
            return self
        if self.transport == "uring" and os.path.exists(URING_PARAM):
            self.old_param = open(URING_PARAM).read().strip()
            with open(URING_PARAM, "w") as f:
                f.write("Y\n")
        # Extra mkfs flags for A/B runs of on-disk features (e.g. --no-one-flush-commit).
        run([self.dxfs, "mkfs", "-f", self.dev] + os.environ.get("DXFS_MKFS_OPTS", "").split())
        self._start_dxfs()
        return self

    def _serve_nbd(self):
        """Serve the image through nbdkit's delay filter; what the filesystem goes on: the
        export's URI for dxfs, nbdfuse's file for ext4 (under a loop device)."""
        sock = os.path.join(self.tmp, "nbd.sock")
        cmd = ["nbdkit", "-f", "-U", sock]
        if self.delay_ms:
            cmd += ["--filter=delay"]
        cmd += ["file", f"file={self.img}"]
        if self.delay_ms:
            cmd += [f"delay-read={self.delay_ms}ms", f"delay-write={self.delay_ms}ms"]
        self.nbdkit = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        for _ in range(500):
            if os.path.exists(sock):
                break
            time.sleep(0.01)
        else:
            raise RuntimeError("nbdkit did not start")
        uri = f"nbd+unix:///?socket={sock}"
        if self.fs == "dxfs":
            return uri
        self.nbdfuse_dir = os.path.join(self.tmp, "nbdfuse")
        os.mkdir(self.nbdfuse_dir)
        pidfile = os.path.join(self.tmp, "nbdfuse.pid")
        # nbdfuse stays in the foreground and writes its pid once it serves.
        self.nbdfuse = subprocess.Popen(["nbdfuse", "-P", pidfile, self.nbdfuse_dir, uri],
                                        stdin=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        for _ in range(500):
            if os.path.exists(pidfile) and os.path.getsize(pidfile) > 0:
                break
            if self.nbdfuse.poll() is not None:
                raise RuntimeError(f"nbdfuse exited with {self.nbdfuse.returncode}")
            time.sleep(0.01)
        else:
            raise RuntimeError("nbdfuse did not start")
        return os.path.join(self.nbdfuse_dir, "nbd")

    def _start_dxfs(self):
        err = open(self.log, "ab") if self.log else subprocess.DEVNULL
        try:
            self.daemon = subprocess.Popen(
                [self.dxfs, "mount", self.dev, self.mnt, "-o", f"transport={self.transport}"] + self.options,
                stderr=err)
        finally:
            if self.log:
                err.close()
        for _ in range(1000):
            if os.path.ismount(self.mnt):
                self.mounted = True
                return
            if self.daemon.poll() is not None:
                raise RuntimeError(f"dxfs mount exited with {self.daemon.returncode}")
            time.sleep(0.01)
        raise RuntimeError("dxfs did not mount")

    def remount(self):
        """Unmount and mount again, with the page, dentry and inode caches dropped: the
        next operations start cold, in the kernel and in the daemon."""
        problems = []
        self._unmount(problems)
        if self.daemon is not None:
            self.daemon.wait(timeout=300)
        if problems:
            raise RuntimeError("; ".join(problems))
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("3\n")
        if self.fs == "ext4":
            run(["mount", self.dev, self.mnt])
            self.mounted = True
        else:
            self._start_dxfs()

    def stats(self):
        """The mount's request counters (`dxfs stats --json`); {} for ext4."""
        if self.daemon is None:
            return {}
        return json.loads(run([self.dxfs, "stats", "--json", self.mnt]).stdout)

    def abort(self):
        """Abort the FUSE connection (a daemon that stopped answering): every request in
        flight and to come fails with ENOTCONN, so processes blocked on the mount return."""
        if self.daemon is None or not self.mounted:
            return
        minor = os.minor(os.stat(self.mnt).st_dev) if os.path.ismount(self.mnt) else None
        if minor is not None:
            with open(f"/sys/fs/fuse/connections/{minor}/abort", "w") as f:
                f.write("1\n")

    def __exit__(self, *exc):
        self._teardown()

    def _teardown(self):
        problems = []
        was_mounted = self.mounted
        try:
            if self.mounted:
                self._unmount(problems)
            if self.daemon is not None and self.daemon.poll() is None:
                try:
                    self.daemon.wait(timeout=300)
                except subprocess.TimeoutExpired:
                    problems.append(f"dxfs daemon {self.daemon.pid} still running 300 s after unmount: killed")
                    self.daemon.kill()
                    self.daemon.wait()
            if self.fsck and self.dev and was_mounted and not os.path.ismount(self.mnt):
                cmd = ["e2fsck", "-fn", self.dev] if self.fs == "ext4" else [self.dxfs, "fsck", "-n", self.dev]
                p = subprocess.run(cmd, capture_output=True, text=True)
                self.fsck_result = (p.returncode, p.stdout + p.stderr)
        finally:
            if self.old_param is not None:
                with open(URING_PARAM, "w") as f:
                    f.write(self.old_param + "\n")
                self.old_param = None
            if self.dev and self.dev.startswith("nbd"):
                self.dev = None
            if self.dev:
                for _ in range(50):
                    if subprocess.run(["losetup", "-d", self.dev], capture_output=True).returncode == 0:
                        break
                    time.sleep(0.1)
                else:
                    problems.append(f"losetup -d {self.dev} failed")
                self.dev = None
            if self.nbdfuse_dir:
                if subprocess.run(["fusermount3", "-u", self.nbdfuse_dir], capture_output=True).returncode != 0:
                    problems.append(f"fusermount3 -u {self.nbdfuse_dir} failed")
                if self.nbdfuse is not None:
                    try:
                        self.nbdfuse.wait(timeout=30)
                    except subprocess.TimeoutExpired:
                        problems.append(f"nbdfuse {self.nbdfuse.pid} still running: killed")
                        self.nbdfuse.kill()
                        self.nbdfuse.wait()
                    self.nbdfuse = None
                if not os.path.ismount(self.nbdfuse_dir):
                    os.rmdir(self.nbdfuse_dir)
                self.nbdfuse_dir = None
            if self.nbdkit is not None:
                self.nbdkit.terminate()
                self.nbdkit.wait()
                self.nbdkit = None
            sock = os.path.join(self.tmp, "nbd.sock") if self.tmp else None
            pidfile = os.path.join(self.tmp, "nbdfuse.pid") if self.tmp else None
            for path, rm in ((sock, os.unlink), (pidfile, os.unlink), (self.img, os.unlink), (self.mnt, os.rmdir),
                             (self.tmp, os.rmdir)):
                if path and os.path.exists(path):
                    try:
                        rm(path)
                    except OSError as e:
                        problems.append(f"{path}: {e}")
            for p in problems:
                print(f"loopvol: {p}", file=sys.stderr)

    def _unmount(self, problems):
        for i in range(100):
            p = subprocess.run(["umount", self.mnt], capture_output=True, text=True)
            if p.returncode == 0 or not os.path.ismount(self.mnt):
                self.mounted = False
                return
            if i == 20 and self.daemon is not None:
                # Busy for 2 s: maybe a process stuck on a daemon that no longer answers.
                try:
                    self.abort()
                except OSError:
                    pass
            time.sleep(0.1)
        problems.append(f"umount {self.mnt}: {p.stderr.strip()}; detached lazily")
        subprocess.run(["umount", "-l", self.mnt], capture_output=True)
        self.mounted = False
