//! Extended attributes and the per-inode xattr-name bloom filter (seed 001).
//!
//! An inode's xattrs are one list of entries `index u8, name_len u8, value_len u32, name
//! suffix, value`, kept in the inode's 64-byte inline area when it fits, else in an xattr
//! block. A list that fits in one block is *shareable*: inodes with identical lists (the
//! common case for ACL-heavy trees) point to the same block, whose header counts them.
//! Larger lists (values up to 64 KiB, as Linux allows) take a head block plus up to 16
//! continuation blocks, owned by one inode and rewritten in place. The namespace prefix
//! is stored as an index (ext4's numbering).
//!
//! Filter: 32 bits in every inode; a name sets k bits (k chosen at mkfs, 11 by default;
//! 1 on volumes with the older XATTR_FILTER flag), positions drawn from 5-bit fields of
//! xxh32 hashes of the name (`filter_mask`; docs/FORMAT.md §9 specifies it, docs/DESIGN.md
//! says why). A clear bit proves the name is absent, so such a getxattr is answered
//! without touching xattr storage. The filter is exact on every change (a name added ORs
//! its bits in, a removal recomputes it); an all-zero filter means "no xattrs at all".

use std::ops::Range;

use crate::disk::codec::*;
use crate::disk::format::{ino_loc, Inode, INLINE_XATTR, XATTR_MAGIC};
use crate::engine::store::{MetaRead, Tx};
use crate::error::{Error, Result};

/// Seed of the filter hash (erofs's value), plus the namespace index.
pub(crate) const FILTER_SEED: u32 = 0x25BB_E08F;
/// Largest value Linux passes (XATTR_SIZE_MAX).
pub(crate) const VALUE_MAX: usize = 65536;
pub(crate) use crate::disk::format::XATTR_CONT_MAGIC;
/// Header of an xattr head block: refcount u32 @16, total list bytes u32 @20, number of
/// continuation blocks u16 @24, then (from @32) the continuation block numbers.
const HEAD: usize = 32;
/// Continuation blocks: owner inode u64 @16, data from @32.
const CONT: usize = 32;
/// Most continuation blocks of one list.
pub(crate) const MAX_CONT: usize = 16;
/// Entry header bytes.
const ENTRY: usize = 6;
/// Bytes a list may take in all (a 64 KiB value with a long name fits).
pub(crate) const LIST_MAX: usize = BLOCK_SIZE - HEAD - 8 * MAX_CONT + MAX_CONT * (BLOCK_SIZE - CONT);
/// Bytes of list a single (shareable) block holds.
pub(crate) const SHARED_MAX: usize = BLOCK_SIZE - HEAD;

const PREFIXES: &[(u8, &[u8])] = &[
    (2, b"system.posix_acl_access"),
    (3, b"system.posix_acl_default"),
    (1, b"user."),
    (4, b"trusted."),
    (6, b"security."),
    (7, b"system."),
];

/// The longest full name (prefix and suffix), as Linux's XATTR_NAME_MAX.
const NAME_MAX: usize = 255;

/// Split a full name into namespace index and suffix.
pub fn split_name(name: &[u8]) -> Result<(u8, &[u8])> {
    if name.len() > NAME_MAX {
        return Err(Error::Range);
    }
    // listxattr returns NUL-separated names: a NUL inside one would break the list.
    if name.contains(&0) {
        return Err(Error::Invalid("xattr name contains a NUL byte".into()));
    }
    for (idx, p) in PREFIXES {
        if let Some(rest) = name.strip_prefix(*p) {
            // The ACL names are whole names, not prefixes.
            if (*idx == 2 || *idx == 3) && !rest.is_empty() {
                continue;
            }
            if rest.is_empty() && *idx != 2 && *idx != 3 {
                return Err(Error::Invalid("empty xattr name".into()));
            }
            return Ok((*idx, rest));
        }
    }
    Err(Error::NotSupported)
}

/// The full name of an entry.
pub fn full_name(idx: u8, suffix: &[u8]) -> Vec<u8> {
    let p = PREFIXES.iter().find(|(i, _)| *i == idx).map(|(_, p)| *p).unwrap_or(b"");
    [p, suffix].concat()
}

