//! A fault-injecting block device for crash tests: records every write and flush in
//! order, stops the machine after a chosen write, and rebuilds every image a power
//! failure could have left (see docs/DESIGN.md, "Assumptions about the device").

use std::fmt;
use std::io;
use std::sync::Arc;

use parking_lot::Mutex;

use super::codec::{Block, BLOCK_SIZE};
use super::device::{check_request, mem_range, pad_to_blocks, BlockDevice, Counters, IoStats};
use crate::error::{Error, Result};

/// Which of the recorded writes a crash image keeps. See [`FaultDevice::crash_image`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CrashMode {
    /// Every write issued before the crash reached the disk.
    All,
    /// Only the durable prefix: writes before the last flush that completed.
    DropUnflushed,
    /// Every write but the last reached the disk; of the last, only its first half.
    Torn,
    /// The durable prefix plus a pseudo-random subset (deterministic for the seed) of
    /// the later writes, applied in order.
    DropRandomUnflushed(u64),
    /// The durable prefix plus only the newest `n` writes before the crash: the older
    /// unflushed writes are lost while the newer ones arrived, as a device that reorders
    /// writes between flushes may leave it.
    NewestUnflushed(usize),
}

/// One recorded block write.
type Record = (u64, Arc<Block>);

/// Bytes of a torn write that reach the disk.
const TORN_BYTES: usize = BLOCK_SIZE / 2;

/// The mutable part of a [`FaultDevice`], under one lock so writes and flushes are
/// recorded in a single global order.
struct FaultState {
    /// The image with every recorded write applied; what reads see.
    current: Vec<u8>,
    /// Every block write since creation, in order.
    writes: Vec<Record>,
    /// Number of writes recorded before each flush.
    flushes: Vec<usize>,
    /// Writes made with `write_durable` (forced unit access): for each of their block
    /// records, its index and the number of records once the whole request was recorded.
    /// Durable once the request completed, without making earlier writes durable.
    fua: Vec<(usize, usize)>,
    /// Writes and flushes fail once this many writes are recorded.
    cut_after: Option<usize>,
}

impl FaultState {
    fn cut(&self) -> bool {
        self.cut_after.is_some_and(|n| self.writes.len() >= n)
    }
}

/// An in-memory device for crash tests: records every block write and flush in order,
/// can simulate the machine stopping after a number of writes, and rebuilds the images
/// a power failure could have left.
///
/// A multi-block write is recorded as one event per block, so crashes and tears happen
/// at 4 KiB granularity. Reads see every write applied so far, like a device with a
/// volatile cache.
pub struct FaultDevice {
    base: Vec<u8>,
    blocks: u64,
    state: Mutex<FaultState>,
    counters: Counters,
}

fn crashed() -> Error {
    Error::Io(io::Error::other("injected crash"))
}

/// Whether write `index` survives in [`CrashMode::DropRandomUnflushed`] with `seed`.
/// Depends only on (seed, index), so the choice is stable whatever crash point is asked.
fn survives(seed: u64, index: usize) -> bool {
    splitmix64(seed ^ splitmix64(index as u64)) & 1 == 1
}

