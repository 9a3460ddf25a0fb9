//! Recursive statistics (ro_compat RSTATS, FORMAT.md §6.2): every directory's sums over
//! its subtree, kept in the state block's rstat tree and pushed up the ancestor chain
//! once per delta, at its snapshot, not once per operation.
//!
//! How: the first time a delta changes an inode, what the inode counted for until then
//! is noted (`Counted`: where it was counted, its own numbers and, for a directory, the
//! sums below it). At the snapshot, every changed inode is taken out of the tree as it
//! was and put back as it is. Each push walks up through directories the delta did not
//! change and stops at the first one it did: that one's own push carries everything
//! below it further up, so a renamed subtree moves as a whole. Removals use only the old
//! numbers; additions go deepest first, so a changed directory's sums are complete when
//! it is pushed.
//!
//! Operations change the tree's shape themselves (a directory's record is inserted by its
//! mkdir and removed by its rmdir, a file's link record by link and unlink), and the
//! snapshot only rewrites values in place, so what it adds to the log is one leaf per
//! record it touches. Before an operation runs, the charge marks the records its changes
//! may touch (`mark`) and counts their leaves against the log's room.

use super::*;
use crate::disk::rstat::{LinkDirs, Rstat, LINKS_KEY, RSTAT_LEN};
use crate::engine::btree;
use crate::engine::leaf::Sharded;
use rustc_hash::{FxHashMap, FxHashSet};

/// What an inode counted for before the delta changed it, in the directory `parent`:
/// its own numbers and, for a directory, the sums below it. `None` in the change map:
/// it counted for nothing (a free slot, no link).
#[derive(Clone, Debug)]
pub(crate) struct Counted {
    parent: u64,
    own: Rstat,
    below: Option<Rstat>,
    /// A file with several links: the directories holding them (each entry counts in
    /// `hardlinks` there and above).
    names: Vec<(u64, u32)>,
    /// Which inode of this number: a number freed and taken again in one delta is two.
    generation: u32,
}

/// Most directories one push walks through: a walk longer than this meets a loop of
/// parents (a damaged volume; fsck rebuilds the counters).
const MAX_WALK: usize = 1 << 16;

/// Sums with a sign, added up before they are applied.
#[derive(Clone, Copy, Default)]
struct Change {
    files: i128,
    dirs: i128,
    bytes: i128,
    blocks: i128,
    hardlinks: i128,
}

impl Change {
    fn of(r: &Rstat, sign: i128) -> Change {
        Change {
            files: sign * i128::from(r.files),
            dirs: sign * i128::from(r.dirs),
            bytes: sign * i128::from(r.bytes),
            blocks: sign * i128::from(r.blocks),
            hardlinks: sign * i128::from(r.hardlinks),
        }
    }

    fn names(n: u32, sign: i128) -> Change {
        Change { hardlinks: sign * i128::from(n), ..Change::default() }
    }

    fn add(&mut self, o: &Change) {
        self.files += o.files;
        self.dirs += o.dirs;
        self.bytes += o.bytes;
        self.blocks += o.blocks;
        self.hardlinks += o.hardlinks;
    }

    /// `r` changed by this; false when a sum would leave `u64` (counters that were wrong
    /// already: a damaged volume), which are clamped.
    fn apply(&self, r: &mut Rstat) -> bool {
        let mut ok = true;
        let mut one = |v: &mut u64, d: i128| {
            let n = i128::from(*v) + d;
            ok &= (0..=i128::from(u64::MAX)).contains(&n);
            *v = n.clamp(0, i128::from(u64::MAX)) as u64;
        };
        one(&mut r.files, self.files);
        one(&mut r.dirs, self.dirs);
        one(&mut r.bytes, self.bytes);
        one(&mut r.blocks, self.blocks);
        one(&mut r.hardlinks, self.hardlinks);
        ok
    }
}

/// The records a delta's snapshot will rewrite, marked by the charges of the operations
/// that change them (in shards: every change looks here, and almost always finds its
/// directory marked), and the leaves they lie in (what the snapshot adds to the log).
pub(super) struct Marks {
    dirs: Sharded<FxHashSet<u64>>,
    leaves: parking_lot::Mutex<FxHashSet<u64>>,
}

impl Default for Marks {
    fn default() -> Marks {
        Marks { dirs: Sharded::new(6), leaves: Default::default() }
    }
}

impl Store {
    /// mkfs: the volume keeps recursive statistics, in a tree still empty.
    pub fn enable_rstats(&mut self) {
        *self.rstats.get_mut() = Some(TreeRoot::default());
        self.rstats_enabled = true;
    }

