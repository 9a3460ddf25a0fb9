//! What the fuzz targets share: the image mutator and the pipeline of the seeded slice
//! (`tests/common/mutate.rs` and `tests/common/fuzz_case.rs`, the same files), the base
//! volume built once per process, a way to put fuzz bytes into one block of it, and an
//! in-memory B+tree node store.
//!
//! A finding (a property the pipeline checks, see `fuzz_case::Prop`) panics, so libFuzzer
//! keeps the input; `DXFS_FUZZ_IGNORE=prop,prop` (names as in the slice's summary) lets a
//! long run go on past bugs already known.

#[path = "../../tests/common/fuzz_case.rs"]
pub mod fuzz_case;
#[path = "../../tests/common/mutate.rs"]
pub mod mutate;

use std::collections::HashMap;
use std::sync::{Arc, OnceLock};

use dxfs::block::MemDevice;
use dxfs::internals::{Block, NodeRead, NodeStore};
use dxfs::{OpenOptions, Volume};

use fuzz_case::{Bases, Context, Finding};
use mutate::BS;

/// The base volume and what the targets need to know of it.
pub struct Shared {
    pub bases: Bases,
    /// Pipeline contexts for the quiet base and the live-log base.
    pub home: Context,
    pub log: Context,
    /// Inode numbers of the base's files, by path ("/small", "/xfile", ...).
    inos: HashMap<String, u64>,
    _scratch: tempfile::TempDir,
}

impl Shared {
    /// The inode number of `path` in the base volume.
    pub fn ino(&self, path: &str) -> u64 {
        *self.inos.get(path).unwrap_or_else(|| panic!("{path} is not in the base volume"))
    }
}

/// Built once per process (a second or two).
pub fn shared() -> &'static Shared {
    static SHARED: OnceLock<Shared> = OnceLock::new();
    SHARED.get_or_init(|| {
        limit_file_size();
        let bases = Bases::build();
        // A memory file system when there is one: an export creates some 570 files.
        let shm = std::path::Path::new("/dev/shm");
        let scratch = if shm.is_dir() { tempfile::tempdir_in(shm) } else { tempfile::tempdir() }
            .or_else(|_| tempfile::tempdir())
            .expect("a scratch directory");
        let home = Context::new(&bases.quiet_index, scratch.path().to_path_buf());
        let log = Context::new(&bases.log_index, scratch.path().to_path_buf());
        let mut inos = HashMap::new();
        let vol = Volume::open(
            Arc::new(MemDevice::from_bytes(bases.quiet.clone())),
            OpenOptions { read_only: true, ..OpenOptions::default() },
        )
        .expect("the base opens");
        for name in ["small", "frag", "xfile", "s1", "big", "long", "short"] {
            let a = vol.lookup(vol.root(), name.as_bytes()).expect("a file of the base");
            inos.insert(format!("/{name}"), a.ino);
        }
        Shared { bases, home, log, inos, _scratch: scratch }
    })
}

/// Export writes what a hostile image says: a 2^44-byte sparse file fills the disk. Cap
/// every file this process writes at 8 MiB, failing with EFBIG rather than a signal.
fn limit_file_size() {
    // SAFETY: plain system calls on this process's own signal disposition and limits.
    #[allow(unsafe_code)]
    unsafe {
        libc::signal(libc::SIGXFSZ, libc::SIG_IGN);
        let lim = libc::rlimit { rlim_cur: 8 << 20, rlim_max: 8 << 20 };
        libc::setrlimit(libc::RLIMIT_FSIZE, &lim);
    }
}

/// Panic with every finding not ignored by `DXFS_FUZZ_IGNORE`, so libFuzzer keeps the
/// input.
pub fn assert_none(found: &[Finding], what: &dyn std::fmt::Display) {
    static IGNORE: OnceLock<Vec<String>> = OnceLock::new();
    let ignore = IGNORE.get_or_init(|| {
        std::env::var("DXFS_FUZZ_IGNORE")
            .map(|v| v.split(',').map(|s| s.trim().to_string()).filter(|s| !s.is_empty()).collect())
            .unwrap_or_default()
    });
    let left: Vec<String> =
        found.iter().filter(|f| !ignore.iter().any(|i| i == f.prop.name())).map(|f| f.to_string()).collect();
    if !left.is_empty() {
        panic!("{what}:\n  {}", left.join("\n  "));
    }
}

/// Put `data` into block `b` of `img` from byte `from` on (zero-padded to the block's
/// end), then reseal the block for address `b`.
pub fn overwrite(img: &mut [u8], b: u64, from: usize, data: &[u8]) {
    let blk = &mut img[b as usize * BS..(b as usize + 1) * BS];
    let n = data.len().min(BS - from);
    blk[from..from + n].copy_from_slice(&data[..n]);
    blk[from + n..].fill(0);
    mutate::reseal(blk, b);
}

/// Little-endian u64 at `off`.
pub fn get_u64(b: &[u8], off: usize) -> u64 {
    u64::from_le_bytes(b[off..off + 8].try_into().expect("8 bytes"))
}

/// B+tree nodes in memory, for the tree functions directly: blocks by number, a pool of
/// fresh numbers to allocate from.
#[derive(Clone, Default)]
pub struct MemStore {
    pub blocks: HashMap<u64, Box<Block>>,
    next: u64,
    allocs: usize,
}

impl MemStore {
    /// A store holding `blocks`; new nodes are numbered from `first_free`.
    pub fn new(blocks: HashMap<u64, Box<Block>>, first_free: u64) -> MemStore {
        MemStore { blocks, next: first_free, allocs: 0 }
    }
}

impl NodeRead for MemStore {
    fn node(&mut self, block: u64) -> dxfs::Result<&Block> {
        self.blocks.get(&block).map(|b| &**b).ok_or_else(|| dxfs::Error::corrupt(format!("no block {block}")))
    }
}

impl NodeStore for MemStore {
    fn node_mut(&mut self, block: u64) -> dxfs::Result<&mut Block> {
        self.blocks.get_mut(&block).map(|b| &mut **b).ok_or_else(|| dxfs::Error::corrupt(format!("no block {block}")))
    }
    fn alloc_node(&mut self, _near: u64) -> dxfs::Result<u64> {
        if self.allocs >= 64 {
            return Err(dxfs::Error::NoSpace);
        }
        self.allocs += 1;
        while self.blocks.contains_key(&self.next) {
            self.next += 1;
        }
        let b = self.next;
        self.blocks.insert(b, Box::new([0u8; BS]));
        Ok(b)
    }
    fn free_node(&mut self, block: u64) -> dxfs::Result<()> {
        self.blocks
            .remove(&block)
            .map(|_| ())
            .ok_or_else(|| dxfs::Error::corrupt(format!("freeing block {block} twice")))
    }
}
