"""The workloads. Each is one function taking a Ctx, registered with @workload; its
docstring says which seed it comes from and what it measures.

The same Python code runs on every filesystem. Per-file loops use os calls relative
to a directory file descriptor; the runner measures Python's own floor on tmpfs and
prints it in the report, so its share of each µs/op can be read off.
"""

import errno
import itertools
import json
import os
import random
from dataclasses import dataclass, field

from .context import df, dir_size
from .datagen import acl_value, default_acl_value, names_of_length, numbered_names

MIB = 1 << 20
KIB = 1 << 10
CREATE_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC
ACL_ACCESS = "system.posix_acl_access"
ACL_DEFAULT = "system.posix_acl_default"


@dataclass(frozen=True)
class Metric:
    key: str
    label: str
    ratio: bool = False  # print ×ext4 / ×fuse2fs next to it


@dataclass
class Workload:
    key: str
    title: str
    seeds: str
    fn: object
    volume: str  # "main" or "small": the volume the runner mounts before calling fn
    metrics: tuple = ()
    tools: tuple = ()
    doc: str = field(default="")


WORKLOADS = {}


def workload(key, title, seeds, volume="main", metrics=(), tools=()):
    """Register a workload function under `key` (the name used by --workloads)."""

    def register(fn):
        doc = " ".join((fn.__doc__ or "").split())
        WORKLOADS[key] = Workload(key, title, seeds, fn, volume, tuple(metrics), tuple(tools), doc)
        return fn

    return register


# ----------------------------------------------------------------------------------------
# Building blocks shared by the workloads


class opendir:
    """A directory file descriptor as a context manager."""

    def __init__(self, path):
        self.path = path

    def __enter__(self):
        self.fd = os.open(self.path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        return self.fd

    def __exit__(self, *exc):
        os.close(self.fd)


def create_files(ctx, dirpath, names, label, data=b""):
    """Create each of `names` in `dirpath` (writing `data` into it if given)."""
    with opendir(dirpath) as dfd:
        for name in ctx.loop(names, label):
            fd = os.open(name, CREATE_FLAGS, 0o644, dir_fd=dfd)
            if data:
                os.write(fd, data)
            os.close(fd)


def stat_names(ctx, dirpath, names, label):
    """lstat each of `names` in `dirpath`, in the order given."""
    with opendir(dirpath) as dfd:
        for name in ctx.loop(names, label):
            os.stat(name, dir_fd=dfd, follow_symlinks=False)


def unlink_names(ctx, dirpath, names, label):
    with opendir(dirpath) as dfd:
        for name in ctx.loop(names, label):
            os.unlink(name, dir_fd=dfd)


def read_dir(dirpath):
    """(name, d_ino) of every entry, in readdir order."""
    with os.scandir(dirpath) as it:
        return [(e.name, e.inode()) for e in it]


def ls_l(ctx, dirpath, label, inode_order=False):
    """readdir, then lstat every entry: in readdir order, or sorted by inode number."""
    entries = read_dir(dirpath)
    if inode_order:
        entries.sort(key=lambda e: e[1])
    stat_names(ctx, dirpath, [name for name, _ in entries], label)
    return len(entries)


def record_dir_size(ctx, key, path):
    size, alloc = dir_size(path)
    ctx.metric(f"{key}_size", size)
    ctx.metric(f"{key}_alloc", alloc)
    return size, alloc


def write_file(ctx, path, nbytes):
    """Write `nbytes`, 1 MiB at a time, then fsync, like dd conv=fsync; stop at ENOSPC.

    Returns how much was written and which call reported ENOSPC (write, fsync or close), if any.
    """
    failed_in = None
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o644)
    try:
        written = append_until_enospc(ctx, fd, MIB, limit=nbytes)
        if written < nbytes:
            failed_in = "write"
        else:
            try:
                os.fsync(fd)
            except OSError as e:
                if e.errno != errno.ENOSPC:
                    raise
                failed_in = "fsync"
    finally:
        try:
            os.close(fd)
        except OSError as e:
            if e.errno != errno.ENOSPC:
                raise
            failed_in = failed_in or "close"
    return {"written_bytes": written, "enospc": failed_in is not None, "enospc_in": failed_in}


