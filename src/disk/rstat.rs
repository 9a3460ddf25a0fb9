//! The rstat tree's two records (ro_compat RSTATS, FORMAT.md §6.2): a directory's
//! recursive statistics, and the directories that hold the links of a file with several.
//! Pure encoding: what keeps them exact lives in `engine::store::rstats`.

use super::codec::*;
use super::format::Inode;
use crate::error::{Error, Result};

/// Bytes of a directory's record.
pub(crate) const RSTAT_LEN: usize = 56;
/// Key bit of a link record: the rest of the key is the file's inode number.
pub(crate) const LINKS_KEY: u64 = 1 << 63;
/// Bytes of one (directory, links) entry of a link record.
const LINK_ENTRY: usize = 12;
/// Most directories one file's links may lie in (a link record fits in a B+tree value).
pub(crate) const MAX_LINK_DIRS: usize = 85;

/// Sums over the inodes counted below a directory (its subtree, itself not included),
/// and the newest ctime in the subtree (itself included). Counted: every inode with at
/// least one link, in the directory its `parent` names.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Rstat {
    /// Non-directories.
    pub files: u64,
    /// Directories.
    pub dirs: u64,
    /// Their `size` fields (files, symlinks, directories).
    pub bytes: u64,
    /// Their `blocks` fields (4 KiB blocks).
    pub blocks: u64,
    /// Entries in the subtree's directories (the directory's own included) that name a
    /// file with two links or more: while there are none, the files reached from the
    /// directory are exactly the files counted in it (what `du` sums).
    pub hardlinks: u64,
    /// The newest ctime in the subtree, the directory's own included.
    pub rctime: (i64, u32),
}

impl Rstat {
    pub(crate) fn encode(&self) -> [u8; RSTAT_LEN] {
        let mut b = [0u8; RSTAT_LEN];
        put_u64(&mut b, 0, self.files);
        put_u64(&mut b, 8, self.dirs);
        put_u64(&mut b, 16, self.bytes);
        put_u64(&mut b, 24, self.blocks);
        put_u64(&mut b, 32, self.hardlinks);
        put_u64(&mut b, 40, self.rctime.0 as u64);
        put_u32(&mut b, 48, self.rctime.1);
        b
    }

    /// A record read from disk: the right length, a nanosecond field below a second.
    pub(crate) fn decode(v: &[u8]) -> Result<Rstat> {
        if v.len() != RSTAT_LEN {
            return Err(Error::corrupt(format!("rstat record of {} bytes", v.len())));
        }
        let r = Rstat {
            files: get_u64(v, 0),
            dirs: get_u64(v, 8),
            bytes: get_u64(v, 16),
            blocks: get_u64(v, 24),
            hardlinks: get_u64(v, 32),
            rctime: (get_u64(v, 40) as i64, get_u32(v, 48)),
        };
        if r.rctime.1 >= 1_000_000_000 || get_u32(v, 52) != 0 {
            return Err(Error::corrupt("rstat record with a bad time or reserved bytes"));
        }
        Ok(r)
    }

    /// What inode `i` adds to the directory it is counted in: itself, and below it.
    pub(crate) fn of(i: &Inode, below: Option<&Rstat>) -> Rstat {
        Rstat::of_parts(i.is_dir(), i.size, i.blocks, i.ctime, below)
    }

    /// The same, from the fields it reads: whether a directory, size, blocks, ctime.
    pub(crate) fn of_parts(dir: bool, bytes: u64, blocks: u64, rctime: (i64, u32), below: Option<&Rstat>) -> Rstat {
        let mut r = Rstat { files: u64::from(!dir), dirs: u64::from(dir), bytes, blocks, hardlinks: 0, rctime };
        if let Some(b) = below {
            r.add(b);
        }
        r
    }

    /// Add `o` (sums saturate: a hostile volume's records cannot wrap them).
    pub fn add(&mut self, o: &Rstat) {
        self.files = self.files.saturating_add(o.files);
        self.dirs = self.dirs.saturating_add(o.dirs);
        self.bytes = self.bytes.saturating_add(o.bytes);
        self.blocks = self.blocks.saturating_add(o.blocks);
        self.hardlinks = self.hardlinks.saturating_add(o.hardlinks);
        self.rctime = self.rctime.max(o.rctime);
    }
}

