//! On-disk structures of format version 1: the superblock, the state block and the
//! fixed layout, the inode record, extent and directory-entry records.
//!
//! docs/FORMAT.md is the byte-by-byte specification; this module is its executable form.
//! Every decoder validates before it trusts: a hostile image yields `Error::Corrupt`.

use crate::disk::codec::*;
use crate::disk::hash::HashVersion;
use crate::error::{Error, Result};

/// The handle a tree's owner keeps (in an inode): where the root is and how tall the tree is.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TreeRoot {
    /// Block of the root node; 0 for an empty tree, which owns no blocks.
    pub root: u64,
    /// Number of levels: 1 for a single leaf, 0 for an empty tree.
    pub depth: u16,
}

/// Superblock magic, "DXSB".
pub(crate) const SB_MAGIC: u32 = u32::from_le_bytes(*b"DXSB");
/// State block magic, "DXST".
pub(crate) const STATE_MAGIC: u32 = u32::from_le_bytes(*b"DXST");
/// Log commit block magic, "DXLC".
pub(crate) const COMMIT_MAGIC: u32 = u32::from_le_bytes(*b"DXLC");
/// Bitmap block magic, "DXBM".
pub(crate) const BITMAP_MAGIC: u32 = u32::from_le_bytes(*b"DXBM");
/// Inode block magic, "DXIN".
pub(crate) const INODE_MAGIC: u32 = u32::from_le_bytes(*b"DXIN");
/// Xattr block magic, "DXXA".
pub(crate) const XATTR_MAGIC: u32 = u32::from_le_bytes(*b"DXXA");
/// Magic of an xattr continuation block, "DXXC".
pub(crate) const XATTR_CONT_MAGIC: u32 = u32::from_le_bytes(*b"DXXC");
/// Mount mark magic, "DXMM".
pub(crate) const MARK_MAGIC: u32 = u32::from_le_bytes(*b"DXMM");

/// The format version this code writes and reads.
pub(crate) const VERSION: u32 = 1;

/// compat: children of a directory get inodes from its reserved region (placement only).
pub(crate) const COMPAT_DIR_RESERVATION: u32 = 1;
/// ro_compat: every inode's xattr-name bloom filter is kept exact. A writer that does
/// not maintain the filter must not write, so it is read-only-compatible.
pub(crate) const RO_COMPAT_XATTR_FILTER: u32 = 1;
/// ro_compat: as XATTR_FILTER, but each name sets `filter_hashes` bits (superblock byte
/// 129) rather than one. Readers that only know XATTR_FILTER do not trust these filters,
/// since the flag they know is clear.
pub(crate) const RO_COMPAT_XATTR_FILTER_K: u32 = 2;
/// ro_compat: inode slots may be freed lazily, recorded in the state block's lazy-free
/// tree instead of in their inode block (FORMAT.md §6.1). A writer that does not know
/// the tree would hand out or count those slots wrongly; a reader loses nothing, since
/// no directory entry points at a lazily freed inode.
pub(crate) const RO_COMPAT_LAZY_INODE_FREE: u32 = 4;
/// ro_compat: a grow is half done (FORMAT.md §2): the superblock already has the new
/// size, and the old tail (the old backup superblock and the blocks past the old end in
/// the old last bitmap block, `Superblock::pending_grow_tail`) is still marked in use.
/// The next read-write open frees it and clears the flag. A writer that does not know
/// this could free those blocks by other means (fsck) and reuse them before this code
/// frees them again, so it must not write; a reader loses nothing.
pub const RO_COMPAT_GROW_PENDING: u32 = 8;
/// ro_compat: the volume has a mount mark (FORMAT.md §15): a block, named by the
/// superblock's `mark_block`, where a read-write open records its host and process and
/// which it rewrites every few seconds, so a second host (or a mount that crashed) is
/// recognised, as ext4's MMP block does. A writer that does not know the mark would not
/// honour it, and an old fsck would free its block as leaked; a reader loses nothing.
pub const RO_COMPAT_MOUNT_MARK: u32 = 16;
/// ro_compat: every directory's recursive statistics are kept in the state block's
/// rstat tree, and every named non-directory's `parent` names the directory it is counted
/// in (FORMAT.md §6.2). A writer that does not know this would leave the counters wrong;
/// a reader loses nothing.
pub(crate) const RO_COMPAT_RSTATS: u32 = 32;
/// ro_compat: every bitmap block records how many of its bits are set (`used`,
/// FORMAT.md §5), so that a bit cleared under live metadata by a bad writer is seen
/// when the map is read, before the allocator hands the block out. A writer that does
/// not know this would leave the counts wrong; a reader loses nothing.
pub(crate) const RO_COMPAT_BITMAP_COUNTS: u32 = 64;
/// ro_compat: a directory's `quota` field (FORMAT.md §7.4) limits the space allocated
/// below it, as counted by the recursive statistics (needs RSTATS). A writer that does
/// not know it would let the subtree grow past its limit, and would clear the field when
/// it rewrote the inode; a reader loses nothing.
pub(crate) const RO_COMPAT_DIR_QUOTA: u32 = 128;
/// incompat: the volume was grown past the bitmap blocks mkfs laid out; bitmap block
/// i ≥ `bitmap_blocks` lives at block 32512·i, the first block it covers (FORMAT.md §2).
/// A reader that does not know this would look for the bitmap in the wrong place.
pub const INCOMPAT_SPILLED_BITMAP: u32 = 1;
/// incompat: a commit block may be marked `ONE_FLUSH` (FORMAT.md §12): written with its
/// body, and the delta's small file data logged in it, under a single flush. A torn one
/// has a valid commit block over a body that fails its checksum, which recovery must take
/// for "not committed"; a reader that does not know this would refuse the volume as
/// corrupt after such a crash.
pub(crate) const INCOMPAT_ONE_FLUSH_COMMIT: u32 = 2;
/// Features this code understands (unknown compat features are harmless by definition).
pub const KNOWN_INCOMPAT: u32 = INCOMPAT_SPILLED_BITMAP | INCOMPAT_ONE_FLUSH_COMMIT;
pub(crate) const KNOWN_RO_COMPAT: u32 = RO_COMPAT_XATTR_FILTER
    | RO_COMPAT_XATTR_FILTER_K
    | RO_COMPAT_LAZY_INODE_FREE
    | RO_COMPAT_GROW_PENDING
    | RO_COMPAT_MOUNT_MARK
    | RO_COMPAT_RSTATS
    | RO_COMPAT_BITMAP_COUNTS
    | RO_COMPAT_DIR_QUOTA;
/// Owner recorded in the nodes of the lazy-free tree: 1 is never an inode number
/// (it would be slot 1 of block 0, the superblock).
pub(crate) const LAZY_FREE_OWNER: u64 = 1;
/// Owner recorded in the nodes of the rstat tree (slot 2 of block 0: no inode either).
pub(crate) const RSTAT_OWNER: u64 = 2;
/// Bits each xattr name sets in the filter of a new volume: k = ln2 · m / n for m = 32
/// bits and the typical n = 2 names of an inode that has any (docs/DESIGN.md, "Xattrs").
pub const DEFAULT_FILTER_HASHES: u8 = 11;
/// Most bits a name may set (all of them).
pub(crate) const MAX_FILTER_HASHES: u8 = 32;