def close_noting_enospc(ctx, fd, what):
    """close(2), where ENOSPC (a FUSE flush that fails) is a finding to note, not an error."""
    try:
        os.close(fd)
    except OSError as e:
        if e.errno != errno.ENOSPC:
            raise
        ctx.note(f"close after {what} failed with ENOSPC")


def append_until_enospc(ctx, fd, chunk, limit=None):
    """Append `chunk`-sized writes to `fd` until ENOSPC (or `limit` bytes); return bytes written."""
    buf = ctx.inputs.pattern(chunk)
    written = 0
    try:
        for n in itertools.count():
            if limit is not None and written >= limit:
                break
            if n % 64 == 0:
                ctx.check_deadline()
                ctx.status(f"writing: {written >> 20} MiB")
            written += os.write(fd, buf if limit is None else buf[: min(chunk, limit - written)])
    except OSError as e:
        if e.errno != errno.ENOSPC:
            raise
    return written


def append_until_enospc_bounded(ctx, fd, chunk, what, already=0):
    """append_until_enospc, but never past the size of the volume: a filesystem that keeps
    accepting writes beyond it has failed to detect out-of-space in the front end (noted)."""
    limit = ctx.vol.size - already
    written = append_until_enospc(ctx, fd, chunk, limit=limit)
    if written >= limit:
        ctx.note(f"{what}: write(2) accepted {ctx.vol.size >> 20} MiB, the whole volume, without ENOSPC")
    return written


def fsync_noting_enospc(ctx, fd, what):
    try:
        os.fsync(fd)
    except OSError as e:
        if e.errno != errno.ENOSPC:
            raise
        ctx.note(f"fsync after {what} failed with ENOSPC")


def fill_until_enospc(ctx, path):
    """Append to one file, 1 MiB then 4 KiB at a time, until ENOSPC (or the volume's size);
    fsync. Returns the bytes written and the call that first reported ENOSPC, if any."""
    failed_in = None
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o644)
    try:
        written = append_until_enospc_bounded(ctx, fd, MIB, "filling")
        written += append_until_enospc_bounded(ctx, fd, 4 * KIB, "filling", already=written)
        if written < ctx.vol.size:
            failed_in = "write"
        try:
            os.fsync(fd)
        except OSError as e:
            if e.errno != errno.ENOSPC:
                raise
            failed_in = failed_in or "fsync"
    finally:
        close_noting_enospc(ctx, fd, "filling")
    return written, failed_in


