//! Bad input: garbage, truncated and bit-flipped images give a clear error or an fsck
//! finding, never a panic, a hang or an unbounded allocation.

mod common;

use std::collections::BTreeMap;
use std::sync::Arc;

use common::*;
use dxfs::block::{BlockDevice, MemDevice};
use dxfs::XattrMode;
use dxfs::{internals::get_u32, BLOCK_SIZE};
use dxfs::{Error, OpenOptions, Volume};
use proptest::prelude::*;

const BLOCKS: u64 = 2048;

/// A volume with one of everything: a multi-level directory, files with inline and
/// tree extent maps, xattrs inline and in a block, symlinks, an open unlinked file.
fn populated() -> Vec<u8> {
    let (dev, vol) = mem_volume(BLOCKS);
    let root = vol.root();
    let d = vol.mkdir(root, b"big", 0o755, 0, 0).unwrap();
    for i in 0..600 {
        vol.create(d.ino, format!("entry-with-a-long-name-{i:05}").as_bytes(), 0o644, 0, 0).unwrap();
    }
    let f = vol.create(root, b"frag", 0o644, 0, 0).unwrap();
    for k in 0..40u64 {
        vol.write(f.ino, k * 8192, &[k as u8; 4096]).unwrap();
        vol.sync().unwrap(); // separate deltas: separate extents
    }
    vol.setxattr(f.ino, b"user.big", &[5u8; 1500], XattrMode::Any).unwrap();
    vol.setxattr(d.ino, b"user.small", b"v", XattrMode::Any).unwrap();
    vol.symlink(root, b"short", b"target", 0, 0).unwrap();
    vol.symlink(root, b"long", &[b'l'; 300], 0, 0).unwrap();
    vol.close().unwrap();
    // One more small delta, so the newest log entry (which a read-only open overlays on
    // the home blocks) covers only a handful of blocks.
    let vol = Volume::open(dev.clone(), OpenOptions::default()).unwrap();
    vol.create(root, b"last", 0o644, 0, 0).unwrap();
    vol.close().unwrap();
    assert_clean(dev.clone());
    dev.to_bytes()
}

/// Blocks listed by the newest valid commit: their home copies are superseded.
fn in_newest_commit(img: &[u8]) -> Vec<usize> {
    let l = get_u32(img, 84) as usize;
    let mut best = (0u64, 0usize, 0usize);
    for area in [2, 2 + l] {
        let b = &img[area * BLOCK_SIZE..(area + 1) * BLOCK_SIZE];
        if &b[..4] == b"DXLC" {
            let seq = u64::from_le_bytes(b[16..24].try_into().unwrap());
            if seq > best.0 {
                best = (seq, area, get_u32(b, 24) as usize);
            }
        }
    }
    let (_, area, n) = best;
    (0..n)
        .map(|i| u64::from_le_bytes(img[(area + 1) * BLOCK_SIZE + 8 * i..][..8].try_into().unwrap()) as usize)
        .collect()
}

/// Open and exercise a volume image; Ok(true) if everything read back without error.
fn exercise(img: Vec<u8>) -> dxfs::Result<bool> {
    let dev = Arc::new(MemDevice::from_bytes(img));
    let report = dxfs::fsck::check(dev.clone(), false, &mut |_| {});
    let vol = Volume::open(dev, OpenOptions { read_only: true, ..Default::default() })?;
    let root = vol.root();
    let mut clean = true;
    let mut stack = vec![root];
    let mut visited = 0;
    while let Some(d) = stack.pop() {
        visited += 1;
        if visited > 10_000 {
            break; // a corrupt image may link directories in a cycle
        }
        let ents = match vol.readdir(d, 0, 100_000) {
            Ok(e) => e,
            Err(_) => {
                clean = false;
                continue;
            }
        };
        for e in ents.iter().filter(|e| e.name != b"." && e.name != b"..") {
            match vol.getattr(e.ino) {
                Ok(a) if a.kind == dxfs::FileType::Directory => stack.push(e.ino),
                Ok(a) => {
                    let r = if a.kind == dxfs::FileType::Symlink {
                        vol.readlink(e.ino).map(|_| ())
                    } else {
                        vol.read(e.ino, 0, 1 << 20).map(|_| ())
                    };
                    clean &= r.is_ok();
                }
                Err(_) => clean = false,
            }
            clean &= vol.listxattr(e.ino).is_ok();
        }
    }
    let fsck_clean = matches!(&report, Ok(r) if r.errors.is_empty());
    Ok(clean && fsck_clean)
}

