//! Recursive statistics (issue 40, FORMAT.md §6.2): every directory's counters against a
//! recount of the live namespace through the public API, after scripted changes (moves
//! of whole subtrees, hard links whose counting link goes), after random ones (a model
//! that knows where each file is counted), across reopens, and with a log so small that
//! the counters' own leaves decide when a delta must commit. fsck, which checks the
//! counters exactly, runs on every volume at the end.

mod common;

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use common::*;
use dxfs::block::MemDevice;
use dxfs::{MkfsOptions, OpenOptions, RenameFlags, Rstat, SetAttr, Volume};
use proptest::prelude::*;

/// Counters recounted from the namespace: every directory reached from the root, each
/// file counted in `counted_in[file]` when it has several links (a model's answer), else
/// in the directory that names it.
fn recount(vol: &Volume, counted_in: &HashMap<u64, u64>) -> BTreeMap<u64, Rstat> {
    vol.sync().unwrap();
    let root = vol.root();
    // Every entry: (directory, name's inode), directories first found breadth first.
    let mut dirs = vec![root];
    let mut entries: Vec<(u64, u64)> = Vec::new();
    let mut k = 0;
    while k < dirs.len() {
        let d = dirs[k];
        k += 1;
        for e in vol.readdir(d, 0, 100_000).unwrap() {
            if e.name == b"." || e.name == b".." {
                continue;
            }
            entries.push((d, e.ino));
            if vol.getattr(e.ino).unwrap().kind == dxfs::FileType::Directory {
                dirs.push(e.ino);
            }
        }
    }
    let parent_of: HashMap<u64, u64> = entries.iter().map(|&(d, i)| (i, d)).collect();
    let names: HashMap<u64, u64> = entries.iter().fold(HashMap::new(), |mut m, &(_, i)| {
        *m.entry(i).or_insert(0) += 1;
        m
    });
    let mut sums: BTreeMap<u64, Rstat> = BTreeMap::new();
    for &d in &dirs {
        let a = vol.getattr(d).unwrap();
        sums.insert(d, Rstat { rctime: a.ctime, ..Rstat::default() });
    }
    let mut add: Vec<(u64, Rstat)> = Vec::new();
    for (&i, &n) in &names {
        let a = vol.getattr(i).unwrap();
        let dir = a.kind == dxfs::FileType::Directory;
        let own = Rstat {
            files: u64::from(!dir),
            dirs: u64::from(dir),
            bytes: a.size,
            blocks: a.blocks / 8,
            hardlinks: 0,
            rctime: a.ctime,
        };
        let home = if n >= 2 { counted_in[&i] } else { parent_of[&i] };
        add.push((home, own));
    }
    for &(d, i) in &entries {
        if names[&i] >= 2 {
            add.push((d, Rstat { hardlinks: 1, ..Rstat::default() }));
        }
    }
    for (home, own) in add {
        let mut d = home;
        loop {
            sums.get_mut(&d).expect("a directory reached").add(&own);
            if d == root {
                break;
            }
            d = parent_of[&d];
        }
    }
    sums
}

/// Every directory's counters equal the recount (rctime at least the newest ctime).
fn assert_counters(vol: &Volume, counted_in: &HashMap<u64, u64>) {
    for (d, want) in recount(vol, counted_in) {
        let have = vol.rstat(d).unwrap().unwrap_or_else(|| panic!("directory {d} has no counters"));
        let same = Rstat { rctime: have.rctime, ..want };
        assert_eq!(have, same, "directory {d}");
        assert!(have.rctime >= want.rctime, "directory {d}: rctime {:?} before {:?}", have.rctime, want.rctime);
    }
}

fn volume(log_blocks: Option<u32>) -> (Arc<MemDevice>, Volume) {
    let dev = Arc::new(MemDevice::new(16_384));
    dxfs::mkfs(dev.clone(), &MkfsOptions { log_blocks, ..Default::default() }).unwrap();
    let vol = Volume::open(dev.clone(), OpenOptions::default()).unwrap();
    (dev, vol)
}