def prefill(ctx, path, leave_free):
    """Leave exactly `leave_free` bytes writable, as the filesystem itself counts them: fill
    the volume with one file (1 MiB writes) until ENOSPC, then give back `leave_free` bytes
    by truncating it. (statvfs is no guide: reserves for root, delalloc pools and metadata
    chunks make its free count differ from what a write can get.) Returns what df says after."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o644)
    try:
        written = append_until_enospc_bounded(ctx, fd, MIB, "prefill")
        fsync_noting_enospc(ctx, fd, "prefill")
        os.ftruncate(fd, max(0, written - leave_free))
        os.fsync(fd)
    finally:
        close_noting_enospc(ctx, fd, "prefill")
    ctx.flush()
    return df(ctx.mnt)["free_bytes"]


def walk(root):
    """Every entry under `root` as (path, is_dir), listing a directory before descending (ls -lR order)."""
    stack = [root]
    while stack:
        d = stack.pop()
        with os.scandir(d) as it:
            entries = [(e.path, e.is_dir(follow_symlinks=False)) for e in it]
        yield from entries
        stack.extend(p for p, is_dir in reversed(entries) if is_dir)


def getxattr_or_none(path, name):
    try:
        return os.getxattr(path, name, follow_symlinks=False)
    except OSError as e:
        if e.errno in (errno.ENODATA, errno.EOPNOTSUPP):
            return None
        raise


def count_files(root):
    return sum(1 for _, is_dir in walk(root) if not is_dir)


def fio_job(ctx, path, rw, bs, size_mib, runtime=None):
    """Run one fio job on `path`; return its bandwidth (MiB/s) and IOPS."""
    cmd = [
        "fio",
        "--name=bench",
        f"--filename={path}",
        f"--rw={rw}",
        f"--bs={bs}",
        f"--size={size_mib}M",
        "--ioengine=psync",
        "--fallocate=none",
        "--output-format=json",
    ]
    if rw in ("write", "randwrite"):
        cmd.append("--end_fsync=1")
    if runtime:
        cmd += ["--time_based", f"--runtime={runtime}"]
    out = ctx.run_cmd(cmd).stdout
    job = json.loads(out[out.index("{") :])["jobs"][0]
    side = job["read"] if rw in ("read", "randread") else job["write"]
    return {"bw_mib_s": round(side["bw_bytes"] / MIB, 2), "iops": round(side["iops"], 1), "ios": side["total_ios"]}


# ----------------------------------------------------------------------------------------
# The workloads


@workload(
    "create",
    "create / stat in reverse / unlink N files in one directory",
    seeds="000",
    metrics=(
        Metric("dir_after_create_size", "dir st_size after create (B)", ratio=True),
        Metric("dir_after_create_alloc", "dir st_blocks×512 after create (B)", ratio=True),
        Metric("dir_after_unlink_size", "dir st_size after unlink all (B)", ratio=True),
        Metric("dir_after_unlink_alloc", "dir st_blocks×512 after unlink all (B)"),
    ),
)
def create_stat_unlink(ctx):
    """Seed 000 (htree thread, Dilger's create/stat test): create N empty files in one
    directory, stat them in reverse creation order warm and after a cold remount, then
    unlink them all from a cold cache. Measures per-operation cost of hashed-directory
    insert, lookup and delete, and whether the directory gives its space back."""
    names = numbered_names("file_name_", ctx.scale.files)
    d = ctx.path("dir")
    os.mkdir(d)
    with ctx.phase("create"):
        create_files(ctx, d, names, "create")
    record_dir_size(ctx, "dir_after_create", d)
    with ctx.phase("stat_reverse_warm", sync=False):
        stat_names(ctx, d, names[::-1], "stat")
    with ctx.phase("stat_reverse_cold", cold=True, sync=False):
        stat_names(ctx, d, names[::-1], "stat")
    with ctx.phase("unlink_cold", cold=True):
        unlink_names(ctx, d, names, "unlink")
    record_dir_size(ctx, "dir_after_unlink", d)


@workload(
    "namelen",
    "lookup cost against name length",
    seeds="000",
    metrics=(Metric("lookup_us_at_max_len", "cold lookup µs/op at the longest name", ratio=True),),
)
def name_length(ctx):
    """Seed 000 (Dilger's name-length test): for each name length from 8 to 255 bytes,
    create M files in a fresh directory, remount cold, and stat them in reverse order.
    Measures cold lookup µs per name against name length (hashing and leaf-scan cost)."""
    points = []
    for length in ctx.scale.name_lengths:
        names = names_of_length(length, ctx.scale.files_per_length)
        d = ctx.path(f"len{length:03d}")
        os.mkdir(d)
        with ctx.phase(f"create_len{length}"):
            create_files(ctx, d, names, f"create len {length}")
        with ctx.phase(f"lookup_len{length}_cold", cold=True, sync=False):
            stat_names(ctx, d, names[::-1], f"lookup len {length}")
        points.append([length, ctx.last_phase()["us_per_op"]])
    ctx.series("lookup_us_by_length", points)
    ctx.metric("lookup_us_at_max_len", points[-1][1])


@workload(
    "steady",
    "steady state: fixed population under create-one/delete-one churn",
    seeds="000",
    metrics=(
        Metric("start_size", "dir st_size at start (B)", ratio=True),
        Metric("end_size", "dir st_size at end (B)", ratio=True),
        Metric("growth_size_percent", "st_size growth %"),
        Metric("start_alloc", "dir st_blocks×512 at start (B)"),
        Metric("end_alloc", "dir st_blocks×512 at end (B)", ratio=True),
        Metric("growth_alloc_percent", "st_blocks growth %"),
    ),
)
def steady_state(ctx):
    """Seed 000 (Phillips' steady.c experiment): a directory holding a fixed population
    of random names from a range of 10^9 goes through delete-one/create-one cycles.
    Samples the directory's st_size and st_blocks over time; a directory that never
    shrinks (ext4) grows, one that coalesces stays flat."""
    rng = random.Random(0)
    present = set()

    def fresh_name():
        while True:
            name = f"foo{rng.randrange(10**9)}"
            if name not in present:
                present.add(name)
                return name

    live = [fresh_name() for _ in range(ctx.scale.steady_population)]
    d = ctx.path("steady")
    os.mkdir(d)
    with ctx.phase("populate"):
        create_files(ctx, d, live, "populate")
    cycles = ctx.scale.steady_cycles
    every = max(1, cycles // ctx.scale.steady_samples)
    samples = [[0, *dir_size(d)]]
    with ctx.phase("churn"), opendir(d) as dfd:
        for c in ctx.loop(range(1, cycles + 1), "cycle"):
            i = rng.randrange(len(live))
            victim, live[i] = live[i], live[-1]
            live.pop()
            present.discard(victim)
            os.unlink(victim, dir_fd=dfd)
            name = fresh_name()
            os.close(os.open(name, CREATE_FLAGS, 0o644, dir_fd=dfd))
            live.append(name)
            if c % every == 0:
                samples.append([c, *dir_size(d)])
    ctx.series("dir_size", samples)
    (_, size0, alloc0), (_, size1, alloc1) = samples[0], samples[-1]
    for key, a, b in (("size", size0, size1), ("alloc", alloc0, alloc1)):
        ctx.metric(f"start_{key}", a)
        ctx.metric(f"end_{key}", b)
        ctx.metric(f"growth_{key}_percent", round(100.0 * (b - a) / a, 2) if a else None)


@workload(
    "massdel",
    "mass delete: directory size before/after, cold readdir of what is left",
    seeds="000",
    metrics=(
        Metric("peak_size", "peak dir st_size (B)", ratio=True),
        Metric("after_size", "dir st_size after delete (B)", ratio=True),
        Metric("after_size_percent", "after / peak st_size %"),
        Metric("peak_alloc", "peak st_blocks×512 (B)"),
        Metric("after_alloc", "st_blocks×512 after (B)", ratio=True),
        Metric("after_alloc_percent", "after / peak st_blocks %"),
    ),
)
def mass_delete(ctx):
    """Seed 000 ("Shrinking ext3 directories"): create N files in one directory, delete
    all but 1%, and compare the directory's size and blocks before and after (after a
    remount too). Then a cold readdir of the nearly empty directory: its time and read
    requests show whether the emptied blocks are still walked."""
    names = numbered_names("file_name_", ctx.scale.massdel_files)
    d = ctx.path("big")
    os.mkdir(d)
    with ctx.phase("create"):
        create_files(ctx, d, names, "create")
    peak_size, peak_alloc = record_dir_size(ctx, "peak", d)
    with ctx.phase("delete_99pct"):
        unlink_names(ctx, d, [n for i, n in enumerate(names) if i % 100], "delete")
    with ctx.phase("readdir_cold", cold=True, sync=False) as ph:
        ph.ops = len(read_dir(d))
    size, alloc = record_dir_size(ctx, "after", d)
    ctx.metric("after_size_percent", round(100.0 * size / peak_size, 2) if peak_size else None)
    ctx.metric("after_alloc_percent", round(100.0 * alloc / peak_alloc, 2) if peak_alloc else None)
    ctx.metric("entries_left", ph.ops)


@workload(
    "lsrm",
    "cold ls -l in readdir order and in inode order, cold rm -rf",
    seeds="002, 004",
    metrics=(Metric("entries", "entries"),),
    tools=("rm",),
)
def cold_ls_and_rm(ctx):
    """Seeds 002 (directory inode reservation) and 004 (readdirplus): N empty files in
    one directory; from a cold cache, readdir + lstat of every entry in readdir order,
    then in inode-number order, then `rm -rf` of the directory. Measures how many
    inode-table reads the scan needs (read requests) and how scattered rm's writes are."""
    names = numbered_names("file_name_", ctx.scale.ls_files)
    d = ctx.path("big")
    os.mkdir(d)
    with ctx.phase("create"):
        create_files(ctx, d, names, "create")
    with ctx.phase("ls_l_readdir_order", cold=True, sync=False):
        ls_l(ctx, d, "ls -l")
    with ctx.phase("ls_l_inode_order", cold=True, sync=False):
        ls_l(ctx, d, "ls -l by inode", inode_order=True)
    with ctx.phase("rm_rf", cold=True) as ph:
        ctx.run_cmd(["rm", "-rf", d])
        ph.ops = len(names)
    ctx.metric("entries", len(names))


@workload(
    "interleave",
    "interleaved directories: files created alternately across K directories",
    seeds="002",
    metrics=(
        Metric("ls_read_requests_per_dir", "cold ls -l read requests per dir", ratio=True),
        Metric("rm_write_requests_per_dir", "cold rm -rf write requests per dir", ratio=True),
    ),
    tools=("rm",),
)
def interleaved_dirs(ctx):
    """Seed 002 (Coly Li's interleaved case): K directories whose files are created
    alternately (file j of every directory before file j+1 of any), then, from a cold
    cache, ls -l of each directory and `rm -rf` of the directories one after another.
    Without per-directory inode reservation each directory's inodes are spread over
    many inode blocks; measures read and write requests per directory."""
    k, f = ctx.scale.interleave_dirs, ctx.scale.interleave_files
    dirs = [ctx.path(f"dir{i:04d}") for i in range(k)]
    for d in dirs:
        os.mkdir(d)
    fds = [os.open(d, os.O_RDONLY | os.O_DIRECTORY) for d in dirs]
    try:
        with ctx.phase("create_interleaved"):
            for n in ctx.loop(range(k * f), "create", total=k * f):
                j, i = divmod(n, k)
                os.close(os.open(f"file{j:05d}", CREATE_FLAGS, 0o644, dir_fd=fds[i]))
    finally:
        for fd in fds:
            os.close(fd)
    with ctx.phase("ls_l_each_dir_cold", cold=True, sync=False) as ph:
        for d in dirs:
            ls_l(ctx, d, f"ls -l {os.path.basename(d)}")
        ph.ops = k * f
    ctx.metric("ls_read_requests_per_dir", _per(ctx.last_phase()["read_requests"], k))
    with ctx.phase("rm_rf_each_dir_cold", cold=True) as ph:
        ctx.run_cmd(["rm", "-rf", *dirs])
        ph.ops = k * f
    ctx.metric("rm_write_requests_per_dir", _per(ctx.last_phase()["write_requests"], k))


def _per(count, n):
    """count / n, or None when there is no count (a volume without a block device)."""
    return None if count is None else round(count / n, 2)


def _build_acl_tree(ctx, root):
    """D directories of F empty files; every 10th file gets an access ACL, every 5th
    directory a default ACL. Returns how many ACLs were set (0 if unsupported)."""
    dirs, files = ctx.scale.acl_dirs, ctx.scale.acl_files
    access, default = acl_value(), default_acl_value()
    set_count = 0
    supported = True
    for n in ctx.loop(range(dirs * files), "build", total=dirs * files):
        di, fi = divmod(n, files)
        d = os.path.join(root, f"d{di:03d}")
        if fi == 0:
            os.mkdir(d)
        p = os.path.join(d, f"f{fi:05d}")
        os.close(os.open(p, CREATE_FLAGS, 0o644))
        acl_target = (p, ACL_ACCESS, access) if fi % 10 == 0 else None
        if fi == files - 1 and di % 5 == 0:
            acl_target = (d, ACL_DEFAULT, default)
        if supported and acl_target:
            try:
                os.setxattr(*acl_target)
                set_count += 1
            except OSError as e:
                if e.errno not in (errno.EOPNOTSUPP, errno.ENOTSUP):
                    raise
                supported = False
                ctx.note(f"setting POSIX ACLs fails: {e.strerror}; the walk runs without ACLs")
    return set_count


def _acl_walk(ctx, root, total):
    """ls -lR with getfattr: lstat and getxattr(system.posix_acl_access) of every entry,
    plus system.posix_acl_default of every directory. Returns how many ACLs were found."""
    hits = 0
    for path, is_dir in ctx.loop(walk(root), "walk", total=total):
        os.lstat(path)
        hits += getxattr_or_none(path, ACL_ACCESS) is not None
        if is_dir:
            hits += getxattr_or_none(path, ACL_DEFAULT) is not None
    return hits


@workload(
    "acl",
    "ls -lR + getfattr system.posix_acl_access over a tree with some ACLs",
    seeds="001",
    metrics=(
        Metric("entries", "entries walked"),
        Metric("acls_set", "ACLs set"),
        Metric("acls_found", "ACLs found by the walk"),
    ),
)
def acl_walk(ctx):
    """Seed 001 (erofs xattr bloom filter): a tree of D directories × F files where 10%
    of files carry an access ACL and some directories a default ACL; an `ls -lR` walk
    that also asks every entry for system.posix_acl_access (as ls does for its '+'),
    cold and warm. Most lookups miss, which a per-inode xattr filter answers without
    reading xattr storage."""
    root = ctx.path("tree")
    os.mkdir(root)
    with ctx.phase("build"):
        acls = _build_acl_tree(ctx, root)
    total = ctx.scale.acl_dirs * (ctx.scale.acl_files + 1)
    with ctx.phase("walk_cold", cold=True, sync=False) as ph:
        found = _acl_walk(ctx, root, total)
    with ctx.phase("walk_warm", sync=False):
        _acl_walk(ctx, root, total)
    ctx.metric("entries", ph.ops)
    ctx.metric("acls_set", acls)
    ctx.metric("acls_found", found)


@workload(
    "dd",
    "dd of a fixed size far from full, getting full, and just over full",
    seeds="003",
    metrics=(
        Metric("near_over_far", "time near full / far from full"),
        Metric("over_over_far", "time over full / far from full"),
        Metric("over_written_mib", "MiB accepted before ENOSPC (over full)", ratio=True),
        Metric("over_enospc_in", "ENOSPC reported by"),
    ),
)
def dd_fullness(ctx):
    """Seed 003 (Tux3 "How fast can we fail?", its dd table): write D MiB with fsync into
    a volume far from full (the main volume), into a small volume filled to ENOSPC and
    then given back 1.15×D (getting full), and into one given back 0.85×D (just over
    full). Measures the slowdown near full and how much is accepted before ENOSPC."""
    size = ctx.scale.dd_mib * MIB
    cases = (("far", None, None), ("near", ctx.scale.small_volume_mib, 1.15), ("over", ctx.scale.small_volume_mib, 0.85))
    times = {}
    for label, volume_mib, free_factor in cases:
        if volume_mib:
            ctx.open_volume(volume_mib)
        free_before = prefill(ctx, ctx.path("prefill"), int(size * free_factor)) if free_factor else None
        with ctx.phase(f"dd_{label}") as ph:
            result = write_file(ctx, ctx.path("dd.out"), size)
            ph.extra.update(result, free_before_mib=free_before and round(free_before / MIB, 1))
        times[label] = ctx.last_phase()["wall_s"]
        ctx.metric(f"{label}_written_mib", round(result["written_bytes"] / MIB, 2))
        ctx.metric(f"{label}_enospc_in", result["enospc_in"])
    ctx.metric("near_over_far", round(times["near"] / times["far"], 3) if times["far"] else None)
    ctx.metric("over_over_far", round(times["over"] / times["far"], 3) if times["far"] else None)


@workload(
    "fill",
    "fill to ENOSPC, tar onto the full volume, rm on the full volume",
    seeds="003",
    volume="small",
    metrics=(
        Metric("fill_percent_of_volume", "written / volume size % at first ENOSPC", ratio=True),
        Metric("first_enospc_from", "first ENOSPC from"),
        Metric("df_used_percent_at_enospc", "df used % at ENOSPC"),
        Metric("df_avail_mib_at_enospc", "df avail MiB at ENOSPC"),
        Metric("tar_exit", "tar exit code"),
        Metric("tar_files_extracted", "files tar got in"),
        Metric("rm_on_full", "unlink on full volume"),
    ),
    tools=("tar",),
)
def fill_and_tar(ctx):
    """Seed 003 (Tux3 ENOSPC metrics 2 and 3, and its "time to fail" test): on a small
    volume, append to one file until the first ENOSPC and record how full the volume
    is by bytes written and by df; then `tar -xf` a few thousand small files onto the
    full volume (the time tar takes to give up), then unlink the big file (which must
    work on a full volume)."""
    tarball = ctx.inputs.small_files_tar()
    os.mkdir(ctx.path("tar"))
    with ctx.phase("fill_to_enospc") as ph:
        written, failed_in = fill_until_enospc(ctx, ctx.path("fill"))
        ph.ops = written // MIB
    at_full = df(ctx.mnt)
    ctx.metric("fill_bytes", written)
    ctx.metric("first_enospc_from", failed_in)
    ctx.metric("fill_percent_of_volume", round(100.0 * written / (ctx.scale.small_volume_mib * MIB), 2))
    ctx.metric("df_used_percent_at_enospc", at_full["used_percent"])
    ctx.metric("df_avail_mib_at_enospc", round(at_full["avail_bytes"] / MIB, 2))
    with ctx.phase("tar_onto_full") as ph:
        done = ctx.run_cmd(["tar", "-xf", tarball, "-C", ctx.path("tar")], check=False)
        ph.ops = ctx.inputs.small_files
    ctx.metric("tar_exit", done.returncode)
    ctx.metric("tar_files_extracted", count_files(ctx.path("tar")))
    with ctx.phase("rm_on_full"):
        try:
            os.unlink(ctx.path("fill"))
            ctx.metric("rm_on_full", "ok")
        except OSError as e:
            ctx.metric("rm_on_full", f"failed: {e.strerror}")
    ctx.metric("df_avail_mib_after_rm", round(df(ctx.mnt)["avail_bytes"] / MIB, 2))


def _blurt_task(path, writes, chunk):
    """The body of one forked writer: create its file and write `writes` chunks."""
    code = 1
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o700)
        for _ in range(writes):
            os.write(fd, chunk)
        os.close(fd)
        code = 0
    except OSError as e:
        code = e.errno or 1
    except BaseException:
        code = 1
    finally:
        os._exit(code)


def _blurt_step(directory, tasks, writes, chunk):
    """Fork `tasks` writers into `directory` at once, wait for all; return their errnos (0 = ok)."""
    pids = []
    try:
        for t in range(tasks):
            pid = os.fork()
            if pid == 0:
                _blurt_task(os.path.join(directory, f"f{t}"), writes, chunk)
            pids.append(pid)
    finally:
        codes = [os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) for pid in pids]
    return codes


