//! fsck repairs damage it cannot undo by dropping what it cannot use: an entry that
//! names an unreadable inode, a directory whose index is broken, a file whose extent
//! map is broken. The rest of the volume survives: after `fsck` with repair, a second
//! check is clean, every undamaged file reads back, and the report names what was lost.

mod common;

use std::collections::BTreeMap;
use std::sync::Arc;

use dxfs::block::{BlockDevice, MemDevice};
use dxfs::internals::ino_loc;
use dxfs::{mkfs, MkfsOptions, OpenOptions, Volume, BLOCK_SIZE};

/// A volume with directory `keep` (files that must survive), directory `doomed` (200
/// files, so its index has several leaves) and a fragmented file `frag` (an extent tree).
/// Returns the device and what `keep` holds.
fn volume() -> (Arc<MemDevice>, BTreeMap<String, Vec<u8>>) {
    let dev = Arc::new(MemDevice::new(8192));
    mkfs(dev.clone(), &MkfsOptions::default()).unwrap();
    let vol = Volume::open(dev.clone(), OpenOptions::default()).unwrap();
    let root = vol.root();
    let keep = vol.mkdir(root, b"keep", 0o755, 0, 0).unwrap().ino;
    let mut kept = BTreeMap::new();
    for i in 0..50u32 {
        let name = format!("k{i}");
        let data: Vec<u8> = (0..(i * 301 + 7)).map(|b| (b ^ i) as u8).collect();
        let f = vol.create(keep, name.as_bytes(), 0o644, 0, 0).unwrap().ino;
        vol.write(f, 0, &data).unwrap();
        kept.insert(name, data);
    }
    let doomed = vol.mkdir(root, b"doomed", 0o755, 0, 0).unwrap().ino;
    for i in 0..200 {
        vol.create(doomed, format!("a-rather-long-name-for-entry-{i:04}").as_bytes(), 0o644, 0, 0).unwrap();
    }
    let frag = vol.create(root, b"frag", 0o644, 0, 0).unwrap().ino;
    for k in 0..60u64 {
        vol.write(frag, k * 8192, &[k as u8; 4096]).unwrap();
        vol.sync().unwrap(); // one delta each: one extent each
    }
    vol.close().unwrap();
    (dev, kept)
}

fn smash(dev: &MemDevice, block: u64) {
    dev.write(block, &[0x5au8; BLOCK_SIZE]).unwrap();
}

fn check(dev: &Arc<MemDevice>, repair: bool) -> dxfs::fsck::Report {
    dxfs::fsck::check(dev.clone(), repair, &mut |_| {}).unwrap()
}

/// Repair, then: a second check is clean, `keep` is whole, and `gone` no longer exists.
fn repaired_without(dev: &Arc<MemDevice>, kept: &BTreeMap<String, Vec<u8>>, gone: &[&str]) -> Vec<String> {
    let r = check(dev, false);
    assert!(!r.errors.is_empty(), "the damage went unnoticed");
    let r = check(dev, true);
    assert!(r.errors.is_empty(), "repair left errors: {:#?}", r.errors);
    assert!(r.fixed.iter().any(|f| f.contains("dropped entry")), "no drop reported: {:#?}", r.fixed);
    let again = check(dev, false);
    assert!(again.errors.is_empty() && again.fixed.is_empty(), "not clean after repair: {:#?}", again.errors);
    let vol = Volume::open(dev.clone(), OpenOptions::default()).unwrap();
    let root = vol.root();
    for g in gone {
        assert!(vol.lookup(root, g.as_bytes()).is_err(), "{g} is still there");
    }
    let keep = vol.lookup(root, b"keep").unwrap().ino;
    for (name, data) in kept {
        let f = vol.lookup(keep, name.as_bytes()).unwrap().ino;
        assert_eq!(&vol.read(f, 0, data.len() + 1).unwrap(), data, "{name}");
    }
    // The volume is writable and its space is whole again.
    let f = vol.create(root, b"after", 0o644, 0, 0).unwrap().ino;
    vol.write(f, 0, b"fine").unwrap();
    vol.close().unwrap();
    common::assert_clean(dev.clone());
    r.fixed
}

