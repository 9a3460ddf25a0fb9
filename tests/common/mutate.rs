//! Structure-aware, checksum-resealing mutations of a dxfs image (issue 39).
//!
//! Random bytes in a metadata block are rejected by its crc32c before any decoder sees
//! them, so this mutator works as an attacker would: it finds the blocks of each kind
//! (docs/FORMAT.md), picks one *decoded field* (an inode's size or an extent's physical
//! block, a B+tree node's level or a child pointer, a directory entry's inode, an xattr
//! entry's lengths, a bitmap bit, a state or superblock field, a commit block's count),
//! sets it to a hostile value (0, the maximum, ±1, a pointer to another kind of block, to
//! itself or to an ancestor, values near 2^64, 2^32, 2^44, 2^61, 2^62) and reseals the
//! block, so the damage reaches the decoders. Log images are resealed as their target
//! block and the commit block's body crc is recomputed (unless the mutation is the crc).
//!
//! Shared by `tests/fuzz_images.rs` (a seeded slice, on stable Rust) and the cargo-fuzz
//! crate in `fuzz/` (through `#[path]`), so it depends on nothing but `dxfs` and `crc32c`.
//! Choices come from a [`Choices`]: a seeded PRNG ([`SeedRng`]) or libFuzzer's bytes
//! ([`ByteChoices`]).

use std::collections::HashMap;
use std::fmt;

/// Block size.
pub const BS: usize = 4096;

const SB_MAGIC: &[u8; 4] = b"DXSB";
const STATE_MAGIC: &[u8; 4] = b"DXST";
const COMMIT_MAGIC: &[u8; 4] = b"DXLC";
const BITMAP_MAGIC: &[u8; 4] = b"DXBM";
const INODE_MAGIC: &[u8; 4] = b"DXIN";
const XATTR_MAGIC: &[u8; 4] = b"DXXA";
const XCONT_MAGIC: &[u8; 4] = b"DXXC";
const MARK_MAGIC: &[u8; 4] = b"DXMM";
const BTREE_MAGIC: &[u8; 4] = b"DXTN";
/// Blocks a bitmap block covers.
const BITS_PER_BITMAP: u64 = 32512;
/// A bitmap block's `used` count (u32) and the ro_compat flag that makes it checked.
const BITMAP_USED: usize = 16;
const BITMAP_COUNTS: u64 = 64;
/// Descriptor flag of a logged file-data image.
const DATA_TARGET: u64 = 1 << 63;

// ---------------------------------------------------------------------------------------
// Choices

/// A deterministic source of choices.
pub trait Choices {
    /// 64 fresh bits.
    fn next_u64(&mut self) -> u64;
    /// A number in `0..n` (0 when `n` is 0).
    fn below(&mut self, n: u64) -> u64 {
        if n == 0 {
            0
        } else {
            self.next_u64() % n
        }
    }
    /// True `num` times in `den`.
    fn chance(&mut self, num: u64, den: u64) -> bool {
        self.below(den) < num
    }
}

/// splitmix64: a seed gives the same mutation on every machine.
pub struct SeedRng(u64);

impl SeedRng {
    pub fn new(seed: u64) -> SeedRng {
        SeedRng(seed ^ 0x9E37_79B9_7F4A_7C15)
    }
}

impl Choices for SeedRng {
    fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
}

/// Choices read from a byte string (libFuzzer's input): each choice takes as few bytes
/// as its range needs, and an exhausted input gives zeros.
pub struct ByteChoices<'a> {
    data: &'a [u8],
}

impl<'a> ByteChoices<'a> {
    pub fn new(data: &'a [u8]) -> ByteChoices<'a> {
        ByteChoices { data }
    }
    fn take(&mut self, n: usize) -> u64 {
        let n = n.min(self.data.len());
        let mut v = 0u64;
        for (i, b) in self.data[..n].iter().enumerate() {
            v |= u64::from(*b) << (8 * i);
        }
        self.data = &self.data[n..];
        v
    }
    /// The bytes not consumed yet.
    pub fn rest(&self) -> &'a [u8] {
        self.data
    }
}

impl Choices for ByteChoices<'_> {
    fn next_u64(&mut self) -> u64 {
        self.take(8)
    }
    fn below(&mut self, n: u64) -> u64 {
        if n <= 1 {
            return 0;
        }
        let bytes = (64 - (n - 1).leading_zeros()).div_ceil(8) as usize;
        self.take(bytes) % n
    }
}

// ---------------------------------------------------------------------------------------
// Little-endian access and sealing

fn get(b: &[u8], off: usize, width: usize) -> u64 {
    let mut v = 0u64;
    for i in 0..width {
        v |= u64::from(b[off + i]) << (8 * i);
    }
    v
}

fn put(b: &mut [u8], off: usize, width: usize, v: u64) {
    for i in 0..width {
        b[off + i] = (v >> (8 * i)) as u8;
    }
}

fn mask(width: usize) -> u64 {
    if width >= 8 {
        u64::MAX
    } else {
        (1u64 << (8 * width)) - 1
    }
}

fn block(img: &[u8], b: u64) -> &[u8] {
    &img[b as usize * BS..(b as usize + 1) * BS]
}

fn block_mut(img: &mut [u8], b: u64) -> &mut [u8] {
    &mut img[b as usize * BS..(b as usize + 1) * BS]
}

/// crc32c of a block with its crc field taken as zero (FORMAT.md §1).
fn block_crc(b: &[u8]) -> u32 {
    let c = crc32c::crc32c(&b[..4]);
    let c = crc32c::crc32c_append(c, &[0u8; 4]);
    crc32c::crc32c_append(c, &b[8..BS])
}

/// Whether `b` is a sealed metadata block of address `blockno`.
pub fn sealed(b: &[u8], blockno: u64) -> bool {
    b.len() >= BS && get(b, 8, 8) == blockno && get(b, 4, 4) as u32 == block_crc(b)
}

/// Reseal a metadata block for address `blockno` with the library's own `seal`.
pub fn reseal(b: &mut [u8], blockno: u64) {
    let blk: &mut [u8; BS] = (&mut b[..BS]).try_into().expect("a whole block");
    dxfs::internals::seal(blk, blockno);
}

// ---------------------------------------------------------------------------------------
// Geometry and classification

/// Where the fixed structures of the (pristine) image lie.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Geometry {
    pub blocks: u64,
    pub log_blocks: u64,
    pub bitmap_start: u64,
    pub bitmap_blocks: u64,
    pub first_free: u64,
    /// 0 without a mount mark.
    pub mark_block: u64,
    pub root_ino: u64,
}

impl Geometry {
    /// Read from block 0 of a sound image.
    pub fn of(img: &[u8]) -> Geometry {
        let sb = block(img, 0);
        let log_blocks = get(sb, 84, 4);
        let bitmap_start = 2 + 2 * log_blocks;
        let bitmap_blocks = get(sb, 112, 8);
        let mark_block = if get(sb, 28, 4) & 16 != 0 { get(sb, 168, 8) } else { 0 };
        Geometry {
            blocks: (img.len() / BS) as u64,
            log_blocks,
            bitmap_start,
            bitmap_blocks,
            first_free: bitmap_start + bitmap_blocks,
            mark_block,
            root_ino: get(sb, 120, 8),
        }
    }
    /// First block of log area `i`.
    pub fn log_area(&self, i: u64) -> u64 {
        2 + i * self.log_blocks
    }
    pub fn backup(&self) -> u64 {
        self.blocks - 1
    }
    /// Whether `b` lies in one of the two log areas.
    pub fn in_log(&self, b: u64) -> bool {
        (2..self.bitmap_start).contains(&b)
    }
    pub fn in_bitmap(&self, b: u64) -> bool {
        (self.bitmap_start..self.first_free).contains(&b)
    }
    /// What a block is by position alone: the fixed structures.
    pub fn fixed_kind(&self, b: u64) -> Option<Kind> {
        Some(if b == 0 || b == self.backup() {
            Kind::Superblock
        } else if b == 1 {
            Kind::State
        } else if b == self.log_area(0) || b == self.log_area(1) {
            Kind::Commit
        } else if self.in_log(b) {
            Kind::LogBody
        } else if self.in_bitmap(b) {
            Kind::Bitmap
        } else if self.mark_block != 0 && b == self.mark_block {
            Kind::Mark
        } else {
            return None;
        })
    }
}

