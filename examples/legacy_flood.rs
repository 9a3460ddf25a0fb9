//! Generate 2^k distinct file names that all have the same ext4 *legacy* directory hash
//! (`dx_hack_hash`), for the hash-flooding test (`tests/flood.rs`, data in
//! `tests/data/legacy_flood.txt`).
//!
//! ```text
//! cargo run --release --example legacy_flood -- OUT [k]     # k defaults to 11: 2048 names, as in tests/data
//! ```
//!
//! writes the names to OUT, one per line, in order. Each name is `k` blocks of 6 chars
//! from `[0-9A-Za-z+_]` (so it is ASCII and hashes the same with signed and unsigned
//! chars, and it is a valid name: no `/`, no NUL, not `.`/`..`). The output is
//! deterministic; with k = 11 it takes a few seconds on one core.
//!
//! # Method: Joux multicollisions on the full 64-bit state
//!
//! `dx_hack_hash` keeps two 32-bit words and feeds one byte per step:
//!
//! ```text
//! h = hash1 + (hash0 ^ c * 7152373);  if h & 0x80000000 { h -= 0x7fffffff }
//! hash1 = hash0;  hash0 = h;          result: hash0 << 1
//! ```
//!
//! If two different blocks B and B' lead from the same state to the same full state
//! (hash0, hash1), every continuation agrees afterwards. Find such a pair (B_i, B'_i) for
//! each of k successive starting states (the state after B_1 .. B_{i-1}): then all 2^k
//! concatenations of one choice per stage end in the same state, hence have the same
//! hash (Joux, "Multicollisions in iterated hash functions", CRYPTO 2004).
//!
//! A generic full-state collision costs ~2^31 block evaluations (birthday on ~62 bits).
//! The structure of the last step makes it much cheaper: after a block's first 5 chars
//! the state is (X, Y) = (hash0, hash1); the 6th char c gives the new state
//! (adj(Y + (X ^ cK)), X). So two 5-char prefixes with the *same X* (a 31-bit
//! collision) complete to a full-state collision as soon as some pair of last chars
//! (c, c') satisfies adj(Y + (X ^ cK)) == adj(Y' + (X ^ c'K)): about 64 * 63 * 2
//! chances in 2^31 per pair, i.e. ~2^-18 for unrelated prefixes. Enumerating 2^28
//! prefixes and keeping those with X = 0 mod 64 (2^22 entries, 48 MiB) gives ~2^17 pairs
//! with equal X, so about one success per round of 2^28 cheap steps is guaranteed by
//! the counting alone (rounds repeat with fresh prefixes until one succeeds).
//!
//! In practice it is better than that: prefixes that share their first three chars and
//! differ in the last two collide on X far more often than chance, and their Y are close,
//! so each stage succeeded in its first round after 10^3..10^5 checked pairs, e.g.
//! `FW3klY` / `FW3niV` from the initial state. Measured on one core of a shared
//! 2-core machine: ~0.5-1 s per stage, 9 s for k = 11 (2048 names of 66 bytes).
//!
//! Finally every name is checked against `dxfs::hash::ext4_hash` (signed and unsigned
//! legacy), so the output cannot disagree with the filesystem's own hash.

use std::io::Write;
use std::time::Instant;

use dxfs::hash::{ext4_hash, HashVersion};

/// dx_hack_hash's multiplier.
const MUL: u32 = 7_152_373;
/// Name characters: 64 of them, all ASCII, none special to a shell at the start of a word.
const ALPHA: &[u8; 64] = b"0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz+_";
/// Characters per block: PREFIX enumerated ones plus one chosen to complete the collision.
const PREFIX: usize = 5;
const BLOCK: usize = PREFIX + 1;
/// Keep only prefixes whose hash0 has these low bits clear (a distinguished-point filter
/// that trades cheap steps for memory).
const FILTER_MASK: u32 = (1 << 6) - 1;
/// Prefixes per round: 16 first characters x 64^4.
const FIRST_PER_ROUND: usize = 16;

/// The legacy hash state: (hash0, hash1).
type State = (u32, u32);

/// The initial state of `dx_hack_hash`.
const INIT: State = (0x12a3_fe2d, 0x37ab_e8f9);

/// One step, with `ck` = char * MUL precomputed. ASCII only, so C's signed and unsigned
/// `char` agree.
#[inline(always)]
fn step(s: State, ck: u32) -> State {
    let mut h = s.1.wrapping_add(s.0 ^ ck);
    if h & 0x8000_0000 != 0 {
        h = h.wrapping_sub(0x7fff_ffff);
    }
    (h, s.0)
}

fn run(s: State, bytes: &[u8]) -> State {
    bytes.iter().fold(s, |s, &b| step(s, u32::from(b).wrapping_mul(MUL)))
}

/// The 5-char prefix numbered `idx` (base 64, first char most significant).
fn prefix_of(idx: u32) -> [u8; PREFIX] {
    let mut out = [0; PREFIX];
    for (i, o) in out.iter_mut().enumerate() {
        *o = ALPHA[((idx >> (6 * (PREFIX - 1 - i))) & 63) as usize];
    }
    out
}