#[test]
fn counters_follow_moves_links_and_removals() {
    let (dev, vol) = volume(None);
    let root = vol.root();
    let none = HashMap::new();
    let a = vol.mkdir(root, b"a", 0o755, 0, 0).unwrap().ino;
    let b = vol.mkdir(a, b"b", 0o755, 0, 0).unwrap().ino;
    let c = vol.mkdir(root, b"c", 0o755, 0, 0).unwrap().ino;
    let f = vol.create(b, b"f", 0o644, 0, 0).unwrap().ino;
    vol.write(f, 0, &vec![7u8; 10_000]).unwrap();
    vol.symlink(b, b"s", b"f", 0, 0).unwrap();
    assert_counters(&vol, &none);
    let ra = vol.rstat(a).unwrap().unwrap();
    assert_eq!((ra.files, ra.dirs, ra.hardlinks), (2, 1, 0), "{ra:?}");
    assert_eq!(ra.bytes, 10_000 + 1 + vol.getattr(b).unwrap().size);
    // The whole subtree moves: out of a, into c.
    vol.rename(a, b"b", c, b"b", RenameFlags::default()).unwrap();
    assert_counters(&vol, &none);
    assert_eq!(vol.rstat(a).unwrap().unwrap().files, 0);
    assert_eq!(vol.rstat(c).unwrap().unwrap().files, 2);
    // A second link elsewhere: still counted once, where it was; both entries are
    // hard-linked names.
    vol.link(f, a, b"g").unwrap();
    let mut counted_in = HashMap::from([(f, b)]);
    assert_counters(&vol, &counted_in);
    assert_eq!(vol.rstat(root).unwrap().unwrap().hardlinks, 2);
    assert_eq!(vol.rstat(a).unwrap().unwrap().files, 0, "a names it, but it is counted in b");
    // The counting link goes: counted where the other one is.
    vol.unlink(b, b"f").unwrap();
    counted_in.clear();
    assert_counters(&vol, &counted_in);
    assert_eq!(vol.rstat(a).unwrap().unwrap().files, 1);
    assert_eq!(vol.rstat(root).unwrap().unwrap().hardlinks, 0);
    // Growth and truncation, a removal, an rmdir.
    vol.setattr(f, &SetAttr { size: Some(3), ..Default::default() }).unwrap();
    vol.unlink(b, b"s").unwrap();
    vol.rmdir(c, b"b").unwrap();
    assert_counters(&vol, &none);
    let r = vol.rstat(root).unwrap().unwrap();
    assert_eq!((r.files, r.dirs), (1, 2), "{r:?}");
    // The virtual xattrs say the same.
    assert_eq!(vol.getxattr(root, b"dxfs.dir.rfiles").unwrap(), b"1");
    assert_eq!(vol.getxattr(root, b"dxfs.dir.rentries").unwrap(), b"3");
    assert!(matches!(vol.getxattr(f, b"dxfs.dir.rfiles"), Err(dxfs::Error::NoData)));
    vol.close().unwrap();
    assert_clean(dev.clone());
    let vol = Volume::open(dev.clone(), OpenOptions::default()).unwrap();
    assert_counters(&vol, &none);
    vol.close().unwrap();
}

/// A log of 64 blocks (room for 62) and two chains of 30 directories whose records lie
/// in 60 different rstat leaves: a change at the bottom of each chain dirties one inode
/// block but makes the snapshot rewrite 30 leaves. The charge counts them, so the two
/// changes commit apart instead of overflowing the log.
#[test]
fn counter_leaves_count_against_the_log() {
    let (dev, vol) = volume(Some(64));
    let root = vol.root();
    let dirs: Vec<u64> =
        (0..3000).map(|i| vol.mkdir(root, format!("d{i:05}").as_bytes(), 0o755, 0, 0).unwrap().ino).collect();
    let mut bottoms = Vec::new();
    for start in [0, 50] {
        // d{start} / d{start+100} / d{start+200} / ...
        for k in 1..30 {
            let (up, i) = (start + 100 * (k - 1), start + 100 * k);
            let name = format!("d{i:05}");
            vol.rename(root, name.as_bytes(), dirs[up], name.as_bytes(), RenameFlags::default()).unwrap();
        }
        bottoms.push(vol.create(dirs[start + 100 * 29], b"f", 0o644, 0, 0).unwrap().ino);
    }
    vol.sync().unwrap();
    for &f in &bottoms {
        vol.setattr(f, &SetAttr { mode: Some(0o600), ..Default::default() }).unwrap();
    }
    vol.sync().unwrap();
    assert_counters(&vol, &HashMap::new());
    assert_eq!(vol.rstat(root).unwrap().unwrap().files, 2);
    vol.close().unwrap();
    assert_clean(dev);
}