#[test]
fn zero_random_and_truncated_images_are_refused_clearly() {
    let zero = Arc::new(MemDevice::new(BLOCKS));
    let e = Volume::open(zero.clone(), OpenOptions::default()).err().expect("zeros must not open");
    assert!(e.to_string().contains("not a dxfs volume"), "{e}");
    assert!(dxfs::fsck::check(zero, false, &mut |_| {}).is_err());

    let mut rng = 0x1234_5678_u64;
    let random: Vec<u8> = (0..BLOCKS as usize * BLOCK_SIZE)
        .map(|_| {
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            rng as u8
        })
        .collect();
    assert!(matches!(
        Volume::open(Arc::new(MemDevice::from_bytes(random)), OpenOptions::default()),
        Err(Error::Corrupt(_))
    ));

    let img = populated();
    let cut = img[..img.len() / 2].to_vec();
    let e = Volume::open(Arc::new(MemDevice::from_bytes(cut)), OpenOptions::default())
        .err()
        .expect("truncated must not open");
    assert!(e.to_string().contains("truncated"), "{e}");
    let tiny = Arc::new(MemDevice::new(1));
    assert!(Volume::open(tiny, OpenOptions::default()).is_err());
}

/// Flip bits in every metadata block of every kind: each flip is reported (by open,
/// by a read, or by fsck), and nothing panics.
#[test]
fn flipped_bits_in_every_metadata_block_are_detected() {
    let img = populated();
    assert!(exercise(img.clone()).unwrap(), "the pristine image must be clean");
    let mut kinds: BTreeMap<[u8; 4], Vec<usize>> = BTreeMap::new();
    for b in 0..BLOCKS as usize {
        let m = get_u32(&img[b * BLOCK_SIZE..], 0).to_le_bytes();
        if m.starts_with(b"DX") {
            kinds.entry(m).or_default().push(b);
        }
    }
    let names: Vec<String> = kinds.keys().map(|k| String::from_utf8_lossy(k).into_owned()).collect();
    for want in ["DXSB", "DXST", "DXBM", "DXIN", "DXTN", "DXXA", "DXLC"] {
        assert!(names.iter().any(|n| n == want), "no {want} block in the test image: {names:?}");
    }
    let log_end = 2 + 2 * get_u32(&img, 84) as usize;
    let superseded = in_newest_commit(&img);
    // A clean close ends with an empty delta: no home block is superseded by the log.
    assert!(superseded.is_empty(), "{superseded:?}");
    let mut tried = 0;
    for (kind, blocks) in &kinds {
        for &b in blocks.iter().take(40) {
            for bit in [0usize, 100, 8 * 200 + 3, 8 * 4095 + 7] {
                let mut bad = img.clone();
                bad[b * BLOCK_SIZE + bit / 8] ^= 1 << (bit % 8);
                tried += 1;
                let detected = match exercise(bad) {
                    Err(_) => true,
                    Ok(clean) => !clean,
                };
                // A flip in the primary superblock is repaired by the backup copy, and the
                // log areas hold copies that are only read if a delta awaits replay.
                let harmless = (kind == b"DXSB" && b == 0) || b < log_end || superseded.contains(&b);
                if !harmless {
                    assert!(
                        detected,
                        "flip of bit {bit} in {} block {b} went unnoticed",
                        String::from_utf8_lossy(kind)
                    );
                }
            }
        }
    }
    assert!(tried > 100);
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 200, ..ProptestConfig::default() })]
    /// Parser fuzzing: random byte damage anywhere in the metadata never panics or hangs.
    #[test]
    fn random_damage_never_panics(hits in proptest::collection::vec((0usize..BLOCKS as usize, 0usize..BLOCK_SIZE, any::<u8>()), 1..20)) {
        let mut img = base_image().clone();
        for (b, off, v) in hits {
            img[b * BLOCK_SIZE + off] = v;
        }
        let _ = exercise(img.clone());
        // Then a repair: it either says what it could not fix, or leaves a volume that
        // checks clean again and opens for writing.
        let dev = Arc::new(MemDevice::from_bytes(img));
        if let Ok(r) = dxfs::fsck::check(dev.clone(), true, &mut |_| {}) {
            if r.errors.is_empty() {
                let again = dxfs::fsck::check(dev.clone(), false, &mut |_| {}).unwrap();
                prop_assert!(again.errors.is_empty(), "repaired ({:?}), yet a second check finds {:?}", r.fixed, again.errors);
                let vol = Volume::open(dev, OpenOptions::default());
                prop_assert!(vol.is_ok(), "repaired, yet it does not open: {:?}", vol.err());
            }
        }
    }
}