/// What a block holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Kind {
    Superblock,
    State,
    Commit,
    LogBody,
    Bitmap,
    Inode,
    Btree,
    XattrHead,
    XattrCont,
    Mark,
    /// In use, no header: file data (or a long symlink's target).
    Data,
    /// Marked free in the bitmap.
    Free,
}

impl Kind {
    /// Whether blocks of this kind carry the common header (FORMAT.md §1).
    pub fn is_metadata(self) -> bool {
        !matches!(self, Kind::Data | Kind::Free | Kind::LogBody)
    }
    fn magic(self) -> Option<&'static [u8; 4]> {
        Some(match self {
            Kind::Superblock => SB_MAGIC,
            Kind::State => STATE_MAGIC,
            Kind::Commit => COMMIT_MAGIC,
            Kind::Bitmap => BITMAP_MAGIC,
            Kind::Inode => INODE_MAGIC,
            Kind::Btree => BTREE_MAGIC,
            Kind::XattrHead => XATTR_MAGIC,
            Kind::XattrCont => XCONT_MAGIC,
            Kind::Mark => MARK_MAGIC,
            _ => return None,
        })
    }
    /// The kind a metadata block's magic names.
    pub fn of_magic(b: &[u8]) -> Option<Kind> {
        let m: &[u8] = &b[..4];
        [
            Kind::Superblock,
            Kind::State,
            Kind::Commit,
            Kind::Bitmap,
            Kind::Inode,
            Kind::Btree,
            Kind::XattrHead,
            Kind::XattrCont,
            Kind::Mark,
        ]
        .into_iter()
        .find(|k| k.magic().is_some_and(|x| x == m))
    }
    pub fn name(self) -> &'static str {
        match self {
            Kind::Superblock => "superblock",
            Kind::State => "state",
            Kind::Commit => "commit",
            Kind::LogBody => "log body",
            Kind::Bitmap => "bitmap",
            Kind::Inode => "inode block",
            Kind::Btree => "btree node",
            Kind::XattrHead => "xattr head",
            Kind::XattrCont => "xattr continuation",
            Kind::Mark => "mount mark",
            Kind::Data => "data",
            Kind::Free => "free",
        }
    }
}

impl fmt::Display for Kind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Whether the bitmap of `img` marks block `b` used (blocks it does not cover: used).
pub fn bitmap_used(img: &[u8], g: &Geometry, b: u64) -> bool {
    let i = b / BITS_PER_BITMAP;
    if i >= g.bitmap_blocks || b >= g.blocks {
        return true;
    }
    let j = b % BITS_PER_BITMAP;
    block(img, g.bitmap_start + i)[32 + (j / 8) as usize] & (1 << (j % 8)) != 0
}

/// Mark the root's inode block free in the image file at `path`, with its bitmap block's
/// `used` count moved with the bit, and reseal: a map that agrees with itself and calls
/// live metadata free, which only fsck's walk can see.
pub fn free_the_roots_inode_block(path: &std::path::Path) {
    use std::os::unix::fs::FileExt;
    let sb = dxfs::read_superblock(&dxfs::block::FileDevice::open(path, true).expect("open")).expect("superblock");
    let root_block = dxfs::internals::ino_loc(sb.root_ino).0;
    assert!(root_block < BITS_PER_BITMAP, "the root's inode block is past the first bitmap block");
    let at = sb.layout.bitmap_start * BS as u64;
    let f = std::fs::OpenOptions::new().read(true).write(true).open(path).expect("open");
    let mut blk = vec![0u8; BS];
    f.read_exact_at(&mut blk, at).expect("read the bitmap");
    let (byte, bit) = (32 + (root_block / 8) as usize, root_block % 8);
    assert!(blk[byte] & (1 << bit) != 0, "the root's inode block is not marked used");
    blk[byte] &= !(1 << bit);
    let used = get(&blk, BITMAP_USED, 4);
    put(&mut blk, BITMAP_USED, 4, used - 1);
    reseal(&mut blk, sb.layout.bitmap_start);
    f.write_all_at(&blk, at).expect("write the bitmap");
}

/// Whether the map of `img` may be trusted to say block `b` is free: no superblock copy
/// asks for checked counts (ro_compat BITMAP_COUNTS), or the `used` count of the bitmap
/// block covering `b` agrees with its bits. A volume then has no way short of fsck's
/// walk to see that the block is live (ext4 and XFS without rmap cannot either).
pub fn bitmap_agrees(img: &[u8], g: &Geometry, b: u64) -> bool {
    let counted = [0, g.backup()].iter().all(|&c| get(block(img, c), 28, 4) & BITMAP_COUNTS != 0);
    let i = b / BITS_PER_BITMAP;
    if !counted || i >= g.bitmap_blocks {
        return true;
    }
    let blk = block(img, g.bitmap_start + i);
    get(blk, BITMAP_USED, 4) == blk[32..].iter().map(|x| u64::from(x.count_ones())).sum::<u64>()
}

/// The kind of every block of a sound image: the fixed structures by position, the rest
/// by magic among blocks in use (a freed metadata block keeps its stale contents).
pub fn classify(img: &[u8], g: &Geometry) -> Vec<Kind> {
    (0..g.blocks)
        .map(|b| {
            if let Some(k) = g.fixed_kind(b) {
                return k;
            }
            if !bitmap_used(img, g, b) {
                return Kind::Free;
            }
            let blk = block(img, b);
            match Kind::of_magic(blk) {
                Some(k) if sealed(blk, b) => k,
                _ => Kind::Data,
            }
        })
        .collect()
}

/// What the mutator knows about the pristine image: block kinds and the relations it
/// draws hostile pointers from (a node's parent, an inode's directory, a continuation's
/// head). Built once per base image.
pub struct Index {
    pub geo: Geometry,
    pub kinds: Vec<Kind>,
    pub by_kind: HashMap<Kind, Vec<u64>>,
    /// Child block -> the block that points at it (a B+tree node's parent node, a tree
    /// root's inode block, an xattr head's inode block, a continuation's head).
    pub parent: HashMap<u64, u64>,
    /// Live inodes, ascending.
    pub inodes: Vec<u64>,
    /// Directory inode -> its parent directory.
    pub dir_parent: HashMap<u64, u64>,
    /// Inode slots that are free (mode 0, used bit clear) in inode blocks in use.
    pub free_inos: Vec<u64>,
    /// Live inodes with the weight a mutation picks them by: an empty regular file
    /// without xattrs (hundreds of them in a big directory) weighs 1, anything with data,
    /// a tree, xattrs or another type weighs 8.
    pub inode_weights: Vec<(u64, u64)>,
}

