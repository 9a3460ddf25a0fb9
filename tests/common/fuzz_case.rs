//! One case of the image fuzzer (issue 39): a small populated volume, mutated by
//! [`mutate`](super::mutate), taken through everything that reads or repairs an image,
//! with every block write watched.
//!
//! Shared by `tests/fuzz_images.rs` (the seeded slice, one worker process per core) and
//! `fuzz/fuzz_targets/image.rs` (libFuzzer), through `#[path]`; it expects its sibling
//! module `mutate` next to it.
//!
//! The pipeline ([`run`]), on the damaged image and on a copy of it:
//! 1. `fsck -n`, a read-only open that walks and reads everything, `export`: nothing may
//!    be written;
//! 2. a read-write open of the damaged copy (as a mount of a hostile image would be) and
//!    a few writes, a sync and a close: no write may land on a superblock, and no fixed
//!    block (state, bitmap, mount mark, log) may get contents other than its own;
//! 3. `fsck` (repair), `fsck -n` again: it must run, find nothing left to fix, and be
//!    clean if the repair said so; a read-only walk then reads everything without error
//!    if it is clean;
//! 4. writes on the repaired volume, a close, `fsck -n`: still clean, and every write
//!    that succeeded reads back.
//!
//! Panics anywhere (other threads of the volume included) are caught per phase. Hangs and
//! crashes are the caller's to catch: the seeded slice runs cases in worker processes
//! with a deadline, libFuzzer has its own.

use std::collections::HashSet;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::{Arc, Mutex};

use dxfs::block::{BlockDevice, IoStats, MemDevice};
use dxfs::{FileType, NewNode, OpenOptions, Volume, XattrMode};

use super::mutate::{self, Choices, Geometry, Index, Kind, Mutation, BS};

/// Blocks of the base volume (8 MiB).
pub const BASE_BLOCKS: u64 = 2048;
/// Written into every file-data block the pipeline writes, to recognise it elsewhere.
pub const TAG: &[u8; 16] = b"<dxfs-fuzz-data>";

// ---------------------------------------------------------------------------------------
// Properties

/// What a case can get wrong. Each is counted on its own in the slice's summary.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Prop {
    /// A panic outside export (any thread).
    Panic,
    /// The worker process died (abort, stack overflow, allocation failure) outside export.
    Crash,
    /// A case took longer than its deadline outside export.
    Hang,
    /// A panic or crash in export.
    ExportPanic,
    /// Export took longer than the deadline.
    ExportHang,
    /// A repair (`fsck` without `-n`) failed to run (exit 8), the volume not being busy.
    RepairFailed,
    /// `fsck -n` after a repair failed to run, or found errors that the repair said it had
    /// fixed (it reported none left).
    FsckAfterRepairNotOk,
    /// `fsck -n` after a repair put something in `fixed`: a repair that did not hold.
    FixedAfterRepair,
    /// A write (or trim) while only reading: fsck -n, a read-only open, export.
    ReadOnlyWrite,
    /// A write to block 0 or to the backup superblock by user writes, or of anything but
    /// a valid superblock by a repair.
    SuperblockOverwritten,
    /// A write that puts the wrong contents on a fixed block (state, bitmap, mount mark,
    /// log), or the mount mark elsewhere.
    MisplacedWrite,
    /// File data written over a block that held live metadata (an inode block, a tree
    /// node, an xattr block) when the writes began, which the volume's own map could
    /// have told was live: marked used, or under a bitmap block whose checked `used`
    /// count disagrees with its bits (ro_compat BITMAP_COUNTS).
    DataOverMetadata,
    /// As [`Prop::DataOverMetadata`], over a block that the map marks free with a count
    /// that agrees (or without checked counts): only fsck's walk of the tree can see
    /// it is live.
    DataOverUnmarkedMetadata,
    /// [`Prop::DataOverUnmarkedMetadata`] on an image where fsck -n found nothing: a
    /// mount that checks first (`dxfs mount -o check`) would not have refused it.
    UnseenDataOverMetadata,
    /// A file read returned a metadata block.
    MetadataRead,
    /// readdir went back to an earlier position or never ended.
    Runaway,
    /// fsck -n found a repaired volume clean, yet reading it failed.
    CleanButUnreadable,
    /// fsck -n found a repaired volume clean, but not after a few writes and a close.
    DamagedByWrites,
    /// A write, sync and close succeeded, and the data did not read back.
    LostWrite,
    /// A case's peak RSS passed 256 MB.
    Memory,
}

impl Prop {
    /// Whether the CI slice fails on this property. The others are counted and printed
    /// but known to be open (docs/BENCHMARKS.md, "The image fuzzer"): the allocator
    /// trusting a free-space map that agrees with itself (file data over live metadata
    /// whose bit was cleared with its count, which only fsck's ownership walk sees, as in
    /// ext4: `dxfs mount -o check` walks first), and reads of a block a wild extent
    /// shares with metadata. Repairs that fail or do not hold, writes that damage a clean
    /// volume and lost writes are enforced since 11-30 (0 in 180,000 long-run cases).
    pub fn enforced(self) -> bool {
        !matches!(self, Prop::DataOverUnmarkedMetadata | Prop::MetadataRead)
    }

    pub const ALL: [Prop; 20] = [
        Prop::Panic,
        Prop::Crash,
        Prop::Hang,
        Prop::ExportPanic,
        Prop::ExportHang,
        Prop::RepairFailed,
        Prop::FsckAfterRepairNotOk,
        Prop::FixedAfterRepair,
        Prop::ReadOnlyWrite,
        Prop::SuperblockOverwritten,
        Prop::MisplacedWrite,
        Prop::DataOverMetadata,
        Prop::DataOverUnmarkedMetadata,
        Prop::UnseenDataOverMetadata,
        Prop::MetadataRead,
        Prop::Runaway,
        Prop::CleanButUnreadable,
        Prop::DamagedByWrites,
        Prop::LostWrite,
        Prop::Memory,
    ];
    pub fn name(self) -> &'static str {
        match self {
            Prop::Panic => "panic",
            Prop::Crash => "crash",
            Prop::Hang => "hang",
            Prop::ExportPanic => "export-panic",
            Prop::ExportHang => "export-hang",
            Prop::RepairFailed => "repair-failed",
            Prop::FsckAfterRepairNotOk => "fsck-after-repair-not-ok",
            Prop::FixedAfterRepair => "fixed-after-repair",
            Prop::ReadOnlyWrite => "read-only-write",
            Prop::SuperblockOverwritten => "superblock-overwritten",
            Prop::MisplacedWrite => "misplaced-write",
            Prop::DataOverMetadata => "data-over-metadata",
            Prop::DataOverUnmarkedMetadata => "data-over-unmarked-metadata",
            Prop::UnseenDataOverMetadata => "unseen-data-over-metadata",
            Prop::MetadataRead => "metadata-read",
            Prop::Runaway => "runaway",
            Prop::CleanButUnreadable => "clean-but-unreadable",
            Prop::DamagedByWrites => "damaged-by-writes",
            Prop::LostWrite => "lost-write",
            Prop::Memory => "memory",
        }
    }
    pub fn from_name(s: &str) -> Option<Prop> {
        Prop::ALL.into_iter().find(|p| p.name() == s)
    }
}

