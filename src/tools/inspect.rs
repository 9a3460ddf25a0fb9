//! The inspector behind `dxfs debug ls|stat|htree|extents|xattrs|log` (as debugfs).
//!
//! Opens a volume read-only the way fsck does (the superblock, then the engine without
//! applying the log: the newest committed delta is overlaid in memory, nothing is
//! written) and returns plain structs. A damaged structure is an `Error::Corrupt` with a
//! message naming what could not be read, never a panic.

use std::sync::Arc;

use crate::disk::device::BlockDevice;
use crate::disk::format::{FileType, Inode, InodeData, Superblock};
use crate::engine::btree;
use crate::engine::log;
use crate::engine::store::{self, Store};
use crate::error::{Error, Result};
use crate::fs::{dir, file, xattr};
use crate::volume::read_usable_superblock;

/// A volume opened for inspection. Never writes to the device.
pub struct Inspector {
    dev: Arc<dyn BlockDevice>,
    sb: Superblock,
    st: Store,
}

/// One directory entry (`debug ls`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Entry {
    pub name: Vec<u8>,
    pub ino: u64,
    pub file_type: &'static str,
}

/// An inode's fields (`debug stat`). Times are (seconds, nanoseconds).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct InodeInfo {
    pub ino: u64,
    pub file_type: &'static str,
    pub mode: u32,
    pub uid: u32,
    pub gid: u32,
    pub nlink: u32,
    pub size: u64,
    pub blocks: u64,
    pub atime: (i64, u32),
    pub mtime: (i64, u32),
    pub ctime: (i64, u32),
    pub crtime: (i64, u32),
    pub generation: u32,
    pub flags: u32,
    pub rdev: u64,
    pub parent: u64,
    pub xattr_block: u64,
    pub xattr_filter: u32,
    pub xattr_inline_len: u16,
    /// How the inode holds its data: "extents" (inline), "extent_tree", "inline_symlink"
    /// or "directory".
    pub data: &'static str,
}

/// One leaf of a directory's index (`debug htree`).
#[derive(Clone, Debug, PartialEq)]
pub struct Leaf {
    pub block: u64,
    pub entries: usize,
    pub bytes_used: usize,
    /// bytes_used as a share of what a leaf can hold, 0..=1.
    pub fill: f64,
    /// The smallest and largest hash key in the leaf.
    pub first_hash: u64,
    pub last_hash: u64,
}

/// A directory's index (`debug htree`).
#[derive(Clone, Debug, PartialEq)]
pub struct Htree {
    /// Levels of the tree (0 for an empty directory).
    pub depth: u16,
    pub root: u64,
    pub entries: u64,
    pub max_disp: u32,
    pub leaves: Vec<Leaf>,
}

/// One extent of a file (`debug extents`); in blocks of 4 KiB.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ExtentInfo {
    pub logical: u64,
    pub physical: u64,
    pub length: u64,
    pub unwritten: bool,
}

/// One xattr name (`debug xattrs`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct XattrName {
    pub name: Vec<u8>,
    pub value_len: usize,
    /// The filter bits this name sets.
    pub bits: u32,
}

/// An inode's xattrs and its filter word (`debug xattrs`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct XattrList {
    /// The filter word stored in the inode.
    pub filter: u32,
    /// Whether the volume keeps filters (else the word is not maintained).
    pub filter_enabled: bool,
    /// Bits each name sets.
    pub hashes: u32,
    pub names: Vec<XattrName>,
}

/// One log area's commit block (`debug log`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LogArea {
    pub area: u32,
    /// The area's first block (its commit block).
    pub start: u64,
    pub valid: bool,
    pub sequence: Option<u64>,
    pub blocks: Option<usize>,
    /// Whether this is the newest valid commit (the one recovery replays).
    pub newest: bool,
    /// The blocks the commit logs (its descriptors), in the order listed.
    pub targets: Vec<u64>,
    /// Whether the logged body matches the commit's checksum (valid commits only).
    pub body_ok: Option<bool>,
}

/// One block, decoded by where it lies and by its magic (`debug block`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BlockInfo {
    pub block: u64,
    /// superblock, state, commit, log body, bitmap, btree node, inode block, xattr head,
    /// xattr continuation, or data (no metadata magic: file data or a free block).
    pub kind: &'static str,
    /// Whether its checksum and own address verify (metadata kinds only).
    pub checksum_ok: Option<bool>,
    /// Whether the free-space map marks it in use.
    pub in_use: bool,
    /// The kind's decoded header fields, as (name, value).
    pub fields: Vec<(&'static str, u64)>,
}

fn type_name(ft: Option<FileType>) -> &'static str {
    match ft {
        Some(FileType::Fifo) => "fifo",
        Some(FileType::CharDevice) => "char_device",
        Some(FileType::Directory) => "directory",
        Some(FileType::BlockDevice) => "block_device",
        Some(FileType::RegularFile) => "regular",
        Some(FileType::Symlink) => "symlink",
        Some(FileType::Socket) => "socket",
        None => "unknown",
    }
}