impl Index {
    pub fn new(img: &[u8]) -> Index {
        let geo = Geometry::of(img);
        let kinds = classify(img, &geo);
        let mut by_kind: HashMap<Kind, Vec<u64>> = HashMap::new();
        for (b, k) in kinds.iter().enumerate() {
            by_kind.entry(*k).or_default().push(b as u64);
        }
        let mut parent = HashMap::new();
        let mut inodes = Vec::new();
        let mut dir_parent = HashMap::new();
        let mut free_inos = Vec::new();
        let mut inode_weights = Vec::new();
        for &b in by_kind.get(&Kind::Inode).map(Vec::as_slice).unwrap_or(&[]) {
            let blk = block(img, b);
            let used = get(blk, 24, 2);
            for s in 1..16u64 {
                let slot = &blk[256 * s as usize..256 * (s as usize + 1)];
                let mode = get(slot, 0, 4) as u32;
                if used & (1 << s) == 0 || mode == 0 {
                    if mode == 0 {
                        free_inos.push(b * 16 + s);
                    }
                    continue;
                }
                let ino = b * 16 + s;
                inodes.push(ino);
                let plain = mode & 0o170000 == 0o100000 && get(slot, 16, 8) == 0 && get(slot, 120, 4) == 0;
                inode_weights.push((ino, if plain { 1 } else { 8 }));
                match slot[126] {
                    1 | 3 => {
                        let root = get(slot, 128, 8);
                        if root != 0 {
                            parent.insert(root, b);
                        }
                    }
                    _ => {}
                }
                if mode & 0o170000 == 0o040000 {
                    dir_parent.insert(ino, get(slot, 96, 8));
                }
                let xb = get(slot, 112, 8);
                if xb != 0 {
                    parent.insert(xb, b);
                }
            }
        }
        for &b in by_kind.get(&Kind::Btree).map(Vec::as_slice).unwrap_or(&[]) {
            let blk = block(img, b);
            if get(blk, 24, 2) == 0 {
                continue;
            }
            for (off, _) in node_records(blk) {
                if get(blk, off + 8, 2) == 8 {
                    parent.insert(get(blk, off + 10, 8), b);
                }
            }
        }
        for &b in by_kind.get(&Kind::XattrHead).map(Vec::as_slice).unwrap_or(&[]) {
            let blk = block(img, b);
            let n = get(blk, 24, 2).min(16) as usize;
            for k in 0..n {
                parent.insert(get(blk, 32 + 8 * k, 8), b);
            }
        }
        Index { geo, kinds, by_kind, parent, inodes, dir_parent, free_inos, inode_weights }
    }

    fn blocks_of(&self, k: Kind) -> &[u64] {
        self.by_kind.get(&k).map(Vec::as_slice).unwrap_or(&[])
    }

    /// The blocks above `b`, nearest first.
    fn ancestors(&self, mut b: u64) -> Vec<u64> {
        let mut out = Vec::new();
        while let Some(&p) = self.parent.get(&b) {
            if out.contains(&p) || out.len() > 16 {
                break;
            }
            out.push(p);
            b = p;
        }
        out
    }

    /// The directories above inode `ino`, nearest first.
    fn ino_ancestors(&self, mut ino: u64) -> Vec<u64> {
        let mut out = Vec::new();
        while let Some(&p) = self.dir_parent.get(&ino) {
            if p == ino || out.contains(&p) || out.len() > 16 {
                break;
            }
            out.push(p);
            ino = p;
        }
        out
    }

    fn kind_of(&self, b: u64) -> Kind {
        self.kinds.get(b as usize).copied().unwrap_or(Kind::Free)
    }
}

/// Records (body offset, slot index) of a B+tree node whose slots point inside the block.
fn node_records(blk: &[u8]) -> Vec<(usize, usize)> {
    let n = get(blk, 26, 2) as usize;
    (0..n.min((BS - 32) / 2))
        .filter_map(|i| {
            let off = get(blk, 32 + 2 * i, 2) as usize;
            (off >= 32 && off + 10 <= BS).then_some((off, i))
        })
        .collect()
}

// ---------------------------------------------------------------------------------------
// Fields

/// How a field is used, which decides the hostile values worth trying.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Role {
    Plain,
    /// A block number; the kind it should name, when there is one.
    Block(Option<Kind>),
    Ino,
    Count,
    Size,
    Len,
    Time,
    Nsec,
    Key,
    Level,
    Offset,
    Flags,
    Magic,
    /// A byte of a name.
    NameByte,
    /// A directory entry's type code.
    DirType,
    Mode,
}

/// One field found in a block (offsets relative to the block).
#[derive(Clone, Debug)]
struct Field {
    name: String,
    off: usize,
    width: usize,
    role: Role,
}

fn f(name: impl Into<String>, off: usize, width: usize, role: Role) -> Field {
    Field { name: name.into(), off, width, role }
}

fn superblock_fields() -> Vec<Field> {
    use Role::*;
    vec![
        f("version", 16, 4, Count),
        f("compat", 20, 4, Flags),
        f("incompat", 24, 4, Flags),
        f("ro_compat", 28, 4, Flags),
        f("block_size", 80, 4, Size),
        f("log_blocks", 84, 4, Count),
        f("block_count", 88, 8, Count),
        f("log_start", 96, 8, Block(Some(Kind::Commit))),
        f("bitmap_start", 104, 8, Block(Some(Kind::Bitmap))),
        f("bitmap_blocks", 112, 8, Count),
        f("root_ino", 120, 8, Ino),
        f("hash_version", 128, 1, Count),
        f("filter_hashes", 129, 1, Count),
        f("region_blocks", 130, 2, Count),
        f("hash_seed[0]", 132, 4, Plain),
        f("grow_from", 160, 8, Count),
        f("mark_block", 168, 8, Block(Some(Kind::Mark))),
        f("magic", 0, 4, Magic),
    ]
}

fn state_fields() -> Vec<Field> {
    use Role::*;
    vec![
        f("orphan_head", 16, 8, Ino),
        f("next_generation", 24, 4, Count),
        f("commit_seq", 32, 8, Count),
        f("inodes", 40, 8, Count),
        f("lazy_root", 48, 8, Block(Some(Kind::Btree))),
        f("lazy_depth", 56, 2, Level),
        f("magic", 0, 4, Magic),
    ]
}

fn commit_fields() -> Vec<Field> {
    use Role::*;
    vec![f("seq", 16, 8, Count), f("n", 24, 4, Count), f("body_crc", 28, 4, Plain), f("flags", 32, 4, Flags)]
}

fn mark_fields() -> Vec<Field> {
    use Role::*;
    vec![
        f("seq", 16, 8, Count),
        f("state", 24, 4, Count),
        f("interval_ms", 28, 4, Count),
        f("time_ms", 32, 8, Time),
        f("pid", 40, 4, Count),
        f("pid_ns", 48, 8, Plain),
        f("boot_id[0..8]", 56, 8, Plain),
        f("host[0]", 72, 1, NameByte),
        f("magic", 0, 4, Magic),
    ]
}

