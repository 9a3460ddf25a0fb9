//! Read-ahead of file data for sequential readers (`volume/ahead.rs`): what a sequential
//! reader gets is always the file's content, whatever changes between its reads
//! (overwrites left dirty, written back, committed, blocks freed and used again, punched
//! holes, truncation), compared with a byte model; and read-ahead does serve reads.

mod common;

use common::*;

/// A small deterministic generator (xorshift), so a failure replays.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

const PIECE: usize = 128 * 1024;
const FILE: usize = 32 * PIECE;

/// Sequential passes over a file in pieces of 128 KiB, with a random change to the file
/// between some reads; every piece read is compared with the model.
#[test]
fn sequential_reads_see_every_change_made_between_them() {
    let (dev, vol) = mem_volume(16384);
    let f = vol.create(vol.root(), b"f", 0o644, 0, 0).unwrap().ino;
    let mut model: Vec<u8> = (0..FILE).map(|i| (i / 4096) as u8 ^ (i % 251) as u8).collect();
    vol.write(f, 0, &model).unwrap();
    vol.sync().unwrap();
    let mut rng = Rng(0x9E37_79B9_7F4A_7C15);
    let mut stamp = 1u8;
    for pass in 0..12 {
        let mut offset = 0usize;
        while offset < model.len() {
            let got = vol.read(f, offset as u64, PIECE).unwrap();
            if rng.below(2) == 0 {
                vol.settle_read_ahead();
            }
            let want = &model[offset..(offset + PIECE).min(model.len())];
            assert!(got == want, "pass {pass}: the piece at {offset} differs from the model");
            offset += got.len().max(1);
            if rng.below(3) != 0 {
                continue;
            }
            // A change, most often to the part about to be read (read ahead already).
            let at = if rng.below(2) == 0 { offset as u64 + rng.below(PIECE as u64) } else { rng.below(FILE as u64) };
            let len = 1 + rng.below(3 * 4096) as usize;
            stamp = stamp.wrapping_add(1);
            match rng.below(6) {
                0..=2 => {
                    let data = vec![stamp; len];
                    vol.write(f, at, &data).unwrap();
                    let end = at as usize + len;
                    if end > model.len() {
                        model.resize(end, 0);
                    }
                    model[at as usize..end].copy_from_slice(&data);
                }
                3 => {
                    // Punch whole pages: their blocks are freed and used again later.
                    let (p, n) = (at / 4096 * 4096, (len as u64).div_ceil(4096) * 4096);
                    if p + n <= model.len() as u64 {
                        vol.fallocate(f, p, n, true, true).unwrap();
                        model[p as usize..(p + n) as usize].fill(0);
                    }
                }
                _ => {}
            }
            match rng.below(3) {
                0 => vol.sync().unwrap(),
                1 => vol.fsync(f).unwrap(),
                _ => {}
            }
        }
        if pass % 4 == 3 {
            // Shorter, then back to the full length with zeros.
            let cut = FILE - PIECE / 2 - rng.below(PIECE as u64) as usize;
            vol.setattr(f, &dxfs::SetAttr { size: Some(cut as u64), ..Default::default() }).unwrap();
            model.truncate(cut);
            vol.setattr(f, &dxfs::SetAttr { size: Some(FILE as u64), ..Default::default() }).unwrap();
            model.resize(FILE, 0);
        }
    }
    assert!(vol.read_ahead_hits() > 0, "sequential reads were never served from read-ahead");
    close_and_check(dev, vol);
}