fn ino_of(dev: &Arc<MemDevice>, path: &[&str]) -> u64 {
    let vol = Volume::open(dev.clone(), OpenOptions { read_only: true, ..Default::default() }).unwrap();
    let mut at = vol.root();
    for p in path {
        at = vol.lookup(at, p.as_bytes()).unwrap().ino;
    }
    at
}

#[test]
fn an_unreadable_inode_block_drops_only_its_entries() {
    let (dev, kept) = volume();
    // The inode block of some file in `doomed`: its entries (up to 15) go, nothing else.
    let victim = ino_of(&dev, &["doomed", "a-rather-long-name-for-entry-0100"]);
    smash(&dev, ino_loc(victim).0);
    let fixed = repaired_without(&dev, &kept, &[]);
    let dropped = fixed.iter().filter(|f| f.contains("dropped entry")).count();
    assert!((1..=15).contains(&dropped), "{dropped} entries dropped: {fixed:#?}");
    let vol = Volume::open(dev.clone(), OpenOptions { read_only: true, ..Default::default() }).unwrap();
    let d = vol.lookup(vol.root(), b"doomed").unwrap().ino;
    assert_eq!(vol.getattr(d).unwrap().nlink, 2);
    let left = vol.readdir(d, 0, 1000).unwrap().len() - 2;
    assert_eq!(left, 200 - dropped, "the rest of `doomed` stays");
}

/// A directory with one unreadable index leaf keeps the entries of its other leaves:
/// fsck rebuilds the index from what it can read and says how many entries it lost.
#[test]
fn a_directory_with_a_broken_index_leaf_keeps_its_other_entries() {
    let (dev, kept) = volume();
    let d = ino_of(&dev, &["doomed"]);
    let leaf = {
        let vol = Volume::open(dev.clone(), OpenOptions { read_only: true, ..Default::default() }).unwrap();
        vol.dir_blocks(d).unwrap()[1]
    };
    smash(&dev, leaf);
    let r = check(&dev, false);
    assert!(!r.errors.is_empty(), "the damage went unnoticed");
    let r = check(&dev, true);
    assert!(r.errors.is_empty(), "repair left errors: {:#?}", r.errors);
    let line = r.fixed.iter().find(|f| f.contains("index rebuilt")).unwrap_or_else(|| panic!("{:#?}", r.fixed));
    assert!(line.contains("of 200 entries kept"), "{line}");
    common::assert_clean(dev.clone());
    let vol = Volume::open(dev.clone(), OpenOptions::default()).unwrap();
    let names = vol.readdir(d, 0, 1000).unwrap();
    let left = names.len() - 2;
    assert!((100..200).contains(&left), "{left} entries left of 200");
    for e in names.iter().filter(|e| !e.name.starts_with(b".")) {
        assert!(vol.getattr(e.ino).is_ok(), "{:?}", e.name);
        assert_eq!(vol.lookup(d, &e.name).unwrap().ino, e.ino);
    }
    let keep = vol.lookup(vol.root(), b"keep").unwrap().ino;
    for (name, data) in &kept {
        let f = vol.lookup(keep, name.as_bytes()).unwrap().ino;
        assert_eq!(&vol.read(f, 0, data.len() + 1).unwrap(), data, "{name}");
    }
    vol.create(d, b"after", 0o644, 0, 0).unwrap();
    vol.close().unwrap();
    common::assert_clean(dev);
}

#[test]
fn a_file_with_a_broken_extent_tree_is_dropped() {
    let (dev, kept) = volume();
    let frag = ino_of(&dev, &["frag"]);
    let node = {
        let vol = Volume::open(dev.clone(), OpenOptions { read_only: true, ..Default::default() }).unwrap();
        vol.extent_tree_blocks(frag).unwrap()[0]
    };
    smash(&dev, node);
    repaired_without(&dev, &kept, &["frag"]);
}

/// The path of every inode reachable from the root (the first one found).
fn paths_by_ino(vol: &Volume) -> BTreeMap<u64, String> {
    let mut out = BTreeMap::new();
    let mut stack = vec![(vol.root(), String::new())];
    while let Some((d, path)) = stack.pop() {
        for e in vol.readdir(d, 0, 100_000).unwrap() {
            if e.name == b"." || e.name == b".." {
                continue;
            }
            let p = format!("{path}/{}", String::from_utf8_lossy(&e.name));
            if vol.getattr(e.ino).unwrap().kind == dxfs::FileType::Directory {
                stack.push((e.ino, p.clone()));
            }
            out.entry(e.ino).or_insert(p);
        }
    }
    out
}