/// SplitMix64 finalizer: a fixed, dependency-free hash, so seeds mean the same forever.
fn splitmix64(x: u64) -> u64 {
    let mut z = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// Number of writes durable at crash point `at`: the count recorded at the last flush
/// with count < `at`. A crash at `at` strikes after write `at - 1` was issued and before
/// anything issued after it completed, so a flush recorded right after that write has
/// not completed yet: the crash between the last write of an epoch and its flush is the
/// one that matters most, and it must be representable.
fn durable_prefix(flushes: &[usize], at: usize) -> usize {
    let i = flushes.partition_point(|&f| f < at);
    if i == 0 {
        0
    } else {
        flushes[i - 1]
    }
}

/// Whether record `i` belongs to a forced-unit-access write that completed before crash
/// point `at` (as for a flush recorded at count `f`: completed when `f < at`).
fn fua_done(fua: &[(usize, usize)], i: usize, at: usize) -> bool {
    let k = fua.partition_point(|&(j, _)| j < i);
    fua.get(k).is_some_and(|&(j, end)| j == i && end < at)
}

/// Whether a forced-unit-access write at or after record `from` completed before `at`.
fn fua_after(fua: &[(usize, usize)], from: usize, at: usize) -> bool {
    let k = fua.partition_point(|&(j, _)| j < from);
    fua[k..].iter().any(|&(_, end)| end < at)
}

fn apply(img: &mut [u8], (block, data): &Record) {
    img[mem_range(*block, BLOCK_SIZE)].copy_from_slice(&data[..]);
}

fn apply_torn(img: &mut [u8], (block, data): &Record) {
    let start = *block as usize * BLOCK_SIZE;
    img[start..start + TORN_BYTES].copy_from_slice(&data[..TORN_BYTES]);
}

/// `base` with the writes of `writes` for which `keep(index)` holds applied in order.
/// Copies each touched block once (its last kept write), so cost is one image copy plus
/// a scan of the indices, not one block copy per write.
fn build_image(base: &[u8], writes: &[Record], keep: impl Fn(usize) -> bool) -> Vec<u8> {
    let mut last = vec![usize::MAX; base.len() / BLOCK_SIZE];
    for (i, (block, _)) in writes.iter().enumerate() {
        if keep(i) {
            last[*block as usize] = i;
        }
    }
    let mut img = base.to_vec();
    for &i in last.iter().filter(|&&i| i != usize::MAX) {
        apply(&mut img, &writes[i]);
    }
    img
}

impl FaultDevice {
    /// A device whose image starts as `base_image` (a partial last block is padded with
    /// zeros). Recording starts empty, with no cut.
    pub fn new(base_image: Vec<u8>) -> FaultDevice {
        let base = pad_to_blocks(base_image);
        FaultDevice {
            blocks: (base.len() / BLOCK_SIZE) as u64,
            state: Mutex::new(FaultState {
                current: base.clone(),
                writes: Vec::new(),
                flushes: Vec::new(),
                fua: Vec::new(),
                cut_after: None,
            }),
            base,
            counters: Counters::default(),
        }
    }

    /// Number of recorded block writes (a write of several blocks counts once per block).
    pub fn events(&self) -> usize {
        self.state.lock().writes.len()
    }

    /// After `n` recorded block writes, every further write and flush fails with
    /// `Error::Io("injected crash")` and is not recorded. A write that crosses the cut
    /// records its blocks up to the cut, then fails. `None` lifts the cut.
    pub fn set_cut_after(&self, n: Option<usize>) {
        self.state.lock().cut_after = n;
    }

    /// The write indices at which flushes happened: the number of writes recorded
    /// before each flush, in order.
    pub fn flush_points(&self) -> Vec<usize> {
        self.state.lock().flushes.clone()
    }

    /// The current image, with every recorded write applied (what reads see).
    pub fn to_bytes(&self) -> Vec<u8> {
        self.state.lock().current.clone()
    }

    /// The image as it could be on disk if power failed after the first `at` block
    /// writes were issued:
    /// - [`CrashMode::All`]: all `at` writes applied;
    /// - [`CrashMode::DropUnflushed`]: only writes before the last flush recorded at or
    ///   before `at` (the durable prefix);
    /// - [`CrashMode::Torn`]: all writes before `at - 1`, and only the first 2048 bytes
    ///   of write `at - 1` (the base image when `at` is 0);
    /// - [`CrashMode::DropRandomUnflushed`]: the durable prefix plus a seeded
    ///   pseudo-random subset of writes `durable..at`, applied in order.
    ///
    /// In the two modes that drop writes, a write made with
    /// [`BlockDevice::write_durable`] is kept once it completed (`at` past its last
    /// block), whatever the flushes.
    ///
    /// # Panics
    /// If `at` exceeds [`events`](Self::events): no such crash point exists.
    pub fn crash_image(&self, at: usize, mode: CrashMode) -> Vec<u8> {
        let st = self.state.lock();
        assert!(at <= st.writes.len(), "crash point {at} beyond the {} recorded writes", st.writes.len());
        let writes = &st.writes[..at];
        match mode {
            CrashMode::All => build_image(&self.base, writes, |_| true),
            CrashMode::DropUnflushed => {
                let d = durable_prefix(&st.flushes, at);
                build_image(&self.base, writes, |i| i < d || fua_done(&st.fua, i, at))
            }
            CrashMode::Torn => match writes.split_last() {
                None => self.base.clone(),
                Some((last, before)) => {
                    let mut img = build_image(&self.base, before, |_| true);
                    apply_torn(&mut img, last);
                    img
                }
            },
            CrashMode::DropRandomUnflushed(seed) => {
                let d = durable_prefix(&st.flushes, at);
                build_image(&self.base, writes, |i| i < d || survives(seed, i) || fua_done(&st.fua, i, at))
            }
            CrashMode::NewestUnflushed(n) => {
                let d = durable_prefix(&st.flushes, at);
                build_image(&self.base, writes, |i| i < d || i + n >= at || fua_done(&st.fua, i, at))
            }
        }
    }

    /// Every crash image of the writes recorded so far, `(at, image)` for `at` in
    /// `0..=events()`, each equal to `crash_image(at, mode)`. Built incrementally (about
    /// one block of work plus one image copy per step), so enumerating thousands of
    /// crash points is cheap. Later writes to the device are not seen.
    pub fn crash_images(&self, mode: CrashMode) -> CrashImages {
        let st = self.state.lock();
        CrashImages {
            base: self.base.clone(),
            writes: st.writes.clone(),
            flushes: st.flushes.clone(),
            fua: st.fua.clone(),
            mode,
            next_at: 0,
            cur: self.base.clone(),
            durable: match mode {
                CrashMode::DropRandomUnflushed(_) => self.base.clone(),
                _ => Vec::new(),
            },
            durable_len: 0,
            applied: 0,
        }
    }
}

impl FaultDevice {
    /// Record one write request, a block at a time; fails at the cut.
    fn record(&self, st: &mut FaultState, block: u64, buf: &[u8]) -> Result<()> {
        for (blk, chunk) in (block..).zip(buf.chunks_exact(BLOCK_SIZE)) {
            // The machine stops mid-request: blocks before the cut are on record.
            if st.cut() {
                return Err(crashed());
            }
            let mut data: Block = [0; BLOCK_SIZE];
            data.copy_from_slice(chunk);
            let record = (blk, Arc::new(data));
            apply(&mut st.current, &record);
            st.writes.push(record);
        }
        Ok(())
    }
}

impl fmt::Debug for FaultDevice {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let st = self.state.lock();
        f.debug_struct("FaultDevice")
            .field("blocks", &self.blocks)
            .field("events", &st.writes.len())
            .field("flushes", &st.flushes.len())
            .field("cut_after", &st.cut_after)
            .finish()
    }
}

