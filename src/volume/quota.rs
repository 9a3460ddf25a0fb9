//! Directory quotas (ro_compat DIR_QUOTA, FORMAT.md §7.4): a directory's `quota` limits
//! the blocks it and its subtree have allocated: its own, and what its recursive
//! statistics count below it.
//!
//! Enforced with the delta's own accounting (seed 003): every change that may allocate
//! charges its worst case to each quota root above the inodes it changes, before it
//! changes anything. A root's use is what it held at the last snapshot (its own blocks,
//! its record's, and those of files below it with no link that still live) plus what
//! changes charged since; each snapshot counts again and starts the charges from zero. A change that would pass a limit commits once (what it counted
//! may have been freed or over-counted since) and then fails with EDQUOT. Deletions are
//! never refused; a cache's write-back of data it accepted is counted, not refused.
//!
//! Which roots lie above an inode never changes while the volume is open, except when a
//! quota is set or cleared: rename and link between directories under different
//! nearest roots fail with EXDEV (as XFS project quotas do), so each directory's nearest
//! root is remembered once found.

use std::sync::atomic::AtomicU64;

use parking_lot::Mutex;
use rustc_hash::FxHashMap;

use super::*;

/// Most directories one walk up a parent chain passes: more is a loop (a damaged
/// volume).
const MAX_WALK: usize = 1 << 16;

/// A quota root, as this open knows it.
#[derive(Clone, Copy, Debug)]
struct Root {
    /// The limit, in blocks (rounded down).
    limit: u64,
    /// The nearest root above it (`None`: none; not yet looked for while absent).
    outer: Option<Option<u64>>,
    /// Blocks its record counted at the last snapshot.
    committed: u64,
    /// Worst cases charged since.
    charged: u64,
}

/// The quota roots met so far and each directory's nearest root (`None`: none above it).
/// Every change that may allocate looks its directory up in `nearest`: sharded, as the
/// other tables every operation reads.
pub(super) struct Quotas {
    roots: Mutex<FxHashMap<u64, Root>>,
    /// Files with no link that still live (open, held, O_TMPFILE) and were below a quota
    /// when they lost their last link or were made: inode → (generation, the roots then).
    /// The counters count them nowhere, but their blocks are still taken: each snapshot
    /// adds them to their roots' use, and drops the ones freed or linked again.
    unlinked: Mutex<FxHashMap<u64, (u32, Vec<u64>)>>,
    nearest: Sharded<FxHashMap<u64, Option<u64>>>,
    /// Raised before `nearest` is cleared: a walk that read the chain before that
    /// remembers nothing (it may have read a quota as it was before the change).
    generation: AtomicU64,
    /// Whether a quota root was ever met (what a caller checks before asking more).
    pub(super) met: Arc<AtomicBool>,
    /// Quotas are not enforced (an open for fsck's repairs, which must never fail for a
    /// limit: a damaged quota may be 1 byte).
    off: bool,
}

impl Quotas {
    /// The quotas of an open for fsck's repairs: none enforced.
    pub(super) fn off() -> Quotas {
        Quotas { off: true, ..Quotas::default() }
    }
}

impl Default for Quotas {
    fn default() -> Quotas {
        Quotas {
            roots: Mutex::default(),
            unlinked: Mutex::default(),
            // Directories of one region share a shard, as in the store's tables.
            nearest: Sharded::new(6),
            generation: AtomicU64::new(0),
            met: Arc::new(AtomicBool::new(false)),
            off: false,
        }
    }
}

/// A quota's limit and use (`Volume::quota`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Quota {
    /// Most bytes the subtree may have allocated.
    pub limit: u64,
    /// Bytes allocated by the directory and below it now, as charged: exact after a commit, and
    /// never less than what the subtree holds.
    pub used: u64,
}

/// The quota name among the virtual xattrs (decimal bytes, as CephFS's
/// `ceph.quota.max_bytes`): read by anyone, set and removed by root.
pub const QUOTA_XATTR: &str = "dxfs.quota.max_bytes";
/// The virtual xattr giving a quota's use in bytes ([`Quota::used`]), read-only.
pub const QUOTA_USED_XATTR: &str = "dxfs.quota.used_bytes";

impl Quotas {
    /// Forget every directory's nearest root and every root's outer one (a quota was set
    /// or cleared).
    fn forget_nearest(&self) {
        self.generation.fetch_add(1, Ordering::SeqCst);
        self.nearest.each_locked(|n| n.clear());
        for r in self.roots.lock().values_mut() {
            r.outer = None;
        }
    }
}

impl Inner {
    fn quotas_on(&self) -> bool {
        self.st.sb.dir_quota() && !self.quotas.off
    }