fn base_image() -> &'static Vec<u8> {
    static IMG: std::sync::OnceLock<Vec<u8>> = std::sync::OnceLock::new();
    IMG.get_or_init(populated)
}

#[test]
fn device_size_is_respected() {
    let dev = MemDevice::new(8);
    let mut buf = vec![0u8; BLOCK_SIZE];
    assert!(dev.read(8, &mut buf).is_err());
}

/// One damaged inode block costs only its own entries: readdirplus lists every name of a
/// 3,000-entry directory, the damaged entries without attributes (and failing on access),
/// every other entry with its attributes.
#[test]
fn one_bad_inode_block_costs_only_its_entries() {
    let (dev, vol) = mem_volume(16_384);
    let root = vol.root();
    let d = vol.mkdir(root, b"d", 0o755, 0, 0).unwrap().ino;
    let files: Vec<u64> =
        (0..3000).map(|i| vol.create(d, format!("f{i:04}").as_bytes(), 0o644, 0, 0).unwrap().ino).collect();
    vol.close().unwrap();
    // Damage the inode block of file 1500 (and so its neighbours in that block).
    let victim = dxfs::internals::ino_loc(files[1500]).0;
    dev.write(victim, &[0xA5u8; BLOCK_SIZE]).unwrap();
    let damaged: Vec<u64> = files.iter().copied().filter(|&i| dxfs::internals::ino_loc(i).0 == victim).collect();
    assert!(damaged.len() >= 2, "{damaged:?}");
    let vol = Volume::open(dev.clone(), OpenOptions::default()).unwrap();
    let mut pos = 0;
    let (mut named, mut without) = (0, Vec::new());
    loop {
        let batch = vol.readdir_plus(d, pos, 256).unwrap();
        if batch.is_empty() {
            break;
        }
        for (e, a) in &batch {
            if e.name == b"." || e.name == b".." {
                continue;
            }
            named += 1;
            match a {
                Some(a) => assert_eq!(a.ino, e.ino),
                None => without.push(e.ino),
            }
        }
        pos = batch.last().unwrap().0.next;
    }
    assert_eq!(named, 3000, "every name is listed");
    without.sort_unstable();
    assert_eq!(without, damaged, "exactly the damaged block's entries come without attributes");
    assert!(matches!(vol.getattr(damaged[0]), Err(Error::Corrupt(_))));
    assert!(vol.getattr(files[0]).is_ok());
    drop(vol);
    // fsck reports the damage.
    let r = dxfs::fsck::check(dev, false, &mut |_| {}).unwrap();
    assert!(!r.errors.is_empty(), "fsck must see the damaged inode block");
}