/// Block of the superblock (a backup lives in the last block).
pub(crate) const SUPERBLOCK: u64 = 0;
/// Block of the journaled state block.
pub const STATE_BLOCK: u64 = 1;
/// First block of log area 0.
pub const LOG_START: u64 = 2;

/// Inode record size; 16 slots per block, slot 0 is the block header.
pub(crate) const INODE_SIZE: usize = 256;
pub(crate) const INODES_PER_BLOCK: u64 = 16;
/// Bits of free-space map per bitmap block (the first 32 bytes are header).
pub(crate) const BITMAP_HEADER: usize = 32;
pub(crate) const BITS_PER_BITMAP_BLOCK: u64 = ((BLOCK_SIZE - BITMAP_HEADER) * 8) as u64;
/// Offset of a bitmap block's `used` count (ro_compat BITMAP_COUNTS), a `u32`.
pub(crate) const BITMAP_USED: usize = 16;

/// The bits a bitmap block sets (what its `used` count must say).
pub(crate) fn bitmap_bits_set(b: &[u8]) -> u32 {
    b[BITMAP_HEADER..BLOCK_SIZE].iter().map(|x| x.count_ones()).sum()
}

/// Write a bitmap block's `used` count from its bits (every writer does, whether or not
/// the volume has ro_compat BITMAP_COUNTS: without it the field is unused).
pub(crate) fn count_bitmap_bits(b: &mut [u8]) {
    let n = bitmap_bits_set(b);
    put_u32(b, BITMAP_USED, n);
}
/// Longest name in a directory.
pub(crate) const NAME_MAX: usize = 255;
/// Largest file: 2^32 blocks of 4 KiB (extents address logical blocks with 32 bits).
pub const MAX_FILE_SIZE: u64 = (1u64 << 32) * BLOCK_SIZE as u64;
/// Longest symlink target (Linux's: below a page).
pub(crate) const MAX_SYMLINK: u64 = 4095;
/// Inline symlink target / xattr area sizes in the inode.
pub(crate) const INLINE_DATA: usize = 64;
pub(crate) const INLINE_XATTR: usize = 64;
/// Extents kept in the inode before the map moves to a B+tree.
pub(crate) const INLINE_EXTENTS: usize = 4;
/// Largest region of inode blocks a directory reserves at once.
pub(crate) const MAX_REGION_BLOCKS: u32 = 64;

/// The inode number of a slot.
#[inline]
pub(crate) fn ino_of(block: u64, slot: u64) -> u64 {
    block * INODES_PER_BLOCK + slot
}
/// The block and slot of an inode number: no search, the number is the address.
#[inline]
pub fn ino_loc(ino: u64) -> (u64, usize) {
    (ino / INODES_PER_BLOCK, (ino % INODES_PER_BLOCK) as usize)
}

/// Where everything fixed lives, derived from the block count (and, for the mount mark,
/// chosen by mkfs and named by the superblock).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Layout {
    pub block_count: u64,
    pub log_blocks: u32,
    pub bitmap_start: u64,
    pub bitmap_blocks: u64,
    /// The mount mark's block in the data area (ro_compat MOUNT_MARK), 0 without one.
    pub mark_block: u64,
}

impl Layout {
    /// The layout mkfs chooses: two log areas of 1/64 of the volume each, between 64
    /// blocks and 65536 blocks (256 MiB, reached at 16 GiB), then the bitmap.
    pub fn for_blocks(block_count: u64) -> Result<Layout> {
        Layout::new(block_count, Self::default_log_blocks(block_count))
    }

    /// The default size of one log area.
    pub fn default_log_blocks(block_count: u64) -> u32 {
        (block_count / 64).clamp(64, 65536) as u32
    }

    /// A layout with log areas of `log_blocks` blocks each (64..=65536: the smallest
    /// must hold the worst single operation plus one write-back fragment).
    pub fn new(block_count: u64, log_blocks: u32) -> Result<Layout> {
        if !(64..=65536).contains(&log_blocks) {
            return Err(Error::Invalid(format!("log areas must be 64..=65536 blocks, not {log_blocks}")));
        }
        let bitmap_blocks = block_count.div_ceil(BITS_PER_BITMAP_BLOCK);
        let l = Layout {
            block_count,
            log_blocks,
            bitmap_start: LOG_START + 2 * log_blocks as u64,
            bitmap_blocks,
            mark_block: 0,
        };
        // Room for the fixed part, the root directory and a little data.
        if l.first_free() + 64 > block_count {
            return Err(Error::Invalid(format!(
                "a volume with this log needs at least {} blocks ({} KiB)",
                l.first_free() + 64,
                (l.first_free() + 64) * 4
            )));
        }
        Ok(l)
    }
    /// The layout of a volume grown to `block_count` blocks from one whose mkfs laid out
    /// `contiguous` bitmap blocks: those stay where they are, and bitmap block i beyond
    /// them is block 32512·i (incompat SPILLED_BITMAP when there are any). A size whose
    /// last spilled bitmap block would be the backup superblock is refused.
    pub fn grown(block_count: u64, log_blocks: u32, contiguous: u64) -> Result<Layout> {
        let mut l = Layout::new(block_count, log_blocks)?;
        if contiguous == 0 || contiguous > l.bitmap_blocks {
            return Err(Error::Invalid(format!(
                "{contiguous} contiguous bitmap blocks do not fit a volume of {block_count} blocks"
            )));
        }
        l.bitmap_blocks = contiguous;
        // mkfs laid out `contiguous` = ceil(N₀ / 32512) blocks for some N₀ ≥ F + 64, so the
        // first spilled bitmap block, 32512·contiguous, lies past that volume's end.
        if contiguous < l.bitmap_count() && contiguous * BITS_PER_BITMAP_BLOCK < l.first_free() + 64 {
            return Err(Error::Invalid(format!(
                "{contiguous} contiguous bitmap blocks cannot have been laid out by mkfs before block {}",
                l.first_free() + 64
            )));
        }
        // Spilled blocks rise with their index: the last decides (a hostile count may
        // make billions of them, never walked).
        let last_spilled = (l.bitmap_count() > l.bitmap_blocks).then(|| l.bitmap_block(l.bitmap_count() - 1));
        if last_spilled.is_some_and(|b| b >= l.backup_superblock()) {
            return Err(Error::Invalid(format!(
                "{block_count} blocks would put a bitmap block on the backup superblock"
            )));
        }
        Ok(l)
    }

    /// Bitmap blocks in all: one per 32512 blocks of the volume.
    pub fn bitmap_count(&self) -> u64 {
        self.block_count.div_ceil(BITS_PER_BITMAP_BLOCK)
    }