impl BlockDevice for FaultDevice {
    fn block_count(&self) -> u64 {
        self.blocks
    }

    fn read(&self, block: u64, buf: &mut [u8]) -> Result<()> {
        let n = check_request("read", block, buf.len(), self.blocks)?;
        buf.copy_from_slice(&self.state.lock().current[mem_range(block, buf.len())]);
        self.counters.read(n);
        Ok(())
    }

    fn write(&self, block: u64, buf: &[u8]) -> Result<()> {
        let n = check_request("write", block, buf.len(), self.blocks)?;
        self.record(&mut self.state.lock(), block, buf)?;
        self.counters.write(n);
        Ok(())
    }

    fn write_durable(&self, block: u64, buf: &[u8]) -> Result<()> {
        let n = check_request("write", block, buf.len(), self.blocks)?;
        let mut st = self.state.lock();
        let start = st.writes.len();
        self.record(&mut st, block, buf)?;
        let end = st.writes.len();
        st.fua.extend((start..end).map(|i| (i, end)));
        self.counters.write(n);
        Ok(())
    }

    fn flush(&self) -> Result<()> {
        let mut st = self.state.lock();
        if st.cut() {
            return Err(crashed());
        }
        let n = st.writes.len();
        st.flushes.push(n);
        self.counters.flush();
        Ok(())
    }