/// A damaged free-space map or state block: a read-write open refuses (it would allocate
/// from a map it cannot read), a read-only open still reads everything, and fsck rebuilds
/// both from the tree, after which the volume is clean, whole and writable.
#[test]
fn bitmap_and_state_are_rebuilt_from_the_tree() {
    for what in ["bitmap", "state", "both"] {
        let (dev, vol) = mem_volume(8192);
        let root = vol.root();
        let d = vol.mkdir(root, b"d", 0o755, 0, 0).unwrap().ino;
        let mut files = Vec::new();
        for i in 0..200u64 {
            let f = vol.create(d, format!("f{i}").as_bytes(), 0o644, 0, 0).unwrap().ino;
            vol.write(f, 0, &vec![i as u8; 5000 + i as usize * 100]).unwrap();
            files.push(f);
        }
        vol.close().unwrap();
        let sb = dxfs::read_superblock(&*dev).unwrap();
        let garbage = [0x5Au8; BLOCK_SIZE];
        if what != "state" {
            dev.write(sb.layout.bitmap_start, &garbage).unwrap();
        }
        if what != "bitmap" {
            dev.write(dxfs::internals::STATE_BLOCK, &garbage).unwrap();
        }
        assert!(matches!(Volume::open(dev.clone(), OpenOptions::default()), Err(Error::Corrupt(_))), "{what}");
        let ro = Volume::open(dev.clone(), OpenOptions { read_only: true, ..Default::default() }).unwrap();
        for (i, f) in files.iter().enumerate() {
            assert_eq!(ro.read(*f, 0, 1 << 20).unwrap(), vec![i as u8; 5000 + i * 100], "{what}: read-only read");
        }
        drop(ro);
        let r = dxfs::fsck::check(dev.clone(), false, &mut |_| {}).unwrap();
        assert_eq!(r.exit_code(), 4, "{what}: fsck -n reports the damage: {r:?}");
        let r = dxfs::fsck::check(dev.clone(), true, &mut |_| {}).unwrap();
        assert!(r.errors.is_empty(), "{what}: {:?}", r.errors);
        assert!(r.fixed.iter().any(|f| f.contains("rebuilt from the tree")), "{what}: {:?}", r.fixed);
        assert_clean(dev.clone());
        let vol = Volume::open(dev.clone(), OpenOptions::default()).unwrap();
        for (i, f) in files.iter().enumerate() {
            assert_eq!(vol.read(*f, 0, 1 << 20).unwrap(), vec![i as u8; 5000 + i * 100], "{what}: after repair");
        }
        let g = vol.create(root, b"after", 0o644, 0, 0).unwrap().ino;
        vol.write(g, 0, &[7u8; 100_000]).unwrap();
        close_and_check(dev, vol);
    }
}

/// A commit record damaged after it was durable must not silently roll the volume back
/// past a completed sync: the home state block shows a newer delta than the newest
/// readable commit, so the open is refused, unless rollback is explicitly allowed.
/// (A commit record torn by a crash before its flush completed cannot look like this:
/// home writes only start after it is durable — the crash tests cover that case.)
#[test]
fn a_damaged_newest_commit_is_not_a_silent_rollback() {
    let (dev, vol) = mem_volume(8192);
    let root = vol.root();
    let a = vol.create(root, b"a", 0o644, 0, 0).unwrap().ino;
    vol.write(a, 0, b"first").unwrap();
    vol.sync().unwrap();
    let b = vol.create(root, b"b", 0o644, 0, 0).unwrap().ino;
    vol.write(b, 0, b"second, synced").unwrap();
    vol.sync().unwrap();
    // Stop as a crash would: no clean close, so the newest commit is b's delta.
    vol.poison();
    drop(vol);
    let sb = dxfs::read_superblock(&*dev).unwrap();
    // Damage the newest valid commit block (the one with the higher sequence number).
    let seq_of = |area: u64| {
        let mut blk = [0u8; BLOCK_SIZE];
        dev.read(area, &mut blk).unwrap();
        u64::from_le_bytes(blk[16..24].try_into().unwrap())
    };
    let (a0, a1) = (
        sb.layout.bitmap_start - 2 * u64::from(sb.layout.log_blocks),
        sb.layout.bitmap_start - u64::from(sb.layout.log_blocks),
    );
    let newest = if seq_of(a0) > seq_of(a1) { a0 } else { a1 };
    let mut blk = [0u8; BLOCK_SIZE];
    dev.read(newest, &mut blk).unwrap();
    blk[100] ^= 0xFF;
    dev.write(newest, &blk).unwrap();
    match Volume::open(dev.clone(), OpenOptions::default()) {
        Err(Error::Corrupt(m)) => assert!(m.contains("damaged") && m.contains("rollback"), "{m}"),
        r => panic!("a silent rollback: {:?}", r.map(|_| ())),
    }
    let r = dxfs::fsck::check(dev.clone(), false, &mut |_| {}).unwrap();
    assert_eq!(r.exit_code(), 4, "fsck reports it: {r:?}");
    // Allowed explicitly, the volume opens as of the older delta: `a` is there.
    let vol = Volume::open(dev.clone(), OpenOptions { allow_rollback: true, ..Default::default() }).unwrap();
    assert_eq!(vol.read(vol.lookup(root, b"a").unwrap().ino, 0, 100).unwrap(), b"first");
    close_and_check(dev, vol);
}
