"""A fresh volume on a loop device over a sparse file in /dev/shm, mounted: kernel ext4,
or dxfs on a given FUSE transport (turning the fuse module's enable_uring on for an
io_uring mount and putting back what it found). Shared by bench/metadata.py and
bench/fio.py."""
import json, os, subprocess, tempfile, time

URING_PARAM = "/sys/module/fuse/parameters/enable_uring"


def run(cmd, **kw):
    return subprocess.run(cmd, check=True, capture_output=True, text=True, **kw)


class LoopVolume:
    """`with LoopVolume("ext4" | "dxfs", ...) as v:` mounts on `v.mnt`."""

    def __init__(self, fs, size_gib, dxfs=None, transport="auto", options=()):
        self.fs, self.size_gib, self.dxfs = fs, size_gib, dxfs
        self.transport, self.options = transport, list(options)
        self.daemon = None
        self.old_param = None

    def __enter__(self):
        self.tmp = tempfile.mkdtemp(dir="/dev/shm", prefix="dxfs-bench-")
        self.img, self.mnt = os.path.join(self.tmp, "img"), os.path.join(self.tmp, "mnt")
        os.mkdir(self.mnt)
        with open(self.img, "wb") as f:
            f.truncate(self.size_gib << 30)
        self.dev = run(["losetup", "--find", "--show", self.img]).stdout.strip()
        if self.fs == "ext4":
            run(["mkfs.ext4", "-F", "-q", "-E", "lazy_itable_init=0,lazy_journal_init=0", self.dev])
            run(["mount", self.dev, self.mnt])
            return self
        if self.transport == "uring" and os.path.exists(URING_PARAM):
            self.old_param = open(URING_PARAM).read().strip()
            with open(URING_PARAM, "w") as f:
                f.write("Y\n")
        run([self.dxfs, "mkfs", "-f", self.dev])
        self.daemon = subprocess.Popen(
            [self.dxfs, "mount", self.dev, self.mnt, "-o", f"transport={self.transport}"] + self.options,
            stderr=subprocess.DEVNULL)
        for _ in range(1000):
            if os.path.ismount(self.mnt):
                return self
            if self.daemon.poll() is not None:
                raise RuntimeError(f"dxfs mount exited with {self.daemon.returncode}")
            time.sleep(0.01)
        raise RuntimeError("dxfs did not mount")

    def stats(self):
        """The mount's request counters (`dxfs stats --json`); {} for ext4."""
        if self.daemon is None:
            return {}
        return json.loads(run([self.dxfs, "stats", "--json", self.mnt]).stdout)

    def __exit__(self, *exc):
        try:
            subprocess.run(["umount", self.mnt], capture_output=True)
            if self.daemon is not None:
                self.daemon.wait(timeout=300)
        finally:
            if self.old_param is not None:
                with open(URING_PARAM, "w") as f:
                    f.write(self.old_param + "\n")
            subprocess.run(["losetup", "-d", self.dev], capture_output=True)
            os.unlink(self.img)
            os.rmdir(self.mnt)
            os.rmdir(self.tmp)