    /// Where bitmap block `i` lives.
    pub fn bitmap_block(&self, i: u64) -> u64 {
        if i < self.bitmap_blocks {
            self.bitmap_start + i
        } else {
            i * BITS_PER_BITMAP_BLOCK
        }
    }

    /// The bitmap blocks that live in the data area (a grown volume's), in order.
    pub fn spilled_bitmap_blocks(&self) -> impl Iterator<Item = u64> + '_ {
        (self.bitmap_blocks..self.bitmap_count()).map(|i| self.bitmap_block(i))
    }

    /// Whether block `b` is a spilled bitmap block (one of a grown volume's bitmap
    /// blocks that live in the data area).
    pub fn is_spilled_bitmap(&self, b: u64) -> bool {
        let i = b / BITS_PER_BITMAP_BLOCK;
        b % BITS_PER_BITMAP_BLOCK == 0 && i >= self.bitmap_blocks && i < self.bitmap_count()
    }

    /// The fixed structures that live in the data area: spilled bitmap blocks and the
    /// mount mark. Always marked used, owned by no inode.
    pub fn fixed_data_blocks(&self) -> impl Iterator<Item = u64> + '_ {
        self.spilled_bitmap_blocks().chain((self.mark_block != 0).then_some(self.mark_block))
    }

    /// First block of log area `i` (0 or 1).
    pub fn log_area(&self, i: u64) -> u64 {
        LOG_START + i * self.log_blocks as u64
    }
    /// First block not used by fixed structures.
    pub fn first_free(&self) -> u64 {
        self.bitmap_start + self.bitmap_blocks
    }
    /// The backup superblock.
    pub fn backup_superblock(&self) -> u64 {
        self.block_count - 1
    }
}

/// The superblock: written by mkfs and by a grow (and the open that finishes one), never
/// by a commit.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Superblock {
    pub version: u32,
    pub compat: u32,
    pub incompat: u32,
    pub ro_compat: u32,
    pub uuid: [u8; 16],
    pub label: String,
    pub layout: Layout,
    pub root_ino: u64,
    pub hash: HashVersion,
    pub region_blocks: u16,
    pub hash_seed: [u32; 4],
    pub mkfs_time: i64,
    /// Bits each xattr name sets in the filter (byte 129): 1..=32 with ro_compat
    /// XATTR_FILTER_K, else 0.
    pub filter_hashes: u8,
    /// The block count before a grow that is not finished yet (bytes 160..168): non-zero
    /// exactly when ro_compat GROW_PENDING is set.
    pub grow_from: u64,
}

impl Superblock {
    pub fn encode(&self, blockno: u64) -> Box<Block> {
        let mut b = Box::new([0u8; BLOCK_SIZE]);
        put_u32(&mut b[..], 0, SB_MAGIC);
        put_u32(&mut b[..], 16, self.version);
        put_u32(&mut b[..], 20, self.compat);
        put_u32(&mut b[..], 24, self.incompat);
        put_u32(&mut b[..], 28, self.ro_compat);
        b[32..48].copy_from_slice(&self.uuid);
        let l = self.label.as_bytes();
        b[48..48 + l.len().min(32)].copy_from_slice(&l[..l.len().min(32)]);
        put_u32(&mut b[..], 80, BLOCK_SIZE as u32);
        put_u32(&mut b[..], 84, self.layout.log_blocks);
        put_u64(&mut b[..], 88, self.layout.block_count);
        put_u64(&mut b[..], 96, LOG_START);
        put_u64(&mut b[..], 104, self.layout.bitmap_start);
        put_u64(&mut b[..], 112, self.layout.bitmap_blocks);
        put_u64(&mut b[..], 120, self.root_ino);
        b[128] = self.hash as u8;
        b[129] = self.filter_hashes;
        put_u16(&mut b[..], 130, self.region_blocks);
        for (i, w) in self.hash_seed.iter().enumerate() {
            put_u32(&mut b[..], 132 + 4 * i, *w);
        }
        put_i64(&mut b[..], 152, self.mkfs_time);
        put_u64(&mut b[..], 160, self.grow_from);
        put_u64(&mut b[..], 168, self.layout.mark_block);
        seal(&mut b, blockno);
        b
    }

    /// Decode and validate a superblock read from `blockno`.
    pub fn decode(b: &Block, blockno: u64) -> Result<Superblock> {
        if magic(b) != SB_MAGIC {
            return Err(Error::corrupt("not a dxfs volume (no superblock magic)"));
        }
        verify(b, blockno, Some(SB_MAGIC))?;
        let version = get_u32(b, 16);
        if version != VERSION {
            return Err(Error::corrupt(format!(
                "format version {version} is not supported (this dxfs reads version {VERSION})"
            )));
        }
        if get_u32(b, 80) != BLOCK_SIZE as u32 {
            return Err(Error::corrupt("block size is not 4096"));
        }
        let block_count = get_u64(b, 88);
        let spilled = get_u32(b, 24) & INCOMPAT_SPILLED_BITMAP != 0;
        let expect = if spilled {
            Layout::grown(block_count, get_u32(b, 84), get_u64(b, 112))
        } else {
            Layout::new(block_count, get_u32(b, 84))
        }
        .map_err(|e| Error::corrupt(format!("implausible geometry: {e}")))?;
        let mut layout = Layout {
            block_count,
            log_blocks: get_u32(b, 84),
            bitmap_start: get_u64(b, 104),
            bitmap_blocks: get_u64(b, 112),
            mark_block: 0,
        };
        if layout != expect || get_u64(b, 96) != LOG_START {
            return Err(Error::corrupt("superblock geometry is inconsistent"));
        }
        let hash =
            HashVersion::from_u8(b[128]).ok_or_else(|| Error::corrupt(format!("unknown hash version {}", b[128])))?;
        let label_raw = &b[48..80];
        let end = label_raw.iter().position(|&c| c == 0).unwrap_or(32);
        let root_ino = get_u64(b, 120);
        let (rb, rs) = ino_loc(root_ino);
        // The root's inode block lies in the data area, off the fixed blocks there (a
        // repair that recreates the root writes that block).
        if rb < layout.first_free() || rb >= layout.backup_superblock() || rs == 0 || layout.is_spilled_bitmap(rb) {
            return Err(Error::corrupt("root inode number out of range"));
        }
        let region_blocks = get_u16(b, 130);
        if region_blocks == 0 || region_blocks as u32 > MAX_REGION_BLOCKS {
            return Err(Error::corrupt("bad inode region size"));
        }
        let ro_compat = get_u32(b, 28);
        let filter_hashes = b[129];
        let want_hashes = ro_compat & RO_COMPAT_XATTR_FILTER_K != 0;
        if want_hashes != (1..=MAX_FILTER_HASHES).contains(&filter_hashes) || (!want_hashes && filter_hashes != 0) {
            return Err(Error::corrupt(format!("xattr filter hash count {filter_hashes} does not match the features")));
        }
        // Without GROW_PENDING bytes 160..168 are reserved: ignored.
        let grow_from = if ro_compat & RO_COMPAT_GROW_PENDING != 0 { get_u64(b, 160) } else { 0 };
        if ro_compat & RO_COMPAT_GROW_PENDING != 0
            && !(layout.first_free() + 64 <= grow_from && grow_from < block_count)
        {
            return Err(Error::corrupt(format!(
                "a pending grow from {grow_from} blocks to {block_count} is implausible"
            )));
        }
        // Without MOUNT_MARK bytes 168..176 are reserved: ignored.
        if ro_compat & RO_COMPAT_MOUNT_MARK != 0 {
            let m = get_u64(b, 168);
            if m < layout.first_free() || m >= layout.backup_superblock() || m == rb || layout.is_spilled_bitmap(m) {
                return Err(Error::corrupt(format!("mount mark block {m} is out of place")));
            }
            layout.mark_block = m;
        }
        let mut uuid = [0u8; 16];
        uuid.copy_from_slice(&b[32..48]);
        Ok(Superblock {
            version,
            compat: get_u32(b, 20),
            incompat: get_u32(b, 24),
            ro_compat,
            uuid,
            label: String::from_utf8_lossy(&label_raw[..end]).into_owned(),
            layout,
            root_ino,
            hash,
            region_blocks,
            hash_seed: [get_u32(b, 132), get_u32(b, 136), get_u32(b, 140), get_u32(b, 144)],
            mkfs_time: get_i64(b, 152),
            filter_hashes,
            grow_from,
        })
    }