#[derive(Clone, Debug)]
enum Op {
    Mkdir(u8, u8),
    Create(u8, u8, u16),
    Write(u8, u16),
    Link(u8, u8, u8),
    Unlink(u8, u8),
    Rmdir(u8, u8),
    Rename(u8, u8, u8, u8),
    Sync,
    Reopen,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        3 => (any::<u8>(), 0..6u8).prop_map(|(d, n)| Op::Mkdir(d, n)),
        4 => (any::<u8>(), 0..6u8, any::<u16>()).prop_map(|(d, n, l)| Op::Create(d, n, l)),
        2 => (any::<u8>(), any::<u16>()).prop_map(|(f, l)| Op::Write(f, l)),
        3 => (any::<u8>(), any::<u8>(), 0..6u8).prop_map(|(f, d, n)| Op::Link(f, d, n)),
        3 => (any::<u8>(), 0..6u8).prop_map(|(d, n)| Op::Unlink(d, n)),
        1 => (any::<u8>(), 0..6u8).prop_map(|(d, n)| Op::Rmdir(d, n)),
        4 => (any::<u8>(), 0..6u8, any::<u8>(), 0..6u8).prop_map(|(a, b, c, d)| Op::Rename(a, b, c, d)),
        1 => Just(Op::Sync),
        1 => Just(Op::Reopen),
    ]
}

/// Where the model counts each file of several links: where it was counted until the
/// directory holding its counting link holds none, then the first directory (by inode
/// number) that still does, or the one a moved name goes to.
struct Model {
    counted_in: HashMap<u64, u64>,
}

impl Model {
    /// File `f` lost a link: counted elsewhere when its counting directory holds none now.
    fn lost_link(&mut self, vol: &Volume, f: u64, dirs: &[u64]) {
        let left = Model::link_dirs(vol, f, dirs);
        if let Some(&c) = self.counted_in.get(&f) {
            if !left.contains(&c) {
                self.counted_in.insert(f, left.first().copied().unwrap_or(c));
            }
        }
    }

