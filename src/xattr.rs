//! Extended attributes and the per-inode xattr-name bloom filter (seed 001).
//!
//! An inode's xattrs are one list of entries `index u8, name_len u8, value_len u16,
//! name suffix, value`, kept in the inode's 64-byte inline area when it fits and in one
//! xattr block otherwise. The namespace prefix is stored as an index (ext4's numbering).
//!
//! Filter: 32 bits in every inode; a name sets bit `xxh32(suffix, FILTER_SEED + index) & 31`
//! (one hash function: for the typical one to three xattrs per inode, k = ln2·32/n rounds
//! to one... and more functions only fill the word faster). A clear bit proves the name is
//! absent, so such a getxattr is answered without touching xattr storage. The filter is
//! exact, recomputed on every change; an all-zero filter means "no xattrs at all".

use crate::codec::*;
use crate::error::{Error, Result};
use crate::format::{Inode, INLINE_XATTR, XATTR_MAGIC};
use crate::store::Store;

/// Seed of the filter hash (erofs's value), plus the namespace index.
pub const FILTER_SEED: u32 = 0x25BB_E08F;
/// Largest value Linux passes (XATTR_SIZE_MAX).
pub const VALUE_MAX: usize = 65536;
/// Bytes of entries an xattr block holds.
pub const BLOCK_CAPACITY: usize = BLOCK_SIZE - 32;

const PREFIXES: &[(u8, &[u8])] = &[
    (2, b"system.posix_acl_access"),
    (3, b"system.posix_acl_default"),
    (1, b"user."),
    (4, b"trusted."),
    (6, b"security."),
    (7, b"system."),
];

/// Split a full name into namespace index and suffix.
pub fn split_name(name: &[u8]) -> Result<(u8, &[u8])> {
    if name.len() > 255 {
        return Err(Error::Range);
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

/// The filter bit of a name.
pub fn filter_bit(idx: u8, suffix: &[u8]) -> u32 {
    1 << (xxhash_rust::xxh32::xxh32(suffix, FILTER_SEED.wrapping_add(idx as u32)) & 31)
}

/// One xattr.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Xattr {
    pub idx: u8,
    pub name: Vec<u8>,
    pub value: Vec<u8>,
}

fn encode(list: &[Xattr]) -> Vec<u8> {
    let mut out = Vec::new();
    for x in list {
        out.push(x.idx);
        out.push(x.name.len() as u8);
        out.extend_from_slice(&(x.value.len() as u16).to_le_bytes());
        out.extend_from_slice(&x.name);
        out.extend_from_slice(&x.value);
    }
    out
}

fn decode(ino: u64, mut b: &[u8]) -> Result<Vec<Xattr>> {
    let mut out = Vec::new();
    while !b.is_empty() {
        if b.len() < 4 {
            return Err(Error::corrupt(format!("inode {ino}: truncated xattr entry")));
        }
        let (idx, nl, vl) = (b[0], b[1] as usize, get_u16(b, 2) as usize);
        if b.len() < 4 + nl + vl {
            return Err(Error::corrupt(format!("inode {ino}: xattr entry overruns its area")));
        }
        out.push(Xattr { idx, name: b[4..4 + nl].to_vec(), value: b[4 + nl..4 + nl + vl].to_vec() });
        b = &b[4 + nl + vl..];
    }
    Ok(out)
}

/// All xattrs of an inode.
pub fn load(st: &mut Store, inode: &Inode) -> Result<Vec<Xattr>> {
    if inode.xattr_block != 0 {
        let blk = st.cache.get(&*st.dev, inode.xattr_block, Some(XATTR_MAGIC))?;
        let used = get_u32(blk, 20) as usize;
        if used > BLOCK_CAPACITY {
            return Err(Error::corrupt(format!("inode {}: xattr block overfull", inode.ino)));
        }
        return decode(inode.ino, &blk[32..32 + used]);
    }
    decode(inode.ino, &inode.xattr_inline[..inode.xattr_inline_len as usize])
}

/// The exact filter of a list.
pub fn filter_of(list: &[Xattr]) -> u32 {
    list.iter().fold(0, |f, x| f | filter_bit(x.idx, &x.name))
}

/// Store a new list, inline when it fits, else in the inode's xattr block.
pub fn store(st: &mut Store, inode: &mut Inode, list: &[Xattr]) -> Result<()> {
    let bytes = encode(list);
    if bytes.len() > BLOCK_CAPACITY {
        return Err(Error::NoSpace);
    }
    inode.xattr_filter = filter_of(list);
    if bytes.len() <= INLINE_XATTR {
        if inode.xattr_block != 0 {
            st.free_meta(inode.xattr_block);
            inode.xattr_block = 0;
            inode.blocks = inode.blocks.saturating_sub(1);
        }
        inode.xattr_inline = [0; INLINE_XATTR];
        inode.xattr_inline[..bytes.len()].copy_from_slice(&bytes);
        inode.xattr_inline_len = bytes.len() as u16;
        return Ok(());
    }
    if inode.xattr_block == 0 {
        inode.xattr_block = st.alloc_meta(crate::format::ino_loc(inode.ino).0)?;
        inode.blocks += 1;
    }
    let blk = st.cache.fresh(inode.xattr_block);
    put_u32(blk, 0, XATTR_MAGIC);
    put_u32(blk, 16, 1);
    put_u32(blk, 20, bytes.len() as u32);
    blk[32..32 + bytes.len()].copy_from_slice(&bytes);
    inode.xattr_inline = [0; INLINE_XATTR];
    inode.xattr_inline_len = 0;
    Ok(())
}

/// Whether the filter rules the name out (then storage need not be read).
pub fn ruled_out(inode: &Inode, idx: u8, suffix: &[u8]) -> bool {
    inode.xattr_filter & filter_bit(idx, suffix) == 0
}

/// Bytes a list takes (for the worst-case space charge of a setxattr).
pub fn encoded_len(list: &[Xattr]) -> usize {
    list.iter().map(|x| 4 + x.name.len() + x.value.len()).sum()
}

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
        let f = filter_of(&l);
        assert!(!ruled_out(&Inode { xattr_filter: f, ..Inode::new(1, libc::S_IFREG) }, 1, b"a"));
        assert_ne!(filter_bit(1, b"a"), 0);
        assert!(decode(1, &[1, 5, 0, 0, b'x']).is_err(), "overrun must be an error");
    }
}