    fn stats(&self) -> IoStats {
        self.counters.snapshot()
    }
}

/// Iterator over the crash images of a [`FaultDevice`]; see
/// [`FaultDevice::crash_images`].
pub struct CrashImages {
    base: Vec<u8>,
    writes: Vec<Record>,
    flushes: Vec<usize>,
    fua: Vec<(usize, usize)>,
    mode: CrashMode,
    /// The crash point the next item is for.
    next_at: usize,
    /// Working image; what it holds depends on the mode (see `next`).
    cur: Vec<u8>,
    /// DropRandomUnflushed only: base plus writes `..durable_len`.
    durable: Vec<u8>,
    /// Writes applied to the durable image (DropUnflushed: to `cur`).
    durable_len: usize,
    /// Writes considered in `cur` (All, Torn, DropRandomUnflushed).
    applied: usize,
}

impl Iterator for CrashImages {
    type Item = (usize, Vec<u8>);

    fn next(&mut self) -> Option<(usize, Vec<u8>)> {
        let at = self.next_at;
        if at > self.writes.len() {
            return None;
        }
        self.next_at += 1;
        if let CrashMode::NewestUnflushed(n) = self.mode {
            // Built from scratch each time (tests use few of these).
            let d = durable_prefix(&self.flushes, at);
            let (fua, writes) = (&self.fua, &self.writes[..at]);
            return Some((at, build_image(&self.base, writes, |i| i < d || i + n >= at || fua_done(fua, i, at))));
        }
        if let CrashMode::DropUnflushed | CrashMode::DropRandomUnflushed(_) = self.mode {
            let d = durable_prefix(&self.flushes, at);
            if fua_after(&self.fua, d, at) {
                // Rare (between a forced-unit-access write and the next flush): built
                // from scratch, leaving the incremental state for the other points.
                let seed = match self.mode {
                    CrashMode::DropRandomUnflushed(seed) => Some(seed),
                    _ => None,
                };
                let (fua, writes) = (&self.fua, &self.writes[..at]);
                let img = build_image(&self.base, writes, |i| {
                    i < d || fua_done(fua, i, at) || seed.is_some_and(|s| survives(s, i))
                });
                return Some((at, img));
            }
        }
        let img = match self.mode {
            // cur = writes ..at.
            CrashMode::All => {
                while self.applied < at {
                    apply(&mut self.cur, &self.writes[self.applied]);
                    self.applied += 1;
                }
                self.cur.clone()
            }
            // cur = writes ..at-1, then the torn one on a copy.
            CrashMode::Torn => {
                if at == 0 {
                    self.cur.clone()
                } else {
                    while self.applied < at - 1 {
                        apply(&mut self.cur, &self.writes[self.applied]);
                        self.applied += 1;
                    }
                    let mut img = self.cur.clone();
                    apply_torn(&mut img, &self.writes[at - 1]);
                    img
                }
            }
            // cur = writes ..durable.
            CrashMode::DropUnflushed => {
                let d = durable_prefix(&self.flushes, at);
                while self.durable_len < d {
                    apply(&mut self.cur, &self.writes[self.durable_len]);
                    self.durable_len += 1;
                }
                self.cur.clone()
            }
            // cur = durable image + surviving writes durable..at.
            CrashMode::DropRandomUnflushed(seed) => {
                let d = durable_prefix(&self.flushes, at);
                if d > self.durable_len {
                    while self.durable_len < d {
                        apply(&mut self.durable, &self.writes[self.durable_len]);
                        self.durable_len += 1;
                    }
                    // A new flush: dropped writes before it are now on disk after all.
                    self.cur.copy_from_slice(&self.durable);
                    self.applied = d;
                }
                while self.applied < at {
                    if survives(seed, self.applied) {
                        apply(&mut self.cur, &self.writes[self.applied]);
                    }
                    self.applied += 1;
                }
                self.cur.clone()
            }
            CrashMode::NewestUnflushed(_) => unreachable!("built from scratch above"),
        };
        Some((at, img))
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        let left = (self.writes.len() + 1).saturating_sub(self.next_at);
        (left, Some(left))
    }
}