    /// The blocks a half-done grow still has to free (ro_compat GROW_PENDING): the old
    /// backup superblock and the rest of the old last bitmap block's range, up to the new
    /// backup superblock. Empty when no grow is pending.
    pub fn pending_grow_tail(&self) -> std::ops::Range<u64> {
        if self.ro_compat & RO_COMPAT_GROW_PENDING == 0 || self.grow_from == 0 {
            return 0..0;
        }
        let end = (self.grow_from.div_ceil(BITS_PER_BITMAP_BLOCK) * BITS_PER_BITMAP_BLOCK)
            .min(self.layout.backup_superblock());
        self.grow_from - 1..end
    }

    /// Whether the volume has a mount mark (ro_compat MOUNT_MARK, FORMAT.md §15).
    pub fn mount_mark(&self) -> bool {
        self.ro_compat & RO_COMPAT_MOUNT_MARK != 0 && self.layout.mark_block != 0
    }

    /// Whether small deltas may commit with one flush (incompat ONE_FLUSH_COMMIT,
    /// FORMAT.md §12).
    pub fn one_flush_commit(&self) -> bool {
        self.incompat & INCOMPAT_ONE_FLUSH_COMMIT != 0
    }

    /// Whether inode slots may be freed through the lazy-free tree (FORMAT.md §6.1).
    pub fn lazy_inode_free(&self) -> bool {
        self.ro_compat & RO_COMPAT_LAZY_INODE_FREE != 0
    }

    /// Whether directories keep recursive statistics (ro_compat RSTATS, FORMAT.md §6.2).
    pub fn rstats(&self) -> bool {
        self.ro_compat & RO_COMPAT_RSTATS != 0
    }

    /// Whether directories may carry a space quota (ro_compat DIR_QUOTA, FORMAT.md §7.4).
    pub fn dir_quota(&self) -> bool {
        self.ro_compat & RO_COMPAT_DIR_QUOTA != 0 && self.rstats()
    }

    /// Whether bitmap blocks carry a checked `used` count (ro_compat BITMAP_COUNTS,
    /// FORMAT.md §5).
    pub fn bitmap_counts(&self) -> bool {
        self.ro_compat & RO_COMPAT_BITMAP_COUNTS != 0
    }

    /// Whether the xattr bloom filter is in force.
    pub fn xattr_filter(&self) -> bool {
        self.ro_compat & (RO_COMPAT_XATTR_FILTER | RO_COMPAT_XATTR_FILTER_K) != 0
    }

    /// Bits each xattr name sets in the filter: byte 129 under XATTR_FILTER_K, else 1.
    pub fn filter_hashes(&self) -> u32 {
        if self.ro_compat & RO_COMPAT_XATTR_FILTER_K != 0 {
            u32::from(self.filter_hashes)
        } else {
            1
        }
    }
}

/// The mount mark (ro_compat MOUNT_MARK, FORMAT.md §15): who holds the volume open
/// read-write, rewritten by the holder every `interval_ms`. Everything it says lies in
/// the block's first 512 bytes, the rest is zero, so a torn write of it leaves either the
/// old mark or the new one.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct MountMark {
    /// Changed at every rewrite by the holder (starts at a random value at each open).
    pub seq: u64,
    /// Whether a read-write open holds the volume (false: closed cleanly).
    pub in_use: bool,
    /// How often the holder rewrites the mark, in milliseconds.
    pub interval_ms: u32,
    /// When the holder last wrote the mark, in milliseconds since the Unix epoch (its clock).
    pub time_ms: u64,
    /// The holder's process id, in its pid namespace.
    pub pid: u32,
    /// The holder's pid namespace (the inode number of /proc/self/ns/pid), 0 if unknown.
    pub pid_ns: u64,
    /// The holder's kernel boot id (/proc/sys/kernel/random/boot_id), zero if unknown.
    pub boot_id: [u8; 16],
    /// The holder's host name, at most 64 bytes.
    pub host: String,
}

/// The longest host name a mount mark keeps.
pub(crate) const MARK_HOST_MAX: usize = 64;

impl MountMark {
    pub fn encode(&self, blockno: u64) -> Box<Block> {
        let mut b = Box::new([0u8; BLOCK_SIZE]);
        put_u32(&mut b[..], 0, MARK_MAGIC);
        put_u64(&mut b[..], 16, self.seq);
        put_u32(&mut b[..], 24, u32::from(self.in_use));
        put_u32(&mut b[..], 28, self.interval_ms);
        put_u64(&mut b[..], 32, self.time_ms);
        put_u32(&mut b[..], 40, self.pid);
        put_u64(&mut b[..], 48, self.pid_ns);
        b[56..72].copy_from_slice(&self.boot_id);
        let h = self.host.as_bytes();
        let n = h.len().min(MARK_HOST_MAX);
        b[72..72 + n].copy_from_slice(&h[..n]);
        seal(&mut b, blockno);
        b
    }

    /// Decode and validate a mark read from `blockno`.
    pub fn decode(b: &Block, blockno: u64) -> Result<MountMark> {
        verify(b, blockno, Some(MARK_MAGIC))?;
        let state = get_u32(b, 24);
        if state > 1 {
            return Err(Error::corrupt(format!("mount mark state {state} is unknown")));
        }
        let raw = &b[72..72 + MARK_HOST_MAX];
        let end = raw.iter().position(|&c| c == 0).unwrap_or(MARK_HOST_MAX);
        let mut boot_id = [0u8; 16];
        boot_id.copy_from_slice(&b[56..72]);
        Ok(MountMark {
            seq: get_u64(b, 16),
            in_use: state == 1,
            interval_ms: get_u32(b, 28),
            time_ms: get_u64(b, 32),
            pid: get_u32(b, 40),
            pid_ns: get_u64(b, 48),
            boot_id,
            host: String::from_utf8_lossy(&raw[..end]).into_owned(),
        })
    }
}

