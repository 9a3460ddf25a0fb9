//! POSIX ACLs in Linux's xattr encoding, and the rules that keep them and the file mode
//! in step (the kernel leaves these to a FUSE server that enables POSIX ACLs): an access
//! ACL equivalent to the mode is not stored, chmod rewrites the ACL's owner, mask (or
//! group) and other entries, and new files inherit their directory's default ACL.
//!
//! Encoding: `version: u32 = 2`, then entries of `tag: u16, perm: u16, id: u32`.

use crate::error::{Error, Result};

const VERSION: u32 = 2;
pub const USER_OBJ: u16 = 0x01;
pub const USER: u16 = 0x02;
pub const GROUP_OBJ: u16 = 0x04;
pub const GROUP: u16 = 0x08;
pub const MASK: u16 = 0x10;
pub const OTHER: u16 = 0x20;

/// One ACL entry.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Entry {
    pub tag: u16,
    pub perm: u16,
    pub id: u32,
}

/// Decode and validate an ACL xattr value.
pub fn decode(v: &[u8]) -> Result<Vec<Entry>> {
    if v.len() < 4 || (v.len() - 4) % 8 != 0 || u32::from_le_bytes(v[..4].try_into().unwrap()) != VERSION {
        return Err(Error::Invalid("malformed POSIX ACL".into()));
    }
    let acl: Vec<Entry> = v[4..]
        .chunks(8)
        .map(|c| Entry {
            tag: u16::from_le_bytes([c[0], c[1]]),
            perm: u16::from_le_bytes([c[2], c[3]]),
            id: u32::from_le_bytes([c[4], c[5], c[6], c[7]]),
        })
        .collect();
    let count = |t| acl.iter().filter(|e| e.tag == t).count();
    let named = count(USER) + count(GROUP);
    if count(USER_OBJ) != 1
        || count(GROUP_OBJ) != 1
        || count(OTHER) != 1
        || count(MASK) > 1
        || (named > 0 && count(MASK) == 0)
        || acl.iter().any(|e| e.perm > 7 || ![USER_OBJ, USER, GROUP_OBJ, GROUP, MASK, OTHER].contains(&e.tag))
    {
        return Err(Error::Invalid("invalid POSIX ACL".into()));
    }
    Ok(acl)
}

/// Encode an ACL.
pub fn encode(acl: &[Entry]) -> Vec<u8> {
    let mut v = VERSION.to_le_bytes().to_vec();
    for e in acl {
        v.extend_from_slice(&e.tag.to_le_bytes());
        v.extend_from_slice(&e.perm.to_le_bytes());
        v.extend_from_slice(&e.id.to_le_bytes());
    }
    v
}

fn perm_of(acl: &[Entry], tag: u16) -> u32 {
    acl.iter().find(|e| e.tag == tag).map_or(0, |e| e.perm as u32)
}

/// The permission bits an access ACL implies (group bits from the mask if there is one).
pub fn mode_bits(acl: &[Entry]) -> u32 {
    let group = if acl.iter().any(|e| e.tag == MASK) { perm_of(acl, MASK) } else { perm_of(acl, GROUP_OBJ) };
    (perm_of(acl, USER_OBJ) << 6) | (group << 3) | perm_of(acl, OTHER)
}

/// Whether an access ACL says nothing the mode does not (owner, group, other only).
pub fn is_minimal(acl: &[Entry]) -> bool {
    acl.iter().all(|e| matches!(e.tag, USER_OBJ | GROUP_OBJ | OTHER))
}

/// chmod: set the owner, mask (or group) and other entries from `mode`.
pub fn chmod(acl: &mut [Entry], mode: u32) {
    let has_mask = acl.iter().any(|e| e.tag == MASK);
    for e in acl.iter_mut() {
        match e.tag {
            USER_OBJ => e.perm = ((mode >> 6) & 7) as u16,
            MASK => e.perm = ((mode >> 3) & 7) as u16,
            GROUP_OBJ if !has_mask => e.perm = ((mode >> 3) & 7) as u16,
            OTHER => e.perm = (mode & 7) as u16,
            _ => {}
        }
    }
}

