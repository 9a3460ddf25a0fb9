//! The B+tree (FORMAT.md §8), directly on nodes made of fuzz bytes: the structural check,
//! salvage, scans, inserts and removes never panic or loop; a tree the check passes scans
//! in key order with as many records as the check counted, and stays valid through an
//! insert and a remove.
//!
//! Input: byte 0 = depth (1..=3) and what to force into the headers; byte 1 = number of
//! nodes (1..=4); bytes 2..10 = a key to insert and scan from; then the nodes, 4096 bytes
//! each (zero-padded), numbered 100, 101, ... (the root is 100).
#![no_main]

use std::collections::HashMap;

use dxfs::internals::{btree_check, btree_insert, btree_remove, btree_salvage, btree_scan, seal, TreeRoot};
use dxfs_fuzz::MemStore;
use libfuzzer_sys::fuzz_target;

const OWNER: u64 = 4242;
const BS: usize = 4096;

fuzz_target!(|data: &[u8]| {
    if data.len() < 10 {
        return;
    }
    let depth = u16::from(data[0] % 3) + 1;
    let force = data[0] >> 2;
    let count = usize::from(data[1] % 4) + 1;
    let key = u64::from_le_bytes(data[2..10].try_into().unwrap());
    let body = &data[10..];
    let mut blocks = HashMap::new();
    for i in 0..count {
        let mut b = Box::new([0u8; BS]);
        let from = (i * BS).min(body.len());
        let to = ((i + 1) * BS).min(body.len());
        b[..to - from].copy_from_slice(&body[from..to]);
        // Mostly get past the header checks, so that the records are what is fuzzed.
        if force & 1 == 0 {
            b[..4].copy_from_slice(b"DXTN");
        }
        if force & 2 == 0 {
            b[16..24].copy_from_slice(&OWNER.to_le_bytes());
        }
        if force & 4 == 0 {
            let level = if i == 0 { depth - 1 } else { (depth - 1).saturating_sub(1) };
            b[24..26].copy_from_slice(&level.to_le_bytes());
        }
        let n = 100 + i as u64;
        seal(&mut b, n);
        blocks.insert(n, b);
    }
    let tree = TreeRoot { root: 100, depth };
    let st = MemStore::new(blocks, 1000);

    let checked = btree_check(&mut st.clone(), &tree, OWNER);
    let _ = btree_salvage(&mut st.clone(), &tree, OWNER);
    let scan = |st: &mut MemStore, tree: &TreeRoot, from: u64| {
        let mut keys = Vec::new();
        let r = btree_scan(st, tree, OWNER, from, |k, _| {
            keys.push(k);
            keys.len() < 100_000
        });
        (r, keys)
    };
    let (r, keys) = scan(&mut st.clone(), &tree, 0);
    let _ = scan(&mut st.clone(), &tree, key);
    if let Ok(stats) = &checked {
        assert!(r.is_ok(), "a tree the check passes does not scan: {r:?}");
        assert_eq!(keys.len() as u64, stats.records, "a scan of a checked tree misses records");
        assert!(keys.windows(2).all(|w| w[0] < w[1]), "a checked tree scans out of order");
    }

    // Changes: never a panic; on a tree the check passes, a valid tree again.
    let mut changed = st.clone();
    let mut t = tree;
    let inserted = btree_insert(&mut changed, &mut t, OWNER, key, &data[..data.len().min(40)], false);
    let removed = btree_remove(&mut changed, &mut t, OWNER, key);
    if checked.is_ok() {
        if inserted.is_ok() {
            assert!(matches!(removed, Ok(Some(_))), "an inserted key is not there to remove: {removed:?}");
        }
        let after = btree_check(&mut changed, &t, OWNER);
        assert!(after.is_ok() || t.root == 0, "a valid tree broke under an insert and a remove: {after:?}");
    }
    let mut t = tree;
    let mut other = st;
    let _ = btree_remove(&mut other, &mut t, OWNER, keys.first().copied().unwrap_or(key));
});