    fn link_dirs(vol: &Volume, f: u64, dirs: &[u64]) -> Vec<u64> {
        // A removed directory's number may have been taken again: each number once.
        let mut dirs = dirs.to_vec();
        dirs.sort_unstable();
        dirs.dedup();
        let mut out = Vec::new();
        for d in dirs {
            if let Ok(es) = vol.readdir(d, 0, 100_000) {
                for e in es {
                    if e.ino == f && e.name != b"." && e.name != b".." {
                        out.push(d);
                    }
                }
            }
        }
        out.sort_unstable();
        out
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn counters_match_a_recount_after_random_changes(ops in proptest::collection::vec(op(), 1..60)) {
        let (dev, mut vol) = volume(Some(64));
        let mut dirs = vec![vol.root()];
        let mut files: Vec<u64> = Vec::new();
        let mut m = Model { counted_in: HashMap::new() };
        let name = |n: u8| format!("n{n}").into_bytes();
        for op in ops {
            let pick = |v: &Vec<u64>, k: u8| v[k as usize % v.len()];
            match op {
                Op::Mkdir(d, n) => {
                    if let Ok(a) = vol.mkdir(pick(&dirs, d), &name(n), 0o755, 0, 0) {
                        dirs.push(a.ino);
                    }
                }
                Op::Create(d, n, l) => {
                    if let Ok(a) = vol.create(pick(&dirs, d), &name(n), 0o644, 0, 0) {
                        let _ = vol.write(a.ino, 0, &vec![1u8; l as usize % 9000]);
                        files.push(a.ino);
                    }
                }
                Op::Write(f, l) if !files.is_empty() => {
                    let _ = vol.write(pick(&files, f), u64::from(l) * 3, &[2u8; 5000]);
                }
                Op::Link(f, d, n) if !files.is_empty() => {
                    let f = pick(&files, f);
                    let before = Model::link_dirs(&vol, f, &dirs);
                    if vol.link(f, pick(&dirs, d), &name(n)).is_ok() && before.len() == 1 {
                        m.counted_in.insert(f, before[0]);
                    }
                }
                Op::Unlink(d, n) => {
                    let d = pick(&dirs, d);
                    let victim = vol.lookup(d, &name(n)).ok().map(|a| a.ino);
                    if vol.unlink(d, &name(n)).is_ok() {
                        m.lost_link(&vol, victim.unwrap(), &dirs);
                    }
                }
                Op::Rmdir(d, n) => {
                    let _ = vol.rmdir(pick(&dirs, d), &name(n));
                }
                Op::Rename(a, b, c, d) => {
                    let (from, to) = (pick(&dirs, a), pick(&dirs, c));
                    let moved = vol.lookup(from, &name(b)).ok().map(|x| x.ino);
                    let replaced = vol.lookup(to, &name(d)).ok().map(|x| x.ino).filter(|&r| Some(r) != moved);
                    if vol.rename(from, &name(b), to, &name(d), RenameFlags::default()).is_ok() {
                        if let Some(r) = replaced {
                            m.lost_link(&vol, r, &dirs);
                        }
                        if let Some(f) = moved {
                            let left = Model::link_dirs(&vol, f, &dirs);
                            if let Some(&cnt) = m.counted_in.get(&f) {
                                if cnt == from && !left.contains(&from) {
                                    m.counted_in.insert(f, to);
                                }
                            }
                        }
                    }
                }
                Op::Sync => vol.sync().unwrap(),
                Op::Reopen => {
                    vol.close().unwrap();
                    vol = Volume::open(dev.clone(), OpenOptions::default()).unwrap();
                }
                _ => {}
            }
        }
        // Only files still of several links keep a model answer.
        let live: HashMap<u64, u64> = m
            .counted_in
            .iter()
            .filter(|(f, _)| vol.getattr(**f).is_ok_and(|a| a.nlink >= 2))
            .map(|(&f, &d)| (f, d))
            .collect();
        assert_counters(&vol, &live);
        vol.close().unwrap();
        assert_clean(dev);
    }
}

/// A damaged rstat tree costs the counters, never a change: operations and commits go on
/// (the tree is set aside), reads of the counters fail or say nothing, and fsck rebuilds
/// them exactly.
#[test]
fn a_damaged_rstat_tree_is_set_aside_and_rebuilt() {
    use dxfs::block::BlockDevice;
    let (dev, vol) = volume(None);
    let root = vol.root();
    let a = vol.mkdir(root, b"a", 0o755, 0, 0).unwrap().ino;
    for i in 0..50 {
        vol.create(a, format!("f{i}").as_bytes(), 0o644, 0, 0).unwrap();
    }
    vol.close().unwrap();
    // The state block names the tree's root at byte 64.
    let mut state = [0u8; 4096];
    dev.read(dxfs::internals::STATE_BLOCK, &mut state).unwrap();
    let tree_root = u64::from_le_bytes(state[64..72].try_into().unwrap());
    assert!(tree_root != 0, "a volume with directories has a tree");
    dev.write(tree_root, &[0x5a; 4096]).unwrap();
    let vol = Volume::open(dev.clone(), OpenOptions::default()).unwrap();
    let b = vol.mkdir(root, b"b", 0o755, 0, 0).unwrap().ino;
    vol.create(b, b"g", 0o644, 0, 0).unwrap();
    vol.unlink(a, b"f0").unwrap();
    vol.rmdir(root, b"b").ok();
    vol.sync().unwrap();
    assert!(!matches!(vol.rstat(root), Ok(Some(_))), "no counters from a damaged tree");
    vol.close().unwrap();
    let r = dxfs::fsck::check(dev.clone(), true, &mut |_| {}).unwrap();
    assert!(r.errors.is_empty(), "{:#?}", r.errors);
    assert_clean(dev.clone());
    let vol = Volume::open(dev.clone(), OpenOptions::default()).unwrap();
    assert_counters(&vol, &HashMap::new());
    assert_eq!(vol.rstat(a).unwrap().unwrap().files, 49);
    vol.close().unwrap();
}

/// A tree removed and another built in the same delta: the new directories take the
/// numbers of the old ones, and what the old ones lose must not be taken from them.
#[test]
fn numbers_taken_again_in_one_delta_count_for_the_new_inodes() {
    let (dev, vol) = volume(None);
    let root = vol.root();
    let build = |name: &[u8]| {
        let t = vol.mkdir(root, name, 0o755, 0, 0).unwrap().ino;
        for d in 0..12 {
            let p = vol.mkdir(t, format!("d{d}").as_bytes(), 0o755, 0, 0).unwrap().ino;
            for f in 0..100 {
                let i = vol.create(p, format!("f{f}").as_bytes(), 0o644, 0, 0).unwrap().ino;
                vol.write(i, 0, b"sixteen bytes!!!").unwrap();
            }
        }
        t
    };
    build(b"old");
    vol.sync().unwrap();
    let r = vol.remove_tree(root, b"old", &dxfs::Caller { uid: 0, gid: 0, groups: vec![] }, &mut |_| {}).unwrap();
    assert!(r.failed.is_empty());
    let new = build(b"new");
    vol.sync().unwrap();
    assert_eq!(vol.rstat(new).unwrap().unwrap().files, 1200);
    assert_counters(&vol, &HashMap::new());
    vol.close().unwrap();
    assert_clean(dev);
}