/// The filter bits of a name when each name sets `k` of the 32 (1..=32): bit positions
/// are 5-bit fields of xxh32 hashes of the suffix, six to a hash, the j-th hash seeded
/// with `FILTER_SEED + index + j·0x9E3779B9`; position i is field i mod 6 of hash i / 6.
/// Independent positions (repeats allowed) are what Bloom's false-positive formula
/// assumes; positions derived from one 32-bit hash would allow only a few hundred
/// distinct masks and miss it by orders of magnitude. With k = 1 this is erofs's single
/// bit `xxh32 & 31`.
pub fn filter_mask(idx: u8, suffix: &[u8], k: u32) -> u32 {
    let mut mask = 0;
    let mut h = 0;
    for i in 0..k.clamp(1, 32) {
        if i % 6 == 0 {
            let seed = FILTER_SEED.wrapping_add(idx as u32).wrapping_add((i / 6).wrapping_mul(0x9E37_79B9));
            h = xxhash_rust::xxh32::xxh32(suffix, seed);
        }
        mask |= 1 << ((h >> (5 * (i % 6))) & 31);
    }
    mask
}

/// One xattr.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Xattr {
    pub idx: u8,
    pub name: Vec<u8>,
    pub value: Vec<u8>,
}

fn encode(list: &[Xattr]) -> Vec<u8> {
    let mut out = Vec::with_capacity(encoded_len(list));
    for x in list {
        out.push(x.idx);
        out.push(x.name.len() as u8);
        out.extend_from_slice(&(x.value.len() as u32).to_le_bytes());
        out.extend_from_slice(&x.name);
        out.extend_from_slice(&x.value);
    }
    out
}

fn decode(ino: u64, b: &[u8]) -> Result<Vec<Xattr>> {
    let (list, err) = decode_lenient(ino, b);
    err.map_or(Ok(list), Err)
}

/// Decode a list as far as it can be read, keeping the entries that can be named; the
/// first problem found comes with it.
fn decode_lenient(ino: u64, mut b: &[u8]) -> (Vec<Xattr>, Option<Error>) {
    let mut out = Vec::new();
    let mut err = None;
    while !b.is_empty() {
        if b.len() < ENTRY {
            err = Some(Error::corrupt(format!("inode {ino}: truncated xattr entry")));
            break;
        }
        let (idx, nl, vl) = (b[0], b[1] as usize, get_u32(b, 2) as usize);
        if vl > VALUE_MAX || b.len() < ENTRY + nl + vl {
            err = Some(Error::corrupt(format!("inode {ino}: xattr entry overruns its area")));
            break;
        }
        let x = Xattr { idx, name: b[ENTRY..ENTRY + nl].to_vec(), value: b[ENTRY + nl..ENTRY + nl + vl].to_vec() };
        if entry_ok(&x) {
            out.push(x);
        } else if err.is_none() {
            err = Some(Error::corrupt(format!(
                "inode {ino}: xattr entry {:?} of namespace {idx} cannot be named",
                String::from_utf8_lossy(&x.name)
            )));
        }
        b = &b[ENTRY + nl + vl..];
    }
    (out, err)
}

/// The validity rule of an entry: a known namespace, an empty name for the two ACLs and
/// a non-empty one otherwise, no NUL in it (listxattr separates names with NULs), and a
/// full name of at most [`NAME_MAX`] bytes (a longer one cannot be asked for: fuzzer
/// seed 2684391123).
fn entry_ok(x: &Xattr) -> bool {
    name_ok(x.idx, &x.name)
}

fn name_ok(idx: u8, name: &[u8]) -> bool {
    let acl = idx == 2 || idx == 3;
    PREFIXES.iter().any(|(i, p)| *i == idx && p.len() + name.len() <= NAME_MAX)
        && acl == name.is_empty()
        && !name.contains(&0)
}

/// One entry's bytes, as a list holds them.
pub(crate) fn entry_bytes(idx: u8, suffix: &[u8], value: &[u8]) -> Vec<u8> {
    encode(&[Xattr { idx, name: suffix.to_vec(), value: value.to_vec() }])
}

