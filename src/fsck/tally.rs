//! fsck's comparisons: what the walk found (`walk.rs`) against what the volume records —
//! link counts, shared xattr blocks' reference counts, inode blocks' used slots and the
//! lazy-free tree, the free-space map. Each returns the differences a repair fixes.

use std::collections::{HashMap, HashSet};

use crate::disk::codec::*;
use crate::disk::format::*;
use crate::engine::btree;
use crate::fs::xattr;

use super::walk::{InodeFix, Reached, Walk};

/// Inode slots against the live inodes: per inode block, the slots the lazy-free tree
/// frees (`lazy`; `lazy_all` also for blocks no reached inode lives in), lazy-free records
/// to drop, blocks whose used slots are wrong (block, used, wanted), and unreadable
/// blocks that hold no live inode, to be written empty (block, the directory whose region
/// holds it).
pub(super) struct Slots {
    pub(super) lazy: HashMap<u64, u16>,
    pub(super) lazy_all: HashMap<u64, u16>,
    pub(super) lazy_drops: Vec<u64>,
    pub(super) slot_fixes: Vec<(u64, u16, u16)>,
    pub(super) reinit: Vec<(u64, u64)>,
}

/// The free-space map against use: blocks marked used that nothing owns, and blocks in
/// use marked free.
pub(super) struct Usage {
    pub(super) leaked: Vec<u64>,
    pub(super) marked_free: Vec<u64>,
}

