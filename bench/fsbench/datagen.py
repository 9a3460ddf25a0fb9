"""Deterministic inputs: file names, POSIX ACL values and tarballs, made locally so
that no network is needed and every run sees the same bytes."""

import io
import os
import random
import struct
import tarfile

# POSIX ACL xattr format (linux/posix_acl_xattr.h): a u32 version, then (u16 tag,
# u16 perm, u32 id) entries sorted by tag.
_ACL_VERSION = 2
_USER_OBJ, _USER, _GROUP_OBJ, _GROUP, _MASK, _OTHER = 0x01, 0x02, 0x04, 0x08, 0x10, 0x20
_UNDEFINED_ID = 0xFFFFFFFF


def acl_value(uid=1234, gid=4321):
    """The system.posix_acl_access value of `u::rw-,u:UID:r--,g::r--,g:GID:r--,m::r--,o::r--`."""
    entries = [
        (_USER_OBJ, 6, _UNDEFINED_ID),
        (_USER, 4, uid),
        (_GROUP_OBJ, 4, _UNDEFINED_ID),
        (_GROUP, 4, gid),
        (_MASK, 4, _UNDEFINED_ID),
        (_OTHER, 4, _UNDEFINED_ID),
    ]
    return struct.pack("<I", _ACL_VERSION) + b"".join(struct.pack("<HHI", *e) for e in entries)


def default_acl_value():
    """A default ACL for directories (same shape as the access ACL)."""
    return acl_value(uid=2345, gid=5432)


def numbered_names(prefix, count, width=6):
    """prefix000000, prefix000001, ... in creation order."""
    return [f"{prefix}{i:0{width}d}" for i in range(count)]


def names_of_length(length, count):
    """`count` distinct names exactly `length` bytes long, distinguished by a leading number."""
    filler = "abcdefghijklmnopqrstuvwxyz0123456789"
    pad = (filler * (length // len(filler) + 1))[:length]
    return [(f"{i:07d}_" + pad)[:length] if length >= 8 else f"{i:0{length}d}" for i in range(count)]


class _Blob:
    """A deterministic pseudo-random buffer that file contents are cut from."""

    def __init__(self, seed, size=4 << 20):
        self.data = random.Random(seed).randbytes(size)

    def piece(self, rng, size):
        start = rng.randrange(0, len(self.data) - size) if size < len(self.data) else 0
        return self.data[start : start + size]


def _source_file_size(rng):
    """Sizes shaped like a source tree: mostly small, a few large (capped at 1 MiB)."""
    r = rng.random()
    if r < 0.60:
        return rng.randint(100, 4096)
    if r < 0.90:
        return rng.randint(4096, 32 << 10)
    if r < 0.99:
        return rng.randint(32 << 10, 256 << 10)
    return rng.randint(256 << 10, 1 << 20)


def _add(tar, name, data, is_dir=False):
    info = tarfile.TarInfo(name)
    info.mtime = 1_600_000_000
    info.uid = info.gid = 0
    info.uname = info.gname = "root"
    if is_dir:
        info.type, info.mode = tarfile.DIRTYPE, 0o755
        tar.addfile(info)
    else:
        info.size, info.mode = len(data), 0o644
        tar.addfile(info, io.BytesIO(data))


def source_tree_tarball(path, files, seed=2024):
    """A synthetic source tree: `files` files of mixed sizes in nested directories."""
    rng = random.Random(seed)
    blob = _Blob(seed)
    dirs = ["src"]
    total = 0
    with tarfile.open(path, "w", format=tarfile.GNU_FORMAT) as tar:
        _add(tar, "src", b"", is_dir=True)
        for i in range(files):
            if rng.random() < 0.08 or len(dirs) == 1:  # a new directory, up to 4 levels deep
                parent = rng.choice(dirs)
                if parent.count("/") < 4:
                    d = f"{parent}/dir{len(dirs):04d}"
                    dirs.append(d)
                    _add(tar, d, b"", is_dir=True)
            size = _source_file_size(rng)
            total += size
            _add(tar, f"{rng.choice(dirs)}/file{i:05d}.c", blob.piece(rng, size))
    return {"files": files, "dirs": len(dirs), "bytes": total, "tar_bytes": os.path.getsize(path)}


def small_files_tarball(path, files, seed=3):
    """A few thousand small files (1-8 KiB) in 20 directories: the tar-onto-full test."""
    rng = random.Random(seed)
    blob = _Blob(seed, size=1 << 20)
    with tarfile.open(path, "w", format=tarfile.GNU_FORMAT) as tar:
        for d in range(20):
            _add(tar, f"t/d{d:02d}", b"", is_dir=True)
        for i in range(files):
            _add(tar, f"t/d{i % 20:02d}/f{i:05d}", blob.piece(rng, rng.randint(1024, 8192)))
    return {"files": files, "tar_bytes": os.path.getsize(path)}


class Inputs:
    """The run's generated inputs, made on first use in a scratch directory."""

    def __init__(self, workdir, scale, log):
        self._dir, self._scale, self._log = workdir, scale, log
        self._pattern = random.Random(7).randbytes(1 << 20)
        self._small_tar = None
        self._source_tar = None
        self.source_tree_info = None

    @property
    def small_files(self):
        return self._scale.tar_full_files

    def pattern(self, size):
        """`size` bytes of incompressible data (a repeated 1 MiB random block)."""
        reps = -(-size // len(self._pattern))
        return (self._pattern * reps)[:size]

    def small_files_tar(self):
        if self._small_tar is None:
            path = os.path.join(self._dir, "small-files.tar")
            self._log(f"generating {path} ({self.small_files} files)")
            small_files_tarball(path, self.small_files)
            self._small_tar = path
        return self._small_tar

    def source_tree_tar(self):
        if self._source_tar is None:
            path = os.path.join(self._dir, "source-tree.tar")
            self._log(f"generating {path} ({self._scale.untar_files} files)")
            self.source_tree_info = source_tree_tarball(path, self._scale.untar_files)
            self._source_tar = path
        return self._source_tar