    /// The nearest quota root at or above directory `dir` (found by walking up once, then
    /// remembered). A chain that cannot be walked (a damaged volume, which fsck repairs)
    /// ends the walk with no root: derived data never fails the change it follows.
    fn nearest_root(&self, dir: u64) -> Result<Option<u64>> {
        let generation = self.quotas.generation.load(Ordering::SeqCst);
        let mut path = Vec::new();
        let mut x = dir;
        let broken = |m: String| {
            tracing::error!("quotas: {m} (run fsck): no quota is enforced below it");
            None
        };
        let found = loop {
            if let Some(&n) = self.quotas.nearest.shard(x).get(&x) {
                break n;
            }
            let i = match self.st.inode(x) {
                Ok(i) => i,
                Err(e) if e.is_missed() => return Err(e),
                Err(e) => break broken(format!("directory {x} on the chain from {dir}: {e}")),
            };
            let InodeData::Dir(d) = i.data else {
                break broken(format!("inode {x} on the chain from {dir} is not a directory"));
            };
            if d.quota > 0 {
                self.learn_root(x, d.quota)?;
                path.push(x);
                break Some(x);
            }
            path.push(x);
            if x == self.st.sb.root_ino {
                break None;
            }
            if path.len() > MAX_WALK {
                break broken(format!("the parent chain from directory {dir} loops"));
            }
            x = i.parent;
        };
        for d in path {
            let mut n = self.quotas.nearest.shard(d);
            // Checked under the shard's lock, which the clearing takes after raising it.
            if self.quotas.generation.load(Ordering::SeqCst) != generation {
                break;
            }
            n.insert(d, found);
        }
        Ok(found)
    }

    /// Directory `dir` has a quota of `bytes`: known from now on, its use read from its
    /// record.
    fn learn_root(&self, dir: u64, bytes: u64) -> Result<()> {
        if self.quotas.roots.lock().contains_key(&dir) {
            return Ok(());
        }
        let r = self.new_root(dir, bytes)?;
        self.quotas.roots.lock().entry(dir).or_insert(r);
        Ok(())
    }

    /// Directory `dir` as a root with a quota of `bytes`, its use as of the last snapshot.
    fn new_root(&self, dir: u64, bytes: u64) -> Result<Root> {
        let committed = self.blocks_below(dir)?;
        self.quotas.met.store(true, Ordering::Relaxed);
        Ok(Root { limit: bytes / BLOCK_SIZE as u64, outer: None, committed, charged: 0 })
    }

    /// Directory `dir`'s quota was just set to `bytes`: known from now on with that
    /// limit (whatever a change running beside it learnt before), and no directory's
    /// nearest root is known any more.
    fn quota_changed(&self, dir: u64, bytes: u64) -> Result<()> {
        self.quotas.forget_nearest();
        if bytes == 0 {
            self.quotas.roots.lock().remove(&dir);
            return Ok(());
        }
        let r = self.new_root(dir, bytes)?;
        self.quotas.roots.lock().insert(dir, r);
        Ok(())
    }

    /// Blocks directory `dir` and its subtree hold, as of the last snapshot: its record's
    /// and its own (the counters count a directory in its parent, but a quota holds the
    /// index its names take).
    /// Without a record (a tree set aside until fsck rebuilds it) only its own count.
    fn blocks_below(&self, dir: u64) -> Result<u64> {
        let below = match self.st.rstat(dir) {
            Ok(r) => r.map_or(0, |r| r.blocks),
            Err(e) if e.is_missed() => return Err(e),
            Err(_) => 0,
        };
        Ok(below.saturating_add(self.st.inode(dir)?.blocks))
    }

    /// The quota roots above directory `dir`, nearest first.
    fn roots_above(&self, dir: u64) -> Result<Vec<u64>> {
        let mut out = Vec::new();
        let mut n = self.nearest_root(dir)?;
        while let Some(q) = n {
            if out.contains(&q) || out.len() > MAX_WALK {
                return Err(Error::corrupt(format!("the quota roots above directory {dir} loop")));
            }
            out.push(q);
            let known = self.quotas.roots.lock().get(&q).and_then(|r| r.outer);
            n = match known {
                Some(o) => o,
                None => {
                    let parent = self.st.inode(q)?.parent;
                    let o = if q == self.st.sb.root_ino { None } else { self.nearest_root(parent)? };
                    if let Some(r) = self.quotas.roots.lock().get_mut(&q) {
                        r.outer = Some(o);
                    }
                    o
                }
            };
        }
        Ok(out)
    }

    /// The quota roots inode `ino`'s blocks count against, nearest first: for a
    /// directory those above itself (a change of it allocates for it or for what it
    /// holds), for a named file those above its counting directory, for a file with no
    /// link those it was below when it lost the last one.
    fn roots_of(&self, ino: u64) -> Result<Vec<u64>> {
        let i = match self.st.inode(ino) {
            Ok(i) => i,
            Err(Error::NotFound) => return Ok(Vec::new()),
            Err(e) => return Err(e),
        };
        match () {
            _ if i.is_dir() => self.roots_above(ino),
            _ if i.nlink == 0 => Ok(self.unlinked_roots(&i)),
            _ => self.roots_above(i.parent),
        }
    }