@workload(
    "blurt",
    "the 1000-task writer: T tasks × 40 × 1 KiB, into 9 directories, rounds until full",
    seeds="003",
    volume="small",
    metrics=(
        Metric("steps", "directory steps done"),
        Metric("stopped_by", "stopped by"),
        Metric("df_used_percent_at_end", "df used % at the end"),
        Metric("enospc_before_full", "ENOSPC before full?"),
    ),
)
def blurt(ctx):
    """Seed 003 (Tux3's "blurt" test): rounds of 9 steps; step i forks T tasks that each
    create their own file in directory i and write 40 × 1 KiB (rewriting the previous
    round's files), until a task fails. Measures total time and how full the volume is
    (df) when the first error comes: ENOSPC well below 100% is a failure of accounting."""
    s = ctx.scale
    chunk = b"hello world!\n".ljust(KIB, b"\0")
    steps, stopped_by = 0, "all rounds done"
    with ctx.phase("blurt") as ph:
        for step in ctx.loop(range(s.blurt_rounds * 9), "step"):
            d = ctx.path(str(step % 9 + 1))
            try:
                os.makedirs(d, exist_ok=True)
                codes = _blurt_step(d, s.blurt_tasks, s.blurt_writes, chunk)
            except OSError as e:
                codes = [e.errno]
            steps += 1
            failures = [c for c in codes if c]
            if failures:
                stopped_by = ", ".join(sorted({errno.errorcode.get(c, str(c)) for c in failures}))
                break
        ph.ops = steps * s.blurt_tasks
    used = df(ctx.mnt)["used_percent"]
    ctx.metric("steps", steps)
    ctx.metric("stopped_by", stopped_by)
    ctx.metric("df_used_percent_at_end", used)
    ctx.metric("enospc_before_full", "ENOSPC" in stopped_by and used is not None and used < 95.0)