impl Inspector {
    /// Open the volume on `dev` read-only.
    pub fn open(dev: Arc<dyn BlockDevice>) -> Result<Inspector> {
        let sb = read_usable_superblock(&*dev)?;
        // Lenient, as fsck: a damaged free-space map or state block does not hide the tree.
        let st = store::open_lenient(dev.clone(), sb.clone(), false, 1 << 12, false, false)?.opened.store;
        Ok(Inspector { dev, sb, st })
    }

    /// The inode at an absolute path inside the volume ("/" is the root).
    fn resolve(&mut self, path: &str) -> Result<Inode> {
        let mut cur = self.st.inode(self.sb.root_ino)?;
        for part in path.split('/').filter(|p| !p.is_empty() && *p != ".") {
            if part == ".." {
                cur = self.st.inode(cur.parent)?;
                continue;
            }
            if !cur.is_dir() {
                return Err(Error::NotDir);
            }
            let found = dir::lookup(&mut self.st.tx(), &cur, part.as_bytes())?;
            match found {
                Some(f) => cur = self.st.inode(f.ino)?,
                None => return Err(Error::NotFound),
            }
        }
        Ok(cur)
    }

    /// Block `n` decoded: what it is by position and magic, whether it verifies, its
    /// header fields. Read from the device as it is (the newest log delta not overlaid).
    pub fn block(&self, n: u64) -> Result<BlockInfo> {
        use crate::disk::codec::{get_u16, get_u32, get_u64, magic, verify, BLOCK_SIZE};
        use crate::disk::format::*;
        let l = self.sb.layout;
        if n >= l.block_count {
            return Err(Error::Invalid(format!("block {n} is past the end of the volume ({} blocks)", l.block_count)));
        }
        let mut b = [0u8; BLOCK_SIZE];
        self.dev.read(n, &mut b)?;
        let check = |want: u32| Some(verify(&b, n, Some(want)).is_ok());
        let (kind, checksum_ok, fields): (&'static str, Option<bool>, Vec<(&'static str, u64)>) = if n == SUPERBLOCK
            || n == l.backup_superblock()
        {
            let ok = Superblock::decode(&b, n).is_ok();
            ("superblock", Some(ok), vec![("block_count", l.block_count), ("root_ino", self.sb.root_ino)])
        } else if n == STATE_BLOCK {
            let st = State::decode(&b);
            let f = vec![
                ("commit_seq", st.commit_seq),
                ("inodes", st.inodes),
                ("orphan_head", st.orphan_head),
                ("lazy_free_root", st.lazy_frees.root),
                ("lazy_free_depth", u64::from(st.lazy_frees.depth)),
            ];
            ("state", check(STATE_MAGIC), f)
        } else if n == l.log_area(0) || n == l.log_area(1) {
            ("commit", check(COMMIT_MAGIC), vec![("sequence", get_u64(&b, 16)), ("blocks", u64::from(get_u32(&b, 24)))])
        } else if n >= l.log_area(0) && n < l.bitmap_start {
            ("log body", None, Vec::new())
        } else if l.mark_block != 0 && n == l.mark_block {
            let m = MountMark::decode(&b, n).ok();
            let f = m.map_or_else(Vec::new, |m| {
                vec![
                    ("in_use", u64::from(m.in_use)),
                    ("pid", u64::from(m.pid)),
                    ("sequence", m.seq),
                    ("time_ms", m.time_ms),
                ]
            });
            ("mount mark", check(MARK_MAGIC), f)
        } else if (n >= l.bitmap_start && n < l.first_free()) || l.is_spilled_bitmap(n) {
            (
                "bitmap",
                check(BITMAP_MAGIC),
                vec![
                    ("used", u64::from(get_u32(&b, BITMAP_USED))),
                    ("bits_set", u64::from(bitmap_bits_set(&b[..]))),
                    ("first_block", if n < l.first_free() { (n - l.bitmap_start) * BITS_PER_BITMAP_BLOCK } else { n }),
                ],
            )
        } else {
            match magic(&b) {
                m if m == btree::BTREE_MAGIC => (
                    "btree node",
                    check(m),
                    vec![
                        ("owner", get_u64(&b, 16)),
                        ("level", u64::from(get_u16(&b, 24))),
                        ("records", u64::from(get_u16(&b, 26))),
                    ],
                ),
                m if m == INODE_MAGIC => {
                    let used = get_u16(&b, IB_USED);
                    (
                        "inode block",
                        check(m),
                        vec![("used_slots", u64::from(used.count_ones())), ("slot_mask", u64::from(used))],
                    )
                }
                m if m == XATTR_MAGIC => (
                    "xattr head",
                    check(m),
                    vec![
                        ("refcount", u64::from(get_u32(&b, 16))),
                        ("bytes", u64::from(get_u32(&b, 20))),
                        ("continuations", u64::from(get_u16(&b, 24))),
                    ],
                ),
                m if m == xattr::XATTR_CONT_MAGIC => ("xattr continuation", check(m), vec![("owner", get_u64(&b, 16))]),
                _ => ("data", None, Vec::new()),
            }
        };
        Ok(BlockInfo { block: n, kind, checksum_ok, in_use: self.st.is_used(n), fields })
    }

    /// A directory's entries, "." and ".." first, then in index order.
    pub fn ls(&mut self, path: &str) -> Result<Vec<Entry>> {
        let d = self.resolve(path)?;
        if !d.is_dir() {
            return Err(Error::NotDir);
        }
        let mut out = Vec::new();
        dir::read(&mut self.st.tx(), &d, 0, |e| {
            out.push(Entry { name: e.name, ino: e.ino, file_type: type_name(Some(e.ft)) });
            true
        })?;
        Ok(out)
    }

    /// An inode's fields.
    pub fn stat(&mut self, path: &str) -> Result<InodeInfo> {
        let i = self.resolve(path)?;
        let data = match i.data {
            InodeData::Extents { .. } => "extents",
            InodeData::ExtentTree { .. } => "extent_tree",
            InodeData::InlineSymlink(_) => "inline_symlink",
            InodeData::Dir(_) => "directory",
        };
        Ok(InodeInfo {
            ino: i.ino,
            file_type: type_name(i.file_type()),
            mode: i.mode,
            uid: i.uid,
            gid: i.gid,
            nlink: i.nlink,
            size: i.size,
            blocks: i.blocks,
            atime: i.atime,
            mtime: i.mtime,
            ctime: i.ctime,
            crtime: i.crtime,
            generation: i.generation,
            flags: i.flags,
            rdev: i.rdev,
            parent: i.parent,
            xattr_block: i.xattr_block,
            xattr_filter: i.xattr_filter,
            xattr_inline_len: i.xattr_inline_len,
            data,
        })
    }

    /// A directory's index: depth and, per leaf, fill and hash range.
    pub fn htree(&mut self, path: &str) -> Result<Htree> {
        let i = self.resolve(path)?;
        let d = *i.dir()?;
        let leaves = btree::leaves(&mut self.st.tx(), &d.tree, i.ino)?
            .into_iter()
            .map(|l| Leaf {
                block: l.block,
                entries: l.records,
                bytes_used: l.bytes_used,
                fill: l.bytes_used as f64 / l.capacity as f64,
                first_hash: l.first_key,
                last_hash: l.last_key,
            })
            .collect();
        Ok(Htree { depth: d.tree.depth, root: d.tree.root, entries: d.entries, max_disp: d.max_disp, leaves })
    }

    /// A file's extent map, in logical order.
    pub fn extents(&mut self, path: &str) -> Result<Vec<ExtentInfo>> {
        let i = self.resolve(path)?;
        if i.is_dir() {
            return Err(Error::IsDir);
        }
        if matches!(i.data, InodeData::InlineSymlink(_)) {
            return Ok(Vec::new());
        }
        Ok(file::all_extents(&mut self.st.tx(), &i)?
            .into_iter()
            .map(|e| ExtentInfo { logical: e.logical, physical: e.phys, length: e.len, unwritten: e.unwritten })
            .collect())
    }

    /// An inode's xattr names, value lengths, its filter word and each name's bits.
    pub fn xattrs(&mut self, path: &str) -> Result<XattrList> {
        let i = self.resolve(path)?;
        let k = self.sb.filter_hashes();
        let names = xattr::load(&mut self.st.tx(), &i)?
            .into_iter()
            .map(|x| XattrName {
                name: xattr::full_name(x.idx, &x.name),
                value_len: x.value.len(),
                bits: xattr::filter_mask(x.idx, &x.name, k),
            })
            .collect();
        Ok(XattrList { filter: i.xattr_filter, filter_enabled: self.sb.xattr_filter(), hashes: k, names })
    }

    /// Both log areas' commit blocks.
    pub fn log(&self) -> Result<Vec<LogArea>> {
        let areas = log::commit_blocks(&*self.dev, self.sb.layout)?;
        let newest = areas.iter().filter_map(|(_, c)| c.map(|(s, _)| s)).max();
        let mut out = Vec::new();
        for (n, (start, c)) in areas.iter().enumerate() {
            let listed = log::commit_targets(&*self.dev, self.sb.layout, *start)?;
            out.push(LogArea {
                area: n as u32,
                start: *start,
                valid: c.is_some(),
                sequence: c.map(|(s, _)| s),
                blocks: c.map(|(_, b)| b),
                newest: c.is_some() && c.map(|(s, _)| s) == newest,
                body_ok: listed.as_ref().map(|(_, ok)| *ok),
                targets: listed.map(|(t, _)| t).unwrap_or_default(),
            });
        }
        Ok(out)
    }
}