    /// The roots an unlinked file `i` was below (none if not noted).
    fn unlinked_roots(&self, i: &Inode) -> Vec<u64> {
        match self.quotas.unlinked.lock().get(&i.ino) {
            Some((g, roots)) if *g == i.generation => roots.clone(),
            _ => Vec::new(),
        }
    }

    /// File `i` has no link now (unlinked while open or held, or an O_TMPFILE made in
    /// directory `dir`) and lives on: its blocks stay charged to the quotas above `dir`.
    pub(super) fn quota_file_unlinked(&self, i: &Inode, dir: u64) -> Result<()> {
        if !self.quotas_on() || i.is_dir() {
            return Ok(());
        }
        let roots = self.roots_above(dir)?;
        if !roots.is_empty() {
            self.quotas.unlinked.lock().insert(i.ino, (i.generation, roots));
        }
        Ok(())
    }

    /// The quota roots a change of the inodes `want` locks for writing is charged to.
    pub(super) fn quota_roots(&self, want: &[(u64, Mode)]) -> Result<Vec<u64>> {
        let mut out = Vec::new();
        if !self.quotas_on() {
            return Ok(out);
        }
        for &(ino, mode) in want {
            if mode != Mode::Write {
                continue;
            }
            for q in self.roots_of(ino)? {
                if !out.contains(&q) {
                    out.push(q);
                }
            }
        }
        Ok(out)
    }

    /// Charge `blocks` to each of `roots`; unless `always`, only if every one has room.
    /// Whether it was charged.
    pub(super) fn quota_charge(&self, roots: &[u64], blocks: u64, always: bool) -> bool {
        let mut t = self.quotas.roots.lock();
        let fits = |r: &Root| r.committed.saturating_add(r.charged).saturating_add(blocks) <= r.limit;
        if !always && !roots.iter().all(|q| t.get(q).is_none_or(fits)) {
            return false;
        }
        for q in roots {
            if let Some(r) = t.get_mut(q) {
                r.charged = r.charged.saturating_add(blocks);
            }
        }
        true
    }

    /// Give back a charge the change did not keep (its reservation failed).
    pub(super) fn quota_uncharge(&self, roots: &[u64], blocks: u64) {
        let mut t = self.quotas.roots.lock();
        for q in roots {
            if let Some(r) = t.get_mut(q) {
                r.charged = r.charged.saturating_sub(blocks);
            }
        }
    }

    /// After a snapshot (under the exclusive lock): every root's use as its record now
    /// counts it, and no charge outstanding.
    pub(super) fn quotas_snapshotted(&self) {
        let roots: Vec<u64> = self.quotas.roots.lock().keys().copied().collect();
        if roots.is_empty() {
            return;
        }
        // Files with no link still taking blocks below a root; the rest are forgotten.
        let mut unlinked: FxHashMap<u64, u64> = FxHashMap::default();
        let noted: Vec<(u64, (u32, Vec<u64>))> = self.quotas.unlinked.lock().drain().collect();
        for (ino, (generation, under)) in noted {
            let Ok(i) = self.st.inode(ino) else { continue };
            if i.generation != generation || i.nlink > 0 {
                continue;
            }
            for &q in &under {
                let n = unlinked.entry(q).or_default();
                *n = n.saturating_add(i.blocks);
            }
            self.quotas.unlinked.lock().insert(ino, (generation, under));
        }
        for q in roots {
            // A record that cannot be read (a tree set aside): keep the estimate.
            let blocks = self.blocks_below(q).ok().map(|b| b.saturating_add(unlinked.get(&q).copied().unwrap_or(0)));
            if let Some(r) = self.quotas.roots.lock().get_mut(&q) {
                r.committed = blocks.unwrap_or(r.committed.saturating_add(r.charged));
                r.charged = 0;
            }
        }
    }

    /// Directory `dir` is gone: it is no root and no one's nearest any more (it was
    /// empty, so no directory below it remembers it).
    pub(super) fn quota_dir_removed(&self, dir: u64) {
        if !self.quotas_on() {
            return;
        }
        self.quotas.nearest.shard(dir).remove(&dir);
        self.quotas.roots.lock().remove(&dir);
    }

    /// EXDEV when a name moving from directory `from` to `to` (rename, or link from a
    /// file counted in `from`) would carry its blocks from under one set of quota roots
    /// to another.
    pub(super) fn quota_same_roots(&self, from: u64, to: u64) -> Result<()> {
        if from == to || !self.quotas_on() {
            return Ok(());
        }
        if self.nearest_root(from)? != self.nearest_root(to)? {
            return Err(Error::CrossDevice);
        }
        Ok(())
    }