/// Inline xattr entries (or a list's entries) from `start` over `len` bytes of `b`.
fn xattr_entry_fields(b: &[u8], start: usize, len: usize, prefix: &str, out: &mut Vec<Field>) {
    use Role::*;
    let end = (start + len).min(b.len());
    let mut p = start;
    let mut i = 0;
    while p + 6 <= end {
        let nl = b[p + 1] as usize;
        let vl = get(b, p + 2, 4) as usize;
        out.push(f(format!("{prefix}xattr[{i}].index"), p, 1, Plain));
        out.push(f(format!("{prefix}xattr[{i}].name_len"), p + 1, 1, Len));
        out.push(f(format!("{prefix}xattr[{i}].value_len"), p + 2, 4, Len));
        if nl > 0 && p + 6 < end {
            out.push(f(format!("{prefix}xattr[{i}].name[0]"), p + 6, 1, NameByte));
        }
        p += 6 + nl + vl;
        i += 1;
    }
}

fn inode_block_fields(blk: &[u8]) -> Vec<Field> {
    use Role::*;
    let mut out = vec![f("owner", 16, 8, Ino), f("used", 24, 2, Flags), f("magic", 0, 4, Magic)];
    let used = get(blk, 24, 2);
    for s in 1..16usize {
        let base = 256 * s;
        let slot = &blk[base..base + 256];
        let mode = get(slot, 0, 4);
        if mode == 0 {
            if used & (1 << s) != 0 {
                out.push(f(format!("slot {s} mode (free)"), base, 4, Mode));
            }
            continue;
        }
        let p = |n: &str| format!("slot {s} {n}");
        out.extend([
            f(p("mode"), base, 4, Mode),
            f(p("uid"), base + 4, 4, Plain),
            f(p("nlink"), base + 12, 4, Count),
            f(p("size"), base + 16, 8, Size),
            f(p("blocks"), base + 24, 8, Count),
            f(p("atime"), base + 32, 8, Time),
            f(p("mtime"), base + 40, 8, Time),
            f(p("ctime"), base + 48, 8, Time),
            f(p("crtime"), base + 56, 8, Time),
            f(p("atime_nsec"), base + 64, 4, Nsec),
            f(p("mtime_nsec"), base + 68, 4, Nsec),
            f(p("ctime_nsec"), base + 72, 4, Nsec),
            f(p("crtime_nsec"), base + 76, 4, Nsec),
            f(p("generation"), base + 80, 4, Plain),
            f(p("flags"), base + 84, 4, Flags),
            f(p("rdev"), base + 88, 8, Plain),
            f(p("parent"), base + 96, 8, Ino),
            f(p("next_orphan"), base + 104, 8, Ino),
            f(p("xattr_block"), base + 112, 8, Block(Some(Kind::XattrHead))),
            f(p("xattr_filter"), base + 120, 4, Flags),
            f(p("xattr_inline_len"), base + 124, 2, Len),
            f(p("data_format"), base + 126, 1, Count),
            f(p("n_extents"), base + 127, 1, Count),
        ]);
        let d = base + 128;
        match slot[126] {
            0 => {
                let n = (slot[127] as usize).min(4);
                for e in 0..n {
                    out.push(f(p(&format!("extent[{e}].logical")), d + 16 * e, 4, Key));
                    out.push(f(p(&format!("extent[{e}].len")), d + 16 * e + 4, 4, Len));
                    out.push(f(p(&format!("extent[{e}].phys")), d + 16 * e + 8, 8, Block(Some(Kind::Data))));
                }
            }
            1 => out.extend([
                f(p("tree.root"), d, 8, Block(Some(Kind::Btree))),
                f(p("tree.depth"), d + 8, 2, Level),
                f(p("tree.count"), d + 12, 4, Count),
            ]),
            2 => out.push(f(p("symlink[0]"), d, 1, NameByte)),
            3 => out.extend([
                f(p("dir.root"), d, 8, Block(Some(Kind::Btree))),
                f(p("dir.depth"), d + 8, 2, Level),
                f(p("dir.max_disp"), d + 12, 4, Count),
                f(p("dir.region_start"), d + 16, 8, Block(Some(Kind::Inode))),
                f(p("dir.region_len"), d + 24, 4, Count),
                f(p("dir.region_used"), d + 28, 4, Count),
                f(p("dir.entries"), d + 32, 8, Count),
                f(p("dir.quota"), d + 40, 8, Size),
            ]),
            _ => {}
        }
        let xl = (get(slot, 124, 2) as usize).min(64);
        xattr_entry_fields(blk, base + 192, xl, &format!("slot {s} inline "), &mut out);
    }
    out
}

fn btree_fields(blk: &[u8]) -> Vec<Field> {
    use Role::*;
    let level = get(blk, 24, 2);
    let owner = get(blk, 16, 8);
    let mut out = vec![
        f("owner", 16, 8, Ino),
        f("level", 24, 2, Level),
        f("nslots", 26, 2, Count),
        f("heap_start", 28, 2, Offset),
        f("frag", 30, 2, Offset),
        f("magic", 0, 4, Magic),
    ];
    for (off, i) in node_records(blk) {
        let vlen = get(blk, off + 8, 2) as usize;
        out.push(f(format!("slot[{i}]"), 32 + 2 * i, 2, Offset));
        out.push(f(format!("rec[{i}].key"), off, 8, Key));
        out.push(f(format!("rec[{i}].vlen"), off + 8, 2, Len));
        let v = off + 10;
        if v + vlen > BS {
            continue;
        }
        if level > 0 {
            if vlen == 8 {
                out.push(f(format!("rec[{i}].child"), v, 8, Block(Some(Kind::Btree))));
            }
        } else if owner == 1 && vlen == 2 {
            out.push(f(format!("rec[{i}].lazy_mask"), v, 2, Flags));
        } else if vlen == 12 {
            out.push(f(format!("rec[{i}].extent.len"), v, 4, Len));
            out.push(f(format!("rec[{i}].extent.phys"), v + 4, 8, Block(Some(Kind::Data))));
        } else if vlen >= 10 {
            out.push(f(format!("rec[{i}].dirent.ino"), v, 8, Ino));
            out.push(f(format!("rec[{i}].dirent.type"), v + 8, 1, DirType));
            out.push(f(format!("rec[{i}].dirent.name[0]"), v + 9, 1, NameByte));
        }
    }
    out
}

fn xattr_head_fields(blk: &[u8]) -> Vec<Field> {
    use Role::*;
    let mut out =
        vec![f("refcount", 16, 4, Count), f("total", 20, 4, Len), f("ncont", 24, 2, Count), f("magic", 0, 4, Magic)];
    let n = (get(blk, 24, 2) as usize).min(16);
    for k in 0..n {
        out.push(f(format!("cont[{k}]"), 32 + 8 * k, 8, Block(Some(Kind::XattrCont))));
    }
    // Entries that begin in the head (the list goes on in the continuations).
    let first = 32 + 8 * n;
    let total = get(blk, 20, 4) as usize;
    xattr_entry_fields(blk, first, total.min(BS - first), "", &mut out);
    out
}

fn xattr_cont_fields() -> Vec<Field> {
    vec![f("owner", 16, 8, Role::Ino), f("data[0]", 32, 1, Role::Plain), f("magic", 0, 4, Role::Magic)]
}

/// Fields of one metadata block of kind `k` (the variable ones decoded from its bytes).
fn fields_of(k: Kind, blk: &[u8]) -> Vec<Field> {
    match k {
        Kind::Superblock => superblock_fields(),
        Kind::State => state_fields(),
        Kind::Commit => commit_fields(),
        Kind::Mark => mark_fields(),
        Kind::Inode => inode_block_fields(blk),
        Kind::Btree => btree_fields(blk),
        Kind::XattrHead => xattr_head_fields(blk),
        Kind::XattrCont => xattr_cont_fields(),
        _ => Vec::new(),
    }
}

// ---------------------------------------------------------------------------------------
// Hostile values