    /// Whether the volume keeps recursive statistics.
    pub fn has_rstats(&self) -> bool {
        self.rstats_enabled
    }

    /// The rstat tree's root, when the volume has one (the state block's copy).
    pub fn rstat_tree(&self) -> Option<TreeRoot> {
        *self.rstats.lock()
    }

    /// Directory `dir`'s statistics as of the last snapshot (`None`: no record).
    pub fn rstat(&self, dir: u64) -> Result<Option<Rstat>> {
        let Some(t) = self.rstat_tree() else { return Ok(None) };
        match record(&mut self.tx(), &t, dir)? {
            Some(v) => Rstat::decode(&v).map(Some),
            None => Ok(None),
        }
    }

    /// The directories holding file `ino`'s links, when it has several.
    pub fn link_dirs(&self, ino: u64) -> Result<Option<LinkDirs>> {
        let Some(t) = self.rstat_tree() else { return Ok(None) };
        match record(&mut self.tx(), &t, LINKS_KEY | ino)? {
            Some(v) => LinkDirs::decode(&v).map(Some),
            None => Ok(None),
        }
    }

    /// What inode `ino` counts for as it is now, where (see [`Counted`]); `below` is read
    /// from the tree for a directory.
    fn counted_now(&self, ino: u64, with_below: bool) -> Result<Option<Counted>> {
        // As the slot holds it, rules or not: what a change (a repair) takes out must be
        // what was put in.
        let i = match self.inode_unchecked(ino) {
            Ok(i) => i,
            Err(Error::NotFound) => return Ok(None),
            Err(e) => return Err(e),
        };
        if i.nlink == 0 {
            return Ok(None);
        }
        let below = match i.is_dir() && with_below {
            true => Some(self.rstat(ino)?.unwrap_or_default()),
            false => None,
        };
        let names = match !i.is_dir() && i.nlink >= 2 {
            true => self.link_dirs(ino)?.map(|l| l.0).unwrap_or_default(),
            false => Vec::new(),
        };
        let parent = if ino == self.sb.root_ino { 0 } else { i.parent };
        Ok(Some(Counted { parent, own: Rstat::of(&i, None), below, names, generation: i.generation }))
    }

    /// Read what the first change of inode `ino` in this delta will note
    /// ([`Store::note_change_of`]: its rstat record or link record), so that a cache
    /// miss comes here, in a charge's cost function, where it is put off and read with
    /// the locks let go, not under them. Only a miss is an error.
    pub fn read_counted(&self, ino: u64) -> Result<()> {
        if !self.rstats_enabled || self.changed_inodes.shard(ino).contains_key(&ino) {
            return Ok(());
        }
        match self.counted_now(ino, true) {
            Err(e) if e.is_missed() => Err(e),
            _ => Ok(()),
        }
    }

    /// Note that the delta changes inode `ino`, which counted for `before` until now
    /// (read only the first time, and only when the volume keeps statistics).
    pub(super) fn note_change(&self, ino: u64, before: impl FnOnce() -> Option<Counted>) {
        // Read with the shard let go (the reads take other locks): the inode's own lock
        // keeps any other change of it out meanwhile.
        if self.changed_inodes.shard(ino).contains_key(&ino) {
            return;
        }
        let b = if self.rstats_enabled { before() } else { None };
        self.changed_inodes.shard(ino).entry(ino).or_insert(b);
    }

    /// [`Store::note_change`] with what inode `ino` counts for as it is now: called before
    /// the change is made. A record that cannot be read counts for nothing (logged): the
    /// counters may then be off, which fsck finds and rebuilds.
    pub(crate) fn note_change_of(&self, ino: u64) {
        self.note_change(ino, || {
            self.counted_now(ino, true).unwrap_or_else(|e| {
                tracing::error!("rstats: inode {ino}: {e}");
                None
            })
        });
    }