/// A read-ahead's piece serves the read that continues the stream, and only it: a read
/// elsewhere in the file, or of another file, reads the device as before.
#[test]
fn read_ahead_serves_only_the_read_that_continues_the_stream() {
    let (dev, vol) = mem_volume(8192);
    let root = vol.root();
    let a = vol.create(root, b"a", 0o644, 0, 0).unwrap().ino;
    let b = vol.create(root, b"b", 0o644, 0, 0).unwrap().ino;
    let da: Vec<u8> = (0..8 * PIECE).map(|i| (i % 253) as u8).collect();
    let db: Vec<u8> = (0..8 * PIECE).map(|i| (i % 241) as u8 ^ 0x5A).collect();
    vol.write(a, 0, &da).unwrap();
    vol.write(b, 0, &db).unwrap();
    vol.sync().unwrap();
    // Two reads in a row start the stream; the third is read ahead.
    assert_eq!(vol.read(a, 0, PIECE).unwrap(), &da[..PIECE]);
    assert_eq!(vol.read(a, PIECE as u64, PIECE).unwrap(), &da[PIECE..2 * PIECE]);
    let before = vol.read_ahead_hits();
    // Another file at the same offset, and the same file elsewhere: not from the piece.
    assert_eq!(vol.read(b, 2 * PIECE as u64, PIECE).unwrap(), &db[2 * PIECE..3 * PIECE]);
    assert_eq!(vol.read(a, 5 * PIECE as u64, PIECE).unwrap(), &da[5 * PIECE..6 * PIECE]);
    assert_eq!(vol.read_ahead_hits(), before);
    // Back in order: 6, 7 follow 5, so the read after them comes from read-ahead.
    assert_eq!(vol.read(a, 6 * PIECE as u64, PIECE).unwrap(), &da[6 * PIECE..7 * PIECE]);
    assert_eq!(vol.read(a, 7 * PIECE as u64, PIECE).unwrap(), &da[7 * PIECE..]);
    assert!(vol.read_ahead_hits() > before, "the read that continued the stream was read ahead");
    // Past the end: nothing.
    assert!(vol.read(a, 8 * PIECE as u64, PIECE).unwrap().is_empty());
    close_and_check(dev, vol);
}

/// A block read ahead, freed and then used again by the same page of the same file
/// before the read that takes the piece: the read returns the page's new content. (Redirect
/// on write moves an overwritten page to another block, and its next overwrite takes the
/// first block back, the one right after the page before it, so only the delta's epoch
/// tells the piece is stale.)
#[test]
fn a_block_used_again_after_read_ahead_is_read_anew() {
    let (dev, vol) = mem_volume(8192);
    let f = vol.create(vol.root(), b"f", 0o644, 0, 0).unwrap().ino;
    let mut model: Vec<u8> = (0..4 * PIECE).map(|i| (i % 239) as u8).collect();
    vol.write(f, 0, &model).unwrap();
    vol.sync().unwrap();
    assert_eq!(vol.read(f, 0, PIECE).unwrap(), &model[..PIECE]);
    assert_eq!(vol.read(f, PIECE as u64, PIECE).unwrap(), &model[PIECE..2 * PIECE]);
    // The piece at 2 × PIECE is read ahead. Overwrite one of its pages twice, committing
    // each time: the page moves away from its block, then back to it.
    vol.settle_read_ahead();
    let page = 2 * PIECE + 5 * 4096;
    for fill in [0xA1u8, 0xB2] {
        vol.write(f, page as u64, &[fill; 4096]).unwrap();
        model[page..page + 4096].fill(fill);
        vol.sync().unwrap();
    }
    let got = vol.read(f, 2 * PIECE as u64, PIECE).unwrap();
    assert!(got == model[2 * PIECE..3 * PIECE], "the piece read ahead before the overwrites was used");
    close_and_check(dev, vol);
}