/// What a field's value is set to, and why.
struct Pick {
    value: u64,
    why: String,
}

fn pick(value: u64, why: impl Into<String>) -> Pick {
    Pick { value, why: why.into() }
}

/// Context for pointer-valued candidates.
struct Ctx<'a> {
    idx: &'a Index,
    /// The block the field lives in (for a log image: its target).
    home: u64,
    /// The inode whose slot holds the field, if any.
    ino: Option<u64>,
    /// The inode owning the tree/node, if any.
    owner: Option<u64>,
}

fn any_of(ch: &mut dyn Choices, v: &[u64]) -> Option<u64> {
    (!v.is_empty()).then(|| v[ch.below(v.len() as u64) as usize])
}

/// A block of another kind than `not`.
fn other_kind_block(ch: &mut dyn Choices, idx: &Index, not: Option<Kind>) -> Option<Pick> {
    let mut kinds: Vec<Kind> = idx.by_kind.keys().copied().filter(|k| Some(*k) != not).collect();
    kinds.sort();
    let k = *kinds.get(ch.below(kinds.len() as u64) as usize)?;
    let b = any_of(ch, idx.blocks_of(k))?;
    Some(pick(b, format!("a {k} block")))
}

fn block_candidates(ch: &mut dyn Choices, c: &Ctx, expect: Option<Kind>, old: u64) -> Pick {
    let g = &c.idx.geo;
    match ch.below(14) {
        0 => pick(c.home, "itself"),
        1 => match any_of(ch, &c.idx.ancestors(c.home)) {
            Some(a) => pick(a, "an ancestor"),
            None => pick(c.home, "itself"),
        },
        2 => pick(0, "the superblock"),
        3 => pick(g.backup(), "the backup superblock"),
        4 => pick(1, "the state block"),
        5 => pick(g.log_area(ch.below(2)) + ch.below(3), "the log"),
        6 => pick(g.bitmap_start, "the bitmap"),
        7 => pick(g.mark_block, "the mount mark"),
        8 => pick(g.blocks + ch.below(2), "just past the end"),
        9 => pick(g.blocks - 2, "the last data block"),
        10 => pick(u64::MAX - ch.below(4), "near 2^64"),
        11 => pick(old.wrapping_add(1), "+1"),
        12 => match any_of(ch, c.idx.blocks_of(Kind::Free)) {
            Some(b) => pick(b, "a free block"),
            None => pick(g.first_free, "the first data block"),
        },
        _ => other_kind_block(ch, c.idx, expect).unwrap_or_else(|| pick(0, "zero")),
    }
}

fn ino_candidates(ch: &mut dyn Choices, c: &Ctx) -> Pick {
    let idx = c.idx;
    match ch.below(12) {
        0 => pick(idx.geo.root_ino, "the root"),
        1 => match c.ino.or(c.owner) {
            Some(i) => pick(i, "itself"),
            None => pick(idx.geo.root_ino, "the root"),
        },
        2 => match any_of(ch, &idx.ino_ancestors(c.owner.or(c.ino).unwrap_or(idx.geo.root_ino))) {
            Some(a) => pick(a, "an ancestor directory"),
            None => pick(idx.geo.root_ino, "the root"),
        },
        3 => match any_of(ch, &idx.inodes) {
            Some(i) => pick(i, "another inode"),
            None => pick(1, "inode 1"),
        },
        4 => match any_of(ch, &idx.free_inos) {
            Some(i) => pick(i, "a free slot"),
            None => pick(idx.geo.first_free * 16 + 15, "a free slot"),
        },
        5 => pick((c.home) * 16, "slot 0 (the block header)"),
        6 => match other_kind_block(ch, idx, Some(Kind::Inode)) {
            Some(p) => pick(p.value * 16 + 1, format!("slot 1 of {}", p.why)),
            None => pick(17, "slot 1 of block 1"),
        },
        7 => pick(1 + ch.below(15), "a slot of the superblock"),
        8 => pick(idx.geo.blocks * 16 + 1, "just past the end"),
        9 => pick(u64::MAX - ch.below(2), "near 2^64"),
        10 => pick(1 << 60, "2^60"),
        _ => pick(0, "zero"),
    }
}

fn number_candidates(ch: &mut dyn Choices, role: Role, old: u64, width: usize, c: &Ctx) -> Pick {
    let g = &c.idx.geo;
    let generic = |ch: &mut dyn Choices| -> Pick {
        match ch.below(16) {
            0 => pick(0, "zero"),
            1 => pick(u64::MAX, "max"),
            2 => pick(old.wrapping_add(1), "+1"),
            3 => pick(old.wrapping_sub(1), "-1"),
            4 => pick(u64::MAX - ch.below(8), "near 2^64"),
            5 => pick((1u64 << 32).wrapping_add(ch.below(3)).wrapping_sub(1), "near 2^32"),
            6 => pick(1 << 44, "2^44"),
            7 => pick(1 << 61, "2^61"),
            8 => pick(1 << 62, "2^62"),
            9 => pick(1 << 63, "2^63"),
            10 => pick(old.wrapping_mul(2).max(1), "doubled"),
            11 => pick(g.blocks, "the block count"),
            12 => pick(1u64 << (8 * width.min(8) - 1), "the top bit"),
            13 => pick(ch.next_u64(), "random"),
            14 => pick(old ^ (1 << ch.below(8 * width as u64)), "a flipped bit"),
            _ => pick(1, "one"),
        }
    };
    match role {
        Role::Size if ch.chance(1, 2) => match ch.below(6) {
            0 => pick((1 << 44) + ch.below(2), "MAX_FILE_SIZE (+1)"),
            1 => pick((1 << 44) - 1, "MAX_FILE_SIZE - 1"),
            2 => pick(i64::MAX as u64, "i64::MAX"),
            3 => pick(old.wrapping_add(4096), "one more block"),
            4 => pick(old / 2, "halved"),
            _ => pick(u64::MAX - 4095, "2^64 - 4096"),
        },
        Role::Len if ch.chance(1, 2) => match ch.below(6) {
            0 => pick(0x7FFF_FFFF, "the largest extent length"),
            1 => pick(0x8000_0000 | old, "the unwritten flag"),
            2 => pick(g.blocks, "the volume's size"),
            3 => pick(old.wrapping_add(1), "+1"),
            4 => pick(0, "zero"),
            _ => pick(255, "255"),
        },
        Role::Time => match ch.below(6) {
            0 => pick(i64::MIN as u64, "i64::MIN"),
            1 => pick(i64::MAX as u64, "i64::MAX"),
            2 => pick(u64::MAX, "-1"),
            3 => pick(1 << 33, "2^33"),
            4 => pick((-(1i64 << 40)) as u64, "-2^40"),
            _ => generic(ch),
        },
        Role::Nsec => match ch.below(5) {
            0 => pick(1_000_000_000, "10^9"),
            1 => pick(999_999_999, "10^9 - 1"),
            2 => pick(u32::MAX as u64, "u32::MAX"),
            3 => pick(2_000_000_000, "2*10^9"),
            _ => generic(ch),
        },
        Role::Level => match ch.below(6) {
            0 => pick(old.wrapping_add(1), "+1"),
            1 => pick(old.wrapping_sub(1), "-1"),
            2 => pick(0, "zero"),
            3 => pick(u16::MAX as u64, "u16::MAX"),
            4 => pick(64, "64"),
            _ => pick(old.wrapping_add(2), "+2"),
        },
        Role::Offset => match ch.below(8) {
            0 => pick(0, "zero"),
            1 => pick(4096, "4096"),
            2 => pick(4095, "4095"),
            3 => pick(4086, "4086 (a header at the very end)"),
            4 => pick(32, "32 (the slot array)"),
            5 => pick(old.wrapping_add(1), "+1"),
            6 => pick(old.wrapping_sub(1), "-1"),
            _ => pick(u16::MAX as u64, "u16::MAX"),
        },
        Role::Key => match ch.below(8) {
            0 => pick(u64::MAX - ch.below(4), "near 2^64 (a cookie that wraps)"),
            1 => pick(1 << 63, "2^63"),
            2 => pick((1 << 63) - 1, "2^63 - 1"),
            3 => pick(0, "zero"),
            4 => pick(old.wrapping_add(1), "+1"),
            5 => pick(old.wrapping_sub(1), "-1"),
            6 => pick(u32::MAX as u64, "u32::MAX"),
            _ => generic(ch),
        },
        Role::Count if width >= 4 && ch.chance(1, 3) => match ch.below(3) {
            0 => pick(g.blocks.wrapping_sub(1), "the block count - 1"),
            1 => pick(c.idx.inodes.len() as u64 + 1, "one more than the live inodes"),
            _ => pick(1 << 32, "2^32"),
        },
        Role::Flags => match ch.below(5) {
            0 => pick(old ^ (1 << ch.below(8 * width as u64)), "a flipped bit"),
            1 => pick(u64::MAX, "all bits"),
            2 => pick(0, "zero"),
            3 => pick(old | (1 << (8 * width as u64 - 1)), "an unknown high bit"),
            _ => pick(old ^ 1, "bit 0 flipped"),
        },
        Role::Mode => match ch.below(6) {
            0 => pick((old & !0o170000) | 0o170000, "an unknown file type"),
            1 => pick((old & !0o170000) | 0o040000, "a directory"),
            2 => pick((old & !0o170000) | 0o100000, "a regular file"),
            3 => pick((old & !0o170000) | 0o120000, "a symlink"),
            4 => pick((old & !0o170000) | 0o020000, "a char device"),
            _ => pick(0, "zero (free)"),
        },
        Role::DirType => {
            let v = [0u64, 3, 4, 8, 10, 2, 255, 5];
            pick(v[ch.below(v.len() as u64) as usize], "a type code")
        }
        Role::NameByte => {
            let v = [(b'/', "'/'"), (0, "NUL"), (b'.', "'.'"), (0xFF, "0xff")];
            let (b, why) = v[ch.below(v.len() as u64) as usize];
            pick(u64::from(b), why)
        }
        Role::Magic => {
            let kinds = [Kind::Inode, Kind::Btree, Kind::XattrHead, Kind::XattrCont, Kind::Commit, Kind::Superblock];
            let k = kinds[ch.below(kinds.len() as u64) as usize];
            pick(get(k.magic().expect("a metadata kind"), 0, 4), format!("the magic of a {k}"))
        }
        _ => generic(ch),
    }
}