    /// EXDEV when file `i`, with no link, would be linked into directory `to` under
    /// other quotas than those it was charged to; else it is counted by the counters
    /// from now on.
    pub(super) fn quota_link_unlinked(&self, i: &Inode, to: u64) -> Result<()> {
        if !self.quotas_on() {
            return Ok(());
        }
        if self.unlinked_roots(i).first().copied() != self.nearest_root(to)? {
            return Err(Error::CrossDevice);
        }
        Ok(())
    }

    /// The bytes the subtree of every quota root above inode `ino` may still allocate
    /// (the least of them; `None`: no quota above it).
    #[cfg(feature = "fuse")]
    pub(super) fn quota_room(&self, ino: u64) -> Result<Option<u64>> {
        Ok(self.tightest_quota(ino)?.map(|(limit, used)| limit.saturating_sub(used) * BLOCK_SIZE as u64))
    }

    /// The limit and use, in blocks, of the quota above inode `ino` with the least room.
    fn tightest_quota(&self, ino: u64) -> Result<Option<(u64, u64)>> {
        if !self.quotas_on() {
            return Ok(None);
        }
        let roots = self.roots_of(ino)?;
        let t = self.quotas.roots.lock();
        Ok(roots
            .iter()
            .filter_map(|q| t.get(q))
            .map(|r| (r.limit, r.committed.saturating_add(r.charged)))
            .min_by_key(|&(limit, used)| limit.saturating_sub(used)))
    }
}

impl Volume {
    /// Directory `dir`'s quota and what its subtree uses against it (`None`: no quota).
    pub fn quota(&self, dir: u64) -> Result<Option<Quota>> {
        let g = self.op(&[(dir, Mode::Read)]);
        let i = g.st.inode(dir)?;
        let InodeData::Dir(d) = i.data else { return Err(Error::NotDir) };
        if d.quota == 0 || !g.quotas_on() {
            return Ok(None);
        }
        g.learn_root(dir, d.quota)?;
        let r = g.quotas.roots.lock().get(&dir).copied();
        Ok(r.map(|r| Quota {
            limit: d.quota,
            used: r.committed.saturating_add(r.charged).saturating_mul(BLOCK_SIZE as u64),
        }))
    }

    /// Set directory `dir`'s quota to `bytes` (`None` or 0: no quota), and commit. A
    /// limit below what the subtree holds already is kept: every allocation below it
    /// then fails with EDQUOT until enough is freed.
    pub fn set_quota(&self, dir: u64, bytes: Option<u64>) -> Result<()> {
        let bytes = bytes.unwrap_or(0);
        if bytes != 0 && bytes < BLOCK_SIZE as u64 {
            return Err(Error::Invalid(format!("a quota of {bytes} bytes is less than one block")));
        }
        {
            let g = self.charged(&[(dir, Mode::Write)], |_| Ok(Cost::new(0, 0, true)))?;
            if !g.quotas_on() {
                return Err(Error::NotSupported);
            }
            let mut i = g.st.inode(dir)?;
            let InodeData::Dir(d) = &mut i.data else { return Err(Error::NotDir) };
            if d.quota == bytes {
                return Ok(());
            }
            d.quota = bytes;
            i.ctime = now();
            g.st.put_inode(&i)?;
            g.quota_changed(dir, bytes)?;
        }
        // The use of a new root is exact from the commit's snapshot on.
        self.commit()
    }

    /// [`Volume::statfs`] as seen from inode `ino`: below a quota, the quota is the
    /// size, and the room it leaves (if less) the space free, as CephFS reports a quota
    /// root to `df`.
    pub fn statfs_at(&self, ino: u64) -> Result<StatFs> {
        let mut s = self.statfs();
        if !self.has_quotas() {
            return Ok(s);
        }
        let g = self.op(&[(ino, Mode::Read)]);
        if let Some((limit, used)) = g.tightest_quota(ino)? {
            let room = limit.saturating_sub(used);
            s.blocks = limit;
            s.bfree = s.bfree.min(room);
            s.bavail = s.bavail.min(room);
        }
        Ok(s)
    }

    /// Whether this open has met a directory quota (they are found as changes walk up
    /// to them: any change below one meets it before it allocates).
    pub(crate) fn has_quotas(&self) -> bool {
        self.s.quotas_met.load(Ordering::Relaxed)
    }

    /// The bytes every quota above inode `ino` still allows (the least; `None`: no quota
    /// above it). What the FUSE server uses to send writers past the page cache near a
    /// limit.
    #[cfg(feature = "fuse")]
    pub(crate) fn quota_room(&self, ino: u64) -> Result<Option<u64>> {
        let g = self.op(&[(ino, Mode::Read)]);
        g.quota_room(ino)
    }
}