/// One thing a case got wrong.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Finding {
    pub prop: Prop,
    /// The phase it happened in.
    pub phase: String,
    pub message: String,
}

impl std::fmt::Display for Finding {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} in {}: {}", self.prop.name(), self.phase, self.message)
    }
}

// ---------------------------------------------------------------------------------------
// Base images

/// The volume every case starts from, in two forms, with what the mutator knows of each.
pub struct Bases {
    /// After a clean close, with both commit blocks zeroed: nothing is replayed, so a
    /// mutated home block is what every open reads.
    pub quiet: Vec<u8>,
    pub quiet_index: Index,
    /// After a crash: the newest delta awaits replay (for mutations of the log).
    pub live_log: Vec<u8>,
    pub log_index: Index,
}

impl Bases {
    pub fn new(quiet: Vec<u8>, live_log: Vec<u8>) -> Bases {
        let quiet_index = Index::new(&quiet);
        let log_index = Index::new(&live_log);
        Bases { quiet, quiet_index, live_log, log_index }
    }

    /// Build both (a second or two).
    pub fn build() -> Bases {
        let (quiet, live_log) = base_images();
        Bases::new(quiet, live_log)
    }
}

/// File contents: the tag, then `seed` bytes.
pub fn data(len: usize, seed: u8) -> Vec<u8> {
    let mut v: Vec<u8> = (0..len).map(|i| seed.wrapping_add((i / 4096) as u8)).collect();
    for off in (0..len).step_by(BS) {
        let n = TAG.len().min(len - off);
        v[off..off + n].copy_from_slice(&TAG[..n]);
    }
    v
}

fn must<T, E: std::fmt::Debug>(what: &str, r: Result<T, E>) -> T {
    r.unwrap_or_else(|e| panic!("building the base volume: {what}: {e:?}"))
}

/// A volume with one of everything: a directory of 270 long names (a two-level index)
/// with some names removed (lazily freed slots), a file of 300 extents (an extent tree
/// of two levels), files with inline extents, xattrs inline, in a block and with
/// continuations, a shared xattr block, short and long symlinks, hard links, a
/// subdirectory chain, device nodes, a fifo, a socket, empty ones, and two open unlinked
/// files on the orphan list. Returns (quiet, live_log) (see [`Bases`]).
pub fn base_images() -> (Vec<u8>, Vec<u8>) {
    let dev = Arc::new(MemDevice::new(BASE_BLOCKS));
    // A fixed hash seed and uuid: a seed must mean the same mutation on every run.
    let opts = dxfs::MkfsOptions {
        seed: Some([0x3e5a_1c6b, 0x7a4e_2f9d, 0x3b0f_118c, 0x6f5e_4d2a]),
        uuid: Some([0x39; 16]),
        ..dxfs::MkfsOptions::default()
    };
    must("mkfs", dxfs::mkfs(dev.clone(), &opts));
    let vol = must("open", Volume::open(dev.clone(), OpenOptions::default()));
    let root = vol.root();
    let big = must("mkdir big", vol.mkdir(root, b"big", 0o755, 0, 0)).ino;
    for i in 0..300 {
        must("create", vol.create(big, format!("entry-with-a-long-name-{i:05}").as_bytes(), 0o644, 0, 0));
    }
    for i in (0..300).step_by(10) {
        must("unlink", vol.unlink(big, format!("entry-with-a-long-name-{i:05}").as_bytes()));
    }
    must("setxattr", vol.setxattr(big, b"user.small", b"v", XattrMode::Any));
    let frag = must("create frag", vol.create(root, b"frag", 0o644, 0, 0)).ino;
    for k in 0..300u64 {
        must("write frag", vol.write(frag, k * 8192, &data(BS, k as u8)));
    }
    must("setxattr", vol.setxattr(frag, b"user.big", &[5u8; 1500], XattrMode::Any));
    let small = must("create small", vol.create(root, b"small", 0o644, 0, 0)).ino;
    must("write", vol.write(small, 0, &data(5000, 1)));
    must("write", vol.write(small, 3 * BS as u64, &data(100, 2)));
    must("setxattr", vol.setxattr(small, b"security.label", b"fuzz", XattrMode::Any));
    must("link", vol.link(small, root, b"small-link"));
    must("link", vol.link(small, big, b"hardlink"));
    let x = must("create xfile", vol.create(root, b"xfile", 0o644, 0, 0)).ino;
    must("setxattr", vol.setxattr(x, b"user.huge", &[9u8; 10_000], XattrMode::Any));
    must("setxattr", vol.setxattr(x, b"trusted.t", b"trusted value", XattrMode::Any));
    for name in [&b"s1"[..], b"s2"] {
        let s = must("create", vol.create(root, name, 0o644, 0, 0)).ino;
        must("setxattr", vol.setxattr(s, b"user.shared", &[3u8; 300], XattrMode::Any));
    }
    must("symlink", vol.symlink(root, b"short", b"target", 0, 0));
    must("symlink", vol.symlink(root, b"long", &[b'l'; 300], 0, 0));
    let mut d = root;
    for name in [&b"a"[..], b"b", b"c", b"d"] {
        d = must("mkdir", vol.mkdir(d, name, 0o755, 0, 0)).ino;
        let f = must("create", vol.create(d, b"f", 0o644, 0, 0)).ino;
        must("write", vol.write(f, 0, &data(300, name[0])));
    }
    must("mknod", vol.mknod(root, b"cdev", libc::S_IFCHR | 0o644, 0x0103, 0, 0));
    must("mknod", vol.mknod(root, b"bdev", libc::S_IFBLK | 0o600, 0x0801, 0, 0));
    must("mknod", vol.mknod(root, b"fifo", libc::S_IFIFO | 0o644, 0, 0, 0));
    must("mknod", vol.mknod(root, b"sock", libc::S_IFSOCK | 0o644, 0, 0, 0));
    must("create", vol.create(root, b"empty", 0o644, 0, 0));
    must("mkdir", vol.mkdir(root, b"emptydir", 0o755, 0, 0));
    must("sync", vol.sync());
    // Open and unlinked at the close: the orphan list.
    let node = NewNode { mode: libc::S_IFREG | 0o600, uid: 0, gid: 0, rdev: 0, umask: 0 };
    let t = must("tmpfile", vol.make_tmpfile(root, node)).ino;
    must("write", vol.write(t, 0, &data(9000, 7)));
    let gone = must("create", vol.create(root, b"gone", 0o644, 0, 0)).ino;
    must("write", vol.write(gone, 0, &data(20_000, 8)));
    must("open", vol.open_file(gone));
    must("unlink", vol.unlink(root, b"gone"));
    must("sync", vol.sync());
    must("close", vol.close());
    let mut quiet = dev.to_bytes();
    mutate::quiet_log(&mut quiet);
    assert_clean("the quiet base", &quiet);

    // The live log: two more deltas, then a crash; the mount mark put back clean.
    let dev = Arc::new(MemDevice::from_bytes(quiet.clone()));
    let vol = must("open", Volume::open(dev.clone(), OpenOptions::default()));
    let late = must("create", vol.create(root, b"late", 0o644, 0, 0)).ino;
    must("write", vol.write(late, 0, &data(3000, 9)));
    must("setxattr", vol.setxattr(late, b"user.late", &[4u8; 200], XattrMode::Any));
    must("mkdir", vol.mkdir(big, b"late-dir", 0o755, 0, 0));
    must("sync", vol.sync());
    let later = must("create", vol.create(root, b"later", 0o644, 0, 0)).ino;
    must("write", vol.write(later, 0, &data(6000, 10)));
    must("unlink", vol.unlink(big, b"entry-with-a-long-name-00001"));
    must("write", vol.write(frag, 5, b"overwrite in place"));
    must("sync", vol.sync());
    vol.poison();
    drop(vol);
    let mut live = dev.to_bytes();
    let g = Geometry::of(&live);
    if g.mark_block != 0 {
        let m = g.mark_block as usize * BS;
        live[m..m + BS].copy_from_slice(&quiet[m..m + BS]);
    }
    assert_clean("the live-log base", &live);
    (quiet, live)
}