/// A sequential reader beside a writer that overwrites whole pages and commits: every
/// page read is one the writer wrote at that place (each carries its page number and a
/// version), never another page's block or a mix, and no page goes back to an older
/// version than the reader saw before.
#[test]
fn a_reader_beside_a_writer_and_its_commits_reads_only_whole_current_pages() {
    const PAGES: u64 = (FILE / 4096) as u64;
    let page = |p: u64, version: u64| -> Vec<u8> {
        let mut b = Vec::with_capacity(4096);
        while b.len() < 4096 {
            b.extend_from_slice(&p.to_le_bytes());
            b.extend_from_slice(&version.to_le_bytes());
        }
        b
    };
    let (dev, vol) = mem_volume(16384);
    let f = vol.create(vol.root(), b"f", 0o644, 0, 0).unwrap().ino;
    for p in 0..PAGES {
        vol.write(f, p * 4096, &page(p, 0)).unwrap();
    }
    vol.sync().unwrap();
    let done = std::sync::atomic::AtomicBool::new(false);
    std::thread::scope(|s| {
        s.spawn(|| {
            let mut rng = Rng(0xD1B5_4A32_D192_ED03);
            for version in 1..=3000u64 {
                let p = rng.below(PAGES);
                vol.write(f, p * 4096, &page(p, version)).unwrap();
                if version % 50 == 0 {
                    vol.sync().unwrap();
                }
            }
            done.store(true, std::sync::atomic::Ordering::Release);
        });
        let mut seen = vec![0u64; PAGES as usize];
        let mut passes = 0;
        while !done.load(std::sync::atomic::Ordering::Acquire) || passes < 2 {
            for piece in 0..(FILE / PIECE) as u64 {
                let got = vol.read(f, piece * PIECE as u64, PIECE).unwrap();
                assert_eq!(got.len(), PIECE);
                for (k, b) in got.chunks(4096).enumerate() {
                    let p = piece * (PIECE / 4096) as u64 + k as u64;
                    let version = u64::from_le_bytes(b[8..16].try_into().unwrap());
                    assert!(b == page(p, version), "page {p}: not a whole page written there");
                    assert!(version >= seen[p as usize], "page {p} went back from {} to {version}", seen[p as usize]);
                    seen[p as usize] = version;
                }
            }
            passes += 1;
        }
    });
    assert!(vol.read_ahead_hits() > 0);
    close_and_check(dev, vol);
}

/// `OpenOptions::data_readahead` off (`-o nodata_readahead`): the same sequential reads,
/// the same bytes, nothing read ahead.
#[test]
fn read_ahead_off_reads_nothing_ahead() {
    use dxfs::block::MemDevice;
    use std::sync::Arc;
    let dev = Arc::new(MemDevice::new(8192));
    dxfs::mkfs(dev.clone(), &dxfs::MkfsOptions::default()).unwrap();
    let opts = dxfs::OpenOptions { data_readahead: false, ..Default::default() };
    let vol = dxfs::Volume::open(dev.clone(), opts).unwrap();
    let f = vol.create(vol.root(), b"f", 0o644, 0, 0).unwrap().ino;
    let data: Vec<u8> = (0..8 * PIECE).map(|i| (i % 233) as u8).collect();
    vol.write(f, 0, &data).unwrap();
    vol.sync().unwrap();
    for k in 0..8 {
        assert_eq!(vol.read(f, (k * PIECE) as u64, PIECE).unwrap(), &data[k * PIECE..(k + 1) * PIECE]);
    }
    assert_eq!(vol.read_ahead_hits(), 0);
    close_and_check(dev, vol);
}

/// Reads for the kernel's page cache (`kernel_reads_ahead`: the kernel reads ahead for
/// them itself) are not followed; `O_DIRECT` readers' are. Same bytes either way.
#[test]
fn reads_the_kernel_reads_ahead_for_are_not_followed() {
    let (dev, vol) = mem_volume(8192);
    let f = vol.create(vol.root(), b"f", 0o644, 0, 0).unwrap().ino;
    let data: Vec<u8> = (0..8 * PIECE).map(|i| (i % 239) as u8).collect();
    vol.write(f, 0, &data).unwrap();
    vol.sync().unwrap();
    let mut out = vec![0u8; PIECE];
    for k in 0..8 {
        assert_eq!(vol.read_into(f, (k * PIECE) as u64, &mut out, true).unwrap(), PIECE);
        assert_eq!(out, &data[k * PIECE..(k + 1) * PIECE]);
    }
    assert_eq!(vol.read_ahead_hits(), 0, "a page-cache reader was read ahead for");
    for k in 0..8 {
        let b = vol.read_aligned(f, (k * PIECE) as u64, PIECE, false).unwrap();
        assert_eq!(&b[..], &data[k * PIECE..(k + 1) * PIECE]);
    }
    assert!(vol.read_ahead_hits() > 0, "an O_DIRECT reader was not read ahead for");
    close_and_check(dev, vol);
}