impl ExactSizeIterator for CrashImages {}

impl fmt::Debug for CrashImages {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CrashImages")
            .field("mode", &self.mode)
            .field("next_at", &self.next_at)
            .field("events", &self.writes.len())
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::disk::device::tests::{blk, exercise, pattern};

    #[test]
    fn fault_device_round_trip_and_per_block_events() {
        let dev = FaultDevice::new(vec![0; 8 * BLOCK_SIZE]);
        assert_eq!(dev.events(), 0);
        exercise(&dev);
        // exercise: one 3-block write and one 1-block write, then a flush.
        assert_eq!(dev.events(), 4);
        assert_eq!(dev.flush_points(), vec![4]);
        assert_eq!(dev.stats().writes, 2);
        assert_eq!(dev.to_bytes(), dev.crash_image(4, CrashMode::All));
        // Crash point 1: only the first block of the 3-block write.
        let img = dev.crash_image(1, CrashMode::All);
        assert_eq!(blk(&img, 2), &[10u8; BLOCK_SIZE][..]);
        assert!(img[3 * BLOCK_SIZE..].iter().all(|&b| b == 0));
    }

    #[test]
    fn fault_cut_after_stops_writes_and_flushes() {
        let dev = FaultDevice::new(vec![0; 8 * BLOCK_SIZE]);
        dev.set_cut_after(Some(2));
        dev.write(0, &pattern(1, 1)).unwrap();
        // Crosses the cut: block 1 is recorded, blocks 2 and 3 are not.
        let err = dev.write(1, &pattern(3, 5)).unwrap_err();
        assert!(matches!(err, Error::Io(ref e) if e.to_string() == "injected crash"));
        assert_eq!(dev.events(), 2);
        let err = dev.flush().unwrap_err();
        assert!(matches!(err, Error::Io(ref e) if e.to_string() == "injected crash"));
        assert!(dev.write(7, &pattern(1, 9)).is_err());
        assert_eq!(dev.events(), 2);
        assert!(dev.flush_points().is_empty());
        // Reads still work and see exactly what was recorded.
        let mut buf = vec![0u8; 4 * BLOCK_SIZE];
        dev.read(0, &mut buf).unwrap();
        let mut want = pattern(2, 0);
        want[..BLOCK_SIZE].fill(1);
        want[BLOCK_SIZE..].fill(5);
        want.extend_from_slice(&[0u8; 2 * BLOCK_SIZE]);
        assert_eq!(buf, want);
        assert_eq!(dev.stats().writes, 1, "failed requests are not counted");
        assert_eq!(dev.stats().flushes, 0);

        // Lifting the cut lets I/O resume.
        dev.set_cut_after(None);
        dev.write(7, &pattern(1, 9)).unwrap();
        dev.flush().unwrap();
        assert_eq!(dev.events(), 3);
        assert_eq!(dev.flush_points(), vec![3]);

        // A cut at or below the current count stops everything at once.
        dev.set_cut_after(Some(0));
        assert!(dev.write(0, &pattern(1, 1)).is_err());
        assert!(dev.flush().is_err());
        assert_eq!(dev.events(), 3);
    }

    const A: u8 = 0xA1;
    const B: u8 = 0xB2;
    const C: u8 = 0xC3;
    const D: u8 = 0xD4;
    const E: u8 = 0xEE;

    /// write A@1, write B@2, flush, write C@1, write D@3 on a 4-block image of 0xEE.
    fn traced() -> FaultDevice {
        let dev = FaultDevice::new(vec![E; 4 * BLOCK_SIZE]);
        dev.write(1, &[A; BLOCK_SIZE]).unwrap();
        dev.write(2, &[B; BLOCK_SIZE]).unwrap();
        dev.flush().unwrap();
        dev.write(1, &[C; BLOCK_SIZE]).unwrap();
        dev.write(3, &[D; BLOCK_SIZE]).unwrap();
        assert_eq!(dev.events(), 4);
        assert_eq!(dev.flush_points(), vec![2]);
        dev
    }