fn assert_clean(what: &str, img: &[u8]) {
    let dev: Arc<dyn BlockDevice> = Arc::new(MemDevice::from_bytes(img.to_vec()));
    let r = dxfs::fsck::check(dev, false, &mut |_| {}).unwrap_or_else(|e| panic!("{what}: fsck: {e}"));
    assert!(r.errors.is_empty() && r.fixed.is_empty(), "{what} is not clean: {:?} {:?}", r.errors, r.fixed);
}

/// Make a case: a copy of a base image with 1 to 3 mutations. One case in eight mutates
/// the log of the live-log base; the others mutate home blocks of the quiet one (the
/// mount mark too when `mark`, see [`mutate::Options::mark`]).
pub fn make_case(bases: &Bases, ch: &mut dyn Choices, mark: bool) -> (Vec<u8>, Vec<Mutation>, bool) {
    let log = ch.chance(1, 8);
    let (mut img, idx, opts) = if log {
        (bases.live_log.clone(), &bases.log_index, mutate::Options::log())
    } else if mark {
        (bases.quiet.clone(), &bases.quiet_index, mutate::Options::home())
    } else {
        (bases.quiet.clone(), &bases.quiet_index, mutate::Options::home_without_mark())
    };
    let muts = mutate::mutate_some(&mut img, idx, ch, &opts);
    (img, muts, log)
}

// ---------------------------------------------------------------------------------------
// Panics

static PANICS: Mutex<Vec<String>> = Mutex::new(Vec::new());

/// Record every panic (any thread) instead of printing it; [`run`] reports them per
/// phase, and `echo` hears each at once (a panic in a volume's thread may leave the
/// phase waiting for ever: the slice's parent then names it with the hang). For the
/// seeded slice's workers; a libFuzzer target keeps its own hook, which aborts, so that
/// libFuzzer sees the panic.
pub fn install_panic_hook(echo: impl Fn(&str) + Send + Sync + 'static) {
    std::panic::set_hook(Box::new(move |info| {
        let msg = if let Some(s) = info.payload().downcast_ref::<&str>() {
            (*s).to_string()
        } else if let Some(s) = info.payload().downcast_ref::<String>() {
            s.clone()
        } else {
            "(non-string payload)".to_string()
        };
        let at = info.location().map(|l| format!("{}:{}", l.file(), l.line())).unwrap_or_default();
        let thread = std::thread::current().name().unwrap_or("?").to_string();
        let one_line = format!("{at}: {} [thread {thread}]", msg.replace('\n', " | "));
        echo(&one_line);
        if let Ok(mut p) = PANICS.lock() {
            p.push(one_line);
        }
    }));
}

fn take_panics() -> Vec<String> {
    PANICS.lock().map(|mut p| std::mem::take(&mut *p)).unwrap_or_default()
}

// ---------------------------------------------------------------------------------------
// The watched device

/// What writes are allowed now.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Mode {
    /// None at all.
    ReadOnly,
    /// A repair: fixed blocks only with their own kind of contents.
    Repair,
    /// User writes: as a repair, and none on a superblock, and no file data over a block
    /// that held live metadata when they began (by the pristine image's bitmap, or by the
    /// volume's own after a repair).
    User { trust_bitmap: bool },
}

struct Watch {
    mode: Mode,
    phase: String,
    /// Blocks holding live metadata when the user writes began.
    live_meta: HashSet<u64>,
    /// Of those, the ones the volume's map marked free with a count that agrees.
    unmarked: HashSet<u64>,
    /// A superblock still says the volume has a mount mark (ro_compat MOUNT_MARK) as the
    /// phase begins. A volume whose copies both lost the flag has none: its old mark
    /// block is an ordinary block then, which a repair may free and a write may use.
    mark_kept: bool,
    found: Vec<Finding>,
}