    /// Mark the records that a change below each directory of `from` may rewrite at the
    /// snapshot: each, and its ancestors up to the root or to one marked already. Returns
    /// the leaves newly counted against the log's room. A directory that cannot be read
    /// ends its walk (its records are then not rewritten either).
    pub fn mark_rstats(&self, from: &[u64]) -> Result<u64> {
        if !self.rstats_enabled {
            return Ok(0);
        }
        let marks = &self.rstat_marks;
        let mut tree = None;
        let mut added = 0;
        for &start in from {
            let mut x = start;
            for _ in 0..MAX_WALK {
                if x == 0 || !marks.dirs.shard(x).insert(x) {
                    break;
                }
                // A tree that cannot be read counts a leaf per record (its snapshot then
                // writes nothing through it anyway).
                let t = *tree.get_or_insert_with(|| self.rstat_tree().unwrap_or_default());
                let leaf = btree::leaves_from(&mut self.tx(), &t, RSTAT_OWNER, x, 1).ok();
                let new = match leaf.as_ref().and_then(|l| l.first()) {
                    Some(&l) => marks.leaves.lock().insert(l),
                    None => true,
                };
                added += u64::from(new);
                if x == self.sb.root_ino {
                    break;
                }
                x = match self.inode(x) {
                    Ok(i) if i.is_dir() => i.parent,
                    _ => break,
                };
            }
        }
        self.rstat_leaves.fetch_add(added, Ordering::Relaxed);
        Ok(added)
    }

    /// Whether the next snapshot may rewrite directory `dir`'s record (a change below it
    /// is not committed yet).
    pub fn rstat_pending(&self, dir: u64) -> bool {
        self.rstat_marks.dirs.shard(dir).contains(&dir)
    }

    /// Leaves of the rstat tree the snapshot will rewrite, as marked so far.
    pub fn rstat_leaves(&self) -> u64 {
        self.rstat_leaves.load(Ordering::Relaxed)
    }

    /// Push the delta's changes up the rstat tree (see the module's comment). Runs with
    /// the volume to itself, before the snapshot takes the dirty blocks.
    pub fn fold_rstats(&mut self) -> Result<()> {
        let Some(t) = self.rstat_tree() else { return Ok(()) };
        // fsck rebuilt the tree from the inodes as they are now: nothing to push.
        let rebuilt = std::mem::take(self.rstats_rebuilt.get_mut());
        let r = if rebuilt { Ok(()) } else { self.fold(t) };
        // Whatever happened, the marks were this delta's: a failed fold must not keep
        // their room from every later delta.
        self.clear_marks();
        if let Err(Error::Corrupt(m)) = &r {
            tracing::error!("rstat tree: {m}: set aside until dxfs fsck rebuilds it");
            *self.rstats.get_mut() = Some(TreeRoot::default());
        }
        r
    }

    fn fold(&mut self, t: TreeRoot) -> Result<()> {
        let mut changed: Vec<(u64, Option<Counted>)> = Vec::new();
        self.changed_inodes.for_each(|s| changed.extend(s.iter().map(|(&i, b)| (i, b.clone()))));
        changed.sort_unstable_by_key(|&(i, _)| i);
        let mut fold = Fold {
            st: self,
            t,
            acc: FxHashMap::default(),
            newest: FxHashMap::default(),
            stops: FxHashSet::default(),
            reborn: FxHashSet::default(),
        };
        let mut now = Vec::with_capacity(changed.len());
        for (ino, before) in changed {
            let n = fold.st.counted_now(ino, false).unwrap_or_else(|e| {
                tracing::error!("rstats: inode {ino} at the snapshot: {e}");
                None
            });
            let was_dir = before.as_ref().is_some_and(|b| b.below.is_some());
            if was_dir || n.as_ref().is_some_and(|n| n.own.dirs == 1) {
                fold.stops.insert(ino);
            }
            if let (Some(b), Some(n)) = (&before, &n) {
                if b.generation != n.generation {
                    fold.reborn.insert(ino);
                }
            }
            now.push((ino, before, n));
        }
        // Everything out as it was.
        for (_, before, _) in &now {
            let Some(b) = before else { continue };
            for &(d, k) in &b.names {
                fold.push_out(d, Change::names(k, -1));
            }
            if b.parent != 0 {
                let mut r = b.own;
                if let Some(below) = &b.below {
                    r.add(below);
                }
                fold.push_out(b.parent, Change::of(&r, -1));
            }
        }
        // Files back in as they are.
        for (_, _, n) in &now {
            let Some(n) = n.as_ref().filter(|n| n.own.dirs == 0) else { continue };
            for &(d, k) in &n.names {
                fold.push(d, Change::names(k, 1), None);
            }
            if n.parent != 0 {
                fold.push(n.parent, Change::of(&n.own, 1), Some(n.own.rctime));
            }
        }
        // Directories back in, deepest (among the changed ones) first.
        let mut order: Vec<(usize, u64, Counted)> = Vec::new();
        let mut depth: FxHashMap<u64, usize> = FxHashMap::default();
        for (ino, _, n) in now {
            if let Some(n) = n.filter(|n| n.own.dirs == 1) {
                let d = fold.depth(ino, n.parent, &mut depth);
                order.push((d, ino, n));
            }
        }
        order.sort_unstable_by(|a, b| b.0.cmp(&a.0).then(a.1.cmp(&b.1)));
        for (_, ino, n) in order {
            let Some(mut r) = fold.settle(ino, Some(n.own.rctime))? else { continue };
            if n.parent != 0 {
                r.add(&n.own);
                fold.push(n.parent, Change::of(&r, 1), Some(r.rctime));
            }
        }
        // The directories the delta did not change that sums reached.
        let mut rest: Vec<u64> = fold.acc.keys().copied().filter(|d| !fold.stops.contains(d)).collect();
        rest.sort_unstable();
        for d in rest {
            fold.settle(d, None)?;
        }
        Ok(())
    }

