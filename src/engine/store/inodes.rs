//! The inode table (seed 002): inode slots in inode blocks, their allocation from a
//! directory's region, their release, and the lazy-free tree of slots freed without
//! rewriting their blocks.
//!
//! Concurrency: the inode blocks of one directory's region hold that directory's children,
//! which other operations change at the same time, slot by slot (each slot under its own
//! inode's lock). What spans a block — its used mask, its lazy-free record, whether it is
//! empty, the region itself — changes only under the owner directory's region lock
//! (`Store::region_lock`), taken before the lazy-free tree's lock, the space map's and the
//! cache's.

use super::*;

impl Tx<'_> {
    /// Write inode block `b` anew, empty, owned by directory `owner` (fsck, for a damaged
    /// block that holds no live inode).
    pub fn blank_inode_block(&mut self, b: u64, owner: u64) {
        self.init_inode_block(b, owner);
    }

    /// Initialise a blank inode block owned by directory `owner`.
    fn init_inode_block(&mut self, b: u64, owner: u64) {
        let blk = self.fresh_block(b);
        put_u32(blk, 0, INODE_MAGIC);
        put_u64(blk, IB_OWNER, owner);
    }

    /// mkfs: the root directory's inode, in its own block.
    pub fn alloc_root(&mut self) -> Result<u64> {
        let b = self.alloc_meta(self.store().sb.layout.first_free())?;
        self.init_inode_block(b, 0);
        let blk = self.block_mut(b, Some(INODE_MAGIC))?;
        put_u16(blk, IB_USED, 1 << 1);
        Ok(ino_of(b, 1))
    }

    /// Take a free slot in block `b`, if any, and write the new inode `make` gives for
    /// its number into it in the same step: no one ever sees the slot used and blank.
    /// The caller holds the block's region lock.
    fn take_slot(&mut self, b: u64, make: &dyn Fn(u64) -> Inode) -> Result<Option<Inode>> {
        // The block is about to be written anyway: settle its lazy frees into it.
        let lazy = self.lazy_freed(b);
        if lazy != 0 {
            self.settle_lazy(b, lazy)?;
        }
        // Looked at before it is dirtied: `alloc_inode` walks a region's full blocks, and
        // dirtying each one it passes rewrote the whole region at every commit and could
        // make one create overrun the log room kept for an operation.
        let used = get_u16(self.block(b, Some(INODE_MAGIC))?, IB_USED) | 1; // slot 0 is the header
        if used == u16::MAX {
            return Ok(None);
        }
        let s = (!used).trailing_zeros() as usize;
        let i = make(ino_of(b, s as u64));
        let blk = self.block_mut(b, Some(INODE_MAGIC))?;
        put_u16(blk, IB_USED, (used | (1 << s)) & !1);
        i.encode(&mut blk[s * INODE_SIZE..(s + 1) * INODE_SIZE]);
        self.release_block();
        self.store().note_change(i.ino, || None);
        Ok(Some(i))
    }

    /// Allocate an inode for a new child of `dir`: `make` gives its record for the number
    /// chosen, written into the slot as it is taken. When the directory's region moves,
    /// `dir` (the caller's copy) is written back at once, under the region lock, so a
    /// free of one of its children sees the new region.
    pub fn alloc_inode(&mut self, dir: &mut Inode, make: &dyn Fn(u64) -> Inode) -> Result<Inode> {
        self.release_block();
        let dir_ino = dir.ino;
        let dir_block = ino_loc(dir_ino).0;
        let st = self.store();
        if !st.reserve_regions {
            // A/B baseline: one shared inode block at a time for the whole volume, filled
            // in creation order whatever the directory (no reservation).
            let _region = st.region_lock(0);
            let mut shared = st.shared_inode_block.lock();
            if let Some(b) = *shared {
                if st.is_used(b) {
                    if let Ok(Some(i)) = self.take_slot(b, make) {
                        return Ok(i);
                    }
                }
            }
            let (b, _) = self.space().alloc_where(0, 1, 1, &|b, n| st.cache.first_held(b, n)).ok_or(Error::NoSpace)?;
            self.init_inode_block(b, 0);
            *shared = Some(b);
            return self.take_slot(b, make)?.ok_or_else(|| Error::corrupt("a fresh inode block has no free slot"));
        }
        let _region = st.region_lock(dir_ino);
        let region_blocks = st.sb.region_blocks as u32;
        let d = dir.dir_mut()?;
        // Blocks already initialised in the current region, newest first (the oldest
        // are the likeliest to be full).
        for k in (0..d.region_used).rev() {
            let b = d.region_start + k as u64;
            if let Some(i) = self.take_slot(b, make)? {
                return Ok(i);
            }
        }
        if d.region_used == d.region_len {
            // Region full (or none yet): reserve the next one close by.
            let want = if d.region_len == 0 { region_blocks } else { (d.region_len * 2).min(MAX_REGION_BLOCKS) } as u64;
            let goal = if d.region_len == 0 { dir_block + 1 } else { d.region_start + d.region_len as u64 };
            let (start, len) = {
                let mut space = self.space();
                // Near full, a region takes no more than an eighth of what is left, so
                // reservation never turns into an early ENOSPC (one block is charged).
                let want = want.min((space.available(Claim::Change) / 8).max(1));
                space.alloc_where(goal, want, 1, &|b, n| st.cache.first_held(b, n)).ok_or(Error::NoSpace)?
            };
            d.region_start = start;
            d.region_len = len as u32;
            d.region_used = 0;
        }
        let b = d.region_start + d.region_used as u64;
        d.region_used += 1;
        self.init_inode_block(b, dir_ino);
        // The region grew (or moved): stored now, under the region lock.
        self.put_inode(dir)?;
        self.take_slot(b, make)?.ok_or_else(|| Error::corrupt("a fresh inode block has no free slot"))
    }

    /// Free an inode slot. An inode block left empty is freed unless it belongs to its
    /// owner directory's current region (which keeps its room for future children).
    ///
    /// With the LAZY_INODE_FREE feature, a block that is not already dirty in this delta
    /// is not rewritten: the slot goes into the lazy-free tree, whose leaves hold a few
    /// hundred blocks' masks. A removal that spans many deltas (`rm -rf` of a million
    /// files in hash order) then writes each partly emptied inode block at most once,
    /// when it is reused, instead of at every commit (docs/DESIGN.md, "Lazy inode frees").
    pub fn free_inode(&mut self, ino: u64) -> Result<()> {
        let (b, s) = self.store().check_ino(ino)?;
        self.release_block();
        self.store().note_change_of(ino);
        // The owner never changes while the block is in use.
        let owner = get_u64(self.block(b, Some(INODE_MAGIC))?, IB_OWNER);
        self.release_block();
        let st = self.store();
        let _region = st.region_lock(if st.reserve_regions { owner } else { 0 });
        let lazy = self.lazy_freed(b) | (1 << s);
        let (used, owner) = {
            let blk = self.block(b, Some(INODE_MAGIC))?;
            (get_u16(blk, IB_USED), get_u64(blk, IB_OWNER))
        };
        if used & !lazy & !1 == 0 && !self.in_current_region(b, owner, ino)? {
            // Nothing live is left: the block goes, with its lazy-free record.
            if lazy != 1 << s {
                self.set_lazy_freed(b, 0)?;
            }
            self.free_meta(b);
            return Ok(());
        }
        // Recording the slot may allocate a tree node: only while space is plentiful
        // (the reserve belongs to deletions and commits), and never when the block is
        // written in this delta anyway.
        if self.store().has_lazy_frees()
            && !self.is_dirty(b)
            && self.space().available(Claim::Change) > LAZY_FREE_MIN_AVAILABLE
        {
            match self.set_lazy_freed(b, lazy) {
                Err(Error::NoSpace) => {}
                r => return r,
            }
        }
        self.settle_lazy(b, lazy)
    }

    /// Whether inode block `b` (owned by directory `owner`) lies in the owner's current
    /// region. `ino` is the inode being freed, which may be the owner itself.
    fn in_current_region(&mut self, b: u64, owner: u64, ino: u64) -> Result<bool> {
        if owner == 0 || owner == ino {
            return Ok(false);
        }
        if let Ok(o) = self.inode(owner) {
            if let Ok(d) = o.dir() {
                // The whole region, not only its initialised part: a block there that
                // held an inode contradicts the region (damage), and freeing it would let
                // the region initialise a block someone else may own by then.
                return Ok(b >= d.region_start && b < d.region_start + d.region_len as u64);
            }
        }
        Ok(false)
    }

    /// Slots of inode block `b` that are free although its used mask says otherwise.
    pub fn lazy_freed(&self, b: u64) -> u16 {
        self.store().lazy_mask(b)
    }

    /// Record `mask` as block `b`'s lazily freed slots (0 removes the record). The tree
    /// changes under its own lock, through a handle of its own: its blocks are nobody's
    /// (they count against no inode).
    fn set_lazy_freed(&mut self, b: u64, mask: u16) -> Result<()> {
        self.release_block();
        let st = self.store();
        let mut root = st.lazy.lock();
        let Some(mut t) = *root else {
            return Err(Error::corrupt("lazy-free tree used on a volume without it"));
        };
        let mut tree = st.tx();
        if mask == 0 {
            crate::engine::btree::remove(&mut tree, &mut t, LAZY_FREE_OWNER, b)?;
            st.lazy_masks.shard(b).remove(&b);
        } else {
            crate::engine::btree::insert(&mut tree, &mut t, LAZY_FREE_OWNER, b, &mask.to_le_bytes(), true)?;
            st.lazy_masks.shard(b).insert(b, mask);
        }
        *root = Some(t);
        Ok(())
    }

    /// Forget block `b`'s lazy-free record, if any (fsck, once the block's own mask is exact).
    pub fn drop_lazy_freed(&mut self, b: u64) -> Result<()> {
        self.release_block();
        let st = self.store();
        let mut root = st.lazy.lock();
        if let Some(mut t) = root.filter(|t| t.root != 0) {
            crate::engine::btree::remove(&mut st.tx(), &mut t, LAZY_FREE_OWNER, b)?;
            *root = Some(t);
        }
        st.lazy_masks.shard(b).remove(&b);
        Ok(())
    }

    /// Clear the slots `mask` in inode block `b` itself and drop its lazy-free record.
    pub fn settle_lazy(&mut self, b: u64, mask: u16) -> Result<()> {
        let had = self.lazy_freed(b);
        let blk = self.block_mut(b, Some(INODE_MAGIC))?;
        let used = get_u16(blk, IB_USED) & !(mask & !1);
        put_u16(blk, IB_USED, used);
        for s in 1..INODES_PER_BLOCK as usize {
            if mask & (1 << s) != 0 {
                blk[s * INODE_SIZE..(s + 1) * INODE_SIZE].fill(0);
            }
        }
        if had != 0 {
            self.set_lazy_freed(b, 0)?;
        }
        Ok(())
    }

    /// A directory is going away: give back the blank tail of its region and any empty
    /// initialised blocks in it.
    pub fn release_region(&mut self, dir: u64, d: &DirInfo) -> Result<()> {
        self.release_block();
        let st = self.store();
        let _region = st.region_lock(dir);
        let tail = d.region_start + d.region_used as u64;
        if d.region_len > d.region_used {
            // Blank blocks were never written in any committed state... but they may
            // have been reserved by a committed delta, so release them with the delta.
            // They are nobody's: not counted as this handle's frees.
            self.space().free_deferred(tail, (d.region_len - d.region_used) as u64);
            // A window read may have cached what they held before (an older inode
            // block): once free, nothing in memory may say they hold metadata.
            for b in tail..d.region_start + d.region_len as u64 {
                st.cache.forget(b);
            }
        }
        for k in 0..d.region_used as u64 {
            let b = d.region_start + k;
            let lazy = self.lazy_freed(b);
            let used = get_u16(self.block(b, Some(INODE_MAGIC))?, IB_USED);
            if used & !lazy & !1 == 0 {
                if lazy != 0 {
                    self.set_lazy_freed(b, 0)?;
                }
                self.free_meta(b);
            }
        }
        Ok(())
    }
}