/// Check an encoded list entry by entry, as `decode` does, without copying any: where
/// the first entry named (`idx`, `suffix`) sits, if any. Each entry's name is also given
/// to `each` (for a filter).
fn scan(ino: u64, b: &[u8], idx: u8, suffix: &[u8], mut each: impl FnMut(u8, &[u8])) -> Result<Option<Range<usize>>> {
    let mut at = 0;
    let mut found = None;
    while at < b.len() {
        let e = &b[at..];
        if e.len() < ENTRY {
            return Err(Error::corrupt(format!("inode {ino}: truncated xattr entry")));
        }
        let (i, nl, vl) = (e[0], e[1] as usize, get_u32(e, 2) as usize);
        if vl > VALUE_MAX || e.len() < ENTRY + nl + vl {
            return Err(Error::corrupt(format!("inode {ino}: xattr entry overruns its area")));
        }
        let name = &e[ENTRY..ENTRY + nl];
        if !name_ok(i, name) {
            return Err(Error::corrupt(format!(
                "inode {ino}: xattr entry {:?} of namespace {i} cannot be named",
                String::from_utf8_lossy(name)
            )));
        }
        if found.is_none() && i == idx && name == suffix {
            found = Some(at..at + ENTRY + nl + vl);
        }
        each(i, name);
        at += ENTRY + nl + vl;
    }
    Ok(found)
}

/// An inode's list as stored (checked as `load` checks it), and where in it the entry
/// named (`idx`, `suffix`) is: one copy of the bytes, none per entry.
pub(crate) fn find(
    st: &mut (impl MetaRead + ?Sized),
    inode: &Inode,
    idx: u8,
    suffix: &[u8],
) -> Result<(Vec<u8>, Option<Range<usize>>)> {
    let bytes = load_bytes(st, inode)?;
    let at = scan(inode.ino, &bytes, idx, suffix, |_, _| {})?;
    Ok((bytes, at))
}

/// The value of the entry `find` found at `at`.
pub(crate) fn value_at(bytes: &[u8], at: Range<usize>) -> &[u8] {
    let nl = bytes[at.start + 1] as usize;
    &bytes[at.start + ENTRY + nl..at.end]
}

/// The exact filter of an encoded list (checked by `find` before).
pub(crate) fn filter_of_bytes(ino: u64, bytes: &[u8], k: u32) -> Result<u32> {
    let mut f = 0;
    scan(ino, bytes, 0, b"", |i, name| f |= filter_mask(i, name, k))?;
    Ok(f)
}

/// Bytes of an inode's list, without reading it (the head block's count for a list in
/// blocks): what a change is charged for.
pub(crate) fn stored_len(st: &mut (impl MetaRead + ?Sized), inode: &Inode) -> Result<usize> {
    if inode.xattr_block == 0 {
        return Ok(inode.xattr_inline_len as usize);
    }
    Ok((get_u32(st.block(inode.xattr_block, Some(XATTR_MAGIC))?, 20) as usize).min(LIST_MAX))
}

/// What can still be read of an inode's list (fsck's repair: the entries that break a
/// rule, or follow a break in the list, are left out).
pub(crate) fn salvage(st: &mut (impl MetaRead + ?Sized), inode: &Inode) -> Vec<Xattr> {
    load_bytes(st, inode).map_or_else(|_| Vec::new(), |bytes| decode_lenient(inode.ino, &bytes).0)
}

/// The encoded bytes of an inode's list.
fn load_bytes(st: &mut (impl MetaRead + ?Sized), inode: &Inode) -> Result<Vec<u8>> {
    if inode.xattr_block == 0 {
        return Ok(inode.xattr_inline[..inode.xattr_inline_len as usize].to_vec());
    }
    // Counted once read: an attempt that missed the cache runs again (`engine::deferred`).
    let r = load_from_blocks(st, inode);
    if !matches!(r, Err(ref e) if e.is_missed()) {
        st.store().xattr_block_reads.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    }
    r
}