/// Find two different blocks that take `start` to the same full state.
fn find_pair(start: State, ck: &[u32; 64], stage: usize) -> ([u8; BLOCK], [u8; BLOCK], State) {
    // (hash0 after the prefix, hash1 after the prefix, prefix index)
    let mut entries: Vec<(u32, u32, u32)> = Vec::new();
    for round in 0..64 / FIRST_PER_ROUND {
        let t = Instant::now();
        let first = (round * FIRST_PER_ROUND) as u32;
        for c0 in first..first + FIRST_PER_ROUND as u32 {
            let s1 = step(start, ck[c0 as usize]);
            for c1 in 0..64u32 {
                let s2 = step(s1, ck[c1 as usize]);
                for c2 in 0..64u32 {
                    let s3 = step(s2, ck[c2 as usize]);
                    for c3 in 0..64u32 {
                        let s4 = step(s3, ck[c3 as usize]);
                        let base = (((c0 << 6 | c1) << 6 | c2) << 6 | c3) << 6;
                        for (c4, &k) in ck.iter().enumerate() {
                            let s5 = step(s4, k);
                            if s5.0 & FILTER_MASK == 0 {
                                entries.push((s5.0, s5.1, base | c4 as u32));
                            }
                        }
                    }
                }
            }
        }
        let new_from = first << 24;
        entries.sort_unstable();
        let mut pairs = 0u64;
        let mut i = 0;
        while i < entries.len() {
            let mut j = i + 1;
            while j < entries.len() && entries[j].0 == entries[i].0 {
                j += 1;
            }
            for a in i..j {
                for b in a + 1..j {
                    let (x, y1, p1) = entries[a];
                    let (_, y2, p2) = entries[b];
                    if p1 < new_from && p2 < new_from {
                        continue; // checked in an earlier round
                    }
                    pairs += 1;
                    if let Some((c1, c2)) = complete(x, y1, y2, ck) {
                        let mut b1 = [0; BLOCK];
                        let mut b2 = [0; BLOCK];
                        b1[..PREFIX].copy_from_slice(&prefix_of(p1));
                        b2[..PREFIX].copy_from_slice(&prefix_of(p2));
                        b1[PREFIX] = ALPHA[c1];
                        b2[PREFIX] = ALPHA[c2];
                        let end = run(start, &b1);
                        assert_eq!(end, run(start, &b2), "collision check");
                        eprintln!(
                            "stage {stage}: round {round}, {} entries, {pairs} equal-hash0 pairs, {:.2?}: {} / {}",
                            entries.len(),
                            t.elapsed(),
                            String::from_utf8_lossy(&b1),
                            String::from_utf8_lossy(&b2)
                        );
                        return (b1, b2, end);
                    }
                }
            }
            i = j;
        }
        eprintln!(
            "stage {stage}: round {round} found nothing ({} entries, {pairs} pairs, {:.2?})",
            entries.len(),
            t.elapsed()
        );
    }
    panic!("no collision after all 2^30 prefixes (expected about 8)");
}

/// Last characters (c1, c2) with step((x, y1), c1) == step((x, y2), c2), if any.
fn complete(x: u32, y1: u32, y2: u32, ck: &[u32; 64]) -> Option<(usize, usize)> {
    let v2: Vec<u32> = ck.iter().map(|&k| step((x, y2), k).0).collect();
    for (c1, &k) in ck.iter().enumerate() {
        let v = step((x, y1), k).0;
        if let Some(c2) = v2.iter().position(|&w| w == v) {
            if y1 != y2 || c1 != c2 {
                return Some((c1, c2));
            }
        }
    }
    None
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if args.len() < 2 || args.len() > 3 {
        eprintln!("usage: legacy_flood OUT [k]   (writes 2^k colliding names, default k = 11)");
        std::process::exit(2);
    }
    let k: usize = args.get(2).map_or(11, |s| s.parse().expect("k: a number"));
    assert!((1..=24).contains(&k), "k must be 1..=24");
    assert!(k * BLOCK <= 255, "names would exceed 255 bytes");
    let ck: [u32; 64] = std::array::from_fn(|i| u32::from(ALPHA[i]).wrapping_mul(MUL));

    let t = Instant::now();
    let mut state = INIT;
    let mut stages = Vec::new();
    for stage in 0..k {
        let (b1, b2, end) = find_pair(state, &ck, stage);
        stages.push(if b1 < b2 { [b1, b2] } else { [b2, b1] });
        state = end;
    }
    eprintln!("{k} stages in {:.2?}", t.elapsed());

    let want = ext4_hash(HashVersion::Legacy, [0; 4], &stages.iter().flat_map(|s| s[0]).collect::<Vec<u8>>());
    let mut out = std::io::BufWriter::new(std::fs::File::create(&args[1]).expect("create OUT"));
    for i in 0..1u64 << k {
        // Bit (k - 1 - s) of i picks stage s's block; blocks are ordered, so names come
        // out in bytewise sorted order.
        let name: Vec<u8> = (0..k).flat_map(|s| stages[s][(i >> (k - 1 - s) & 1) as usize]).collect();
        assert_eq!(run(INIT, &name).0, state.0);
        assert_eq!(ext4_hash(HashVersion::Legacy, [0; 4], &name), want);
        assert_eq!(ext4_hash(HashVersion::LegacyUnsigned, [0; 4], &name), want);
        out.write_all(&name).unwrap();
        out.write_all(b"\n").unwrap();
    }
    out.flush().unwrap();
    eprintln!("{} names of {} bytes, legacy major {:#010x}, written to {}", 1u64 << k, k * BLOCK, want.0, args[1]);
}