/// What a volume holds, by path: file contents, symlink targets, directories.
fn contents(vol: &Volume) -> BTreeMap<String, Vec<u8>> {
    let mut out = BTreeMap::new();
    let mut stack = vec![(vol.root(), String::new())];
    while let Some((d, path)) = stack.pop() {
        for e in vol.readdir(d, 0, 100_000).unwrap() {
            if e.name == b"." || e.name == b".." {
                continue;
            }
            let p = format!("{path}/{}", String::from_utf8_lossy(&e.name));
            let a = vol.getattr(e.ino).unwrap_or_else(|err| panic!("{p}: {err}"));
            match a.kind {
                dxfs::FileType::Directory => {
                    out.insert(p.clone(), b"<dir>".to_vec());
                    stack.push((e.ino, p));
                }
                dxfs::FileType::Symlink => {
                    out.insert(p, vol.readlink(e.ino).unwrap());
                }
                _ => {
                    out.insert(p, vol.read(e.ino, 0, a.size as usize + 1).unwrap());
                }
            }
        }
    }
    out
}

/// Every metadata block of a populated volume smashed in turn, then `fsck` with repair:
/// the volume ends clean and mountable with everything it still lists intact (files
/// may only be missing, never wrong), or fsck says what it could not repair. Prints the
/// share of images that end whole, with entries dropped, or unrepaired
/// (docs/BENCHMARKS.md, "Damaged images").
#[test]
fn every_smashed_metadata_block_ends_repaired_or_reported() {
    let (base, _) = volume();
    {
        let vol = Volume::open(base.clone(), OpenOptions::default()).unwrap();
        let root = vol.root();
        let f = vol.create(root, b"xattrs", 0o644, 0, 0).unwrap().ino;
        vol.setxattr(f, b"user.big", &[7u8; 3000], dxfs::XattrMode::Any).unwrap();
        vol.symlink(root, b"link", &[b'l'; 300], 0, 0).unwrap();
        vol.close().unwrap();
    }
    let img = base.to_bytes();
    let want = contents(&Volume::open(base.clone(), OpenOptions { read_only: true, ..Default::default() }).unwrap());
    let names =
        paths_by_ino(&Volume::open(base.clone(), OpenOptions { read_only: true, ..Default::default() }).unwrap());
    let log_end = 2 + 2 * u64::from(u32::from_le_bytes(img[84..88].try_into().unwrap()));
    let (mut whole, mut partial, mut refused, mut tried) = (0, 0, 0, 0);
    for b in log_end..base.block_count() - 1 {
        let at = (b as usize) * BLOCK_SIZE;
        if &img[at..at + 2] != b"DX" {
            continue;
        }
        tried += 1;
        let dev = Arc::new(MemDevice::from_bytes(img.clone()));
        smash(&dev, b);
        let r = check(&dev, true);
        if !r.errors.is_empty() {
            eprintln!(
                "block {b} ({}): {:?}",
                String::from_utf8_lossy(&img[at..at + 4]),
                &r.errors[..r.errors.len().min(3)]
            );
            refused += 1;
            continue;
        }
        let again = check(&dev, false);
        assert!(again.errors.is_empty(), "block {b}: repaired, yet a second check finds {:?}", again.errors);
        let vol = Volume::open(dev.clone(), OpenOptions::default())
            .unwrap_or_else(|e| panic!("block {b}: repaired but does not open: {e}"));
        let got = contents(&vol);
        vol.close().unwrap();
        // What came back through lost+found is compared under its old path.
        let got: BTreeMap<String, Vec<u8>> = got
            .into_iter()
            .filter(|(p, _)| p != "/lost+found")
            .map(|(p, data)| match p.strip_prefix("/lost+found/#") {
                Some(rest) => {
                    let (n, tail) = rest.split_at(rest.find('/').unwrap_or(rest.len()));
                    let old = names.get(&n.parse::<u64>().unwrap()).unwrap_or_else(|| panic!("block {b}: {p}"));
                    (format!("{old}{tail}"), data)
                }
                None => (p, data),
            })
            .collect();
        for (p, data) in &got {
            assert_eq!(want.get(p), Some(data), "block {b}: {p} is not what was written");
        }
        if got.len() == want.len() {
            whole += 1;
        } else {
            let said = r.fixed.iter().any(|f| f.contains("dropped entry") || f.contains("index rebuilt"));
            assert!(said, "block {b}: files gone without a word");
            partial += 1;
        }
    }
    eprintln!(
        "{tried} metadata blocks smashed: {whole} repaired whole, {partial} repaired with entries dropped, {refused} left unrepaired"
    );
    assert!(tried > 20, "only {tried} metadata blocks");
    assert_eq!(whole + partial + refused, tried);
}

