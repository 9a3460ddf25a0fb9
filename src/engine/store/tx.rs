//! An operation's handle on the store ([`Tx`]): how the layers above read and change
//! metadata blocks, allocate and free, and count what they allocated.
//!
//! A `Tx` holds at most one cached block at a time (a guard of that block's cache shard)
//! and lets it go at the start of its next call, before it takes anything else: so a
//! thread never holds two shard locks, never waits for a lock while holding a block, and
//! the shard locks stay leaves of the lock order. The borrow checker does the rest: the
//! `&Block` a call returns borrows the `Tx`, so it is dead before the next call.

use super::*;
use crate::engine::btree::{NodeRead, NodeStore, BTREE_MAGIC};
use crate::engine::cache::{BlockMut, BlockRef};
use crate::engine::deferred::{self, Wanted};
use crate::engine::leaf::{guard_dropped, guard_taken, guards_held};

/// Reading metadata: what code that only reads (lookups, listings, file and xattr reads)
/// asks of a [`Tx`].
pub(crate) trait MetaRead: NodeRead {
    /// The store: superblock, space map, lazy-free records.
    fn store(&self) -> &Store;
    /// A verified metadata block, its magic checked when `want` is given.
    fn block(&mut self, b: u64, want: Option<u32>) -> Result<&Block>;
    /// Inode block `b`, or `None` if it was freed by a delta that is not yet durable (a
    /// stale inode number); read ahead in windows by the store's policy.
    fn inode_block(&mut self, b: u64) -> Result<Option<&Block>>;
    /// Let go of the cache block held, if any: what the caller read it for is done, and
    /// it may take other locks now (nothing above the cache's is taken while one is held).
    fn let_go(&mut self) {}
}

/// One operation's access to the store (see the module doc).
pub struct Tx<'a> {
    st: &'a Store,
    /// The block this handle holds for reading, if any.
    cur: Option<BlockRef<'a>>,
    /// The block this handle holds for changing, if any.
    cur_mut: Option<BlockMut<'a>>,
    /// Blocks allocated less blocks freed through this handle: what `usage_mark` and
    /// `account` measure an owner's growth by.
    net: i64,
}

impl Drop for Tx<'_> {
    fn drop(&mut self) {
        self.let_go();
    }
}

impl<'a> Tx<'a> {
    pub(super) fn new(st: &'a Store) -> Tx<'a> {
        Tx { st, cur: None, cur_mut: None, net: 0 }
    }

    /// Let go of the block held, if any: done first by every call, before it takes
    /// anything else.
    pub(super) fn release_block(&mut self) {
        if self.cur.take().is_some() || self.cur_mut.take().is_some() {
            guard_dropped();
        }
        debug_assert_eq!(guards_held(), 0, "another handle of this thread holds a block");
    }

    /// Let go of the block held, if any, without the check: the caller is done with
    /// it and may take other locks now (nothing above the cache's is taken while a block
    /// is held).
    pub fn let_go(&mut self) {
        if self.cur.take().is_some() || self.cur_mut.take().is_some() {
            guard_dropped();
        }
    }

    fn hold(&mut self, r: BlockRef<'a>) -> &Block {
        guard_taken();
        self.cur.insert(r)
    }

    fn hold_mut(&mut self, w: BlockMut<'a>) -> &mut Block {
        guard_taken();
        self.cur_mut.insert(w)
    }

    /// The store this handle works on (for its shared parts, outliving the handle's
    /// borrows).
    pub fn store(&self) -> &'a Store {
        self.st
    }

