//! fsck's check of the recursive statistics (ro_compat RSTATS, FORMAT.md §6.2): every
//! directory's record and every link record against what the walk recounts, and each
//! file's counting directory against the names that lead to it. The counters are derived
//! data, so a repair rebuilds the whole tree (`Fixes::rstats`).

use std::collections::{HashMap, VecDeque};

use crate::disk::format::*;
use crate::disk::rstat::{LinkDirs, Rstat, LINKS_KEY};
use crate::engine::btree;

use super::walk::{Reached, Walk};

/// What the check found wrong, and the tree and counting directories a repair writes.
#[derive(Default)]
pub(super) struct RstatCheck {
    pub(super) errors: Vec<String>,
    /// The tree's blocks are owned by nothing (it could not be walked): any repair drops
    /// the tree, since the leak check frees them.
    pub(super) unowned: bool,
    /// The whole tree, sorted by key.
    pub(super) records: Vec<(u64, Vec<u8>)>,
    /// Files counted in a directory that names them not: (file, directory to count it in).
    pub(super) parents: Vec<(u64, u64)>,
}

/// The rstat tree's records by key, what made part of it unreadable, and whether its
/// blocks could not even be listed (then owned by nothing: the tree must go with them).
pub(super) type Found = (HashMap<u64, Vec<u8>>, Option<String>, bool);

/// Most differences reported one by one.
const SHOWN: usize = 20;

impl Walk<'_> {
    /// The rstat tree's records, its blocks owned (`None`: a volume without the feature).
    /// A tree that cannot be read gives what could be read, and an error.
    pub(super) fn rstat_records(&mut self) -> Option<Found> {
        let t = self.st.rstat_tree()?;
        if t.root == 0 {
            return Some((HashMap::new(), None, false));
        }
        let mut found = HashMap::new();
        let mut broken = None;
        let mut unowned = false;
        let checked = btree::check(&mut self.st.tx(), &t, RSTAT_OWNER);
        match checked {
            Ok(stats) => {
                for b in &stats.blocks {
                    self.own(*b, 0, "rstat tree");
                }
                let r = btree::scan(&mut self.st.tx(), &t, RSTAT_OWNER, 0, |k, v| {
                    found.insert(k, v.to_vec());
                    true
                });
                if let Err(e) = r {
                    broken = Some(format!("rstat tree: {e}"));
                }
            }
            // Its blocks are not owned then: the leak check frees them, and the repair
            // builds a new tree.
            Err(e) => {
                broken = Some(format!("rstat tree broken: {e} (a repair rebuilds it)"));
                unowned = true;
            }
        }
        Some((found, broken, unowned))
    }

    /// Recount the statistics from the walk's `inodes` (each file counted once, in the
    /// directory its `parent` names when that directory names it, else in the first
    /// that does) and compare them with the tree's `found` records.
    pub(super) fn check_rstats(
        &self,
        inodes: &HashMap<u64, Reached>,
        found: &HashMap<u64, Vec<u8>>,
        broken: Option<String>,
        unowned: bool,
    ) -> RstatCheck {
        let root = self.st.sb.root_ino;
        let mut c = RstatCheck { unowned, ..RstatCheck::default() };
        c.errors.extend(broken);
        // Where each named inode is counted.
        let mut children: HashMap<u64, Vec<u64>> = HashMap::new();
        let mut links: Vec<(u64, LinkDirs)> = Vec::new();
        // Entries naming a file of several links, per directory.
        let mut hard: HashMap<u64, u64> = HashMap::new();
        for (&ino, i) in inodes {
            if i.nlink == 0 || ino == root {
                continue;
            }
            let counted_in = if i.is_dir() {
                i.parent
            } else {
                let dirs = self.names_of(ino);
                let names = dirs.clone().count();
                if names == 0 {
                    continue;
                }
                let mut l = LinkDirs::default();
                for d in dirs.clone() {
                    l.add(d);
                }
                let p = if l.holds(i.parent) { i.parent } else { l.first().unwrap_or(i.parent) };
                if p != i.parent {
                    c.parents.push((ino, p));
                }
                if names >= 2 {
                    for d in dirs {
                        *hard.entry(d).or_insert(0) += 1;
                    }
                    links.push((ino, l));
                }
                p
            };
            children.entry(counted_in).or_default().push(ino);
        }
        // Directories from the root down, then summed from the bottom up.
        let mut order = vec![root];
        let mut queue = VecDeque::from([root]);
        while let Some(d) = queue.pop_front() {
            for &k in children.get(&d).into_iter().flatten() {
                if inodes.get(&k).is_some_and(|i| i.is_dir()) {
                    order.push(k);
                    queue.push_back(k);
                }
            }
        }
        let mut sums: HashMap<u64, Rstat> = HashMap::new();
        for &d in order.iter().rev() {
            let mut r = Rstat {
                rctime: inodes.get(&d).map_or((0, 0), |i| i.ctime),
                hardlinks: hard.get(&d).copied().unwrap_or(0),
                ..Rstat::default()
            };
            for &k in children.get(&d).into_iter().flatten() {
                if let Some(i) = inodes.get(&k) {
                    r.add(&Rstat::of_parts(i.is_dir(), i.size, i.blocks, i.ctime, sums.get(&k)));
                }
            }
            sums.insert(d, r);
        }
        // Compare, and the tree a repair writes (a later rctime kept: it only grows).
        let mut wrong = Vec::new();
        for (&d, want) in &sums {
            let mut keep = *want;
            match found.get(&d).map(|v| Rstat::decode(v)) {
                Some(Ok(have)) => {
                    keep.rctime = keep.rctime.max(have.rctime);
                    if have != keep {
                        wrong.push(format!("directory {d}: rstats {have:?}, should be {want:?}"));
                    }
                }
                Some(Err(e)) => wrong.push(format!("directory {d}: rstat record: {e}")),
                None => wrong.push(format!("directory {d}: no rstat record")),
            }
            c.records.push((d, keep.encode().to_vec()));
        }
        for (ino, l) in &links {
            let v = l.encode();
            if found.get(&(LINKS_KEY | ino)) != Some(&v) {
                wrong.push(format!("file {ino}: link record differs from its {} names", l.links()));
            }
            c.records.push((LINKS_KEY | ino, v));
        }
        let wanted: std::collections::HashSet<u64> = c.records.iter().map(|(k, _)| *k).collect();
        let mut extra: Vec<u64> = found.keys().copied().filter(|k| !wanted.contains(k)).collect();
        extra.sort_unstable();
        wrong
            .extend(extra.iter().map(|k| format!("rstat record {k:#x} names no directory or file with several links")));
        wrong.extend(
            c.parents.iter().map(|(i, p)| {
                format!("file {i}: counted in a directory that does not name it (should be directory {p})")
            }),
        );
        wrong.sort();
        let n = wrong.len();
        c.errors.extend(wrong.into_iter().take(SHOWN));
        if n > SHOWN {
            c.errors.push(format!("... and {} more rstat differences", n - SHOWN));
        }
        c.records.sort_unstable_by_key(|(k, _)| *k);
        c
    }
}