/// Set `f` (offset, new little-endian bytes) in the record of inode `ino`, in place,
/// with the block's checksum made good again: a wrong field, not a damaged block.
fn poke(dev: &MemDevice, ino: u64, offset: usize, bytes: &[u8]) {
    let (b, slot) = ino_loc(ino);
    let mut blk = [0u8; BLOCK_SIZE];
    dev.read(b, &mut blk).unwrap();
    let at = slot * 256 + offset;
    blk[at..at + bytes.len()].copy_from_slice(bytes);
    dxfs::internals::seal(&mut blk, b);
    dev.write(b, &blk).unwrap();
}

/// Inode fields fsck can recompute from the walk (blocks owned, a directory's parent,
/// the xattr-name filter) are repaired in place, nothing dropped.
#[test]
fn wrong_inode_fields_are_recomputed() {
    let (dev, kept) = volume();
    {
        let vol = Volume::open(dev.clone(), OpenOptions::default()).unwrap();
        let keep = vol.lookup(vol.root(), b"keep").unwrap().ino;
        let k0 = vol.lookup(keep, b"k0").unwrap().ino;
        vol.setxattr(k0, b"user.tag", b"v", dxfs::XattrMode::Any).unwrap();
        vol.close().unwrap();
    }
    let frag = ino_of(&dev, &["frag"]);
    let doomed = ino_of(&dev, &["doomed"]);
    let k0 = ino_of(&dev, &["keep", "k0"]);
    let root = ino_of(&dev, &[]);
    poke(&dev, frag, 24, &999u64.to_le_bytes()); // blocks
    poke(&dev, doomed, 96, &frag.to_le_bytes()); // parent
    poke(&dev, k0, 120, &0u32.to_le_bytes()); // xattr_filter
    let r = check(&dev, false);
    assert_eq!(r.errors.len(), 3, "{:#?}", r.errors);
    let r = check(&dev, true);
    assert!(r.errors.is_empty(), "{:#?}", r.errors);
    assert_eq!(r.fixed.len(), 3, "{:#?}", r.fixed);
    assert!(r.fixed.iter().all(|f| !f.contains("dropped")), "{:#?}", r.fixed);
    common::assert_clean(dev.clone());
    let vol = Volume::open(dev.clone(), OpenOptions::default()).unwrap();
    assert_eq!(vol.lookup(doomed, b"..").unwrap().ino, root);
    assert_eq!(vol.getxattr(k0, b"user.tag").unwrap(), b"v");
    let keep = vol.lookup(vol.root(), b"keep").unwrap().ino;
    for (name, data) in &kept {
        let f = vol.lookup(keep, name.as_bytes()).unwrap().ino;
        assert_eq!(&vol.read(f, 0, data.len() + 1).unwrap(), data);
    }
    vol.close().unwrap();
}