/// A memory device that checks every write against the phase it happens in.
pub struct Recorder {
    inner: MemDevice,
    geo: Geometry,
    base_kinds: Arc<Vec<Kind>>,
    watch: Mutex<Watch>,
}

impl Recorder {
    fn new(img: Vec<u8>, geo: Geometry, base_kinds: Arc<Vec<Kind>>) -> Recorder {
        Recorder {
            inner: MemDevice::from_bytes(img),
            geo,
            base_kinds,
            watch: Mutex::new(Watch {
                mode: Mode::ReadOnly,
                phase: String::new(),
                live_meta: HashSet::new(),
                unmarked: HashSet::new(),
                mark_kept: true,
                found: Vec::new(),
            }),
        }
    }

    fn set(&self, mode: Mode, phase: &str) {
        let (live_meta, unmarked) = match mode {
            Mode::User { trust_bitmap } => {
                let img = self.inner.to_bytes();
                let live = self.live_metadata(&img, trust_bitmap);
                let unmarked = live
                    .iter()
                    .copied()
                    .filter(|&b| !mutate::bitmap_used(&img, &self.geo, b) && mutate::bitmap_agrees(&img, &self.geo, b))
                    .collect();
                (live, unmarked)
            }
            _ => (HashSet::new(), HashSet::new()),
        };
        let mark_kept = [0, self.geo.backup()].iter().any(|&b| {
            let mut sb = vec![0u8; BS];
            self.inner.read(b, &mut sb).is_ok() && u32::from_le_bytes(sb[28..32].try_into().unwrap()) & 16 != 0
        });
        let mut w = self.watch.lock().unwrap_or_else(|e| e.into_inner());
        w.mode = mode;
        w.phase = phase.to_string();
        w.live_meta = live_meta;
        w.unmarked = unmarked;
        w.mark_kept = mark_kept;
    }

    fn take(&self) -> Vec<Finding> {
        std::mem::take(&mut self.watch.lock().unwrap_or_else(|e| e.into_inner()).found)
    }

    pub fn to_bytes(&self) -> Vec<u8> {
        self.inner.to_bytes()
    }

    /// Blocks that hold, sealed at their own address, the kind of metadata (inode, tree
    /// node, xattr) they held in the pristine image, an inode block with a linked inode
    /// (`holds_linked_inode`), and (with `trust_bitmap`) that the volume's bitmap marks
    /// used: a repair may have dropped a block it found damaged.
    fn live_metadata(&self, img: &[u8], trust_bitmap: bool) -> HashSet<u64> {
        (0..self.geo.blocks)
            .filter(|&b| {
                let k = self.base_kinds[b as usize];
                let blk = &img[b as usize * BS..(b as usize + 1) * BS];
                matches!(k, Kind::Inode | Kind::Btree | Kind::XattrHead | Kind::XattrCont)
                    && Kind::of_magic(blk) == Some(k)
                    && mutate::sealed(blk, b)
                    && (!trust_bitmap || mutate::bitmap_used(img, &self.geo, b))
                    && (k != Kind::Inode || holds_linked_inode(blk))
            })
            .collect()
    }

    fn check_write(&self, start: u64, buf: &[u8], what: &str) {
        let mut w = self.watch.lock().unwrap_or_else(|e| e.into_inner());
        if w.found.len() >= 16 {
            return;
        }
        let n = (buf.len() / BS) as u64;
        let phase = w.phase.clone();
        let add = |w: &mut Watch, prop: Prop, message: String| {
            if !w.found.iter().any(|f| f.prop == prop && f.message == message) {
                w.found.push(Finding { prop, phase: phase.clone(), message });
            }
        };
        if w.mode == Mode::ReadOnly {
            add(&mut w, Prop::ReadOnlyWrite, format!("{what} of {n} block(s) at block {start}"));
            return;
        }
        let g = self.geo;
        for k in 0..n {
            let b = start + k;
            let blk = &buf[k as usize * BS..(k as usize + 1) * BS];
            let is = |kind: Kind| Kind::of_magic(blk) == Some(kind) && mutate::sealed(blk, b);
            let data = contains(blk, TAG);
            let desc = if data { "file data" } else { "other contents" };
            if b == 0 || b == g.backup() {
                if matches!(w.mode, Mode::User { .. }) {
                    add(&mut w, Prop::SuperblockOverwritten, format!("{what} to block {b} (a superblock), {desc}"));
                } else if !is(Kind::Superblock) {
                    add(&mut w, Prop::SuperblockOverwritten, format!("{what} of {desc} over block {b} (a superblock)"));
                }
            } else if let Some(kind @ (Kind::State | Kind::Bitmap | Kind::Mark | Kind::Commit)) =
                g.fixed_kind(b).filter(|k| *k != Kind::Mark || w.mark_kept)
            {
                if !is(kind) {
                    add(&mut w, Prop::MisplacedWrite, format!("{what} of {desc} over block {b} (the {kind})"));
                }
            } else if g.in_log(b) {
                let area = if b < g.log_area(1) { g.log_area(0) } else { g.log_area(1) };
                if start != area && start != area + 1 {
                    add(&mut w, Prop::MisplacedWrite, format!("{what} of {desc} into the log at block {b}"));
                }
            } else if is(Kind::Mark) {
                let k = self.base_kinds.get(b as usize).copied().unwrap_or(Kind::Free);
                if k != Kind::Free {
                    add(&mut w, Prop::MisplacedWrite, format!("a mount mark written over block {b} (a {k} in use)"));
                }
            } else if matches!(w.mode, Mode::User { .. }) && data && w.live_meta.contains(&b) {
                let k = self.base_kinds[b as usize];
                let prop =
                    if w.unmarked.contains(&b) { Prop::DataOverUnmarkedMetadata } else { Prop::DataOverMetadata };
                add(&mut w, prop, format!("file data written over block {b}, a live {k} when the writes began"));
            }
        }
    }
}

/// Whether an inode block has a used slot whose inode is linked. A block whose inodes
/// all have no links holds only the unlinked-but-open, which the next read-write open
/// frees (the orphan list): the volume may then free the block and reuse it for data.
fn holds_linked_inode(blk: &[u8]) -> bool {
    let used = u16::from_le_bytes([blk[24], blk[25]]);
    (1..16).any(|s| used & (1 << s) != 0 && u32::from_le_bytes(blk[256 * s + 12..256 * s + 16].try_into().unwrap()) > 0)
}