fn hostile(ch: &mut dyn Choices, field: &Field, old: u64, c: &Ctx) -> Pick {
    let p = match field.role {
        Role::Block(expect) if ch.chance(3, 4) => block_candidates(ch, c, expect, old),
        Role::Ino if ch.chance(3, 4) => ino_candidates(ch, c),
        role => number_candidates(ch, role, old, field.width, c),
    };
    let value = p.value & mask(field.width);
    let why = if value == p.value { p.why } else { format!("{}, cut to {} bytes", p.why, field.width) };
    Pick { value, why }
}

// ---------------------------------------------------------------------------------------
// Mutations

/// What a mutation changed, for failure messages.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Mutation {
    /// The block changed (for a log image: the log block holding it).
    pub block: u64,
    pub kind: Kind,
    pub field: String,
    pub old: u64,
    pub new: u64,
    pub why: String,
    /// What else was done to keep it reachable (resealing, the body crc, both copies).
    pub note: String,
}

impl fmt::Display for Mutation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "block {} ({}) {}: {:#x} -> {:#x} ({})",
            self.block, self.kind, self.field, self.old, self.new, self.why
        )?;
        if !self.note.is_empty() {
            write!(f, "; {}", self.note)?;
        }
        Ok(())
    }
}

/// Which kinds of block a mutation may pick, and how likely each is.
#[derive(Clone, Debug)]
pub struct Options {
    /// (kind, weight); kinds the image lacks are skipped.
    pub weights: Vec<(Kind, u64)>,
    /// Chance (in 100) that a superblock change is made to both copies.
    pub both_superblocks: u64,
    /// Whether the mount mark may be damaged (its block, or the superblock's
    /// `mark_block`). Every read-write open of such an image watches the mark for 11 s or
    /// more before it takes it over (FORMAT.md §15), a designed wait that a time-boxed
    /// slice cannot afford in every hundredth case.
    pub mark: bool,
}

impl Options {
    /// Home-block mutations (a base image whose log replays nothing).
    pub fn home() -> Options {
        Options {
            weights: vec![
                (Kind::Inode, 34),
                (Kind::Btree, 30),
                (Kind::XattrHead, 6),
                (Kind::XattrCont, 3),
                (Kind::State, 7),
                (Kind::Superblock, 7),
                (Kind::Bitmap, 7),
                (Kind::Mark, 1),
            ],
            both_superblocks: 50,
            mark: true,
        }
    }
    /// As [`Options::home`], without damage to the mount mark.
    pub fn home_without_mark() -> Options {
        Options { mark: false, ..Options::home() }
    }
    /// Log mutations only (a base image whose newest delta waits for replay).
    pub fn log() -> Options {
        Options { weights: vec![(Kind::Commit, 2), (Kind::LogBody, 3)], both_superblocks: 0, mark: false }
    }
}

/// Mutate one field of one block of `img` (a copy of the image `idx` was built from, or
/// of one already mutated), reseal what it touched and say what it did. `None` when the
/// image has no block of an allowed kind.
pub fn mutate(img: &mut [u8], idx: &Index, ch: &mut dyn Choices, opts: &Options) -> Option<Mutation> {
    let avail: Vec<(Kind, u64)> = opts
        .weights
        .iter()
        .copied()
        .filter(|(k, w)| *w > 0 && !idx.blocks_of(*k).is_empty() && (*k != Kind::Mark || opts.mark))
        .collect();
    let total: u64 = avail.iter().map(|(_, w)| w).sum();
    if total == 0 {
        return None;
    }
    let mut r = ch.below(total);
    let mut kind = avail[0].0;
    for (k, w) in &avail {
        if r < *w {
            kind = *k;
            break;
        }
        r -= w;
    }
    if kind == Kind::Inode && !idx.inode_weights.is_empty() && !ch.chance(1, 8) {
        return mutate_inode(img, idx, ch);
    }
    let b = any_of(ch, idx.blocks_of(kind))?;
    match kind {
        Kind::Bitmap => Some(mutate_bitmap(img, idx, ch, b)),
        Kind::Commit => Some(mutate_commit(img, idx, ch, b)),
        Kind::LogBody => mutate_log_body(img, idx, ch, b),
        _ => mutate_field(img, idx, ch, b, kind, opts),
    }
}

