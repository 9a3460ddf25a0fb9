//! Lazy inode frees (ro_compat LAZY_INODE_FREE): a removal that spans many deltas
//! writes partly emptied inode blocks at most once, slots freed lazily are reused, and
//! the volume stays consistent (fsck) across commits, reopen and full removal.

mod common;

use std::collections::HashSet;
use std::sync::Arc;

use common::*;
use dxfs::block::{BlockDevice, MemDevice};
use dxfs::{mkfs, MkfsOptions, OpenOptions, Volume};
use rand::seq::SliceRandom;
use rand::SeedableRng;

fn volume(lazy: bool) -> (Arc<MemDevice>, Volume) {
    let dev = Arc::new(MemDevice::new(1 << 16));
    mkfs(dev.clone(), &MkfsOptions { lazy_inode_free: lazy, ..Default::default() }).unwrap();
    let vol = Volume::open(dev.clone(), OpenOptions::default()).unwrap();
    (dev, vol)
}

/// All names of a directory in readdir order (what `rm -rf` unlinks in).
fn names(vol: &Volume, d: u64) -> Vec<Vec<u8>> {
    let (mut out, mut pos) = (Vec::new(), 0);
    loop {
        let batch = vol.readdir(d, pos, 512).unwrap();
        if batch.is_empty() {
            return out;
        }
        for e in batch {
            pos = e.next;
            if e.name != b"." && e.name != b".." {
                out.push(e.name);
            }
        }
    }
}

/// Blocks written while removing `n` files in readdir order with a commit every
/// `every` unlinks, as periodic commits cut a long `rm -rf` through the mount.
fn removal_writes(lazy: bool, n: usize, every: usize) -> u64 {
    let (dev, vol) = volume(lazy);
    let d = vol.mkdir(vol.root(), b"d", 0o755, 0, 0).unwrap().ino;
    let fresh = vol.statfs().bfree;
    for i in 0..n {
        vol.create(d, format!("f{i:07}").as_bytes(), 0o644, 0, 0).unwrap();
    }
    vol.sync().unwrap();
    let before = dev.stats();
    for (k, name) in names(&vol, d).iter().enumerate() {
        vol.unlink(d, name).unwrap();
        if k % every == every - 1 {
            vol.sync().unwrap();
        }
    }
    vol.sync().unwrap();
    let written = dev.stats().since(before).blocks_written;
    vol.rmdir(vol.root(), b"d").unwrap();
    vol.sync().unwrap();
    // The files' blocks are back (fsck below checks for leaks exactly; the lazy-free tree
    // may keep a leaf for the directory's own slot in the root's region).
    assert!(vol.statfs().bfree + 1 >= fresh, "lazy={lazy}: {fresh} blocks free before, {} after", vol.statfs().bfree);
    close_and_check(dev, vol);
    written
}

#[test]
fn a_removal_over_many_deltas_does_not_rewrite_inode_blocks() {
    // 30,000 files in 2,000 inode blocks, removed in hash order with 30 commits on the
    // way: without lazy frees nearly every inode block is rewritten at every commit.
    let eager = removal_writes(false, 30_000, 1_000);
    let lazy = removal_writes(true, 30_000, 1_000);
    eprintln!("blocks written by the removal: eager {eager}, lazy {lazy}");
    assert!(lazy * 4 < eager, "lazy frees wrote {lazy} blocks, eager {eager}");
}