fn contains(hay: &[u8], needle: &[u8]) -> bool {
    hay.windows(needle.len()).any(|w| w == needle)
}

impl BlockDevice for Recorder {
    fn block_count(&self) -> u64 {
        self.inner.block_count()
    }
    fn read(&self, block: u64, buf: &mut [u8]) -> dxfs::Result<()> {
        self.inner.read(block, buf)
    }
    fn write(&self, block: u64, buf: &[u8]) -> dxfs::Result<()> {
        if buf.len() % BS == 0 && block.checked_add((buf.len() / BS) as u64).is_some_and(|e| e <= self.geo.blocks) {
            self.check_write(block, buf, "a write");
        }
        self.inner.write(block, buf)
    }
    fn write_data(&self, block: u64, buf: &[u8]) -> dxfs::Result<()> {
        if buf.len() % BS == 0 && block.checked_add((buf.len() / BS) as u64).is_some_and(|e| e <= self.geo.blocks) {
            self.check_write(block, buf, "a data write");
        }
        self.inner.write(block, buf)
    }
    fn flush(&self) -> dxfs::Result<()> {
        self.inner.flush()
    }
    fn stats(&self) -> IoStats {
        self.inner.stats()
    }
    fn trim(&self, block: u64, count: u64) -> dxfs::Result<()> {
        let mut w = self.watch.lock().unwrap_or_else(|e| e.into_inner());
        let bad = w.mode == Mode::ReadOnly
            || (block..block.saturating_add(count)).any(|b| b < self.geo.first_free || b == self.geo.backup());
        if bad && w.found.len() < 16 {
            let (prop, phase) =
                (if w.mode == Mode::ReadOnly { Prop::ReadOnlyWrite } else { Prop::MisplacedWrite }, w.phase.clone());
            w.found.push(Finding { prop, phase, message: format!("a trim of {count} block(s) at block {block}") });
        }
        Ok(())
    }
}

// ---------------------------------------------------------------------------------------
// The pipeline

/// What the pipeline needs of the base: its geometry and block kinds (by position: the
/// superblock, state, log, bitmap and mark blocks; by magic among blocks in use).
pub struct Context {
    pub geo: Geometry,
    pub base_kinds: Arc<Vec<Kind>>,
    /// Where export writes (a fresh directory is made inside it per export).
    pub scratch: std::path::PathBuf,
}

impl Context {
    pub fn new(idx: &Index, scratch: std::path::PathBuf) -> Context {
        Context { geo: idx.geo, base_kinds: Arc::new(idx.kinds.clone()), scratch }
    }
}

/// What [`run`] tells its caller as it goes.
pub enum Event<'a> {
    /// A phase begins.
    Phase(&'a str),
    /// Something went wrong (also in the returned list).
    Found(&'a Finding),
}

struct Run<'a> {
    announce: &'a mut dyn FnMut(Event),
    found: Vec<Finding>,
    /// How many of `found` were told.
    told: usize,
}

impl Run<'_> {
    /// Run one phase: announced, watched, its panics caught and reported.
    fn phase<T>(&mut self, name: &str, dev: &Recorder, mode: Mode, f: impl FnOnce() -> T) -> Option<T> {
        self.tell();
        (self.announce)(Event::Phase(name));
        dev.set(mode, name);
        take_panics();
        let r = catch_unwind(AssertUnwindSafe(f));
        dev.set(Mode::ReadOnly, "between phases");
        let export = name.starts_with("export");
        for p in take_panics() {
            let prop = if export { Prop::ExportPanic } else { Prop::Panic };
            self.found.push(Finding { prop, phase: name.to_string(), message: p });
        }
        if r.is_err() && !self.found.iter().any(|f| f.phase == name) {
            let prop = if export { Prop::ExportPanic } else { Prop::Panic };
            self.found.push(Finding { prop, phase: name.to_string(), message: "a panic (no hook)".into() });
        }
        self.found.extend(dev.take());
        r.ok()
    }

    fn add(&mut self, prop: Prop, phase: &str, message: String) {
        self.found.push(Finding { prop, phase: phase.to_string(), message });
    }

    /// Tell the caller what was found since last time (before a phase that may hang).
    fn tell(&mut self) {
        for f in &self.found[self.told..] {
            (self.announce)(Event::Found(f));
        }
        self.told = self.found.len();
    }

    fn finish(mut self) -> Vec<Finding> {
        self.tell();
        self.found
    }
}

fn device(img: &[u8], ctx: &Context) -> Arc<Recorder> {
    Arc::new(Recorder::new(img.to_vec(), ctx.geo, ctx.base_kinds.clone()))
}

fn ro_opts() -> OpenOptions {
    OpenOptions { read_only: true, cache_blocks: 1 << 13, ..OpenOptions::default() }
}

/// Whether an error is the volume saying it is held (a designed refusal, not a failure).
fn busy(e: &dxfs::Error) -> bool {
    matches!(e, dxfs::Error::Busy(_))
}

/// Whether the superblock copy in block `b` could be used: it decodes, fits the device,
/// and names no unknown incompatible feature. When neither copy can, refusing the volume
/// (exit 8) is the designed answer (issue 39, item 12), not a failure.
pub fn superblock_usable(img: &[u8], b: u64) -> bool {
    let Some(raw) = img.get(b as usize * BS..(b as usize + 1) * BS) else { return false };
    let blk: &[u8; BS] = raw.try_into().expect("a whole block");
    match dxfs::Superblock::decode(blk, b) {
        Ok(sb) => {
            sb.layout.block_count <= (img.len() / BS) as u64 && sb.incompat & !dxfs::internals::KNOWN_INCOMPAT == 0
        }
        Err(_) => false,
    }
}

/// Which parts of the pipeline run besides fsck -n and the read-only walk.
#[derive(Clone, Copy, Debug)]
pub struct Steps {
    pub export: bool,
    /// The read-write session on the damaged image.
    pub damaged_writes: bool,
    /// The repair, and everything after it.
    pub repair: bool,
}