fn ctx_for<'a>(idx: &'a Index, home: u64, kind: Kind, blk: &[u8], field: &Field) -> Ctx<'a> {
    let (ino, owner) = match kind {
        // (A damaged log body may name any home block: no inode number past u64.)
        Kind::Inode if field.off >= 256 => (home.checked_mul(16).map(|i| i + (field.off / 256) as u64), None),
        Kind::Inode => (None, Some(get(blk, 16, 8)).filter(|&o| o != 0)),
        Kind::Btree | Kind::XattrCont => (None, Some(get(blk, 16, 8))),
        _ => (None, None),
    };
    Ctx { idx, home, ino, owner }
}

/// Set one field of a live inode, picked by weight (files with data, directories,
/// symlinks and the like before the many empty files): its base fields, its data area
/// (extents, tree root, directory) or its inline xattrs, each group as likely.
fn mutate_inode(img: &mut [u8], idx: &Index, ch: &mut dyn Choices) -> Option<Mutation> {
    let total: u64 = idx.inode_weights.iter().map(|(_, w)| w).sum();
    let mut r = ch.below(total);
    let mut ino = idx.inode_weights[0].0;
    for &(i, w) in &idx.inode_weights {
        if r < w {
            ino = i;
            break;
        }
        r -= w;
    }
    let (b, s) = (ino / 16, ino % 16);
    let prefix = format!("slot {s} ");
    let fields: Vec<Field> =
        inode_block_fields(block(img, b)).into_iter().filter(|f| f.name.starts_with(&prefix)).collect();
    let group = |f: &Field| {
        let n = &f.name[prefix.len()..];
        if n.starts_with("extent[") || n.starts_with("tree.") || n.starts_with("dir.") || n.starts_with("symlink") {
            1
        } else if n.starts_with("inline xattr") {
            2
        } else {
            0
        }
    };
    let mut groups: Vec<u8> = fields.iter().map(group).collect();
    groups.sort_unstable();
    groups.dedup();
    let g = *groups.get(ch.below(groups.len() as u64) as usize)?;
    let fields: Vec<Field> = fields.into_iter().filter(|f| group(f) == g).collect();
    let field = fields.get(ch.below(fields.len() as u64) as usize)?.clone();
    Some(set_field(img, idx, ch, b, Kind::Inode, field))
}

/// Set `field` of metadata block `b` (of kind `kind`) to a hostile value and reseal it.
fn set_field(img: &mut [u8], idx: &Index, ch: &mut dyn Choices, b: u64, kind: Kind, field: Field) -> Mutation {
    let old = get(block(img, b), field.off, field.width);
    let ctx = ctx_for(idx, b, kind, block(img, b), &field);
    let mut p = hostile(ch, &field, old, &ctx);
    if p.value == old {
        p = pick(old.wrapping_add(1) & mask(field.width), "+1 (the pick equalled the old value)");
    }
    let blk = block_mut(img, b);
    put(blk, field.off, field.width, p.value);
    reseal(blk, b);
    Mutation { block: b, kind, field: field.name, old, new: p.value, why: p.why, note: "resealed".into() }
}

/// Set one decoded field of metadata block `b` (of kind `kind`) and reseal it.
fn mutate_field(
    img: &mut [u8],
    idx: &Index,
    ch: &mut dyn Choices,
    b: u64,
    kind: Kind,
    opts: &Options,
) -> Option<Mutation> {
    let mut fields = fields_of(kind, block(img, b));
    if !opts.mark {
        fields.retain(|f| f.name != "mark_block");
    }
    let field = fields.get(ch.below(fields.len() as u64) as usize)?.clone();
    let mut m = set_field(img, idx, ch, b, kind, field.clone());
    if kind == Kind::Superblock && ch.below(100) < opts.both_superblocks {
        let other = if b == 0 { idx.geo.backup() } else { 0 };
        let blk = block_mut(img, other);
        put(blk, field.off, field.width, m.new);
        reseal(blk, other);
        m.note = format!("both copies (also block {other}), resealed");
    }
    Some(m)
}

/// Damage bitmap block `b`: its `used` count (one case in eight), or one bit, set or
/// cleared under live metadata, data, a fixed block, the mark, the backup superblock, a
/// free block or past the end of the volume. Half the bit flips also move the count
/// with the bit, as a writer that means harm would: then only fsck's walk sees it.
fn mutate_bitmap(img: &mut [u8], idx: &Index, ch: &mut dyn Choices, b: u64) -> Mutation {
    let g = idx.geo;
    if ch.below(8) == 0 {
        let blk = block_mut(img, b);
        let old = get(blk, BITMAP_USED, 4);
        let (new, why) = match ch.below(4) {
            0 => (0, "zero"),
            1 => (u64::from(u32::MAX), "u32::MAX"),
            2 => (old.wrapping_sub(1) & 0xffff_ffff, "-1"),
            _ => ((old + 1) & 0xffff_ffff, "+1"),
        };
        put(blk, BITMAP_USED, 4, new);
        reseal(blk, b);
        return Mutation {
            block: b,
            kind: Kind::Bitmap,
            field: "used".into(),
            old,
            new,
            why: why.into(),
            note: "resealed".into(),
        };
    }
    let i = b - g.bitmap_start;
    let lo = i * BITS_PER_BITMAP;
    let hi = lo + BITS_PER_BITMAP;
    let in_range = |v: &[u64]| v.iter().copied().filter(|x| (lo..hi).contains(x)).collect::<Vec<_>>();
    let (target, why) = match ch.below(10) {
        0 => (any_of(ch, &in_range(idx.blocks_of(Kind::Inode))), "an inode block"),
        1 => (any_of(ch, &in_range(idx.blocks_of(Kind::Btree))), "a btree node"),
        2 => (any_of(ch, &in_range(idx.blocks_of(Kind::XattrHead))), "an xattr block"),
        3 => (any_of(ch, &in_range(idx.blocks_of(Kind::Data))), "a data block"),
        4 => (Some(ch.below(g.first_free)), "a fixed block"),
        5 => (Some(g.mark_block).filter(|&m| m != 0), "the mount mark"),
        6 => (Some(g.backup()), "the backup superblock"),
        7 => (Some(g.blocks + ch.below(hi.saturating_sub(g.blocks).max(1))).filter(|&x| x < hi), "past the end"),
        8 => (any_of(ch, &in_range(idx.blocks_of(Kind::XattrCont))), "an xattr continuation"),
        _ => (any_of(ch, &in_range(idx.blocks_of(Kind::Free))), "a free block"),
    };
    let t = target.filter(|x| (lo..hi).contains(x)).unwrap_or(lo + ch.below(g.blocks.min(hi) - lo));
    let j = t - lo;
    let (byte, bit) = (32 + (j / 8) as usize, (j % 8) as u8);
    let blk = block_mut(img, b);
    let old = u64::from(blk[byte] >> bit & 1);
    blk[byte] ^= 1 << bit;
    let counted = ch.below(2) == 0;
    if counted {
        let used = blk[32..].iter().map(|x| u64::from(x.count_ones())).sum::<u64>();
        put(blk, BITMAP_USED, 4, used);
    }
    reseal(blk, b);
    let why = if target.is_some() { why } else { "a block" };
    Mutation {
        block: b,
        kind: Kind::Bitmap,
        field: format!("bit of block {t}"),
        old,
        new: old ^ 1,
        why: format!("{} {why}", if old == 0 { "set on" } else { "cleared under" }),
        note: if counted { "its count moved with it, resealed" } else { "resealed" }.into(),
    }
}

/// The body crc of the commit at `at` as its count says, when the body lies in its area.
fn body_crc(img: &[u8], g: &Geometry, at: u64) -> Option<u32> {
    let n = get(block(img, at), 24, 4);
    let d = n.div_ceil(512);
    if 1 + d + n > g.log_blocks {
        return None;
    }
    let s = (at + 1) as usize * BS;
    Some(crc32c::crc32c(&img[s..s + ((d + n) as usize) * BS]))
}