/// The root's inode block unreadable: fsck recreates the root with the entries of its
/// index, found by scanning for the index's leaves, so everything below it survives.
#[test]
fn an_unreadable_root_inode_is_recreated_with_its_entries() {
    let (dev, kept) = volume();
    let root = ino_of(&dev, &[]);
    smash(&dev, ino_loc(root).0);
    assert!(Volume::open(dev.clone(), OpenOptions { read_only: true, ..Default::default() })
        .and_then(|v| v.getattr(v.root()))
        .is_err());
    let r = check(&dev, true);
    assert!(r.errors.is_empty(), "repair left errors: {:#?}", r.errors);
    assert!(r.fixed.iter().any(|f| f.contains("recreated")), "{:#?}", r.fixed);
    common::assert_clean(dev.clone());
    let vol = Volume::open(dev.clone(), OpenOptions::default()).unwrap();
    let a = vol.getattr(vol.root()).unwrap();
    assert_eq!((a.mode & 0o7777, a.nlink), (0o755, 4), "keep, doomed + . and ..");
    assert!(vol.lookup(vol.root(), b"frag").is_ok());
    let doomed = vol.lookup(vol.root(), b"doomed").unwrap().ino;
    assert_eq!(vol.readdir(doomed, 0, 1000).unwrap().len(), 202);
    let keep = vol.lookup(vol.root(), b"keep").unwrap().ino;
    for (name, data) in &kept {
        let f = vol.lookup(keep, name.as_bytes()).unwrap().ino;
        assert_eq!(&vol.read(f, 0, data.len() + 1).unwrap(), data, "{name}");
    }
    vol.create(vol.root(), b"after", 0o644, 0, 0).unwrap();
    vol.close().unwrap();
    common::assert_clean(dev);
}

/// The root's inode block relabelled, checksum valid, as another structure (issue 39's
/// fuzzer): where that structure cannot be live there (an xattr continuation its owner
/// does not name, a state block away from block 1, an xattr head no readable inode
/// names: fuzzer seeds 3489661648, 3758146569; a magic no structure has), fsck recreates the root with its
/// entries; one that may be live is left alone and reported.
#[test]
fn a_root_block_relabelled_as_another_structure_is_recreated_unless_it_may_be_live() {
    let relabel = |dev: &MemDevice, magic: &[u8; 4]| {
        let rb = ino_loc(ino_of_mem(dev)).0;
        let mut blk = [0u8; BLOCK_SIZE];
        dev.read(rb, &mut blk).unwrap();
        blk[..4].copy_from_slice(magic);
        dxfs::internals::seal(&mut blk, rb);
        dev.write(rb, &blk).unwrap();
    };
    for magic in [b"DXXC", b"DXST", b"DXTN", b"DXXA", b"EXIN"] {
        let (dev, kept) = volume();
        relabel(&dev, magic);
        let r = check(&dev, true);
        assert!(r.errors.is_empty(), "{magic:?}: repair left errors: {:#?}", r.errors);
        assert!(r.fixed.iter().any(|f| f.contains("recreated")), "{:#?}", r.fixed);
        common::assert_clean(dev.clone());
        let vol = Volume::open(dev.clone(), OpenOptions::default()).unwrap();
        let keep = vol.lookup(vol.root(), b"keep").unwrap().ino;
        for (name, data) in &kept {
            let f = vol.lookup(keep, name.as_bytes()).unwrap().ino;
            assert_eq!(&vol.read(f, 0, data.len() + 1).unwrap(), data, "{name}");
        }
        vol.close().unwrap();
        common::assert_clean(dev);
    }
    // An xattr head an inode names may be live: `keep`'s list pointed at the root's block.
    let (dev, _) = volume();
    let keep = ino_of(&dev, &["keep"]);
    relabel(&dev, b"DXXA");
    let rb = ino_loc(ino_of_mem(&dev)).0;
    poke(&dev, keep, 112, &rb.to_le_bytes());
    let e = dxfs::fsck::check(dev.clone(), true, &mut |_| {}).map(|r| r.errors).unwrap_err();
    assert!(e.to_string().contains("cannot be recreated there"), "a named head: {e}");
    // A B+tree node its owner's tree reaches may be live: directory `keep`'s leaf, moved
    // to the root's block (the seed 1610625145 relabelled block has owner 0, reached by
    // no tree, and is recreated above).
    let (dev, _) = volume();
    let vol = Volume::open(dev.clone(), OpenOptions { read_only: true, ..Default::default() }).unwrap();
    let keep = vol.lookup(vol.root(), b"keep").unwrap().ino;
    drop(vol);
    let (kb, ks) = ino_loc(keep);
    let mut iblk = [0u8; BLOCK_SIZE];
    dev.read(kb, &mut iblk).unwrap();
    let leaf = u64::from_le_bytes(iblk[ks * 256 + 128..ks * 256 + 136].try_into().unwrap());
    let rb = ino_loc(ino_of_mem(&dev)).0;
    let mut node = [0u8; BLOCK_SIZE];
    dev.read(leaf, &mut node).unwrap();
    dxfs::internals::seal(&mut node, rb);
    dev.write(rb, &node).unwrap();
    iblk[ks * 256 + 128..ks * 256 + 136].copy_from_slice(&rb.to_le_bytes());
    dxfs::internals::seal(&mut iblk, kb);
    dev.write(kb, &iblk).unwrap();
    let e = dxfs::fsck::check(dev.clone(), true, &mut |_| {}).map(|r| r.errors).unwrap_err();
    assert!(e.to_string().contains("cannot be recreated there"), "a node its owner reaches: {e}");
}