    /// The free-space map and budget, locked (see [`Store::space`]).
    pub fn space(&mut self) -> LeafGuard<'a, Space> {
        self.release_block();
        self.st.space.lock()
    }

    /// A verified metadata block, read (and verified) on a miss.
    pub fn block(&mut self, b: u64, want: Option<u32>) -> Result<&Block> {
        self.release_block();
        let st = self.st;
        st.check_block_place(b, want)?;
        let r = st.cache.get(&*st.dev, b, want)?;
        Ok(self.hold(r))
    }

    /// A metadata block to change: it joins the delta's dirty set.
    pub fn block_mut(&mut self, b: u64, want: Option<u32>) -> Result<&mut Block> {
        deferred::check_change();
        self.release_block();
        let st = self.st;
        st.check_block_place(b, want)?;
        let w = st.cache.get_mut(&*st.dev, b, want)?;
        Ok(self.hold_mut(w))
    }

    /// A zeroed dirty block for new contents, without reading the device.
    pub fn fresh_block(&mut self, b: u64) -> &mut Block {
        deferred::check_change();
        self.release_block();
        let w = self.st.cache.fresh(b);
        self.hold_mut(w)
    }

    /// Read the uncached ones of `blocks` in one sorted sweep.
    pub fn prefetch(&mut self, blocks: &[u64]) -> Result<()> {
        self.release_block();
        self.st.prefetch(blocks)
    }

    /// See [`Store::prefetch_inodes`].
    pub fn prefetch_inodes(&mut self, blocks: &[u64], limit: usize) -> Result<()> {
        self.release_block();
        self.st.prefetch_inodes(blocks, limit)
    }

    /// Whether block `b` is dirty in the delta being built.
    pub fn is_dirty(&mut self, b: u64) -> bool {
        self.release_block();
        self.st.cache.is_dirty(b)
    }

    /// Allocate a run of between `min` and `want` blocks near `goal` (see
    /// [`Space::alloc`]), counted as this operation's.
    pub fn alloc(&mut self, goal: u64, want: u64, min: u64) -> Option<(u64, u64)> {
        deferred::check_change();
        let st = self.st;
        let got = self.space().alloc_where(goal, want, min, &|b, n| st.cache.first_held(b, n));
        if let Some((_, n)) = got {
            self.net += n as i64;
        }
        got
    }

    /// Allocate one metadata block near `goal`, zeroed and dirty.
    pub fn alloc_meta(&mut self, goal: u64) -> Result<u64> {
        let (b, _) = self.alloc(goal, 1, 1).ok_or(Error::NoSpace)?;
        self.fresh_block(b);
        Ok(b)
    }

    /// Free a metadata block at the end of the delta; its cached copy is dropped (and
    /// tombstoned) so it is never written home (a stale write could land on the block's
    /// next owner).
    pub fn free_meta(&mut self, block: u64) {
        self.release_block();
        self.st.cache.free(block);
        self.free_deferred(block, 1);
    }

    /// Free a run of blocks at the end of the delta (see [`Space::free_deferred`]).
    pub fn free_deferred(&mut self, start: u64, len: u64) {
        deferred::check_change();
        self.space().free_deferred(start, len);
        self.net -= len as i64;
    }

    /// Free a run now: blocks allocated in this same delta, which the committed state
    /// never referenced (see [`Space::free_now`]).
    pub fn free_now(&mut self, start: u64, len: u64) {
        deferred::check_change();
        self.space().free_now(start, len);
        self.net -= len as i64;
    }

    /// A mark for counting the blocks an operation allocates and frees from here on
    /// (through this handle).
    pub fn usage_mark(&self) -> i64 {
        self.net
    }

    /// Adjust an owner's block count (`inode.blocks`) by what this handle allocated and
    /// freed since `mark`.
    pub fn account(&self, blocks: &mut u64, mark: i64) {
        *blocks = (*blocks as i64 + self.net - mark).max(0) as u64;
    }

    /// Read an inode (see [`read_inode`]).
    pub fn inode(&mut self, ino: u64) -> Result<Inode> {
        read_inode(self, ino)
    }

    /// Read an inode without the validity rules (see [`read_inode_unchecked`]).
    pub fn inode_unchecked(&mut self, ino: u64) -> Result<Inode> {
        read_inode_unchecked(self, ino)
    }

    /// Write an inode back into its block. Its orphan-list link is kept as it is in the
    /// block: another operation may have changed it meanwhile (taking the inode before
    /// this one off the list), and only [`Tx::set_next_orphan`] changes it.
    pub fn put_inode(&mut self, inode: &Inode) -> Result<()> {
        let (b, s) = self.st.check_ino(inode.ino)?;
        self.release_block();
        self.st.note_change_of(inode.ino);
        let blk = self.block_mut(b, Some(INODE_MAGIC))?;
        let slot = &mut blk[s * INODE_SIZE..(s + 1) * INODE_SIZE];
        let link = get_u64(slot, INODE_NEXT_ORPHAN);
        inode.encode(slot);
        put_u64(slot, INODE_NEXT_ORPHAN, link);
        self.release_block();
        Ok(())
    }

    /// Set inode `ino`'s orphan-list link (the caller holds the orphan list's lock).
    pub fn set_next_orphan(&mut self, ino: u64, next: u64) -> Result<()> {
        let (b, s) = self.st.check_ino(ino)?;
        self.release_block();
        self.st.note_change_of(ino);
        let blk = self.block_mut(b, Some(INODE_MAGIC))?;
        put_u64(&mut blk[s * INODE_SIZE..(s + 1) * INODE_SIZE], INODE_NEXT_ORPHAN, next);
        self.release_block();
        Ok(())
    }
}