    fn clear_marks(&mut self) {
        let marks = &mut self.rstat_marks;
        marks.dirs.for_each(|s| s.clear());
        marks.leaves.get_mut().clear();
        *self.rstat_leaves.get_mut() = 0;
    }

    /// fsck: forget a tree too broken to walk (its blocks, which nothing owned, are freed
    /// as leaked by the same repair); the check after it finds no record and rebuilds.
    pub fn drop_rstats(&self) {
        if self.rstat_tree().is_some() {
            *self.rstats.lock() = Some(TreeRoot::default());
            self.rstats_rebuilt.store(true, Ordering::Relaxed);
        }
    }

    /// fsck: replace the rstat tree with `records` (sorted by key), as the last change of
    /// its delta (whose snapshot then pushes nothing). The old tree's blocks are freed.
    pub fn rebuild_rstats(&self, records: &[(u64, Vec<u8>)]) -> Result<()> {
        let Some(mut t) = self.rstat_tree() else { return Ok(()) };
        self.rstats_rebuilt.store(true, Ordering::Relaxed);
        let mut tx = self.tx();
        if t.root != 0 && btree::destroy(&mut tx, &mut t, RSTAT_OWNER).is_err() {
            // A tree too broken to walk: its blocks are left to the leak check.
            t = TreeRoot::default();
        }
        for (k, v) in records {
            btree::insert(&mut tx, &mut t, RSTAT_OWNER, *k, v, true)?;
        }
        drop(tx);
        *self.rstats.lock() = Some(t);
        Ok(())
    }
}

/// One snapshot's pushes: sums waiting per directory, the newest ctime reaching each,
/// the directories the delta changed (where a push stops), and the numbers freed and
/// taken again by another inode in the delta.
struct Fold<'a> {
    st: &'a Store,
    t: TreeRoot,
    acc: FxHashMap<u64, Change>,
    newest: FxHashMap<u64, (i64, u32)>,
    stops: FxHashSet<u64>,
    reborn: FxHashSet<u64>,
}