/// The state block: the small amount of volume-wide state that changes with commits.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct State {
    /// First inode of the list of unlinked-but-open inodes, freed at the next open.
    pub orphan_head: u64,
    /// Next inode generation number.
    pub next_generation: u32,
    /// Sequence number of the delta that wrote this block.
    pub commit_seq: u64,
    /// Live inodes (statfs; checked by fsck).
    pub inodes: u64,
    /// The lazy-free tree: inode block → mask of slots freed but still marked used in
    /// the block (ro_compat LAZY_INODE_FREE; empty otherwise).
    pub lazy_frees: TreeRoot,
    /// The rstat tree: each directory's recursive statistics and the link directories of
    /// each file with several links (ro_compat RSTATS; empty otherwise).
    pub rstats: TreeRoot,
}

impl State {
    pub fn encode_into(&self, b: &mut Block) {
        b.fill(0);
        put_u32(b, 0, STATE_MAGIC);
        put_u64(b, 16, self.orphan_head);
        put_u32(b, 24, self.next_generation);
        put_u64(b, 32, self.commit_seq);
        put_u64(b, 40, self.inodes);
        put_u64(b, 48, self.lazy_frees.root);
        put_u16(b, 56, self.lazy_frees.depth);
        put_u64(b, 64, self.rstats.root);
        put_u16(b, 72, self.rstats.depth);
    }
    pub fn decode(b: &Block) -> State {
        State {
            orphan_head: get_u64(b, 16),
            next_generation: get_u32(b, 24),
            commit_seq: get_u64(b, 32),
            inodes: get_u64(b, 40),
            lazy_frees: TreeRoot { root: get_u64(b, 48), depth: get_u16(b, 56) },
            rstats: TreeRoot { root: get_u64(b, 64), depth: get_u16(b, 72) },
        }
    }
}

/// One mapped run of a file: `len` blocks from logical block `logical` at `phys`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Extent {
    pub logical: u64,
    pub len: u64,
    pub phys: u64,
    /// Allocated but never written (fallocate): reads as zeros.
    pub unwritten: bool,
}

impl Extent {
    pub fn end(&self) -> u64 {
        self.logical + self.len
    }
    /// The 12-byte B+tree value (the key is `logical`).
    pub fn encode_value(&self) -> [u8; 12] {
        let mut v = [0u8; 12];
        put_u32(&mut v, 0, self.len as u32 | if self.unwritten { 1 << 31 } else { 0 });
        put_u64(&mut v, 4, self.phys);
        v
    }
    pub fn decode_value(logical: u64, v: &[u8]) -> Result<Extent> {
        if v.len() != 12 {
            return Err(Error::corrupt("extent record has the wrong size"));
        }
        let l = get_u32(v, 0);
        Ok(Extent { logical, len: (l & !(1 << 31)) as u64, phys: get_u64(v, 4), unwritten: l & (1 << 31) != 0 })
    }
}

/// File types as stored in directory entries (same numbers as the DT_* constants).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum FileType {
    Fifo = 1,
    CharDevice = 2,
    Directory = 4,
    BlockDevice = 6,
    RegularFile = 8,
    Symlink = 10,
    Socket = 12,
}

impl FileType {
    pub fn from_mode(mode: u32) -> Option<FileType> {
        Some(match mode & libc::S_IFMT {
            libc::S_IFIFO => FileType::Fifo,
            libc::S_IFCHR => FileType::CharDevice,
            libc::S_IFDIR => FileType::Directory,
            libc::S_IFBLK => FileType::BlockDevice,
            libc::S_IFREG => FileType::RegularFile,
            libc::S_IFLNK => FileType::Symlink,
            libc::S_IFSOCK => FileType::Socket,
            _ => return None,
        })
    }
    pub fn from_u8(v: u8) -> Option<FileType> {
        Some(match v {
            1 => FileType::Fifo,
            2 => FileType::CharDevice,
            4 => FileType::Directory,
            6 => FileType::BlockDevice,
            8 => FileType::RegularFile,
            10 => FileType::Symlink,
            12 => FileType::Socket,
            _ => return None,
        })
    }
}

/// A directory entry's B+tree value: inode number, type, name.
pub(crate) fn encode_dirent(ino: u64, ft: FileType, name: &[u8]) -> Vec<u8> {
    let mut v = Vec::with_capacity(9 + name.len());
    v.extend_from_slice(&ino.to_le_bytes());
    v.push(ft as u8);
    v.extend_from_slice(name);
    v
}

/// Decode a directory entry value into (ino, type, name).
pub fn decode_dirent(v: &[u8]) -> Result<(u64, FileType, &[u8])> {
    if v.len() < 10 || v.len() > 9 + NAME_MAX {
        return Err(Error::corrupt("directory entry has a bad length"));
    }
    let ft = FileType::from_u8(v[8]).ok_or_else(|| Error::corrupt("directory entry has a bad type"))?;
    Ok((get_u64(v, 0), ft, &v[9..]))
}

/// What the 64-byte data area of an inode holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum InodeData {
    /// Up to four extents in the inode (regular files, long symlinks; `n` used).
    Extents { ext: [Extent; INLINE_EXTENTS], n: u8 },
    /// The extent map is a B+tree.
    ExtentTree { tree: TreeRoot, count: u32 },
    /// A symlink target of at most 64 bytes (its length is the inode size).
    InlineSymlink([u8; INLINE_DATA]),
    /// A directory: its hashed index and its reserved inode region.
    Dir(DirInfo),
}

/// A directory's index root and inode reservation.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DirInfo {
    pub tree: TreeRoot,
    /// Largest displacement of any entry's key from its name hash (collision probing).
    pub max_disp: u32,
    /// The reserved region: `region_len` blocks from `region_start`, of which the first
    /// `region_used` are initialised inode blocks; the rest are allocated but blank.
    pub region_start: u64,
    pub region_len: u32,
    pub region_used: u32,
    /// Number of entries (not counting . and ..).
    pub entries: u64,
    /// Most bytes the subtree may have allocated, 0 for no limit (ro_compat DIR_QUOTA;
    /// without it the field is reserved and ignored).
    pub quota: u64,
}