/// Remove a random half of 1,500 files over two deltas, reopen, check what is left and
/// create 750 more. Returns how many new files took a freed slot, and over how many inode
/// blocks the new files are spread.
fn half_removed_then_refilled(lazy: bool) -> (usize, usize) {
    let (dev, vol) = volume(lazy);
    let d = vol.mkdir(vol.root(), b"d", 0o755, 0, 0).unwrap().ino;
    let mut inos = Vec::new();
    for i in 0..1_500 {
        inos.push((format!("f{i}"), vol.create(d, format!("f{i}").as_bytes(), 0o644, 0, 0).unwrap().ino));
    }
    vol.sync().unwrap();
    let mut rng = rand::rngs::StdRng::seed_from_u64(5);
    inos.shuffle(&mut rng);
    let (gone, kept) = inos.split_at(750);
    for (k, (name, _)) in gone.iter().enumerate() {
        vol.unlink(d, name.as_bytes()).unwrap();
        if k == 400 {
            vol.sync().unwrap();
        }
    }
    vol.close().unwrap();
    assert_clean(dev.clone());

    // Reopen: the frees were committed with the unlinks.
    let vol = Volume::open(dev.clone(), OpenOptions::default()).unwrap();
    for (_, ino) in gone {
        assert!(vol.getattr(*ino).is_err(), "lazy={lazy}: freed inode {ino} still answers");
    }
    for (name, ino) in kept {
        assert_eq!(vol.lookup(d, name.as_bytes()).unwrap().ino, *ino);
    }
    let new: Vec<u64> =
        (0..750).map(|i| vol.create(d, format!("new{i}").as_bytes(), 0o644, 0, 0).unwrap().ino).collect();
    let freed: HashSet<u64> = gone.iter().map(|(_, i)| *i).collect();
    let reused = new.iter().filter(|i| freed.contains(i)).count();
    assert!(reused > 0, "lazy={lazy}: no freed slot was reused");
    close_and_check(dev, vol);
    let blocks: HashSet<u64> = new.iter().map(|i| i / 16).collect();
    (reused, blocks.len())
}

#[test]
fn lazily_freed_slots_are_reused_like_eagerly_freed_ones() {
    // The allocator sees a lazily freed slot exactly as a cleared one: as many new inodes
    // land in freed slots, spread over as many inode blocks. (The numbers themselves may
    // shift by whole blocks: the lazy-free tree takes a block of its own.)
    let eager = half_removed_then_refilled(false);
    let lazy = half_removed_then_refilled(true);
    assert_eq!(lazy, eager, "(new inodes in freed slots, inode blocks they use): lazy {lazy:?}, eager {eager:?}");
}

#[test]
fn volumes_without_the_feature_still_free_eagerly_and_check_clean() {
    let (dev, vol) = volume(false);
    let d = vol.mkdir(vol.root(), b"d", 0o755, 0, 0).unwrap().ino;
    for i in 0..300 {
        vol.create(d, format!("f{i}").as_bytes(), 0o644, 0, 0).unwrap();
    }
    vol.sync().unwrap();
    for i in (0..300).step_by(2) {
        vol.unlink(d, format!("f{i}").as_bytes()).unwrap();
    }
    close_and_check(dev.clone(), vol);
    let mut b = [0u8; 4096];
    dev.read(0, &mut b).unwrap();
    let ro_compat = u32::from_le_bytes(b[28..32].try_into().unwrap());
    assert_eq!(ro_compat & 4, 0, "LAZY_INODE_FREE set by mkfs --no-lazy-inode-free");
}

#[test]
fn a_damaged_lazy_free_tree_is_reported_and_the_files_stay_readable() {
    let (dev, vol) = volume(true);
    let d = vol.mkdir(vol.root(), b"d", 0o755, 0, 0).unwrap().ino;
    for i in 0..600 {
        vol.create(d, format!("f{i}").as_bytes(), 0o644, 0, 0).unwrap();
    }
    vol.sync().unwrap();
    for i in (0..600).step_by(3) {
        vol.unlink(d, format!("f{i}").as_bytes()).unwrap();
    }
    vol.close().unwrap();
    assert_clean(dev.clone());
    // The state block names the tree's root (bytes 48..56); smash that node's body.
    let mut state = [0u8; 4096];
    dev.read(dxfs::internals::STATE_BLOCK, &mut state).unwrap();
    let root = u64::from_le_bytes(state[48..56].try_into().unwrap());
    assert_ne!(root, 0, "the unlinks left no lazy-free record: the test means nothing");
    let mut node = [0u8; 4096];
    dev.read(root, &mut node).unwrap();
    node[100..200].fill(0xa5);
    dev.write(root, &node).unwrap();

    let r = dxfs::fsck::check(dev.clone(), false, &mut |_| {}).unwrap();
    assert!(r.errors.iter().any(|e| e.contains("lazy-free")), "fsck did not name the tree: {:?}", r.errors);
    let vol = Volume::open(dev.clone(), OpenOptions { read_only: true, ..Default::default() }).unwrap();
    for i in (0..600).filter(|i| i % 3 != 0) {
        vol.lookup(d, format!("f{i}").as_bytes()).unwrap_or_else(|e| panic!("f{i}: {e}"));
    }
}