impl Fold<'_> {
    /// Take `c` out of directory `from` as it was: where the number is another inode now
    /// (a directory removed and its number taken again), the old one's own removal
    /// carries it, and the new one must not lose it.
    fn push_out(&mut self, from: u64, c: Change) {
        if !self.reborn.contains(&from) {
            self.push(from, c, None);
        }
    }

    /// Add `c` (and the time `t`) to directory `from` and the ancestors above it, up to
    /// the root or the first directory the delta changed, which passes it on itself.
    fn push(&mut self, from: u64, c: Change, t: Option<(i64, u32)>) {
        let mut x = from;
        for _ in 0..MAX_WALK {
            self.acc.entry(x).or_default().add(&c);
            if let Some(t) = t {
                let e = self.newest.entry(x).or_insert(t);
                *e = (*e).max(t);
            }
            if self.stops.contains(&x) || x == self.st.sb.root_ino {
                return;
            }
            x = match self.st.inode(x) {
                Ok(i) if i.is_dir() && i.nlink > 0 => i.parent,
                other => {
                    tracing::error!("rstats: directory {x} on a parent chain: {:?}", other.map(|i| i.mode));
                    return;
                }
            };
        }
        tracing::error!("rstats: the parent chain from {from} loops");
    }

    /// How many changed directories lie above `ino` on its chain (memoized in `depth`).
    fn depth(&self, ino: u64, parent: u64, depth: &mut FxHashMap<u64, usize>) -> usize {
        let mut chain = vec![ino];
        let mut x = parent;
        let mut base = 0;
        for _ in 0..MAX_WALK {
            if x == 0 {
                break;
            }
            if let Some(&d) = depth.get(&x) {
                base = d + 1;
                break;
            }
            if self.stops.contains(&x) {
                chain.push(x);
            }
            if x == self.st.sb.root_ino {
                break;
            }
            x = match self.st.inode(x) {
                Ok(i) if i.is_dir() => i.parent,
                _ => break,
            };
        }
        // The chain holds `ino` and the changed directories above it, nearest first.
        let n = chain.len();
        for (k, &c) in chain.iter().enumerate() {
            depth.entry(c).or_insert(base + (n - 1 - k));
        }
        depth[&ino]
    }

    /// Write directory `d`'s record: as committed, plus what reached it, its ctime `own`
    /// and the newest below. Returns the sums below it (`None`: it has no record).
    fn settle(&mut self, d: u64, own: Option<(i64, u32)>) -> Result<Option<Rstat>> {
        let c = self.acc.get(&d).copied().unwrap_or_default();
        let newest = self.newest.get(&d).copied();
        let mut tx = self.st.tx();
        let mut out = None;
        btree::change_floor(&mut tx, &self.t, RSTAT_OWNER, d, |(k, v), _| {
            if k != d {
                return Ok(None);
            }
            let mut r = Rstat::decode(v)?;
            if !c.apply(&mut r) {
                tracing::error!("rstats: directory {d}'s counters were wrong (run fsck)");
            }
            r.rctime = r.rctime.max(own.unwrap_or_default()).max(newest.unwrap_or_default());
            out = Some(r);
            // An unchanged record stays clean (a change that counts for nothing, an
            // atime, must not dirty a leaf no charge counted).
            let new = r.encode();
            Ok((new[..] != *v).then_some(new))
        })?;
        if out.is_none() && d != 0 {
            tracing::error!("rstats: directory {d} has no record (run fsck)");
        }
        Ok(out)
    }
}

/// The value of `key` in the rstat tree.
fn record(tx: &mut Tx<'_>, t: &TreeRoot, key: u64) -> Result<Option<Vec<u8>>> {
    Ok(btree::floor(tx, t, RSTAT_OWNER, key)?.filter(|(k, _)| *k == key).map(|(_, v)| v))
}

impl Tx<'_> {
    /// Change the rstat tree under its lock: `f` gets the tree and a handle of its own.
    /// A tree found damaged is set aside (the counters read as absent, its blocks are
    /// left to fsck, which rebuilds it): derived data never fails the change it follows.
    fn rstat_tree_change(&mut self, f: impl FnOnce(&mut Tx<'_>, &mut TreeRoot) -> Result<()>) -> Result<()> {
        self.release_block();
        let st = self.store();
        let mut root = st.rstats.lock();
        let Some(mut t) = *root else {
            return Err(Error::corrupt("rstat tree used on a volume without it"));
        };
        match f(&mut st.tx(), &mut t) {
            Err(Error::Corrupt(m)) => {
                tracing::error!("rstat tree: {m}: set aside until dxfs fsck rebuilds it");
                *root = Some(TreeRoot::default());
                Ok(())
            }
            r => {
                *root = Some(t);
                r
            }
        }
    }

    /// A new directory's record: nothing below it yet, its own ctime the newest.
    pub fn rstat_insert(&mut self, dir: u64, ctime: (i64, u32)) -> Result<()> {
        let r = Rstat { rctime: ctime, ..Rstat::default() };
        self.rstat_tree_change(|tx, t| btree::insert(tx, t, RSTAT_OWNER, dir, &r.encode(), true))
    }

    /// A directory is gone: its record goes (what it counted was noted before).
    pub fn rstat_remove(&mut self, dir: u64) -> Result<()> {
        self.rstat_tree_change(|tx, t| btree::remove(tx, t, RSTAT_OWNER, dir).map(drop))
    }

    /// Set (or with `None`, remove) file `ino`'s link record.
    pub fn set_link_dirs(&mut self, ino: u64, dirs: Option<&LinkDirs>) -> Result<()> {
        self.release_block();
        // The record is part of what the file counts for: noted before it changes.
        self.store().note_change_of(ino);
        self.rstat_tree_change(|tx, t| match dirs {
            Some(l) => btree::insert(tx, t, RSTAT_OWNER, LINKS_KEY | ino, &l.encode(), true),
            None => btree::remove(tx, t, RSTAT_OWNER, LINKS_KEY | ino).map(drop),
        })
    }
}

const _: () = assert!(RSTAT_LEN <= btree::MAX_VALUE);