/// The encoded bytes of a list kept in an xattr block (and its continuations).
fn load_from_blocks(st: &mut (impl MetaRead + ?Sized), inode: &Inode) -> Result<Vec<u8>> {
    let bad = |m: &str| Error::corrupt(format!("inode {}: xattr block {}: {m}", inode.ino, inode.xattr_block));
    let blk = st.block(inode.xattr_block, Some(XATTR_MAGIC))?;
    let total = get_u32(blk, 20) as usize;
    let ncont = get_u16(blk, 24) as usize;
    if ncont > MAX_CONT || total > LIST_MAX {
        return Err(bad("header out of range"));
    }
    let first = HEAD + 8 * ncont;
    let in_head = total.min(BLOCK_SIZE - first);
    if ncont == 0 && total > SHARED_MAX || total > in_head + ncont * (BLOCK_SIZE - CONT) {
        return Err(bad("list longer than its blocks"));
    }
    let conts: Vec<u64> = (0..ncont).map(|k| get_u64(blk, HEAD + 8 * k)).collect();
    let mut out = blk[first..first + in_head].to_vec();
    for c in conts {
        let cb = st.block(c, Some(XATTR_CONT_MAGIC))?;
        if get_u64(cb, 16) != inode.ino {
            return Err(bad("continuation block owned by another inode"));
        }
        let take = (total - out.len()).min(BLOCK_SIZE - CONT);
        out.extend_from_slice(&cb[CONT..CONT + take]);
    }
    if out.len() != total {
        return Err(bad("continuation blocks missing"));
    }
    Ok(out)
}

/// All xattrs of an inode.
pub(crate) fn load(st: &mut (impl MetaRead + ?Sized), inode: &Inode) -> Result<Vec<Xattr>> {
    let bytes = load_bytes(st, inode)?;
    decode(inode.ino, &bytes)
}

/// The blocks an inode's xattrs occupy: head first, then continuations (fsck).
pub(crate) fn blocks_of(st: &mut Tx, inode: &Inode) -> Result<Vec<u64>> {
    if inode.xattr_block == 0 {
        return Ok(Vec::new());
    }
    let layout = st.store().sb.layout;
    let blk = st.block(inode.xattr_block, Some(XATTR_MAGIC))?;
    let ncont = get_u16(blk, 24) as usize;
    if ncont > MAX_CONT {
        return Err(Error::corrupt(format!("xattr block {}: {ncont} continuation blocks", inode.xattr_block)));
    }
    let mut v = vec![inode.xattr_block];
    v.extend((0..ncont).map(|k| get_u64(blk, HEAD + 8 * k)));
    if let Some(b) = v.iter().find(|&&b| !layout.meta_block_ok(b)) {
        return Err(Error::corrupt(format!(
            "xattr block {}: continuation block {b} is out of range",
            inode.xattr_block
        )));
    }
    Ok(v)
}

/// Reference count of a head block (fsck).
pub(crate) fn refcount(st: &mut Tx, block: u64) -> Result<u32> {
    Ok(get_u32(st.block(block, Some(XATTR_MAGIC))?, 16))
}

/// Drop an inode's reference to its xattr block(s); free them with the last one.
/// Returns the number of blocks the inode no longer counts.
pub(crate) fn release(st: &mut Tx, inode: &mut Inode) -> Result<u64> {
    if inode.xattr_block == 0 {
        return Ok(0);
    }
    let owned = blocks_of(st, inode)?;
    let head = inode.xattr_block;
    inode.xattr_block = 0;
    // Reference counts change with the sharing hints locked, so a block another inode is
    // about to share is not freed under it.
    st.let_go();
    let mut hints = st.store().xattr_shared.lock();
    let blk = st.block_mut(head, Some(XATTR_MAGIC))?;
    let refs = get_u32(blk, 16);
    if refs > 1 {
        put_u32(blk, 16, refs - 1);
        return Ok(1);
    }
    hints.forget_block(head);
    st.free_meta(head);
    // Only blocks that are this inode's continuations are freed: a damaged chain may
    // name the head again, or a block something else owns.
    let mut seen = std::collections::HashSet::from([head]);
    for &c in &owned[1..] {
        let ours = seen.insert(c) && st.block(c, Some(XATTR_CONT_MAGIC)).is_ok_and(|cb| get_u64(cb, 16) == inode.ino);
        if ours {
            st.free_meta(c);
        } else {
            tracing::warn!("inode {}: xattr chain of block {head} names block {c}, not its own: left alone", inode.ino);
        }
    }
    Ok(owned.len() as u64)
}