/// An inode, decoded. Times are (seconds, nanoseconds).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Inode {
    pub ino: u64,
    pub mode: u32,
    pub uid: u32,
    pub gid: u32,
    pub nlink: u32,
    pub size: u64,
    /// 4 KiB blocks owned: data, extent tree, directory index, xattr block.
    pub blocks: u64,
    pub atime: (i64, u32),
    pub mtime: (i64, u32),
    pub ctime: (i64, u32),
    pub crtime: (i64, u32),
    pub generation: u32,
    pub flags: u32,
    pub rdev: u64,
    /// Directories: the parent directory.
    pub parent: u64,
    /// Orphan list link.
    pub next_orphan: u64,
    pub xattr_block: u64,
    pub xattr_filter: u32,
    pub xattr_inline_len: u16,
    pub xattr_inline: [u8; INLINE_XATTR],
    pub data: InodeData,
}

const FMT_EXTENTS: u8 = 0;
const FMT_TREE: u8 = 1;
const FMT_SYMLINK: u8 = 2;
const FMT_DIR: u8 = 3;

impl Inode {
    /// A blank inode of the given mode.
    pub fn new(ino: u64, mode: u32) -> Inode {
        let data = if mode & libc::S_IFMT == libc::S_IFDIR {
            InodeData::Dir(DirInfo::default())
        } else {
            InodeData::Extents { ext: [Extent::default(); INLINE_EXTENTS], n: 0 }
        };
        Inode {
            ino,
            mode,
            uid: 0,
            gid: 0,
            nlink: 0,
            size: 0,
            blocks: 0,
            atime: (0, 0),
            mtime: (0, 0),
            ctime: (0, 0),
            crtime: (0, 0),
            generation: 0,
            flags: 0,
            rdev: 0,
            parent: 0,
            next_orphan: 0,
            xattr_block: 0,
            xattr_filter: 0,
            xattr_inline_len: 0,
            xattr_inline: [0; INLINE_XATTR],
            data,
        }
    }

    pub fn file_type(&self) -> Option<FileType> {
        FileType::from_mode(self.mode)
    }
    pub fn is_dir(&self) -> bool {
        self.mode & libc::S_IFMT == libc::S_IFDIR
    }
    pub fn dir(&self) -> Result<&DirInfo> {
        match &self.data {
            InodeData::Dir(d) => Ok(d),
            _ => Err(Error::NotDir),
        }
    }
    pub fn dir_mut(&mut self) -> Result<&mut DirInfo> {
        match &mut self.data {
            InodeData::Dir(d) => Ok(d),
            _ => Err(Error::NotDir),
        }
    }

    /// Encode into a 256-byte slot.
    pub fn encode(&self, s: &mut [u8]) {
        s[..INODE_SIZE].fill(0);
        put_u32(s, 0, self.mode);
        put_u32(s, 4, self.uid);
        put_u32(s, 8, self.gid);
        put_u32(s, 12, self.nlink);
        put_u64(s, 16, self.size);
        put_u64(s, 24, self.blocks);
        put_i64(s, 32, self.atime.0);
        put_i64(s, 40, self.mtime.0);
        put_i64(s, 48, self.ctime.0);
        put_i64(s, 56, self.crtime.0);
        put_u32(s, 64, self.atime.1);
        put_u32(s, 68, self.mtime.1);
        put_u32(s, 72, self.ctime.1);
        put_u32(s, 76, self.crtime.1);
        put_u32(s, 80, self.generation);
        put_u32(s, 84, self.flags);
        put_u64(s, 88, self.rdev);
        put_u64(s, 96, self.parent);
        put_u64(s, INODE_NEXT_ORPHAN, self.next_orphan);
        put_u64(s, 112, self.xattr_block);
        put_u32(s, 120, self.xattr_filter);
        put_u16(s, 124, self.xattr_inline_len);
        let mut d = [0u8; INLINE_DATA];
        let (fmt, n) = match &self.data {
            InodeData::Extents { ext, n } => {
                for (i, e) in ext.iter().take(*n as usize).enumerate() {
                    put_u32(&mut d, 16 * i, e.logical as u32);
                    d[16 * i + 4..16 * i + 16].copy_from_slice(&e.encode_value());
                }
                (FMT_EXTENTS, *n)
            }
            InodeData::ExtentTree { tree, count } => {
                put_u64(&mut d, 0, tree.root);
                put_u16(&mut d, 8, tree.depth);
                put_u32(&mut d, 12, *count);
                (FMT_TREE, 0)
            }
            InodeData::InlineSymlink(t) => {
                d.copy_from_slice(t);
                (FMT_SYMLINK, 0)
            }
            InodeData::Dir(di) => {
                put_u64(&mut d, 0, di.tree.root);
                put_u16(&mut d, 8, di.tree.depth);
                put_u32(&mut d, 12, di.max_disp);
                put_u64(&mut d, 16, di.region_start);
                put_u32(&mut d, 24, di.region_len);
                put_u32(&mut d, 28, di.region_used);
                put_u64(&mut d, 32, di.entries);
                put_u64(&mut d, 40, di.quota);
                (FMT_DIR, 0)
            }
        };
        s[126] = fmt;
        s[127] = n;
        s[128..192].copy_from_slice(&d);
        s[192..256].copy_from_slice(&self.xattr_inline);
    }

    /// Decode a 256-byte slot; `None` when the slot is free (mode 0).
    pub fn decode(ino: u64, s: &[u8]) -> Result<Option<Inode>> {
        let mode = get_u32(s, 0);
        if mode == 0 {
            return Ok(None);
        }
        let bad = |m: &str| Error::corrupt(format!("inode {ino}: {m}"));
        if FileType::from_mode(mode).is_none() {
            return Err(bad("unknown file type"));
        }
        let d = &s[128..192];
        let data = match s[126] {
            FMT_EXTENTS => {
                let n = s[127];
                if n as usize > INLINE_EXTENTS {
                    return Err(bad("too many inline extents"));
                }
                let mut ext = [Extent::default(); INLINE_EXTENTS];
                for (i, e) in ext.iter_mut().take(n as usize).enumerate() {
                    *e = Extent::decode_value(get_u32(d, 16 * i) as u64, &d[16 * i + 4..16 * i + 16])?;
                }
                InodeData::Extents { ext, n }
            }
            FMT_TREE => InodeData::ExtentTree {
                tree: TreeRoot { root: get_u64(d, 0), depth: get_u16(d, 8) },
                count: get_u32(d, 12),
            },
            FMT_SYMLINK => {
                let mut t = [0u8; INLINE_DATA];
                t.copy_from_slice(d);
                InodeData::InlineSymlink(t)
            }
            FMT_DIR => InodeData::Dir(DirInfo {
                tree: TreeRoot { root: get_u64(d, 0), depth: get_u16(d, 8) },
                max_disp: get_u32(d, 12),
                region_start: get_u64(d, 16),
                region_len: get_u32(d, 24),
                region_used: get_u32(d, 28),
                entries: get_u64(d, 32),
                quota: get_u64(d, 40),
            }),
            f => return Err(bad(&format!("unknown data format {f}"))),
        };
        let ft = FileType::from_mode(mode);
        let fits = match &data {
            InodeData::Dir(_) => ft == Some(FileType::Directory),
            InodeData::InlineSymlink(_) => ft == Some(FileType::Symlink),
            InodeData::ExtentTree { .. } => matches!(ft, Some(FileType::RegularFile) | Some(FileType::Symlink)),
            InodeData::Extents { n, .. } => {
                matches!(ft, Some(FileType::RegularFile) | Some(FileType::Symlink))
                    || (*n == 0 && ft != Some(FileType::Directory))
            }
        };
        if !fits {
            return Err(bad("data format does not match the file type"));
        }
        let xattr_inline_len = get_u16(s, 124);
        if xattr_inline_len as usize > INLINE_XATTR {
            return Err(bad("inline xattr length out of range"));
        }
        let size = get_u64(s, 16);
        if matches!(data, InodeData::InlineSymlink(_)) && size as usize > INLINE_DATA {
            return Err(bad("inline symlink longer than its area"));
        }
        let mut xattr_inline = [0u8; INLINE_XATTR];
        xattr_inline.copy_from_slice(&s[192..256]);
        Ok(Some(Inode {
            ino,
            mode,
            uid: get_u32(s, 4),
            gid: get_u32(s, 8),
            nlink: get_u32(s, 12),
            size,
            blocks: get_u64(s, 24),
            atime: (get_i64(s, 32), get_u32(s, 64)),
            mtime: (get_i64(s, 40), get_u32(s, 68)),
            ctime: (get_i64(s, 48), get_u32(s, 72)),
            crtime: (get_i64(s, 56), get_u32(s, 76)),
            generation: get_u32(s, 80),
            flags: get_u32(s, 84),
            rdev: get_u64(s, 88),
            parent: get_u64(s, 96),
            next_orphan: get_u64(s, INODE_NEXT_ORPHAN),
            xattr_block: get_u64(s, 112),
            xattr_filter: get_u32(s, 120),
            xattr_inline_len,
            xattr_inline,
            data,
        }))
    }
}