    /// An image from per-block contents: each block is `(bytes 0..2048, bytes 2048..4096)`
    /// (literal sizes, independent of the code under test).
    fn image(blocks: [(u8, u8); 4]) -> Vec<u8> {
        let mut img = Vec::new();
        for (lo, hi) in blocks {
            img.extend_from_slice(&[lo; 2048]);
            img.extend_from_slice(&[hi; 4096 - 2048]);
        }
        img
    }

    fn full(b: u8) -> (u8, u8) {
        (b, b)
    }

    fn check_all_points(dev: &FaultDevice, mode: CrashMode, want: &[Vec<u8>]) {
        assert_eq!(want.len(), dev.events() + 1);
        for (at, w) in want.iter().enumerate() {
            assert!(dev.crash_image(at, mode) == *w, "{mode:?} crash_image at {at} differs");
        }
        let got: Vec<(usize, Vec<u8>)> = dev.crash_images(mode).collect();
        assert_eq!(got.len(), want.len());
        for ((at, img), (i, w)) in got.iter().zip(want.iter().enumerate()) {
            assert_eq!(*at, i);
            assert!(img == w, "{mode:?} crash_images at {at} differs");
        }
    }

    #[test]
    fn fault_crash_mode_all_hand_traced() {
        let e = full(E);
        check_all_points(
            &traced(),
            CrashMode::All,
            &[
                image([e, e, e, e]),
                image([e, full(A), e, e]),
                image([e, full(A), full(B), e]),
                image([e, full(C), full(B), e]),
                image([e, full(C), full(B), full(D)]),
            ],
        );
    }

    #[test]
    fn fault_crash_mode_drop_unflushed_hand_traced() {
        let e = full(E);
        let flushed = image([e, full(A), full(B), e]);
        check_all_points(
            &traced(),
            CrashMode::DropUnflushed,
            &[image([e, e, e, e]), image([e, e, e, e]), image([e, e, e, e]), flushed.clone(), flushed],
        );
    }

    /// A forced-unit-access write is durable once it completed, alone: the unflushed
    /// write before it is not, nor the one after.
    #[test]
    fn fault_write_durable_hand_traced() {
        let dev = FaultDevice::new(vec![E; 4 * BLOCK_SIZE]);
        dev.write(1, &[A; BLOCK_SIZE]).unwrap();
        dev.flush().unwrap();
        dev.write(2, &[B; BLOCK_SIZE]).unwrap();
        dev.write_durable(1, &[C; BLOCK_SIZE]).unwrap();
        dev.write(3, &[D; BLOCK_SIZE]).unwrap();
        assert_eq!((dev.events(), dev.flush_points(), dev.stats().flushes), (4, vec![1], 1));
        let e = full(E);
        check_all_points(
            &dev,
            CrashMode::DropUnflushed,
            &[
                image([e, e, e, e]),
                image([e, e, e, e]),
                image([e, full(A), e, e]),
                image([e, full(A), e, e]),
                image([e, full(C), e, e]),
            ],
        );
        for seed in 0..16 {
            let mode = CrashMode::DropRandomUnflushed(seed);
            let all: Vec<(usize, Vec<u8>)> = dev.crash_images(mode).collect();
            for (at, img) in &all {
                assert!(*img == dev.crash_image(*at, mode), "seed {seed} at {at}");
            }
            assert!(blk(&all[4].1, 1) == [C; BLOCK_SIZE], "seed {seed}: the completed FUA write is durable");
        }
        // A later flush covers everything; a cut write_durable records nothing as durable.
        dev.flush().unwrap();
        dev.write(0, &[A; BLOCK_SIZE]).unwrap();
        assert!(dev.crash_image(5, CrashMode::DropUnflushed) == image([e, full(C), full(B), full(D)]));
        dev.set_cut_after(Some(5));
        assert!(dev.write_durable(0, &[A; BLOCK_SIZE]).is_err());
    }