/// Point the inode at an existing block holding exactly `bytes`, if one is known.
fn share(st: &mut Tx, inode: &mut Inode, bytes: &[u8], hash: u64) -> Result<bool> {
    st.let_go();
    let mut hints = st.store().xattr_shared.lock();
    let Some(b) = hints.get(hash) else { return Ok(false) };
    // The index is only a hint: the block may have changed or gone since.
    let ok = st.store().is_used(b)
        && st.block(b, Some(XATTR_MAGIC)).is_ok_and(|blk| {
            get_u16(blk, 24) == 0 && get_u32(blk, 20) as usize == bytes.len() && &blk[HEAD..HEAD + bytes.len()] == bytes
        });
    if !ok {
        hints.forget_hash(hash);
        return Ok(false);
    }
    let blk = st.block_mut(b, Some(XATTR_MAGIC))?;
    let refs = get_u32(blk, 16);
    if refs == u32::MAX {
        return Ok(false);
    }
    put_u32(blk, 16, refs + 1);
    inode.xattr_block = b;
    inode.blocks += 1;
    Ok(true)
}

/// Store a new list: inline when it fits, else in a shared or private block (chain).
pub(crate) fn store(st: &mut Tx, inode: &mut Inode, list: &[Xattr]) -> Result<()> {
    let filter = filter_of(list, st.store().sb.filter_hashes());
    store_bytes(st, inode, &encode(list), filter)
}

/// Store a list given encoded, whose exact filter is `filter`. A list that needs a
/// chain and had one of its own is written over it in place (metadata changes go
/// through the log, so that is as safe as new blocks, and a file's every setxattr does
/// not cost a new chain and a freed one); otherwise the old storage is released first.
pub(crate) fn store_bytes(st: &mut Tx, inode: &mut Inode, bytes: &[u8], filter: u32) -> Result<()> {
    if bytes.len() > LIST_MAX {
        return Err(Error::TooBig);
    }
    inode.xattr_filter = filter;
    if bytes.len() > SHARED_MAX && inode.xattr_block != 0 {
        if let Some(old) = own_chain(st, inode) {
            return rewrite_chain(st, inode, bytes, &old);
        }
    }
    let released = release(st, inode)?;
    inode.blocks = inode.blocks.saturating_sub(released);
    inode.xattr_inline = [0; INLINE_XATTR];
    inode.xattr_inline_len = 0;
    if bytes.len() <= INLINE_XATTR {
        inode.xattr_inline[..bytes.len()].copy_from_slice(bytes);
        inode.xattr_inline_len = bytes.len() as u16;
        return Ok(());
    }
    let near = ino_loc(inode.ino).0;
    if bytes.len() <= SHARED_MAX {
        let hash = xxhash_rust::xxh64::xxh64(bytes, 0);
        if share(st, inode, bytes, hash)? {
            return Ok(());
        }
        let b = st.alloc_meta(near)?;
        let blk = st.fresh_block(b);
        put_u32(blk, 0, XATTR_MAGIC);
        put_u32(blk, 16, 1);
        put_u32(blk, 20, bytes.len() as u32);
        blk[HEAD..HEAD + bytes.len()].copy_from_slice(bytes);
        st.let_go();
        st.store().xattr_shared.lock().insert(hash, b);
        inode.xattr_block = b;
        inode.blocks += 1;
        return Ok(());
    }
    // A private chain: the head plus the fewest continuation blocks that hold the rest.
    let ncont = chain_len(bytes.len())?;
    let head = st.alloc_meta(near)?;
    let mut conts = Vec::with_capacity(ncont);
    for _ in 0..ncont {
        conts.push(st.alloc_meta(head)?);
    }
    write_chain(st, inode, bytes, head, &conts);
    inode.blocks += 1 + ncont as u64;
    Ok(())
}