/// Recompute the commit block's body crc and reseal it; false when the count is out of
/// the area (then only resealed).
fn refresh_commit(img: &mut [u8], g: &Geometry, at: u64) -> bool {
    let crc = body_crc(img, g, at);
    let blk = block_mut(img, at);
    if let Some(c) = crc {
        put(blk, 28, 4, u64::from(c));
    }
    reseal(blk, at);
    crc.is_some()
}

fn is_valid_commit(img: &[u8], at: u64) -> bool {
    let b = block(img, at);
    &b[..4] == COMMIT_MAGIC && sealed(b, at)
}

fn mutate_commit(img: &mut [u8], idx: &Index, ch: &mut dyn Choices, at: u64) -> Mutation {
    let fields = commit_fields();
    let field = fields[ch.below(fields.len() as u64) as usize].clone();
    let old = get(block(img, at), field.off, field.width);
    let other = if at == idx.geo.log_area(0) { idx.geo.log_area(1) } else { idx.geo.log_area(0) };
    let ctx = Ctx { idx, home: at, ino: None, owner: None };
    let mut p = match field.name.as_str() {
        "seq" => match ch.below(5) {
            0 => pick(get(block(img, other), 16, 8).wrapping_add(1), "the other area's + 1"),
            1 => pick(get(block(img, other), 16, 8), "the other area's"),
            2 => pick(get(block(img, other), 16, 8).wrapping_sub(1), "the other area's - 1"),
            3 => pick(u64::MAX, "max"),
            _ => pick(0, "zero"),
        },
        "n" => match ch.below(5) {
            0 => pick(old + 1, "+1"),
            1 => pick(old.saturating_sub(1), "-1"),
            2 => pick(idx.geo.log_blocks - 1, "the area size - 1"),
            3 => pick(u32::MAX as u64, "u32::MAX"),
            _ => pick(0, "zero"),
        },
        "flags" => pick(old ^ (1 << ch.below(3)), "a flipped flag"),
        _ => hostile(ch, &field, old, &ctx),
    };
    p.value &= mask(field.width);
    if p.value == old {
        p = pick(old.wrapping_add(1) & mask(field.width), "+1 (the pick equalled the old value)");
    }
    let was_valid = is_valid_commit(img, at);
    put(block_mut(img, at), field.off, field.width, p.value);
    let note = if field.name != "body_crc" && ch.chance(1, 2) {
        if refresh_commit(img, &idx.geo, at) {
            "body crc recomputed, resealed"
        } else {
            "count beyond the area: resealed only"
        }
    } else {
        reseal(block_mut(img, at), at);
        "resealed (body crc kept)"
    };
    Mutation {
        block: at,
        kind: Kind::Commit,
        field: field.name,
        old,
        new: p.value,
        why: p.why,
        note: if was_valid { note.into() } else { format!("{note}; this area held no valid commit") },
    }
}

/// Mutate a descriptor entry or a logged metadata image of the commit whose area holds
/// `b`, then recompute that commit's body crc (mostly) and reseal it.
fn mutate_log_body(img: &mut [u8], idx: &Index, ch: &mut dyn Choices, b: u64) -> Option<Mutation> {
    let g = idx.geo;
    let area = if b < g.log_area(1) { 0 } else { 1 };
    let mut at = g.log_area(area);
    if !is_valid_commit(img, at) {
        at = g.log_area(1 - area);
    }
    if !is_valid_commit(img, at) {
        return None;
    }
    let n = get(block(img, at), 24, 4);
    let d = n.div_ceil(512);
    if n == 0 || 1 + d + n > g.log_blocks {
        return None;
    }
    let i = ch.below(n);
    let desc_at = at + 1 + (8 * i) / BS as u64;
    let desc_off = ((8 * i) % BS as u64) as usize;
    let entry = get(block(img, desc_at), desc_off, 8);
    let target = entry & !DATA_TARGET;
    let img_at = at + 1 + d + i;
    let image = block(img, img_at);
    let image_kind = if entry & DATA_TARGET == 0 { Kind::of_magic(image) } else { None };
    let fields = image_kind.map(|k| fields_of(k, image)).unwrap_or_default();
    let m = if fields.is_empty() || ch.chance(1, 3) {
        // The descriptor: where the image goes.
        let field = f(format!("descriptor[{i}]"), desc_off, 8, Role::Block(Some(Kind::Inode)));
        let ctx = Ctx { idx, home: target, ino: None, owner: None };
        let mut p = match ch.below(3) {
            0 => pick(entry ^ DATA_TARGET, "the data flag flipped"),
            _ => hostile(ch, &field, target, &ctx),
        };
        if p.value & !DATA_TARGET == target && p.why != "the data flag flipped" {
            p.value = target + 1;
            p.why = "+1".into();
        }
        let new = if p.why == "the data flag flipped" { p.value } else { (entry & DATA_TARGET) | p.value };
        put(block_mut(img, desc_at), desc_off, 8, new);
        Mutation {
            block: desc_at,
            kind: Kind::LogBody,
            field: format!("descriptor[{i}] (image of block {target})"),
            old: entry,
            new,
            why: p.why,
            note: String::new(),
        }
    } else {
        let k = image_kind.expect("fields come from a kind");
        let field = fields[ch.below(fields.len() as u64) as usize].clone();
        let old = get(image, field.off, field.width);
        let ctx = ctx_for(idx, target, k, image, &field);
        let mut p = hostile(ch, &field, old, &ctx);
        if p.value == old {
            p = pick(old.wrapping_add(1) & mask(field.width), "+1 (the pick equalled the old value)");
        }
        let blk = block_mut(img, img_at);
        put(blk, field.off, field.width, p.value);
        reseal(blk, target);
        Mutation {
            block: img_at,
            kind: Kind::LogBody,
            field: format!("logged {k} image of block {target}: {}", field.name),
            old,
            new: p.value,
            why: p.why,
            note: format!("image resealed as block {target}"),
        }
    };
    let mut m = m;
    let extra = if ch.chance(7, 8) {
        refresh_commit(img, &g, at);
        format!("commit {at}'s body crc recomputed")
    } else {
        format!("commit {at}'s body crc left stale")
    };
    m.note = if m.note.is_empty() { extra } else { format!("{}, {extra}", m.note) };
    Some(m)
}

/// Zero the commit block of both log areas, and the state block's `commit_seq` (so the
/// open does not take the missing commit for a damaged one): after a clean close this
/// leaves nothing to replay, so recovery never writes over a mutated home block.
pub fn quiet_log(img: &mut [u8]) {
    let g = Geometry::of(img);
    for a in 0..2 {
        block_mut(img, g.log_area(a)).fill(0);
    }
    let st = block_mut(img, 1);
    put(st, 32, 8, 0);
    reseal(st, 1);
}

/// Apply 1 to 3 mutations (mostly 1), each described.
pub fn mutate_some(img: &mut [u8], idx: &Index, ch: &mut dyn Choices, opts: &Options) -> Vec<Mutation> {
    let n = match ch.below(20) {
        0 => 3,
        1 | 2 => 2,
        _ => 1,
    };
    (0..n).filter_map(|_| mutate(img, idx, ch, opts)).collect()
}

/// The kind a block of the pristine image had.
pub fn kind_of(idx: &Index, b: u64) -> Kind {
    idx.kind_of(b)
}