/// The directories holding a file's links, with how many each holds, sorted by
/// directory: kept while the file has two links or more.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LinkDirs(pub Vec<(u64, u32)>);

impl LinkDirs {
    pub(crate) fn encode(&self) -> Vec<u8> {
        let mut v = vec![0u8; self.0.len() * LINK_ENTRY];
        for (k, &(d, n)) in self.0.iter().enumerate() {
            put_u64(&mut v, k * LINK_ENTRY, d);
            put_u32(&mut v, k * LINK_ENTRY + 8, n);
        }
        v
    }

    /// A record read from disk: whole entries, at most `MAX_LINK_DIRS`, directories
    /// strictly increasing, no zero directory or count.
    pub(crate) fn decode(v: &[u8]) -> Result<LinkDirs> {
        if v.len() % LINK_ENTRY != 0 || v.len() / LINK_ENTRY > MAX_LINK_DIRS || v.is_empty() {
            return Err(Error::corrupt(format!("link record of {} bytes", v.len())));
        }
        let l: Vec<(u64, u32)> = v.chunks(LINK_ENTRY).map(|c| (get_u64(c, 0), get_u32(c, 8))).collect();
        if l.iter().any(|&(d, n)| d == 0 || n == 0) || l.windows(2).any(|w| w[0].0 >= w[1].0) {
            return Err(Error::corrupt("link record out of order"));
        }
        Ok(LinkDirs(l))
    }

    /// Links counted.
    pub fn links(&self) -> u64 {
        self.0.iter().map(|&(_, n)| u64::from(n)).sum()
    }

    /// One more link in `dir`; false when that would pass `MAX_LINK_DIRS` directories.
    pub fn add(&mut self, dir: u64) -> bool {
        match self.0.binary_search_by_key(&dir, |&(d, _)| d) {
            Ok(k) => {
                self.0[k].1 = self.0[k].1.saturating_add(1);
                true
            }
            Err(_) if self.0.len() >= MAX_LINK_DIRS => false,
            Err(k) => {
                self.0.insert(k, (dir, 1));
                true
            }
        }
    }

    /// One link fewer in `dir` (none recorded there: nothing changes). Returns whether
    /// `dir` holds any link afterwards.
    pub fn remove(&mut self, dir: u64) -> bool {
        if let Ok(k) = self.0.binary_search_by_key(&dir, |&(d, _)| d) {
            self.0[k].1 -= 1;
            if self.0[k].1 == 0 {
                self.0.remove(k);
                return false;
            }
            return true;
        }
        false
    }

    pub fn holds(&self, dir: u64) -> bool {
        self.0.binary_search_by_key(&dir, |&(d, _)| d).is_ok()
    }

    /// The first directory holding a link.
    pub fn first(&self) -> Option<u64> {
        self.0.first().map(|&(d, _)| d)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_round_trip_and_bad_ones_are_refused() {
        let r = Rstat { files: 3, dirs: 1, bytes: 1 << 40, blocks: 9, hardlinks: 2, rctime: (-5, 999_999_999) };
        assert_eq!(Rstat::decode(&r.encode()).unwrap(), r);
        let mut bad = r.encode();
        bad[48..52].copy_from_slice(&1_000_000_000u32.to_le_bytes());
        assert!(Rstat::decode(&bad).is_err());
        assert!(Rstat::decode(&r.encode()[..40]).is_err());

        let mut l = LinkDirs::default();
        assert!(l.add(70) && l.add(40) && l.add(70));
        assert_eq!(l.0, vec![(40, 1), (70, 2)]);
        assert_eq!(l.links(), 3);
        assert_eq!(LinkDirs::decode(&l.encode()).unwrap(), l);
        assert!(l.remove(70) && !l.remove(40) && !l.remove(40));
        assert_eq!(l.0, vec![(70, 1)]);
        let out_of_order = LinkDirs(vec![(9, 1), (3, 1)]).encode();
        assert!(LinkDirs::decode(&out_of_order).is_err());
        assert!(LinkDirs::decode(&[]).is_err());
        let mut full = LinkDirs::default();
        for d in 1..=MAX_LINK_DIRS as u64 {
            assert!(full.add(d));
        }
        assert!(!full.add(1000), "one directory too many");
        assert!(full.encode().len() <= 1024);
    }
}