/// Continuation blocks a chain holding `len` bytes needs.
fn chain_len(len: usize) -> Result<usize> {
    (1..=MAX_CONT).find(|&n| BLOCK_SIZE - HEAD - 8 * n + n * (BLOCK_SIZE - CONT) >= len).ok_or(Error::TooBig)
}

/// The blocks of the inode's chain (head first) if they are its alone to write over: a
/// head no other inode counts, continuations that name this inode as owner, no block
/// twice. `None` for anything else (shared, damaged, not a chain).
fn own_chain(st: &mut Tx, inode: &Inode) -> Option<Vec<u64>> {
    let old = blocks_of(st, inode).ok()?;
    if old.len() < 2 || refcount(st, old[0]).ok()? != 1 {
        return None;
    }
    let mut seen = std::collections::HashSet::with_capacity(old.len());
    for &b in &old {
        if !seen.insert(b) {
            return None;
        }
    }
    for &c in &old[1..] {
        let cb = st.block(c, Some(XATTR_CONT_MAGIC)).ok()?;
        if get_u64(cb, 16) != inode.ino {
            return None;
        }
    }
    Some(old)
}

/// Write `bytes` over the inode's own chain `old` (head first), keeping as many of its
/// blocks as the new list needs and taking or freeing the difference.
fn rewrite_chain(st: &mut Tx, inode: &mut Inode, bytes: &[u8], old: &[u64]) -> Result<()> {
    let ncont = chain_len(bytes.len())?;
    let head = old[0];
    let mut conts: Vec<u64> = old[1..].iter().copied().take(ncont).collect();
    while conts.len() < ncont {
        conts.push(st.alloc_meta(head)?);
    }
    for &b in old[1..].iter().skip(ncont) {
        st.free_meta(b);
    }
    write_chain(st, inode, bytes, head, &conts);
    inode.blocks = inode.blocks.saturating_sub(old.len() as u64) + 1 + ncont as u64;
    Ok(())
}

/// Fill a chain's blocks (all of them written whole) with `bytes`, and point the inode at it.
fn write_chain(st: &mut Tx, inode: &mut Inode, bytes: &[u8], head: u64, conts: &[u64]) {
    let ncont = conts.len();
    let first = HEAD + 8 * ncont;
    let in_head = bytes.len().min(BLOCK_SIZE - first);
    let blk = st.fresh_block(head);
    put_u32(blk, 0, XATTR_MAGIC);
    put_u32(blk, 16, 1);
    put_u32(blk, 20, bytes.len() as u32);
    put_u16(blk, 24, ncont as u16);
    for (k, c) in conts.iter().enumerate() {
        put_u64(blk, HEAD + 8 * k, *c);
    }
    blk[first..first + in_head].copy_from_slice(&bytes[..in_head]);
    let mut at = in_head;
    for c in conts {
        let take = (bytes.len() - at).min(BLOCK_SIZE - CONT);
        let cb = st.fresh_block(*c);
        put_u32(cb, 0, XATTR_CONT_MAGIC);
        put_u64(cb, 16, inode.ino);
        cb[CONT..CONT + take].copy_from_slice(&bytes[at..at + take]);
        at += take;
    }
    inode.xattr_block = head;
}

/// The exact filter of a list.
pub fn filter_of(list: &[Xattr], k: u32) -> u32 {
    list.iter().fold(0, |f, x| f | filter_mask(x.idx, &x.name, k))
}

/// Whether the filter rules the name out (then storage need not be read).
pub(crate) fn ruled_out(inode: &Inode, idx: u8, suffix: &[u8], k: u32) -> bool {
    let m = filter_mask(idx, suffix, k);
    inode.xattr_filter & m != m
}

/// Bytes a list takes (for the worst-case space charge of a setxattr).
pub(crate) fn encoded_len(list: &[Xattr]) -> usize {
    list.iter().map(|x| ENTRY + x.name.len() + x.value.len()).sum()
}