/// The root's inode number, read from the superblock.
fn ino_of_mem(dev: &MemDevice) -> u64 {
    dxfs::read_superblock(dev).unwrap().root_ino
}

/// Every regular file reachable from the root, by inode: (path, contents).
fn files_by_ino(vol: &Volume) -> BTreeMap<u64, (String, Vec<u8>)> {
    let mut out = BTreeMap::new();
    let mut stack = vec![(vol.root(), String::new())];
    while let Some((d, path)) = stack.pop() {
        for e in vol.readdir(d, 0, 100_000).unwrap() {
            if e.name == b"." || e.name == b".." {
                continue;
            }
            let p = format!("{path}/{}", String::from_utf8_lossy(&e.name));
            let a = vol.getattr(e.ino).unwrap_or_else(|err| panic!("{p}: {err}"));
            match a.kind {
                dxfs::FileType::Directory => stack.push((e.ino, p)),
                dxfs::FileType::RegularFile => {
                    out.insert(e.ino, (p, vol.read(e.ino, 0, a.size as usize + 1).unwrap()));
                }
                _ => {}
            }
        }
    }
    out
}

/// Files and directories whose entries went with an unreadable directory leaf are not
/// lost: fsck links them into /lost+found as `#INO` (a lost directory with everything
/// below it), says so for each, and the volume checks clean afterwards.
#[test]
fn inodes_cut_off_by_a_lost_leaf_come_back_in_lost_and_found() {
    let dev = Arc::new(MemDevice::new(8192));
    mkfs(dev.clone(), &MkfsOptions { seed: Some([1, 2, 3, 4]), ..Default::default() }).unwrap();
    let mut tagged = Vec::new();
    let (big, before) = {
        let vol = Volume::open(dev.clone(), OpenOptions::default()).unwrap();
        let big = vol.mkdir(vol.root(), b"big", 0o755, 0, 0).unwrap().ino;
        for i in 0..300u32 {
            let f = vol.create(big, format!("file-with-a-long-name-{i:04}").as_bytes(), 0o644, 0, 0).unwrap().ino;
            let data: Vec<u8> = (0..(i * 37 + 1)).map(|b| (b * 7 + i) as u8).collect();
            vol.write(f, 0, &data).unwrap();
            if i % 3 == 0 {
                // One xattr block shared by all of them (too big to be inline).
                vol.setxattr(f, b"user.shared", &[9u8; 200], dxfs::XattrMode::Any).unwrap();
                tagged.push(f);
            }
            if i % 8 == 0 {
                let d = vol.mkdir(big, format!("subdirectory-number-{i:04}").as_bytes(), 0o755, 0, 0).unwrap().ino;
                let g = vol.create(d, b"inner", 0o600, 0, 0).unwrap().ino;
                vol.write(g, 0, format!("inner {i}").as_bytes()).unwrap();
            }
        }
        let before = files_by_ino(&vol);
        vol.close().unwrap();
        (big, before)
    };
    let leaf = {
        let vol = Volume::open(dev.clone(), OpenOptions { read_only: true, ..Default::default() }).unwrap();
        vol.dir_blocks(big).unwrap()[1]
    };
    smash(&dev, leaf);
    let r = check(&dev, true);
    assert!(r.errors.is_empty(), "repair left errors: {:#?}", r.errors);
    let back: Vec<&String> = r.fixed.iter().filter(|f| f.contains("reattached as /lost+found/#")).collect();
    assert!(!back.is_empty(), "nothing reattached: {:#?}", r.fixed);
    assert!(back.iter().any(|f| f.contains("(directory)")), "no directory among {back:#?}");
    assert!(r.fixed.iter().any(|f| f.contains("created /lost+found")), "{:#?}", r.fixed);
    let again = check(&dev, false);
    assert!(again.errors.is_empty() && again.fixed.is_empty(), "not clean after repair: {:#?}", again.errors);
    let vol = Volume::open(dev.clone(), OpenOptions::default()).unwrap();
    let after = files_by_ino(&vol);
    // Every file is there with its data, under its name or in lost+found.
    for (ino, (path, data)) in &before {
        let (now, got) = after.get(ino).unwrap_or_else(|| panic!("{path} (inode {ino}) is gone"));
        assert_eq!(got, data, "{path} now at {now}");
        if now != path {
            assert!(now.starts_with("/lost+found/#"), "{path} moved to {now}");
        }
    }
    assert_eq!(after.len(), before.len());
    for f in &tagged {
        assert_eq!(vol.getxattr(*f, b"user.shared").unwrap(), [9u8; 200], "{}", after[f].0);
    }
    let moved = before.iter().filter(|(ino, (p, _))| &after[*ino].0 != p).count();
    assert!(moved > 10, "only {moved} files came back through lost+found");
    // A reattached directory knows its new parent, and the volume takes changes.
    let lf = vol.lookup(vol.root(), b"lost+found").unwrap().ino;
    for e in vol.readdir(lf, 0, 1000).unwrap() {
        if e.name != b"." && e.name != b".." && vol.getattr(e.ino).unwrap().kind == dxfs::FileType::Directory {
            assert_eq!(vol.lookup(e.ino, b"..").unwrap().ino, lf);
            assert!(vol.lookup(e.ino, b"inner").is_ok());
        }
    }
    vol.create(lf, b"after", 0o644, 0, 0).unwrap();
    vol.close().unwrap();
    common::assert_clean(dev);
}