@workload(
    "fio",
    "fio sequential 1 MiB and random 4 KiB, write then cold read",
    seeds="-",
    metrics=(
        Metric("seq_write_mib_s", "seq write MiB/s", ratio=True),
        Metric("seq_read_mib_s", "seq read MiB/s (cold)", ratio=True),
        Metric("rand_write_iops", "4k rand write IOPS", ratio=True),
        Metric("rand_read_iops", "4k rand read IOPS (cold)", ratio=True),
    ),
    tools=("fio",),
)
def fio_rw(ctx):
    """The usual throughput baseline (no seed): fio with psync on one file: sequential
    1 MiB writes (with a final fsync), sequential reads from a cold cache, then 4 KiB
    random writes and cold random reads, each random job time-limited."""
    s = ctx.scale
    path = ctx.path("fio.dat")
    jobs = (
        ("seq_write", "write", "1M", None, False, "seq_write_mib_s", "bw_mib_s"),
        ("seq_read_cold", "read", "1M", None, True, "seq_read_mib_s", "bw_mib_s"),
        ("rand_write_4k", "randwrite", "4k", s.fio_runtime_s, False, "rand_write_iops", "iops"),
        ("rand_read_4k_cold", "randread", "4k", s.fio_runtime_s, True, "rand_read_iops", "iops"),
    )
    for name, rw, bs, runtime, cold, metric, field_name in jobs:
        with ctx.phase(name, cold=cold, sync=rw.endswith("write")) as ph:
            result = fio_job(ctx, path, rw, bs, s.fio_mib, runtime)
            ph.ops = result["ios"]
            ph.extra.update(result)
        ctx.metric(metric, result[field_name])