    #[test]
    fn fault_crash_mode_torn_hand_traced() {
        let e = full(E);
        check_all_points(
            &traced(),
            CrashMode::Torn,
            &[
                image([e, e, e, e]),
                image([e, (A, E), e, e]),
                image([e, full(A), (B, E), e]),
                image([e, (C, A), full(B), e]),
                image([e, full(C), full(B), (D, E)]),
            ],
        );
    }

    #[test]
    fn fault_crash_mode_drop_random_hand_traced() {
        let e = full(E);
        let mut seen = std::collections::HashSet::new();
        for seed in 0..64u64 {
            // Before the flush completes, A and B (writes 0, 1) are themselves unflushed.
            let a1 = if survives(seed, 0) { full(A) } else { e };
            let b2 = if survives(seed, 1) { full(B) } else { e };
            let keep_c = survives(seed, 2);
            let keep_d = survives(seed, 3);
            seen.insert((keep_c, keep_d));
            let b1 = if keep_c { full(C) } else { full(A) };
            let b3 = if keep_d { full(D) } else { e };
            check_all_points(
                &traced(),
                CrashMode::DropRandomUnflushed(seed),
                &[
                    image([e, e, e, e]),
                    image([e, a1, e, e]),
                    image([e, a1, b2, e]),
                    image([e, b1, full(B), e]),
                    image([e, b1, full(B), b3]),
                ],
            );
        }
        assert_eq!(seen.len(), 4, "seeds never produced some subset of {{C, D}}");
    }

    #[test]
    fn fault_drop_random_applies_unflushed_writes_in_order() {
        // Two unflushed writes to the same block: when both survive, the later wins.
        let seed = (0..1000u64).find(|&s| survives(s, 0) && survives(s, 1)).unwrap();
        let dev = FaultDevice::new(vec![0; BLOCK_SIZE]);
        dev.write(0, &[1; BLOCK_SIZE]).unwrap();
        dev.write(0, &[2; BLOCK_SIZE]).unwrap();
        let mode = CrashMode::DropRandomUnflushed(seed);
        assert_eq!(dev.crash_image(2, mode), vec![2; BLOCK_SIZE]);
        assert_eq!(dev.crash_images(mode).last().unwrap().1, vec![2; BLOCK_SIZE]);
        // And a seed that drops the later one keeps the earlier.
        let seed = (0..1000u64).find(|&s| survives(s, 0) && !survives(s, 1)).unwrap();
        let mode = CrashMode::DropRandomUnflushed(seed);
        assert_eq!(dev.crash_image(2, mode), vec![1; BLOCK_SIZE]);
        assert_eq!(dev.crash_images(mode).last().unwrap().1, vec![1; BLOCK_SIZE]);
    }

    /// A workload where every block write carries its own index, with flushes now and
    /// then, so an image tells exactly which writes it holds.
    fn stamped_workload(blocks: u64, writes: usize) -> FaultDevice {
        use rand::{Rng, SeedableRng};
        let mut rng = rand::rngs::StdRng::seed_from_u64(7);
        let dev = FaultDevice::new(vec![0; blocks as usize * BLOCK_SIZE]);
        let mut i = 0usize;
        while i < writes {
            let n = rng.gen_range(1..=3usize).min(writes - i);
            let start = rng.gen_range(0..=blocks - n as u64);
            let mut buf = vec![0u8; n * BLOCK_SIZE];
            for (k, chunk) in buf.chunks_exact_mut(BLOCK_SIZE).enumerate() {
                // Stamp = index + 1, so a zero block means "never written".
                chunk[..8].copy_from_slice(&((i + k + 1) as u64).to_le_bytes());
            }
            dev.write(start, &buf).unwrap();
            i += n;
            if rng.gen_ratio(1, 10) {
                dev.flush().unwrap();
            }
        }
        assert_eq!(dev.events(), writes);
        dev
    }