/// Repairs are not all-or-nothing: with an error fsck cannot repair left (an extent
/// tree whose record count disagrees with its inode), it still repairs what it can (a link count, a damaged backup
/// superblock, a block in use that the map marks free), and a second check finds only
/// that error.
#[test]
fn what_can_be_repaired_is_repaired_even_when_an_error_remains() {
    let (dev, kept) = volume();
    {
        let vol = Volume::open(dev.clone(), OpenOptions::default()).unwrap();
        let keep = vol.lookup(vol.root(), b"keep").unwrap().ino;
        for k in [b"k2", b"k3"] {
            let f = vol.lookup(keep, k).unwrap().ino;
            vol.setxattr(f, b"user.shared", &[3u8; 300], dxfs::XattrMode::Any).unwrap();
        }
        vol.close().unwrap();
    }
    let k1 = ino_of(&dev, &["keep", "k1"]);
    let frag = ino_of(&dev, &["frag"]);
    let node = {
        let vol = Volume::open(dev.clone(), OpenOptions { read_only: true, ..Default::default() }).unwrap();
        vol.extent_tree_blocks(frag).unwrap()[0]
    };
    // The extent count of the tree format (data @128, count @12): not repairable.
    let count = {
        let (b, slot) = ino_loc(frag);
        let mut blk = [0u8; BLOCK_SIZE];
        dev.read(b, &mut blk).unwrap();
        u32::from_le_bytes(blk[slot * 256 + 140..slot * 256 + 144].try_into().unwrap())
    };
    poke(&dev, frag, 140, &(count + 1).to_le_bytes());
    poke(&dev, k1, 12, &3u32.to_le_bytes()); // nlink
    smash(&dev, dev.block_count() - 1); // the backup superblock

    // The extent-tree node marked free in the bitmap (whose count then disagrees).
    let sb = dxfs::read_superblock(&*dev).unwrap();
    let bm = sb.layout.bitmap_block(node / 32512);
    let mut blk = [0u8; BLOCK_SIZE];
    dev.read(bm, &mut blk).unwrap();
    let bit = node % 32512;
    blk[32 + (bit / 8) as usize] &= !(1 << (bit % 8));
    dxfs::internals::seal(&mut blk, bm);
    dev.write(bm, &blk).unwrap();
    // The shared xattr block (the only one) says 5 users.
    let xb = (0..dev.block_count())
        .find(|&b| {
            dev.read(b, &mut blk).unwrap();
            &blk[..4] == b"DXXA" && blk[8..16] == b.to_le_bytes() // not a copy in the log
        })
        .unwrap();
    blk[16..20].copy_from_slice(&5u32.to_le_bytes());
    dxfs::internals::seal(&mut blk, xb);
    dev.write(xb, &blk).unwrap();

    let r = check(&dev, false);
    assert_eq!(r.errors.len(), 6, "{:#?}", r.errors);
    let r = check(&dev, true);
    assert_eq!(r.errors.len(), 1, "{:#?}", r.errors);
    assert!(r.errors[0].contains("extent count"), "{:#?}", r.errors);
    for want in [
        "link count 3, should be 1",
        "superblock copy",
        &format!("block {node} is in use but marked free"),
        &format!("bitmap block {bm} counts"),
        &format!("xattr block {xb}: reference count 5, used by 2 inodes"),
    ] {
        assert!(r.fixed.iter().any(|f| f.contains(want)), "{want} not fixed: {:#?}", r.fixed);
    }
    let again = check(&dev, false);
    assert_eq!(again.errors, r.errors, "a second check finds more than the error left");
    let vol = Volume::open(dev.clone(), OpenOptions::default()).unwrap();
    assert_eq!(vol.getattr(k1).unwrap().nlink, 1);
    let keep = vol.lookup(vol.root(), b"keep").unwrap().ino;
    for (name, data) in &kept {
        let f = vol.lookup(keep, name.as_bytes()).unwrap().ino;
        assert_eq!(&vol.read(f, 0, data.len() + 1).unwrap(), data, "{name}");
    }
    vol.close().unwrap();
    // The error left is still found by a clean open and close (nothing hid it).
    assert_eq!(check(&dev, false).errors.len(), 1);
}