/// Blocks a list of `bytes` encoded bytes occupies outside the inode (the charge of a
/// setxattr).
pub(crate) fn blocks_for(bytes: usize) -> u64 {
    if bytes <= INLINE_XATTR {
        0
    } else if bytes <= SHARED_MAX {
        1
    } else {
        1 + (1..=MAX_CONT).find(|&n| BLOCK_SIZE - HEAD - 8 * n + n * (BLOCK_SIZE - CONT) >= bytes).unwrap_or(MAX_CONT)
            as u64
    }
}

#[cfg(test)]
/// The worked examples of docs/FORMAT.md §9 for k = 11 (`user.foo`, `system.posix_acl_access`).
const FORMAT_MD_USER_FOO_K11: u32 = 0x806b_3400;
#[cfg(test)]
const FORMAT_MD_ACL_ACCESS_K11: u32 = 0x4169_4930;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_split_and_join() {
        assert_eq!(split_name(b"user.foo").unwrap(), (1, &b"foo"[..]));
        assert_eq!(split_name(b"system.posix_acl_access").unwrap(), (2, &b""[..]));
        assert_eq!(split_name(b"system.posix_acl_default").unwrap(), (3, &b""[..]));
        assert_eq!(split_name(b"system.posix_acl_accessX").unwrap(), (7, &b"posix_acl_accessX"[..]));
        assert!(matches!(split_name(b"bogus.x"), Err(Error::NotSupported)));
        assert!(split_name(b"user.").is_err());
        for n in [&b"user.a"[..], b"trusted.zz", b"security.selinux", b"system.posix_acl_default"] {
            let (i, s) = split_name(n).unwrap();
            assert_eq!(full_name(i, s), n);
        }
    }

    #[test]
    fn encode_decode_and_filter() {
        let l = vec![
            Xattr { idx: 1, name: b"a".to_vec(), value: vec![1, 2, 3] },
            Xattr { idx: 2, name: vec![], value: vec![9; 28] },
        ];
        assert_eq!(decode(1, &encode(&l)).unwrap(), l);
        for k in [1, 2, 11, 32] {
            let f = filter_of(&l, k);
            let i = Inode { xattr_filter: f, ..Inode::new(1, libc::S_IFREG) };
            assert!(!ruled_out(&i, 1, b"a", k) && !ruled_out(&i, 2, b"", k));
            let bits = filter_mask(1, b"a", k).count_ones();
            assert!(bits >= 1 && bits <= k, "{bits} bits for k = {k}");
        }
        // k = 1 is erofs's bit; the documented examples of docs/FORMAT.md.
        assert_eq!(filter_mask(1, b"foo", 1), 1 << 12);
        assert_eq!(filter_mask(2, b"", 1), 1 << 30);
        // k = 11 (the mkfs default), computed from FORMAT.md's words, not from filter_mask:
        // position i is the 5-bit field i mod 6 (from bit 0) of
        // xxh32(suffix, 0x25BBE08F + index + (i div 6) * 0x9E3779B9).
        let spec = |idx: u32, suffix: &[u8], k: u32| -> u32 {
            (0..k).fold(0u32, |m, i| {
                let seed = 0x25BB_E08Fu32.wrapping_add(idx).wrapping_add((i / 6).wrapping_mul(0x9E37_79B9));
                let h = xxhash_rust::xxh32::xxh32(suffix, seed);
                m | 1 << ((h >> (5 * (i % 6))) & 31)
            })
        };
        for (idx, name) in [(1u8, &b"foo"[..]), (2, b""), (3, b""), (1, b"mime_type"), (4, b"selinux"), (5, b"x")] {
            for k in [1, 2, 6, 7, 11, 12, 32] {
                assert_eq!(filter_mask(idx, name, k), spec(u32::from(idx), name, k), "{idx} {name:?} k={k}");
            }
        }
        // The k = 11 examples printed in FORMAT.md.
        assert_eq!(filter_mask(1, b"foo", 11), FORMAT_MD_USER_FOO_K11);
        assert_eq!(filter_mask(2, b"", 11), FORMAT_MD_ACL_ACCESS_K11);
        assert!(decode(1, &[1, 5, 0, 0, 0, 0, b'x']).is_err(), "overrun must be an error");
    }
}