impl Steps {
    pub const ALL: Steps = Steps { export: true, damaged_writes: true, repair: true };
    pub const READ_ONLY: Steps = Steps { export: false, damaged_writes: false, repair: false };
}

/// Run the whole pipeline on a damaged image; `announce` hears each phase's name as it
/// begins and each finding as soon as the phase that found it ends (the slice's parent
/// keeps them when a later phase hangs, and names the phase that did).
pub fn run(img: &[u8], ctx: &Context, announce: &mut dyn FnMut(Event)) -> Vec<Finding> {
    run_steps(img, ctx, Steps::ALL, announce)
}

/// [`run`] with only some of its steps (the per-decoder fuzz targets).
pub fn run_steps(img: &[u8], ctx: &Context, steps: Steps, announce: &mut dyn FnMut(Event)) -> Vec<Finding> {
    let mut run = Run { announce, found: Vec::new(), told: 0 };
    let dev = device(img, ctx);
    let as_dyn = |d: &Arc<Recorder>| -> Arc<dyn BlockDevice> { d.clone() };

    // 1. Only reading: fsck -n, a walk, export.
    let first = run.phase("fsck -n", &dev, Mode::ReadOnly, || dxfs::fsck::check(as_dyn(&dev), false, &mut |_| {}));
    let undetected = matches!(&first, Some(Ok(r)) if r.errors.is_empty() && r.fixed.is_empty());
    let walked = run
        .phase("read-only walk", &dev, Mode::ReadOnly, || {
            Volume::open(as_dyn(&dev), ro_opts()).map(|vol| walk(&vol, ctx)).map_err(|e| e.to_string())
        })
        .and_then(Result::ok);
    if let Some(w) = &walked {
        for (prop, m) in &w.findings {
            run.add(*prop, "read-only walk", m.clone());
        }
        if undetected && !w.errors.is_empty() {
            run.add(
                Prop::CleanButUnreadable,
                "read-only walk",
                format!("fsck -n found nothing: {}", w.errors.join("; ")),
            );
        }
    }
    if steps.export {
        run.phase("export", &dev, Mode::ReadOnly, || {
            let vol = Volume::open(as_dyn(&dev), ro_opts()).ok()?;
            let dir = tempfile::Builder::new().prefix("export-").tempdir_in(&ctx.scratch).ok()?;
            let r = dxfs::tools::export::export(&vol, &dir.path().join("out"), &mut |_| {});
            Some(r.is_ok())
        });
    }

    // 2. A read-write open of the damaged image (a mount of a hostile image) and writes.
    if steps.damaged_writes {
        damaged_writes(&mut run, img, ctx, walked.as_ref(), undetected);
    }
    if !steps.repair {
        return run.finish();
    }

    // 3. Repair, and check that it held.
    let repair = run.phase("fsck (repair)", &dev, Mode::Repair, || dxfs::fsck::check(as_dyn(&dev), true, &mut |_| {}));
    let some_superblock = superblock_usable(img, 0) || superblock_usable(img, ctx.geo.backup());
    let mut repair_error = None;
    let repair = match repair {
        Some(Ok(r)) => Some(r),
        // Held by a live process, or no usable superblock: refusing is the design.
        Some(Err(e)) if busy(&e) || !some_superblock => return run.finish(),
        Some(Err(e)) => {
            let backup = if superblock_usable(img, 0) { "" } else { " (block 0 is damaged, the backup is usable)" };
            run.add(Prop::RepairFailed, "fsck (repair)", format!("{e}{backup}"));
            repair_error = Some(e.to_string());
            None
        }
        None => None,
    };
    let after =
        run.phase("fsck -n after repair", &dev, Mode::ReadOnly, || dxfs::fsck::check(as_dyn(&dev), false, &mut |_| {}));
    let clean = match after {
        Some(Ok(r)) => {
            if !r.fixed.is_empty() {
                run.add(Prop::FixedAfterRepair, "fsck -n after repair", format!("fixed: {:?}", r.fixed));
            }
            if let Some(rep) = &repair {
                if rep.errors.is_empty() && !r.errors.is_empty() {
                    run.add(
                        Prop::FsckAfterRepairNotOk,
                        "fsck -n after repair",
                        format!("the repair left no errors (fixed {:?}), yet: {:?}", rep.fixed, r.errors),
                    );
                }
            }
            r.errors.is_empty() && r.fixed.is_empty()
        }
        Some(Err(e)) => {
            // The same refusal as the repair's is one finding, not two.
            if repair_error.as_deref() != Some(e.to_string().as_str()) {
                run.add(Prop::FsckAfterRepairNotOk, "fsck -n after repair", format!("failed to run: {e}"));
            }
            false
        }
        None => false,
    };
    let walked = run
        .phase("read-only walk after repair", &dev, Mode::ReadOnly, || {
            Volume::open(as_dyn(&dev), ro_opts()).map(|vol| walk(&vol, ctx)).map_err(|e| e.to_string())
        })
        .map(|r| r.map_err(|e| vec![format!("open: {e}")]));
    let mut files = Vec::new();
    match walked {
        Some(Ok(w)) => {
            for (prop, m) in &w.findings {
                run.add(*prop, "read-only walk after repair", m.clone());
            }
            if clean && !w.errors.is_empty() {
                run.add(Prop::CleanButUnreadable, "read-only walk after repair", w.errors.join("; "));
            }
            files = w.files;
        }
        Some(Err(e)) if clean => run.add(Prop::CleanButUnreadable, "read-only walk after repair", e.join("; ")),
        _ => {}
    }

    // 4. Writes on the repaired volume.
    let wrote =
        run.phase("writes after repair", &dev, Mode::User { trust_bitmap: true }, || user_writes(as_dyn(&dev), &files));
    let check = run.phase("fsck -n after the writes", &dev, Mode::ReadOnly, || {
        dxfs::fsck::check(as_dyn(&dev), false, &mut |_| {})
    });
    if clean {
        match &check {
            Some(Ok(r)) if !r.errors.is_empty() => run.add(
                Prop::DamagedByWrites,
                "fsck -n after the writes",
                format!("{:?} (writes: {:?})", r.errors, wrote.as_ref().map(|w| &w.notes)),
            ),
            Some(Err(e)) => run.add(Prop::DamagedByWrites, "fsck -n after the writes", format!("failed to run: {e}")),
            _ => {}
        }
    }
    if let Some(w) = wrote.filter(|w| w.closed && !w.kept.is_empty()) {
        let lost = run.phase("reading the writes back", &dev, Mode::ReadOnly, || read_back(as_dyn(&dev), &w.kept));
        if let Some(Some(m)) = lost {
            run.add(Prop::LostWrite, "reading the writes back", m);
        }
    }
    run.finish()
}