/// A new inode in a directory with default ACL `default`, created with `mode`: returns
/// the new permission bits and its access ACL (None when equivalent to the mode), as
/// Linux's posix_acl_create does. The umask does not apply.
pub fn inherit(default: &[Entry], mode: u32) -> (u32, Option<Vec<Entry>>) {
    let mut acl = default.to_vec();
    let mut m = mode & 0o777;
    let has_mask = acl.iter().any(|e| e.tag == MASK);
    for e in acl.iter_mut() {
        match e.tag {
            USER_OBJ => {
                e.perm &= ((m >> 6) & 7) as u16;
                m &= ((e.perm as u32) << 6) | !0o700;
            }
            OTHER => {
                e.perm &= (m & 7) as u16;
                m &= e.perm as u32 | !0o007;
            }
            MASK => {
                e.perm &= ((m >> 3) & 7) as u16;
                m &= ((e.perm as u32) << 3) | !0o070;
            }
            GROUP_OBJ if !has_mask => {
                e.perm &= ((m >> 3) & 7) as u16;
                m &= ((e.perm as u32) << 3) | !0o070;
            }
            _ => {}
        }
    }
    let mode = (mode & !0o777) | (m & 0o777);
    (mode, if is_minimal(&acl) { None } else { Some(acl) })
}