/// Offset of `next_orphan` in an inode record: the orphan list's link, which only the
/// orphan list's code writes (`Tx::set_next_orphan`; `Tx::put_inode` keeps it).
pub(crate) const INODE_NEXT_ORPHAN: usize = 104;

/// Inode block header (slot 0): owner directory and the bitmap of used slots.
pub(crate) const IB_OWNER: usize = 16;
pub(crate) const IB_USED: usize = 24;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn inode_round_trip_every_format() {
        let mut i = Inode::new(17, libc::S_IFREG | 0o644);
        i.size = 12345;
        i.mtime = (-5, 999_999_999);
        i.data = InodeData::Extents {
            ext: [
                Extent { logical: 0, len: 3, phys: 900, unwritten: false },
                Extent { logical: 7, len: 1, phys: 1000, unwritten: true },
                Extent::default(),
                Extent::default(),
            ],
            n: 2,
        };
        i.xattr_inline[..3].copy_from_slice(b"abc");
        i.xattr_inline_len = 3;
        let mut s = [0u8; INODE_SIZE];
        i.encode(&mut s);
        assert_eq!(Inode::decode(17, &s).unwrap(), Some(i));

        let mut d = Inode::new(33, libc::S_IFDIR | 0o755);
        *d.dir_mut().unwrap() = DirInfo {
            tree: TreeRoot { root: 77, depth: 3 },
            max_disp: 4,
            region_start: 500,
            region_len: 8,
            region_used: 2,
            entries: 1_000_000,
            quota: 1 << 40,
        };
        d.encode(&mut s);
        assert_eq!(Inode::decode(33, &s).unwrap(), Some(d));
        s.fill(0);
        assert_eq!(Inode::decode(33, &s).unwrap(), None);
    }

    #[test]
    fn hostile_inode_fields_are_errors() {
        let mut s = [0u8; INODE_SIZE];
        Inode::new(1, libc::S_IFREG | 0o600).encode(&mut s);
        let mut t = s;
        t[127] = 9;
        assert!(Inode::decode(1, &t).is_err());
        let mut t = s;
        t[126] = 3; // dir data on a regular file
        assert!(Inode::decode(1, &t).is_err());
        let mut t = s;
        put_u32(&mut t, 0, 0o170000 | 0o644);
        assert!(Inode::decode(1, &t).is_err());
    }

    /// The superblock of docs/FORMAT.md §14, byte for byte.
    #[test]
    fn format_doc_worked_example() {
        let layout = Layout::new(4096, 64).unwrap();
        let sb = Superblock {
            version: VERSION,
            compat: COMPAT_DIR_RESERVATION,
            incompat: 0,
            ro_compat: RO_COMPAT_XATTR_FILTER_K | RO_COMPAT_LAZY_INODE_FREE,
            uuid: [0x11, 0x22, 0x33, 0x44, 0x55, 0x66, 0x47, 0x77, 0x88, 0x99, 0xaa, 0xbb, 0xcc, 0xdd, 0xee, 0xff],
            label: "example".into(),
            layout,
            root_ino: 2097,
            hash: HashVersion::HalfMd4,
            region_blocks: 4,
            hash_seed: [0x3e5a_1c6b, 0x7a4e_2f9d, 0x3b0f_118c, 0x6f5e_4d2a],
            mkfs_time: 1_735_689_600,
            filter_hashes: DEFAULT_FILTER_HASHES,
            grow_from: 0,
        };
        let old = Superblock { ro_compat: RO_COMPAT_XATTR_FILTER, filter_hashes: 0, ..sb.clone() }.encode(0);
        assert_eq!(get_u32(&old[..], 4), 0x2534_9e47, "the version-1 example before XATTR_FILTER_K");
        // Volumes made with the one-bit filter still open, with k = 1.
        assert_eq!(Superblock::decode(&old, 0).unwrap().filter_hashes(), 1);
        let before_lazy = Superblock { ro_compat: RO_COMPAT_XATTR_FILTER_K, ..sb.clone() }.encode(0);
        assert_eq!(get_u32(&before_lazy[..], 4), 0x7f65_4f35, "the example before LAZY_INODE_FREE");
        let b = sb.encode(0);
        assert_eq!((layout.bitmap_start, layout.bitmap_blocks, layout.first_free()), (130, 1, 131));
        assert_eq!(&b[0x1c..0x20], &[6, 0, 0, 0], "ro_compat");
        assert_eq!(&b[0x80..0x84], &[1, 11, 4, 0], "hash, filter_hashes, region_blocks");
        assert_eq!(get_u32(&b[..], 4), 0x7158_7e47, "crc of the worked example: {:#010x}", get_u32(&b[..], 4));
        assert!(b[160..].iter().all(|&x| x == 0));
        // mkfs's defaults since MOUNT_MARK: the mark in block F + 1 = 132.
        let marked = Superblock {
            ro_compat: sb.ro_compat | RO_COMPAT_MOUNT_MARK,
            layout: Layout { mark_block: 132, ..layout },
            ..sb.clone()
        };
        let b = marked.encode(0);
        assert_eq!(&b[0x1c..0x20], &[0x16, 0, 0, 0], "ro_compat");
        assert_eq!(&b[168..176], &[132, 0, 0, 0, 0, 0, 0, 0], "mark_block");
        assert_eq!(
            get_u32(&b[..], 4),
            0xc839_08e1,
            "crc of the worked example with a mount mark: {:#010x}",
            get_u32(&b[..], 4)
        );
        assert_eq!(Superblock::decode(&b, 0).unwrap(), marked);
        assert!(b[176..].iter().all(|&x| x == 0));
        // Out of place: on the root's block, in the fixed area, on the backup superblock.
        for bad in [131u64, 100, 4095] {
            let mut b = marked.encode(0);
            b[168..176].copy_from_slice(&bad.to_le_bytes());
            seal(&mut b, 0);
            assert!(Superblock::decode(&b, 0).is_err(), "mark block {bad}");
        }
        // mkfs's defaults since ONE_FLUSH_COMMIT: incompat 2 (FORMAT.md §14's block).
        let current = Superblock { incompat: INCOMPAT_ONE_FLUSH_COMMIT, ..marked.clone() };
        let b = current.encode(0);
        assert_eq!(&b[0x18..0x1c], &[2, 0, 0, 0], "incompat");
        assert_eq!(get_u32(&b[..], 4), 0x53d9_9eda, "crc of the worked example today: {:#010x}", get_u32(&b[..], 4));
        assert!(Superblock::decode(&b, 0).unwrap().one_flush_commit());
    }

    #[test]
    fn mount_mark_round_trip_torn_and_damaged() {
        let m = MountMark {
            seq: 0x1122_3344_5566_7788,
            in_use: true,
            interval_ms: 5000,
            time_ms: 1_735_689_600_000,
            pid: 4242,
            pid_ns: 4_026_531_836,
            boot_id: [9; 16],
            host: "h".repeat(80),
        };
        let b = m.encode(132);
        let back = MountMark::decode(&b, 132).unwrap();
        assert_eq!(back, MountMark { host: "h".repeat(MARK_HOST_MAX), ..m.clone() });
        assert!(b[512..].iter().all(|&x| x == 0), "everything in the first sector");
        // A write torn anywhere past the first sector leaves the new mark whole.
        let old = MountMark { in_use: false, seq: 1, ..m.clone() }.encode(132);
        let mut torn = old.clone();
        torn[..2048].copy_from_slice(&b[..2048]);
        assert_eq!(MountMark::decode(&torn, 132).unwrap(), back);
        assert!(MountMark::decode(&b, 133).is_err(), "misdirected");
        let mut bad = b.clone();
        put_u32(&mut bad[..], 24, 7);
        seal(&mut bad, 132);
        assert!(MountMark::decode(&bad, 132).is_err(), "unknown state");
    }

    #[test]
    fn superblock_round_trip_and_rejects() {
        let layout = Layout::for_blocks(10_000).unwrap();
        let sb = Superblock {
            version: VERSION,
            compat: COMPAT_DIR_RESERVATION,
            incompat: 0,
            ro_compat: RO_COMPAT_XATTR_FILTER_K,
            uuid: [7; 16],
            label: "hello".into(),
            layout,
            root_ino: ino_of(layout.first_free(), 1),
            hash: HashVersion::HalfMd4,
            region_blocks: 4,
            hash_seed: [1, 2, 3, 4],
            mkfs_time: 1234,
            filter_hashes: 11,
            grow_from: 0,
        };
        let b = sb.encode(0);
        assert_eq!(Superblock::decode(&b, 0).unwrap(), sb);
        // The hash count must agree with the feature flags.
        for (ro, k) in [(RO_COMPAT_XATTR_FILTER_K, 0), (RO_COMPAT_XATTR_FILTER_K, 33), (RO_COMPAT_XATTR_FILTER, 3)] {
            let bad = Superblock { ro_compat: ro, filter_hashes: k, ..sb.clone() };
            assert!(Superblock::decode(&bad.encode(0), 0).is_err(), "ro_compat {ro} with {k} hashes accepted");
        }
        assert!(Superblock::decode(&b, 5).is_err());
        // A grown volume: bitmap blocks past the contiguous ones, a grow still pending.
        let grown = Layout::grown(100_000, layout.log_blocks, layout.bitmap_blocks).unwrap();
        assert_eq!((grown.bitmap_count(), grown.bitmap_block(1), grown.bitmap_block(3)), (4, 32_512, 97_536));
        let big = Superblock {
            layout: grown,
            incompat: INCOMPAT_SPILLED_BITMAP,
            ro_compat: sb.ro_compat | RO_COMPAT_GROW_PENDING,
            grow_from: 10_000,
            ..sb.clone()
        };
        let d = Superblock::decode(&big.encode(0), 0).unwrap();
        assert_eq!(d, big);
        assert_eq!(d.pending_grow_tail(), 9_999..32_512);
        // Without the flag the contiguous count must be mkfs's.
        assert!(Superblock::decode(&Superblock { incompat: 0, ..big.clone() }.encode(0), 0).is_err());
        // A pending grow must come from a smaller volume that could exist.
        for from in [0, 100_000, 200] {
            let bad = Superblock { grow_from: from, ..big.clone() };
            assert!(Superblock::decode(&bad.encode(0), 0).is_err(), "grow from {from} accepted");
        }
        // Without GROW_PENDING bytes 160.. are reserved and ignored.
        let stray = Superblock { ro_compat: sb.ro_compat, ..big.clone() }.encode(0);
        assert_eq!(Superblock::decode(&stray, 0).unwrap().grow_from, 0);
        // Spilled bitmap blocks must lie past any volume mkfs could have made: one
        // contiguous block cannot precede a log reaching past block 32512.
        assert!(Layout::grown(200_000, 65_536, 1).is_err());
        assert!(Layout::grown(200_000, 65_536, 5).is_ok());
        // The spilled blocks are judged without walking them: a hostile count of 2^64 - 1
        // blocks (5.7·10^14 bitmap blocks) decodes, or is refused, at once (fuzzer seed
        // 2952803245 hung here), and the membership test agrees with the list.
        let huge = Layout::grown(u64::MAX, layout.log_blocks, layout.bitmap_blocks).unwrap();
        let at = huge.bitmap_block(huge.bitmap_count() - 1);
        assert!(huge.is_spilled_bitmap(at) && !huge.is_spilled_bitmap(at + 1));
        let stray_huge =
            Superblock { layout: Layout { mark_block: 0, ..huge }, incompat: INCOMPAT_SPILLED_BITMAP, ..sb.clone() };
        let _ = Superblock::decode(&stray_huge.encode(0), 0);
        let spilled: Vec<u64> = grown.spilled_bitmap_blocks().collect();
        for b in 0..grown.block_count {
            assert_eq!(grown.is_spilled_bitmap(b), spilled.contains(&b), "block {b}");
        }
        let zero = [0u8; BLOCK_SIZE];
        assert!(Superblock::decode(&zero, 0).is_err());
    }
}