impl Walk<'_> {
    /// Shared xattr blocks: owned once, reference count equal to the inodes using them
    /// (compared once the lost inodes, which may use them too, are known): per block, the
    /// count it records and the references the walk found.
    pub(super) fn xattr_counts(&mut self) -> Vec<(u64, u32, u32)> {
        let mut xattr_counts: Vec<(u64, u32, u32)> = Vec::new();
        let refs: Vec<(u64, u32)> = self.xattr_refs.iter().map(|(b, n)| (*b, *n)).collect();
        for (b, n) in refs {
            self.own(b, 0, "xattr");
            let found = xattr::refcount(&mut self.st.tx(), b);
            match found {
                Ok(c) => xattr_counts.push((b, c, n)),
                Err(e) => self.err(format!("xattr block {b}: {e}")),
            }
        }
        xattr_counts
    }

    /// Link counts against the entries found: (inode, count, should be).
    pub(super) fn nlink_fixes(
        &self,
        inodes: &HashMap<u64, Reached>,
        orphans: &HashSet<u64>,
        subdirs: &HashMap<u64, u32>,
    ) -> Vec<(u64, u32, u32)> {
        let mut nlink_fixes = Vec::new();
        for (ino, i) in inodes {
            let want = if i.is_dir() && orphans.contains(ino) {
                // A removed directory kept alive by its holder (a process's working
                // directory, say) over a commit: no name, no `.`, no subdirectory.
                0
            } else if i.is_dir() {
                2 + subdirs.get(ino).copied().unwrap_or(0)
            } else {
                self.links.get(ino).copied().unwrap_or(0)
            };
            if i.nlink != want {
                nlink_fixes.push((*ino, i.nlink, want));
            }
        }
        nlink_fixes
    }

    /// Directory inode regions against every other owner the walk found. A region is
    /// only a reservation, worth less than anything it overlaps: one that names a block
    /// something else owns, an initialised block that is another directory's inode
    /// block, or a blank block a reached inode lives in, is cleared by a repair (its
    /// children stay where they are). The rest are claimed: the initialised blocks as
    /// inode blocks, the blank ones as their directory's. Lowest directory first, so two
    /// overlapping regions give the same finding whatever the walk's order.
    pub(super) fn regions(&mut self, inodes: &HashMap<u64, Reached>) {
        let live: HashSet<u64> = inodes.keys().map(|&i| ino_loc(i).0).collect();
        let mut regions = std::mem::take(&mut self.regions);
        regions.sort_unstable_by_key(|&(ino, _)| ino);
        let layout = self.st.sb.layout;
        for (ino, d) in regions {
            if !d.region_ok(&layout) {
                continue; // the inode itself is unusable (its check says why)
            }
            let blocks = d.region_start..d.region_start + d.region_len as u64;
            let initialised = d.region_start + d.region_used as u64;
            let problem = blocks.clone().find_map(|b| {
                let owned = self.owner.get(&b).copied();
                let also = |o: u64| format!("block {b} is also owned by inode {o}");
                if owned == Some(u64::MAX) {
                    return Some(format!("block {b} is another region's inode block"));
                }
                if b >= initialised {
                    return owned
                        .map(also)
                        .or_else(|| live.contains(&b).then(|| format!("its blank block {b} holds live inodes")));
                }
                let header = self.st.tx().block(b, Some(INODE_MAGIC)).map(|blk| get_u64(blk, IB_OWNER));
                match (header, owned) {
                    (Ok(o), _) if o != ino => Some(format!("block {b} is an inode block of directory {o}")),
                    (Ok(_), Some(o)) if self.meta.contains(&b) => Some(also(o)),
                    // Its own inode block: a file extent over it is the wild one, and goes
                    // (`data_over_metadata`).
                    (Ok(_), _) => None,
                    // Unreadable: written empty if it holds no live inode, but never when
                    // something else owns it.
                    (Err(_), Some(o)) => Some(also(o)),
                    (Err(_), None) => None,
                }
            });
            if let Some(p) = problem {
                let m = format!(
                    "directory {ino}: inode region of {} blocks at {} ({} initialised) overlaps other \
                     owners ({p}): a repair clears it",
                    d.region_len, d.region_start, d.region_used
                );
                self.fix(ino, InodeFix::NoRegion, m);
                continue;
            }
            for b in blocks {
                if b >= initialised {
                    self.own(b, ino, "reserved region");
                } else {
                    self.owner.insert(b, u64::MAX); // an inode block, shared by its inodes
                }
            }
            self.regions.push((ino, d));
        }
    }

    /// Inode blocks and the lazy-free tree against the live inodes (see [`Slots`]).
    pub(super) fn inode_slots(&mut self, inodes: &HashMap<u64, Reached>) -> Slots {
        // Inode blocks: used slots must be exactly the live inodes.
        let mut ib: HashMap<u64, u16> = HashMap::new();
        for ino in inodes.keys() {
            let (b, s) = ino_loc(*ino);
            *ib.entry(b).or_insert(0) |= 1 << s;
        }
        // Which directory's region each initialised region block belongs to.
        let mut region_of: HashMap<u64, u64> = HashMap::new();
        // Only the regions that keep the rules (`regions`).
        for (ino, d) in &self.regions {
            for k in 0..d.region_used as u64 {
                ib.entry(d.region_start + k).or_insert(0);
                region_of.insert(d.region_start + k, *ino);
            }
        }
        // The lazy-free tree: slots freed without rewriting their inode block.
        let mut lazy: HashMap<u64, u16> = HashMap::new();
        // Every record, also those for blocks no reached inode lives in (to tell the live
        // slots of a block only lost inodes live in).
        let mut lazy_all: HashMap<u64, u16> = HashMap::new();
        let mut lazy_drops = Vec::new();
        if let Some(t) = self.st.lazy_frees().filter(|t| t.root != 0) {
            let found = btree::check(&mut self.st.tx(), &t, LAZY_FREE_OWNER);
            match found {
                Ok(stats) => {
                    for b in &stats.blocks {
                        self.own(*b, 0, "lazy-free tree");
                    }
                    let mut recs = Vec::new();
                    let r = btree::scan(&mut self.st.tx(), &t, LAZY_FREE_OWNER, 0, |k, v| {
                        recs.push((k, v.to_vec()));
                        true
                    });
                    if let Err(e) = r {
                        self.blind(format!("lazy-free tree: {e}"));
                    }
                    for (b, v) in recs {
                        let mask = if v.len() == 2 { u16::from_le_bytes([v[0], v[1]]) } else { 0 };
                        lazy_all.insert(b, mask);
                        self.lazy_block_under_data(b, inodes);
                        if mask & !1 == 0 || mask & 1 != 0 || !ib.contains_key(&b) {
                            // Malformed, or for a block with no live inode (which should
                            // have been freed with its record): the record goes.
                            lazy_drops.push(b);
                        } else {
                            lazy.insert(b, mask);
                        }
                    }
                }
                Err(e) => self.blind(format!("lazy-free tree broken: {e}")),
            }
        }
        let mut slot_fixes = Vec::new();
        let mut reinit: Vec<(u64, u64)> = Vec::new();
        for (&b, &mask) in &ib {
            let found = self.st.tx().block(b, Some(INODE_MAGIC)).map(|blk| get_u16(blk, IB_USED));
            if found.is_ok() {
                self.meta.insert(b);
            }
            match found {
                Ok(used) => {
                    let freed = lazy.get(&b).copied().unwrap_or(0);
                    // A record may only free slots the block marks used.
                    if freed & !used != 0 || used & !freed != mask {
                        slot_fixes.push((b, used, mask));
                    }
                }
                // An unreadable block that should hold no live inode (a region block whose
                // inodes were all dropped) is written again as an empty one: only in the
                // data area, never over a fixed block a wild region names.
                Err(crate::error::Error::Corrupt(_)) if mask == 0 && self.st.sb.layout.meta_block_ok(b) => {
                    reinit.push((b, region_of.get(&b).copied().unwrap_or(0)))
                }
                Err(e) => self.blind(format!("inode block {b}: {e}")),
            }
            match self.owner.get(&b) {
                Some(&o) if o != u64::MAX => self.err(format!("inode block {b} is also owned by inode {o}")),
                _ => {
                    self.owner.insert(b, u64::MAX);
                }
            }
        }
        Slots { lazy, lazy_all, lazy_drops, slot_fixes, reinit }
    }

    /// A lazy-free record names block `b` as an inode block (checksummed, as the block is),
    /// and the runtime reads a sealed inode block there as metadata: a file extent over it
    /// is the wild one (fuzzer seed 1074495009). The block becomes metadata no walk reached:
    /// `data_over_metadata` drops the extent, and the block is leaked unless lost inodes
    /// live in it (`find_lost`, with the record's slots taken away).
    /// (A directory owns no data: a block it owns outside `meta` is its reserved region's.)
    fn lazy_block_under_data(&mut self, b: u64, inodes: &HashMap<u64, Reached>) {
        let Some(&o) = self.owner.get(&b) else { return };
        let data = inodes.get(&o).is_some_and(|i| !i.is_dir()) && !self.meta.contains(&b);
        if !data || self.st.tx().block(b, Some(INODE_MAGIC)).is_err() {
            return;
        }
        self.meta.insert(b);
        self.owner.remove(&b);
    }

    /// The free-space map against what the walk found owned (nothing to compare when the
    /// map is to be rebuilt); also counts the blocks in use.
    pub(super) fn space_map(&mut self, rebuild_bitmap: bool) -> Usage {
        let layout = self.st.sb.layout;
        let mut leaked = Vec::new();
        let mut marked_free = Vec::new();
        let mut used = layout.first_free() + 1;
        // The old tail of a grow cut short is marked used and owned by nothing until the next
        // read-write open frees it (ro_compat GROW_PENDING): not a leak.
        let pending_tail = self.st.sb.pending_grow_tail();
        for b in layout.first_free()..layout.backup_superblock() {
            let owned = self.owner.contains_key(&b);
            let marked = self.st.is_used(b);
            let in_tail = pending_tail.contains(&b);
            if owned {
                used += 1;
            }
            if owned && in_tail {
                self.blind(format!("block {b} is in use but lies in the old tail a pending grow is to free"));
            }
            if rebuild_bitmap {
                continue; // the map is rebuilt from `owner` below
            }
            if owned && !marked {
                marked_free.push(b);
            } else if marked && !owned && !in_tail {
                leaked.push(b);
            }
        }
        self.r.blocks_used = used;
        Usage { leaked, marked_free }
    }
}