/// A read-write session on (a copy of) the damaged image, as a mount of a hostile image
/// would be; when fsck -n found nothing wrong with it, the session must leave nothing
/// wrong either.
fn damaged_writes(run: &mut Run, img: &[u8], ctx: &Context, walked: Option<&Walked>, undetected: bool) {
    let as_dyn = |d: &Arc<Recorder>| -> Arc<dyn BlockDevice> { d.clone() };
    let hostile = device(img, ctx);
    let files = walked.map(|w| w.files.clone()).unwrap_or_default();
    let before = run.found.len();
    let wrote = run.phase("writes on the damaged volume", &hostile, Mode::User { trust_bitmap: false }, || {
        user_writes(as_dyn(&hostile), &files)
    });
    if !undetected {
        return;
    }
    let over: Vec<String> = run.found[before..]
        .iter()
        .filter(|f| f.prop == Prop::DataOverUnmarkedMetadata)
        .map(|f| f.message.clone())
        .collect();
    for m in over {
        run.add(Prop::UnseenDataOverMetadata, "writes on the damaged volume", format!("fsck -n found nothing: {m}"));
    }
    let check = run.phase("fsck -n after the writes on the damaged volume", &hostile, Mode::ReadOnly, || {
        dxfs::fsck::check(as_dyn(&hostile), false, &mut |_| {})
    });
    let notes = wrote.as_ref().map(|w| &w.notes);
    match &check {
        Some(Ok(r)) if !r.errors.is_empty() => run.add(
            Prop::DamagedByWrites,
            "writes on the damaged volume",
            format!("fsck -n found nothing before, then {:?} (writes: {notes:?})", r.errors),
        ),
        Some(Err(e)) => {
            run.add(Prop::DamagedByWrites, "writes on the damaged volume", format!("fsck -n then failed to run: {e}"))
        }
        _ => {}
    }
}

// ---------------------------------------------------------------------------------------
// Reading everything

/// What a walk found.
#[derive(Default)]
struct Walked {
    /// Operations that failed (EIO and the like): fine on a damaged volume.
    errors: Vec<String>,
    /// Properties broken.
    findings: Vec<(Prop, String)>,
    /// Regular files: (inode, size).
    files: Vec<(u64, u64)>,
}

const MAX_DIRS: usize = 5000;
const MAX_ENTRIES: u64 = 200_000;
const READ_CAP: u64 = 1 << 20;

/// Read everything a read-only open shows: every directory (readdir and readdirplus),
/// every entry's lookup and attributes, xattrs, symlink targets, file data (the first
/// MiB and the last 64 KiB of each file).
fn walk(vol: &Volume, ctx: &Context) -> Walked {
    let mut w = Walked::default();
    let err = |w: &mut Walked, what: String, e: dxfs::Error| {
        if w.errors.len() < 20 {
            w.errors.push(format!("{what}: {e}"));
        }
    };
    let _ = vol.statfs();
    let root = vol.root();
    if let Err(e) = vol.getattr(root) {
        err(&mut w, "getattr /".into(), e);
    }
    let mut seen_dirs = HashSet::from([root]);
    let mut seen_files = HashSet::new();
    let mut queue = std::collections::VecDeque::from([(root, String::new())]);
    let mut entries = 0u64;
    while let Some((dir, path)) = queue.pop_front() {
        if seen_dirs.len() > MAX_DIRS {
            break;
        }
        xattrs(vol, dir, &path, &mut w);
        let mut pos = 0u64;
        let mut first = true;
        loop {
            if first {
                first = false;
                if let Err(e) = vol.readdir_plus(dir, 0, 64) {
                    err(&mut w, format!("readdirplus {path}/"), e);
                }
            }
            let batch = match vol.readdir(dir, pos, 256) {
                Ok(b) => b,
                Err(e) => {
                    err(&mut w, format!("readdir {path}/"), e);
                    break;
                }
            };
            if batch.is_empty() {
                break;
            }
            for e in batch {
                if e.next <= pos {
                    w.findings.push((
                        Prop::Runaway,
                        format!("readdir of {path}/ went from position {pos:#x} back to {:#x}", e.next),
                    ));
                    return w;
                }
                pos = e.next;
                entries += 1;
                if entries > MAX_ENTRIES {
                    w.findings.push((Prop::Runaway, format!("readdir of {path}/ gave over {MAX_ENTRIES} entries")));
                    return w;
                }
                if e.name == b"." || e.name == b".." {
                    continue;
                }
                let p = format!("{path}/{}", String::from_utf8_lossy(&e.name));
                match vol.lookup(dir, &e.name) {
                    Ok(a) if a.ino != e.ino => {
                        if w.errors.len() < 20 {
                            w.errors.push(format!("lookup {p}: inode {} but readdir said {}", a.ino, e.ino));
                        }
                    }
                    Ok(_) => {}
                    Err(x) => err(&mut w, format!("lookup {p}"), x),
                }
                let a = match vol.getattr(e.ino) {
                    Ok(a) => a,
                    Err(x) => {
                        err(&mut w, format!("getattr {p}"), x);
                        continue;
                    }
                };
                if a.kind == FileType::Directory {
                    if seen_dirs.insert(e.ino) {
                        queue.push_back((e.ino, p));
                    }
                    continue;
                }
                if !seen_files.insert(e.ino) {
                    continue; // a hard link, read already
                }
                match a.kind {
                    FileType::Symlink => {
                        if let Err(x) = vol.readlink(e.ino) {
                            err(&mut w, format!("readlink {p}"), x);
                        }
                    }
                    FileType::RegularFile => {
                        w.files.push((e.ino, a.size));
                        read_file(vol, ctx, e.ino, a.size, &p, &mut w);
                    }
                    _ => {}
                }
                xattrs(vol, e.ino, &p, &mut w);
            }
        }
    }
    w
}