    fn stamps(img: &[u8]) -> impl Iterator<Item = u64> + '_ {
        img.chunks_exact(BLOCK_SIZE).map(|b| u64::from_le_bytes(b[..8].try_into().unwrap()))
    }

    #[test]
    fn fault_drop_unflushed_never_contains_unflushed_write() {
        let dev = stamped_workload(32, 400);
        let flushes = dev.flush_points();
        assert!(flushes.len() > 5);
        for (at, img) in dev.crash_images(CrashMode::DropUnflushed) {
            let d = flushes.iter().copied().filter(|&f| f < at).max().unwrap_or(0);
            for s in stamps(&img) {
                assert!(s as usize <= d, "crash at {at}: write {} after last flush ({d}) survived", s - 1);
            }
            assert_eq!(img, dev.crash_image(d, CrashMode::All));
        }
    }

    #[test]
    fn fault_newest_unflushed_keeps_the_newest_writes_only() {
        let dev = FaultDevice::new(vec![0; 8 * BLOCK_SIZE]);
        dev.write(1, &[1; BLOCK_SIZE]).unwrap();
        dev.flush().unwrap();
        dev.write(2, &[2; BLOCK_SIZE]).unwrap();
        dev.write(3, &[3; BLOCK_SIZE]).unwrap();
        dev.write(4, &[4; BLOCK_SIZE]).unwrap();
        let img = dev.crash_image(dev.events(), CrashMode::NewestUnflushed(1));
        let block = |b: usize| img[b * BLOCK_SIZE];
        assert_eq!((block(1), block(2), block(3), block(4)), (1, 0, 0, 4), "flushed and newest kept, older lost");
    }

    #[test]
    fn fault_crash_images_iterator_matches_crash_image() {
        let dev = stamped_workload(24, 300);
        for mode in [
            CrashMode::All,
            CrashMode::DropUnflushed,
            CrashMode::Torn,
            CrashMode::DropRandomUnflushed(1),
            CrashMode::DropRandomUnflushed(0xDEAD_BEEF),
            CrashMode::NewestUnflushed(3),
        ] {
            let iter = dev.crash_images(mode);
            assert_eq!(iter.len(), 301);
            let mut n = 0;
            for (at, img) in iter {
                assert_eq!(at, n);
                assert!(img == dev.crash_image(at, mode), "{mode:?} at {at}");
                n += 1;
            }
            assert_eq!(n, 301);
        }
        // Random mode never loses a flushed write and is deterministic per seed.
        let flushes = dev.flush_points();
        for at in [0, 50, 150, 300] {
            let d = flushes.iter().copied().filter(|&f| f < at).max().unwrap_or(0);
            let durable = dev.crash_image(at, CrashMode::DropUnflushed);
            let rnd = dev.crash_image(at, CrashMode::DropRandomUnflushed(9));
            assert_eq!(rnd, dev.crash_image(at, CrashMode::DropRandomUnflushed(9)));
            for (b, (s_rnd, s_dur)) in stamps(&rnd).zip(stamps(&durable)).enumerate() {
                assert!(s_rnd as usize <= at, "block {b}: write from the future");
                // Either the durable content or a later (unflushed) write to that block.
                assert!(s_rnd == s_dur || s_rnd as usize > d, "block {b} at {at}");
            }
        }
    }

    #[test]
    #[should_panic(expected = "crash point 5 beyond the 4 recorded writes")]
    fn fault_crash_image_past_the_end_panics() {
        traced().crash_image(5, CrashMode::All);
    }

    /// Not run by default: `cargo test --release -- --ignored --nocapture` prints timings.
    #[test]
    #[ignore]
    fn fault_crash_images_3000_writes_timing() {
        let dev = stamped_workload(512, 3000);
        let t = std::time::Instant::now();
        let n = dev.crash_images(CrashMode::All).count();
        eprintln!("crash_images(All): {n} images in {:?}", t.elapsed());
        let t = std::time::Instant::now();
        for at in 0..=dev.events() {
            std::hint::black_box(dev.crash_image(at, CrashMode::DropRandomUnflushed(3)));
        }
        eprintln!("crash_image loop (random): {:?}", t.elapsed());
    }
}