impl MetaRead for Tx<'_> {
    fn store(&self) -> &Store {
        self.st
    }
    fn block(&mut self, b: u64, want: Option<u32>) -> Result<&Block> {
        Tx::block(self, b, want)
    }
    fn inode_block(&mut self, b: u64) -> Result<Option<&Block>> {
        self.release_block();
        let st = self.st;
        let r = match st.cache.peek(b, Some(INODE_MAGIC)) {
            Some(r) => r?,
            None if deferred::deferring() => {
                // A miss, read once the operation has let go.
                let w = if st.inode_readahead { INODE_WINDOW as usize } else { 1 };
                deferred::want(Wanted::Inodes(vec![b], w));
                return Err(Error::missed());
            }
            None => {
                // A miss: read the block's window of inode blocks with it.
                if st.inode_readahead {
                    st.prefetch_inodes(&[b], INODE_WINDOW as usize)?;
                }
                st.cache.get_live(&*st.dev, b, Some(INODE_MAGIC))?
            }
        };
        Ok(r.map(|r| self.hold(r)))
    }
    fn let_go(&mut self) {
        Tx::let_go(self);
    }
}

impl NodeRead for Tx<'_> {
    fn node(&mut self, block: u64) -> Result<&Block> {
        self.block(block, Some(BTREE_MAGIC))
    }
}

impl NodeStore for Tx<'_> {
    fn node_mut(&mut self, block: u64) -> Result<&mut Block> {
        self.block_mut(block, Some(BTREE_MAGIC))
    }
    fn alloc_node(&mut self, near: u64) -> Result<u64> {
        let (b, _) = self.alloc(near, 1, 1).ok_or(Error::NoSpace)?;
        put_u32(self.fresh_block(b), 0, BTREE_MAGIC);
        Ok(b)
    }
    fn free_node(&mut self, block: u64) -> Result<()> {
        self.free_meta(block);
        Ok(())
    }
}

/// Read an inode. A free slot or an out-of-range number is `NotFound` (a stale handle);
/// a damaged block, or an inode that breaks a validity rule (`Inode::check`), is
/// `Corrupt`.
pub(crate) fn read_inode(r: &mut (impl MetaRead + ?Sized), ino: u64) -> Result<Inode> {
    let (b, _) = r.store().check_ino(ino)?;
    if !r.store().is_used(b) {
        return Err(Error::NotFound);
    }
    let i = read_inode_unchecked(r, ino)?;
    i.check(&r.store().sb.layout)?;
    Ok(i)
}

/// Read an inode as its slot decodes, without the validity rules and whatever the
/// free-space map says of its block: fsck, which checks both itself so that it can
/// repair what breaks them (an intact inode block marked free is marked used again).
pub(super) fn read_inode_unchecked(r: &mut (impl MetaRead + ?Sized), ino: u64) -> Result<Inode> {
    let (b, s) = r.store().check_ino(ino)?;
    // A damaged lazy-free tree must not make every inode unreadable: no directory
    // entry names a lazily freed inode, so reading goes on as if it had no record
    // (fsck reports the tree; changes that need it fail).
    let lazy = r.store().lazy_mask(b);
    let blk = r.inode_block(b)?.ok_or(Error::NotFound)?;
    if get_u16(blk, IB_USED) & (1 << s) == 0 {
        return Err(Error::NotFound);
    }
    let i = Inode::decode(ino, &blk[s * INODE_SIZE..(s + 1) * INODE_SIZE])?
        .ok_or_else(|| Error::corrupt(format!("inode {ino} is marked used but blank")));
    // The caller goes on with the decoded inode (and often to other locks).
    r.let_go();
    let i = i?;
    if lazy & (1 << s) != 0 {
        return Err(Error::NotFound);
    }
    Ok(i)
}