/// Whether a caller may access an object in the ways `want` asks (bits 4 read, 2 write,
/// 1 execute), by POSIX.1e's access check: the owner by the owner bits; a named user by
/// its entry under the mask; else the groups (the owning group and named groups the
/// caller is in: granted if any matching entry grants all of `want` under the mask,
/// denied if some matched and none did); else other. Without an ACL the mode's classes
/// do the same. Root may do everything but execute what no one may execute.
pub fn permits(
    mode: u32,
    owner: (u32, u32),
    acl: Option<&[Entry]>,
    caller: (u32, &dyn Fn(u32) -> bool),
    want: u32,
) -> bool {
    let (uid, in_group) = caller;
    let want = want & 7;
    if uid == 0 {
        return want & 1 == 0 || mode & libc::S_IFMT == libc::S_IFDIR || mode & 0o111 != 0;
    }
    let grants = |perm: u32| perm & want == want;
    if uid == owner.0 {
        return grants(mode >> 6 & 7);
    }
    let Some(acl) = acl else {
        if in_group(owner.1) {
            return grants(mode >> 3 & 7);
        }
        return grants(mode & 7);
    };
    let mask = acl.iter().find(|e| e.tag == MASK).map_or(7, |e| u32::from(e.perm));
    if let Some(e) = acl.iter().find(|e| e.tag == USER && e.id == uid) {
        return grants(u32::from(e.perm) & mask);
    }
    let mut matched = false;
    for e in acl {
        let member = match e.tag {
            GROUP_OBJ => in_group(owner.1),
            GROUP => in_group(e.id),
            _ => false,
        };
        if member {
            matched = true;
            if grants(u32::from(e.perm) & mask) {
                return true;
            }
        }
    }
    !matched && grants(mode & 7)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn e(tag: u16, perm: u16, id: u32) -> Entry {
        Entry { tag, perm, id }
    }

    #[test]
    fn access_check_follows_posix_1e() {
        let file = libc::S_IFREG | 0o640;
        let owner = (1000, 100);
        let groups = |gs: &'static [u32]| move |g: u32| gs.contains(&g);
        let (none, staff, wheel) = (groups(&[]), groups(&[100]), groups(&[7, 100]));
        // Mode bits alone: owner rw, group r (supplementary groups count), other nothing.
        assert!(permits(file, owner, None, (1000, &none), 6));
        assert!(!permits(file, owner, None, (1000, &none), 1));
        assert!(permits(file, owner, None, (2000, &staff), 4));
        assert!(!permits(file, owner, None, (2000, &staff), 2));
        assert!(permits(file, owner, None, (2000, &wheel), 4));
        assert!(!permits(file, owner, None, (2000, &none), 4));
        // Root: anything but executing a file no one may execute.
        assert!(permits(file, owner, None, (0, &none), 6));
        assert!(!permits(file, owner, None, (0, &none), 1));
        assert!(permits(libc::S_IFDIR | 0o700, owner, None, (0, &none), 1));
        // An ACL: named user 2000 rw but the mask allows r only; group 7 rw; other nothing.
        let acl =
            [e(USER_OBJ, 6, 0), e(USER, 6, 2000), e(GROUP_OBJ, 0, 0), e(GROUP, 6, 7), e(MASK, 4, 0), e(OTHER, 0, 0)];
        let mode = libc::S_IFREG | 0o640;
        assert!(permits(mode, owner, Some(&acl), (2000, &none), 4));
        assert!(!permits(mode, owner, Some(&acl), (2000, &none), 2), "the mask limits named users");
        assert!(permits(mode, owner, Some(&acl), (3000, &wheel), 4), "named group 7, under the mask");
        assert!(!permits(mode, owner, Some(&acl), (3000, &wheel), 2));
        // A group entry matched without granting denies: other is not consulted.
        let open_other = [e(USER_OBJ, 6, 0), e(GROUP_OBJ, 0, 0), e(MASK, 7, 0), e(OTHER, 4, 0)];
        assert!(!permits(libc::S_IFREG | 0o604, owner, Some(&open_other), (3000, &staff), 4));
        assert!(permits(libc::S_IFREG | 0o604, owner, Some(&open_other), (3000, &none), 4));
    }

    #[test]
    fn encode_decode_validate() {
        let acl = vec![e(USER_OBJ, 6, 0), e(USER, 4, 65534), e(GROUP_OBJ, 4, 0), e(MASK, 4, 0), e(OTHER, 0, 0)];
        assert_eq!(decode(&encode(&acl)).unwrap(), acl);
        assert!(decode(&encode(&acl[..4])).is_err(), "no OTHER entry");
        assert!(
            decode(&encode(&[e(USER_OBJ, 6, 0), e(USER, 4, 1), e(GROUP_OBJ, 4, 0), e(OTHER, 0, 0)])).is_err(),
            "named entry without a mask"
        );
        assert!(decode(&[1, 0, 0, 0]).is_err());
        assert_eq!(mode_bits(&acl), 0o640);
    }

    #[test]
    fn chmod_updates_the_mask_not_the_group() {
        let mut acl = vec![e(USER_OBJ, 6, 0), e(USER, 7, 5), e(GROUP_OBJ, 5, 0), e(MASK, 7, 0), e(OTHER, 4, 0)];
        chmod(&mut acl, 0o750);
        assert_eq!(acl[0].perm, 7);
        assert_eq!(acl[2].perm, 5, "group entry untouched when a mask exists");
        assert_eq!(acl[3].perm, 5);
        assert_eq!(acl[4].perm, 0);
    }

    #[test]
    fn inheritance_masks_by_the_create_mode() {
        let def = vec![e(USER_OBJ, 7, 0), e(USER, 7, 5), e(GROUP_OBJ, 5, 0), e(MASK, 7, 0), e(OTHER, 5, 0)];
        let (mode, acl) = inherit(&def, libc::S_IFREG | 0o666);
        assert_eq!(mode, libc::S_IFREG | 0o664);
        let acl = acl.unwrap();
        assert_eq!(acl[0].perm, 6);
        assert_eq!(acl[1].perm, 7, "named entries are limited by the mask, not changed");
        assert_eq!(acl[3].perm, 6);
        let minimal = vec![e(USER_OBJ, 7, 0), e(GROUP_OBJ, 5, 0), e(OTHER, 0, 0)];
        assert_eq!(inherit(&minimal, libc::S_IFDIR | 0o777), (libc::S_IFDIR | 0o750, None));
    }
}