fn xattrs(vol: &Volume, ino: u64, path: &str, w: &mut Walked) {
    match vol.listxattr(ino) {
        Ok(names) => {
            for n in names {
                if let Err(e) = vol.getxattr(ino, &n) {
                    if w.errors.len() < 20 {
                        w.errors.push(format!("getxattr {path} {}: {e}", String::from_utf8_lossy(&n)));
                    }
                }
            }
        }
        Err(e) => {
            if w.errors.len() < 20 {
                w.errors.push(format!("listxattr {path}: {e}"));
            }
        }
    }
}

fn read_file(vol: &Volume, ctx: &Context, ino: u64, size: u64, path: &str, w: &mut Walked) {
    let mut spans = vec![(0, size.min(READ_CAP))];
    if size > READ_CAP {
        spans.push((size - 65536, 65536));
    }
    for (start, len) in spans {
        let mut off = start;
        while off < start + len {
            let n = (start + len - off).min(256 << 10) as usize;
            match vol.read(ino, off, n) {
                Ok(buf) => {
                    if off % BS as u64 == 0 {
                        for (i, blk) in buf.chunks(BS).enumerate() {
                            if blk.len() == BS {
                                // A sealed block of a kind that was live at its address
                                // in the pristine image (stale copies in free blocks are
                                // not metadata any more).
                                let at = get64(blk, 8);
                                let live = |k: &Kind| ctx.base_kinds.get(at as usize) == Some(k);
                                if let Some(k) = Kind::of_magic(blk).filter(|k| live(k) && mutate::sealed(blk, at)) {
                                    w.findings.push((
                                        Prop::MetadataRead,
                                        format!(
                                            "reading {path} at {} returned block {} ({k})",
                                            off + (i * BS) as u64,
                                            get64(blk, 8)
                                        ),
                                    ));
                                    return;
                                }
                            }
                        }
                    }
                    if buf.is_empty() {
                        break;
                    }
                    off += buf.len() as u64;
                }
                Err(e) => {
                    if w.errors.len() < 20 {
                        w.errors.push(format!("read {path} at {off}: {e}"));
                    }
                    break;
                }
            }
        }
    }
}

fn get64(b: &[u8], off: usize) -> u64 {
    u64::from_le_bytes(b[off..off + 8].try_into().expect("8 bytes"))
}

// ---------------------------------------------------------------------------------------
// Writing

/// What the writes did.
struct Wrote {
    /// Whether sync and close succeeded.
    closed: bool,
    /// Writes that succeeded: (inode, offset, data).
    kept: Vec<(u64, u64, Vec<u8>)>,
    notes: Vec<String>,
}

/// A few writes of each kind a user makes: a new file, 10 bytes into block 1 of existing
/// files and an append to them, an xattr, a directory, a sync, an unlink, a close.
fn user_writes(dev: Arc<dyn BlockDevice>, files: &[(u64, u64)]) -> Wrote {
    let mut out = Wrote { closed: false, kept: Vec::new(), notes: Vec::new() };
    let opts = OpenOptions { cache_blocks: 1 << 13, ..OpenOptions::default() };
    let vol = match Volume::open(dev, opts) {
        Ok(v) => v,
        Err(e) => {
            out.notes.push(format!("open: {e}"));
            return out;
        }
    };
    let root = vol.root();
    let note = |out: &mut Wrote, what: &str, e: dxfs::Error| out.notes.push(format!("{what}: {e}"));
    match vol.create(root, b"fuzz-new", 0o644, 0, 0) {
        Ok(a) => {
            let d = data(20_000, 0xA0);
            match vol.write(a.ino, 0, &d) {
                Ok(_) => out.kept.push((a.ino, 0, d)),
                Err(e) => note(&mut out, "write fuzz-new", e),
            }
        }
        Err(e) => note(&mut out, "create fuzz-new", e),
    }
    // Files with data first: their extents are what the damage may have bent.
    let mut files = files.to_vec();
    files.sort_by_key(|&(_, size)| size == 0);
    for (i, &(ino, size)) in files.iter().take(12).enumerate() {
        let mut d = TAG.to_vec();
        d.push(i as u8);
        let blocks = size.div_ceil(BS as u64);
        let mut offsets: Vec<u64> = if blocks <= 16 {
            (0..blocks.max(2)).map(|b| b * BS as u64 + 7).collect()
        } else {
            [0, 1, 2, blocks / 2, blocks - 1].iter().map(|b| b * BS as u64 + 7).collect()
        };
        offsets.push(size); // an append
        for off in offsets {
            match vol.write(ino, off, &d) {
                Ok(_) => out.kept.push((ino, off, d.clone())),
                Err(e) => note(&mut out, &format!("write {} bytes to inode {ino} at {off}", d.len()), e),
            }
        }
    }
    if let Err(e) = vol.setxattr(root, b"user.fuzz", &[7u8; 100], XattrMode::Any) {
        note(&mut out, "setxattr /", e);
    }
    if let Err(e) = vol.mkdir(root, b"fuzz-dir", 0o755, 0, 0) {
        note(&mut out, "mkdir", e);
    }
    let synced = vol.sync();
    if let Err(e) = vol.unlink(root, b"fuzz-new") {
        note(&mut out, "unlink", e);
    }
    out.kept.retain(|(ino, ..)| files.iter().any(|(f, _)| f == ino));
    match (synced, vol.close()) {
        (Ok(()), Ok(())) => out.closed = true,
        (s, c) => out.notes.push(format!("sync {s:?}, close {c:?}")),
    }
    out
}

/// The first write that does not read back (later writes to the same bytes win).
fn read_back(dev: Arc<dyn BlockDevice>, kept: &[(u64, u64, Vec<u8>)]) -> Option<String> {
    let vol = Volume::open(dev, ro_opts()).ok()?;
    for (i, (ino, off, d)) in kept.iter().enumerate() {
        let overwritten =
            kept[i + 1..].iter().any(|(j, o, e)| j == ino && *o < off + d.len() as u64 && off < &(o + e.len() as u64));
        if overwritten {
            continue;
        }
        match vol.read(*ino, *off, d.len()) {
            Ok(got) if got == *d => {}
            Ok(got) => {
                return Some(format!(
                    "{} bytes written to inode {ino} at {off} (write, sync and close all succeeded) read back as {:?}",
                    d.len(),
                    String::from_utf8_lossy(&got[..got.len().min(24)])
                ))
            }
            Err(e) => {
                return Some(format!("{} bytes written to inode {ino} at {off} read back as an error: {e}", d.len()))
            }
        }
    }
    None
}
