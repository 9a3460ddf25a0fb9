//! `dxfs debug ls|stat|htree|extents|xattrs|log`: each subcommand's JSON on a volume the
//! test builds and therefore knows, and damaged images (a clear error and exit 8, never a
//! panic).

mod common;

use common::dxfs;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use dxfs::block::{BlockDevice, FileDevice};
use dxfs::hash::ext4_hash;
use dxfs::internals::{filter_mask, split_name};
use dxfs::{mkfs, MkfsOptions, OpenOptions, Volume, XattrMode, BLOCK_SIZE};
use serde_json::Value;

fn debug_json(img: &Path, args: &[&str]) -> Value {
    let mut all = vec!["debug"];
    all.extend_from_slice(args);
    all.push("--json");
    let img = img.to_str().unwrap().to_string();
    all.insert(2, &img);
    let (code, out, err) = dxfs(&all);
    assert_eq!(code, 0, "dxfs {all:?}: {out}{err}");
    serde_json::from_str(&out).unwrap_or_else(|e| panic!("dxfs {all:?}: not JSON ({e}): {out}"))
}

const NAMES: usize = 1500;

fn pattern(seed: u8, len: usize) -> Vec<u8> {
    (0..len).map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed)).collect()
}

/// What the test put in the volume.
struct Known {
    img: PathBuf,
    _tmp: tempfile::TempDir,
    big: u64,
    ino_of: BTreeMap<String, (u64, &'static str)>,
}

fn build() -> Known {
    let tmp = tempfile::tempdir().unwrap();
    let img = tmp.path().join("v.img");
    let dev = Arc::new(FileDevice::create(&img, 64 << 20).unwrap());
    mkfs(dev.clone(), &MkfsOptions::default()).unwrap();
    let vol = Volume::open(dev.clone(), OpenOptions::default()).unwrap();
    let root = vol.root();
    let mut ino_of = BTreeMap::new();
    let big = vol.mkdir(root, b"big", 0o755, 0, 0).unwrap().ino;
    ino_of.insert("big".to_string(), (big, "directory"));
    for i in 0..NAMES {
        vol.create(big, format!("entry-{i}").as_bytes(), 0o644, 0, 0).unwrap();
    }
    let file = vol.create(root, b"file", 0o640, 1000, 100).unwrap().ino;
    ino_of.insert("file".to_string(), (file, "regular"));
    vol.write(file, 0, &pattern(1, 3 * BLOCK_SIZE)).unwrap();
    vol.write(file, 10 * BLOCK_SIZE as u64, &pattern(2, 2 * BLOCK_SIZE)).unwrap();
    vol.fallocate(file, 20 * BLOCK_SIZE as u64, BLOCK_SIZE as u64, false, false).unwrap();
    vol.setxattr(file, b"user.colour", b"blue", XattrMode::Any).unwrap();
    vol.setxattr(file, b"trusted.big", &[7u8; 300], XattrMode::Any).unwrap();
    let sym = vol.symlink(root, b"sym", b"file", 0, 0).unwrap().ino;
    ino_of.insert("sym".to_string(), (sym, "symlink"));
    let fifo = vol.mknod(root, b"fifo", libc::S_IFIFO | 0o600, 0, 0, 0).unwrap().ino;
    ino_of.insert("fifo".to_string(), (fifo, "fifo"));
    vol.sync().unwrap();
    vol.close().unwrap();
    Known { img, _tmp: tmp, big, ino_of }
}

fn fsck_clean(img: &Path) {
    let dev = Arc::new(FileDevice::open(img, true).unwrap()) as Arc<dyn BlockDevice>;
    let r = dxfs::fsck::check(dev, false, &mut |_| {}).unwrap();
    assert!(r.errors.is_empty(), "fsck: {:#?}", r.errors);
}

fn open_ro(img: &Path) -> (Arc<dyn BlockDevice>, Volume) {
    let dev = Arc::new(FileDevice::open(img, true).unwrap()) as Arc<dyn BlockDevice>;
    let vol = Volume::open(dev.clone(), OpenOptions { read_only: true, ..Default::default() }).unwrap();
    (dev, vol)
}

#[test]
fn ls_and_stat() {
    let k = build();
    let (_, vol) = open_ro(&k.img);
    let root = debug_json(&k.img, &["ls", "/"]);
    let got: BTreeMap<String, (u64, String)> = root
        .as_array()
        .unwrap()
        .iter()
        .map(|e| {
            (
                e["name"].as_str().unwrap().to_string(),
                (e["inode"].as_u64().unwrap(), e["type"].as_str().unwrap().into()),
            )
        })
        .collect();
    let mut want: BTreeMap<String, (u64, String)> =
        k.ino_of.iter().map(|(n, (i, t))| (n.clone(), (*i, t.to_string()))).collect();
    want.insert(".".into(), (vol.root(), "directory".into()));
    want.insert("..".into(), (vol.root(), "directory".into()));
    assert_eq!(got, want);
    let big = debug_json(&k.img, &["ls", "/big"]);
    assert_eq!(big.as_array().unwrap().len(), NAMES + 2);
    let e = big.as_array().unwrap().iter().find(|e| e["name"] == "entry-77").expect("entry-77 listed");
    let a = vol.lookup(k.big, b"entry-77").unwrap();
    assert_eq!(e["inode"].as_u64(), Some(a.ino));

    for path in ["/file", "/sym", "/fifo", "/big", "/big/entry-5", "/big/../file"] {
        let j = debug_json(&k.img, &["stat", path]);
        let mut ino = vol.root();
        for part in path.split('/').filter(|p| !p.is_empty()) {
            ino = if part == ".." { vol.root() } else { vol.lookup(ino, part.as_bytes()).unwrap().ino };
        }
        let a = vol.getattr(ino).unwrap();
        assert_eq!(j["inode"].as_u64(), Some(a.ino), "{path}");
        assert_eq!(j["mode"].as_u64(), Some(a.mode as u64), "{path}");
        assert_eq!(j["uid"].as_u64(), Some(a.uid as u64), "{path}");
        assert_eq!(j["gid"].as_u64(), Some(a.gid as u64), "{path}");
        assert_eq!(j["nlink"].as_u64(), Some(a.nlink as u64), "{path}");
        assert_eq!(j["size"].as_u64(), Some(a.size), "{path}");
        assert_eq!(j["blocks"].as_u64().map(|b| b * 8), Some(a.blocks), "{path}: 4 KiB blocks vs 512-byte units");
        assert_eq!(j["mtime"]["sec"].as_i64(), Some(a.mtime.0), "{path}");
        assert_eq!(j["mtime"]["nsec"].as_u64(), Some(a.mtime.1 as u64), "{path}");
        assert_eq!(j["generation"].as_u64(), Some(a.generation as u64), "{path}");
    }
    let j = debug_json(&k.img, &["stat", "/big"]);
    assert_eq!(j["parent"].as_u64(), Some(vol.root()));
    assert_eq!(j["data"], "directory");
    assert_eq!(debug_json(&k.img, &["stat", "/sym"])["data"], "inline_symlink");
    fsck_clean(&k.img);
}

#[test]
fn htree_leaves_partition_the_name_hashes() {
    let k = build();
    let (_, vol) = open_ro(&k.img);
    let sb = vol.superblock();
    let j = debug_json(&k.img, &["htree", "/big"]);
    let (entries, depth) = vol.dir_stats(k.big).unwrap();
    assert_eq!(j["entries"].as_u64(), Some(entries));
    assert_eq!(j["depth"].as_u64(), Some(depth as u64));
    assert!(depth >= 2, "{NAMES} names should need more than one leaf");
    let leaves = j["leaves"].as_array().unwrap();
    assert_eq!(j["leaf_count"].as_u64(), Some(leaves.len() as u64));
    // The leaves are the index's blocks other than its internal nodes (one root at depth 2).
    let blocks = vol.dir_blocks(k.big).unwrap();
    let leaf_blocks: Vec<u64> = leaves.iter().map(|l| l["block"].as_u64().unwrap()).collect();
    if depth == 2 {
        assert_eq!(leaf_blocks, blocks[1..].to_vec());
    }
    // With no displaced entry, the keys are the names' hashes: sorted, the leaves cut
    // them into consecutive runs whose ends are each leaf's hash range.
    assert_eq!(j["max_disp"].as_u64(), Some(0), "a collision in {NAMES} names: pick other names");
    let mut keys: Vec<u64> = (0..NAMES)
        .map(|i| {
            let (major, minor) = ext4_hash(sb.hash, sb.hash_seed, format!("entry-{i}").as_bytes());
            ((major as u64 >> 1) << 32) | minor as u64
        })
        .collect();
    keys.sort_unstable();
    let mut at = 0;
    for l in leaves {
        let n = l["entries"].as_u64().unwrap() as usize;
        assert!(n > 0);
        assert_eq!(l["first_hash"].as_u64(), Some(keys[at]));
        assert_eq!(l["last_hash"].as_u64(), Some(keys[at + n - 1]));
        let fill = l["fill"].as_f64().unwrap();
        assert!(fill > 0.0 && fill <= 1.0, "fill {fill}");
        at += n;
    }
    assert_eq!(at, NAMES);
    // A file has no index: a clear error.
    let (code, _, err) = dxfs(&["debug", "htree", k.img.to_str().unwrap(), "/file"]);
    assert_eq!(code, 8);
    assert!(err.contains("dxfs:") && !err.contains("panicked"), "{err}");
    fsck_clean(&k.img);
}

#[test]
fn extents_point_at_the_data() {
    let k = build();
    let j = debug_json(&k.img, &["extents", "/file"]);
    let list = j.as_array().unwrap();
    let got: Vec<(u64, u64, bool)> = list
        .iter()
        .map(|e| (e["logical"].as_u64().unwrap(), e["length"].as_u64().unwrap(), e["unwritten"].as_bool().unwrap()))
        .collect();
    assert_eq!(got, vec![(0, 3, false), (10, 2, false), (20, 1, true)]);
    // The physical blocks hold what was written there.
    let dev = FileDevice::open(&k.img, true).unwrap();
    for (e, (seed, len)) in list.iter().zip([(1u8, 3usize), (2, 2)]) {
        let mut buf = vec![0u8; len * BLOCK_SIZE];
        dev.read(e["physical"].as_u64().unwrap(), &mut buf).unwrap();
        assert_eq!(buf, pattern(seed, len * BLOCK_SIZE));
    }
    assert_eq!(debug_json(&k.img, &["extents", "/sym"]), serde_json::json!([]));
    fsck_clean(&k.img);
}

#[test]
fn xattrs_and_their_filter_bits() {
    let k = build();
    let (_, vol) = open_ro(&k.img);
    let j = debug_json(&k.img, &["xattrs", "/file"]);
    let hashes = vol.superblock().filter_hashes();
    assert_eq!(j["hashes"].as_u64(), Some(hashes as u64));
    let mut want_filter = 0u32;
    let mut want = BTreeMap::new();
    for (name, len) in [("user.colour", 4u64), ("trusted.big", 300)] {
        let (idx, suffix) = split_name(name.as_bytes()).unwrap();
        let bits = filter_mask(idx, suffix, hashes);
        want_filter |= bits;
        want.insert(name.to_string(), (len, bits as u64));
    }
    let got: BTreeMap<String, (u64, u64)> = j["names"]
        .as_array()
        .unwrap()
        .iter()
        .map(|n| (n["name"].as_str().unwrap().into(), (n["value_len"].as_u64().unwrap(), n["bits"].as_u64().unwrap())))
        .collect();
    assert_eq!(got, want);
    assert_eq!(j["filter_enabled"], true);
    assert_eq!(j["filter"].as_u64(), Some(want_filter as u64));
    let none = debug_json(&k.img, &["xattrs", "/fifo"]);
    assert_eq!(none["filter"].as_u64(), Some(0));
    assert_eq!(none["names"], serde_json::json!([]));
    fsck_clean(&k.img);
}

#[test]
fn log_areas_alternate() {
    let k = build();
    let areas = debug_json(&k.img, &["log"]);
    let newest = |a: &Value| {
        let a = a.as_array().unwrap();
        assert_eq!(a.len(), 2);
        let n: Vec<&Value> = a.iter().filter(|x| x["newest"] == true).collect();
        assert_eq!(n.len(), 1, "{a:?}");
        let seq = n[0]["sequence"].as_u64().unwrap();
        // The other area holds the delta before (the volume has committed several).
        let other = a.iter().find(|x| x["newest"] == false).unwrap();
        assert_eq!(other["valid"], true, "{a:?}");
        assert_eq!(other["sequence"].as_u64(), Some(seq - 1), "{a:?}");
        assert!(n[0]["blocks"].as_u64().is_some());
        (n[0]["area"].as_u64().unwrap(), seq)
    };
    let (area, seq) = newest(&areas);
    // Commit delta n goes to area n % 2.
    assert_eq!(area, seq % 2);
    // One more committed delta: the other area, the next sequence.
    {
        let dev = Arc::new(FileDevice::open(&k.img, false).unwrap());
        let vol = Volume::open(dev, OpenOptions::default()).unwrap();
        let f = vol.create(vol.root(), b"later", 0o644, 0, 0).unwrap();
        vol.write(f.ino, 0, b"x").unwrap();
        vol.sync().unwrap();
        vol.close().unwrap();
    }
    let areas2 = debug_json(&k.img, &["log"]);
    let (area2, seq2) = newest(&areas2);
    assert!(seq2 > seq);
    assert_eq!(area2, seq2 % 2);
    // The delta that created "later" logged the state block and the inode block that
    // holds the new file, with a body that matches its checksum.
    let later = debug_json(&k.img, &["stat", "/later"])["inode"].as_u64().unwrap();
    let holder = areas2.as_array().unwrap().iter().find(|a| a["sequence"].as_u64() == Some(seq + 1)).unwrap();
    let targets: Vec<u64> = holder["targets"].as_array().unwrap().iter().map(|t| t.as_u64().unwrap()).collect();
    assert_eq!(targets.len() as u64, holder["blocks"].as_u64().unwrap(), "{holder}");
    assert!(targets.contains(&1), "state block not logged: {targets:?}");
    assert!(targets.contains(&(later / 16)), "inode block of {later} not logged: {targets:?}");
    assert_eq!(holder["body_ok"], true);
    fsck_clean(&k.img);
}

#[test]
fn damaged_images_give_clear_errors() {
    let k = build();
    let (_, vol) = open_ro(&k.img);
    let leaf = *vol.dir_blocks(k.big).unwrap().last().unwrap();
    drop(vol);
    // A directory leaf overwritten with garbage.
    {
        let dev = FileDevice::open(&k.img, false).unwrap();
        dev.write(leaf, &[0x5a; BLOCK_SIZE]).unwrap();
        dev.flush().unwrap();
    }
    let img = k.img.to_str().unwrap();
    for args in [
        vec!["debug", "ls", img, "/big"],
        vec!["debug", "htree", img, "/big"],
        vec!["debug", "ls", img, "/nonexistent"],
        vec!["debug", "stat", img, "/file/below-a-file"],
        vec!["debug", "extents", img, "/big"],
    ] {
        let (code, out, err) = dxfs(&args);
        assert_eq!(code, 8, "{args:?}: {out}{err}");
        assert!(err.starts_with("dxfs: ") && !err.contains("panicked"), "{args:?}: {err}");
    }
    // Not a volume at all.
    let junk = k._tmp.path().join("junk");
    std::fs::write(&junk, vec![0xa5u8; 1 << 20]).unwrap();
    for sub in ["ls", "stat", "htree", "extents", "xattrs"] {
        let (code, _, err) = dxfs(&["debug", sub, junk.to_str().unwrap(), "/"]);
        assert_eq!(code, 8);
        assert!(err.starts_with("dxfs: ") && !err.contains("panicked"), "{sub}: {err}");
    }
    let (code, _, err) = dxfs(&["debug", "log", junk.to_str().unwrap()]);
    assert_eq!(code, 8);
    assert!(err.starts_with("dxfs: ") && !err.contains("panicked"), "{err}");
}

/// `debug block N` names what a block is and decodes its header: the superblock, the
/// state block, an inode block holding a known inode, a directory leaf owned by its
/// directory, a data block in use; a damaged leaf shows a bad checksum.
#[test]
fn blocks_are_decoded() {
    let k = build();
    let b = |n: u64| debug_json(&k.img, &["block", &n.to_string()]);
    let j = b(0);
    assert_eq!((j["kind"].as_str(), j["checksum_ok"].as_bool()), (Some("superblock"), Some(true)), "{j}");
    let j = b(1);
    assert_eq!(j["kind"], "state", "{j}");
    assert_eq!(j["fields"]["inodes"].as_u64(), Some(NAMES as u64 + 5), "{j}");
    let (file, _) = k.ino_of["file"];
    let (iblk, slot) = dxfs::internals::ino_loc(file);
    let j = b(iblk);
    assert_eq!(
        (j["kind"].as_str(), j["checksum_ok"].as_bool(), j["in_use"].as_bool()),
        (Some("inode block"), Some(true), Some(true))
    );
    assert_ne!(j["fields"]["slot_mask"].as_u64().unwrap() & (1 << slot), 0, "{j}");
    let leaf = debug_json(&k.img, &["htree", "/big"])["leaves"][0]["block"].as_u64().unwrap();
    let j = b(leaf);
    assert_eq!(
        (j["kind"].as_str(), j["fields"]["owner"].as_u64(), j["fields"]["level"].as_u64()),
        (Some("btree node"), Some(k.big), Some(0)),
        "{j}"
    );
    let data = debug_json(&k.img, &["extents", "/file"])[0]["physical"].as_u64().unwrap();
    let j = b(data);
    assert_eq!((j["kind"].as_str(), j["in_use"].as_bool()), (Some("data"), Some(true)), "{j}");
    // Past the end: a clear error.
    let (code, _, err) = dxfs(&["debug", "block", k.img.to_str().unwrap(), "99999999"]);
    assert_eq!(code, 8, "{err}");
    assert!(err.contains("past the end"), "{err}");
    fsck_clean(&k.img);
    // A damaged leaf still decodes, with its checksum marked bad.
    {
        let dev = FileDevice::open(&k.img, false).unwrap();
        let mut blk = vec![0u8; BLOCK_SIZE];
        dev.read(leaf, &mut blk).unwrap();
        blk[3000] ^= 0xFF;
        dev.write(leaf, &blk).unwrap();
    }
    let j = b(leaf);
    assert_eq!((j["kind"].as_str(), j["checksum_ok"].as_bool()), (Some("btree node"), Some(false)), "{j}");
}