@workload(
    "untar",
    "untar a synthetic source tree, read it back cold, rm -rf it cold",
    seeds="-",
    metrics=(Metric("files", "files"), Metric("mib", "MiB of file data")),
    tools=("tar", "rm"),
)
def untar_tree(ctx):
    """The usual metadata+data mix (no seed): `tar -xf` of a deterministic synthetic
    source tree (files of mixed sizes in nested directories, made by the runner),
    then a cold read of every file, then a cold `rm -rf` of the tree."""
    tarball = ctx.inputs.source_tree_tar()
    info = ctx.inputs.source_tree_info
    with ctx.phase("untar") as ph:
        ctx.run_cmd(["tar", "-xf", tarball, "-C", ctx.mnt])
        ph.ops = info["files"]
    with ctx.phase("read_all_cold", cold=True, sync=False):
        for path, is_dir in ctx.loop(walk(ctx.path("src")), "read", total=info["files"] + info["dirs"]):
            if not is_dir:
                with open(path, "rb", buffering=0) as f:
                    while f.read(MIB):
                        pass
    with ctx.phase("rm_rf_cold", cold=True) as ph:
        ctx.run_cmd(["rm", "-rf", ctx.path("src")])
        ph.ops = info["files"]
    ctx.metric("files", info["files"])
    ctx.metric("mib", round(info["bytes"] / MIB, 1))


@workload(
    "fsmark",
    "fs_mark-style small files: create, write, fsync, close",
    seeds="-",
    metrics=(Metric("files_per_s", "files/s", ratio=True),),
)
def fsmark_small(ctx):
    """The usual small-file baseline (no seed), after fs_mark's default loop: create N
    files of K KiB in one directory, each written, fsync'ed and closed before the
    next. Measures files per second with a durability point per file."""
    s = ctx.scale
    data = ctx.inputs.pattern(s.fsmark_kib * KIB)
    d = ctx.path("fsmark")
    os.mkdir(d)
    with ctx.phase("create_write_fsync") as ph, opendir(d) as dfd:
        for i in ctx.loop(range(s.fsmark_files), "files"):
            fd = os.open(f"f{i:07d}", CREATE_FLAGS, 0o644, dir_fd=dfd)
            os.write(fd, data)
            os.fsync(fd)
            os.close(fd)
    rec = ctx.last_phase()
    ctx.metric("files_per_s", round(ph.ops / rec["wall_s"], 1) if rec["wall_s"] else None)