/// A directory whose inode is unreadable loses its entry, but not its files: they come
/// back in /lost+found with their data and their xattrs, which they share in one block
/// that nothing else still names.
#[test]
fn files_of_an_unreadable_directory_come_back_with_their_shared_xattrs() {
    let dev = Arc::new(MemDevice::new(8192));
    mkfs(dev.clone(), &MkfsOptions::default()).unwrap();
    let (sub, files) = {
        let vol = Volume::open(dev.clone(), OpenOptions::default()).unwrap();
        let sub = vol.mkdir(vol.root(), b"sub", 0o755, 0, 0).unwrap().ino;
        let mut files = Vec::new();
        for i in 0..10u8 {
            let f = vol.create(sub, format!("f{i}").as_bytes(), 0o644, 0, 0).unwrap().ino;
            vol.write(f, 0, &[i; 5000]).unwrap();
            vol.setxattr(f, b"user.shared", &[7u8; 300], dxfs::XattrMode::Any).unwrap();
            files.push((f, i));
        }
        vol.close().unwrap();
        (sub, files)
    };
    assert_ne!(ino_loc(sub).0, ino_loc(files[0].0).0, "the files live in the directory's own region");
    smash(&dev, ino_loc(sub).0);
    let r = check(&dev, true);
    assert!(r.errors.is_empty(), "repair left errors: {:#?}", r.errors);
    let back = r.fixed.iter().filter(|f| f.contains("reattached as /lost+found/#")).count();
    assert_eq!(back, files.len(), "{:#?}", r.fixed);
    let again = check(&dev, false);
    assert!(again.errors.is_empty() && again.fixed.is_empty(), "not clean after repair: {:#?}", again.errors);
    let vol = Volume::open(dev.clone(), OpenOptions::default()).unwrap();
    let lf = vol.lookup(vol.root(), b"lost+found").unwrap().ino;
    for (f, i) in &files {
        let a = vol.lookup(lf, format!("#{f}").as_bytes()).unwrap();
        assert_eq!(a.ino, *f);
        assert_eq!(a.nlink, 1);
        assert_eq!(vol.read(*f, 0, 6000).unwrap(), vec![*i; 5000]);
        assert_eq!(vol.getxattr(*f, b"user.shared").unwrap(), [7u8; 300]);
    }
    vol.close().unwrap();
    common::assert_clean(dev);
}
