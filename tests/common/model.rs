//! An in-memory model of a volume's namespace keyed by the volume's own inode numbers,
//! for tests that pick inodes by number from several threads (tests/concurrent_model.rs):
//! operations are applied one at a time, each returning the result the volume must have
//! given. Unlinked inodes stay in the model (with no link), as they stay alive in a volume
//! whose holder ([`dxfs::Volume::set_holder`]) holds every inode, so inode numbers are
//! never reused.
//!
//! Semantics follow Linux where the volume's API can be reached by a caller (ENOENT for a
//! name made in a removed directory, ENOTDIR for a parent that is not a directory), and
//! the volume's documented choices elsewhere (a held unlinked file may be linked again,
//! as an O_TMPFILE file can).

use std::collections::{BTreeMap, HashMap};

use super::{set_first_links, Dump, Node};
use dxfs::{Attr, FileType, RenameFlags, SetAttr, Volume, XattrMode};

/// One operation, by inode numbers and names.
#[derive(Clone, Debug)]
pub enum Op {
    Create {
        dir: u64,
        name: String,
    },
    Mkdir {
        dir: u64,
        name: String,
    },
    /// A target of `len` bytes `byte`.
    Symlink {
        dir: u64,
        name: String,
        byte: u8,
        len: usize,
    },
    Unlink {
        dir: u64,
        name: String,
    },
    Rmdir {
        dir: u64,
        name: String,
    },
    /// `flags`: 0 plain, 1 RENAME_NOREPLACE, 2 RENAME_EXCHANGE.
    Rename {
        d1: u64,
        n1: String,
        d2: u64,
        n2: String,
        flags: u8,
    },
    Link {
        ino: u64,
        dir: u64,
        name: String,
    },
    Write {
        ino: u64,
        off: u64,
        len: usize,
        byte: u8,
    },
    Truncate {
        ino: u64,
        size: u64,
    },
    /// fallocate: `mode` 0 allocates (and may extend), 1 allocates keeping the size, 2
    /// punches a hole.
    Fallocate {
        ino: u64,
        off: u64,
        len: u64,
        mode: u8,
    },
    SetXattr {
        ino: u64,
        name: String,
        len: usize,
        byte: u8,
    },
    RemoveXattr {
        ino: u64,
        name: String,
    },
    GetXattr {
        ino: u64,
        name: String,
    },
    Readdir {
        dir: u64,
    },
    ReaddirPlus {
        dir: u64,
    },
    Lookup {
        dir: u64,
        name: String,
    },
    Getattr {
        ino: u64,
    },
    Read {
        ino: u64,
    },
}

/// What an inode looked like to an operation that returns attributes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Seen {
    pub ino: u64,
    pub kind: FileType,
    /// Files and symlinks only (a directory's size is the volume's business).
    pub size: Option<u64>,
    pub nlink: u32,
}

impl Seen {
    pub fn of(a: &Attr) -> Seen {
        let size = (a.kind != FileType::Directory).then_some(a.size);
        Seen { ino: a.ino, kind: a.kind, size, nlink: a.nlink }
    }
}

/// The result of an operation, reduced to what the model can predict.
#[derive(Clone, PartialEq, Eq)]
pub enum Outcome {
    Done,
    Attr(Seen),
    /// A listing without `.` and `..`: name -> inode.
    Entries(BTreeMap<Vec<u8>, u64>),
    /// A listing with attributes.
    EntriesPlus(BTreeMap<Vec<u8>, Seen>),
    Data(Vec<u8>),
    Wrote(usize),
    Err(i32),
}

impl std::fmt::Debug for Outcome {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Outcome::Done => write!(f, "Done"),
            Outcome::Attr(s) => write!(f, "{s:?}"),
            Outcome::Entries(e) => {
                let v: Vec<String> = e.iter().map(|(n, i)| format!("{}:{i}", String::from_utf8_lossy(n))).collect();
                write!(f, "Entries[{}]", v.join(" "))
            }
            Outcome::EntriesPlus(e) => {
                let v: Vec<String> = e.iter().map(|(n, a)| format!("{}:{a:?}", String::from_utf8_lossy(n))).collect();
                write!(f, "EntriesPlus[{}]", v.join(" "))
            }
            Outcome::Data(d) => {
                // Runs of equal bytes: what writes of one byte value leave.
                let mut runs: Vec<String> = Vec::new();
                let mut k = 0;
                while k < d.len() {
                    let j = d[k..].iter().position(|&b| b != d[k]).map_or(d.len(), |x| k + x);
                    runs.push(format!("{}x{}@{k}", d[k], j - k));
                    k = j;
                }
                write!(f, "Data({} bytes: {})", d.len(), runs.join(" "))
            }
            Outcome::Wrote(n) => write!(f, "Wrote({n})"),
            Outcome::Err(e) => write!(f, "Err({})", std::io::Error::from_raw_os_error(*e)),
        }
    }
}

fn outcome<T>(msg: &mut Option<String>, r: dxfs::Result<T>, f: impl FnOnce(T) -> Outcome) -> Outcome {
    match r {
        Ok(v) => f(v),
        Err(e) => {
            *msg = Some(e.to_string());
            Outcome::Err(e.errno())
        }
    }
}

/// Run `op` on the volume.
pub fn run(vol: &Volume, op: &Op) -> Outcome {
    run_with_message(vol, op).0
}

/// Run `op` on the volume; also returns the error's message, if it failed.
pub fn run_with_message(vol: &Volume, op: &Op) -> (Outcome, Option<String>) {
    let attr = |a: Attr| Outcome::Attr(Seen::of(&a));
    let done = |_| Outcome::Done;
    let mut m = None;
    let o = match op {
        Op::Create { dir, name } => outcome(&mut m, vol.create(*dir, name.as_bytes(), 0o644, 0, 0), attr),
        Op::Mkdir { dir, name } => outcome(&mut m, vol.mkdir(*dir, name.as_bytes(), 0o755, 0, 0), attr),
        Op::Symlink { dir, name, byte, len } => {
            outcome(&mut m, vol.symlink(*dir, name.as_bytes(), &vec![*byte; *len], 0, 0), attr)
        }
        Op::Unlink { dir, name } => outcome(&mut m, vol.unlink(*dir, name.as_bytes()), done),
        Op::Rmdir { dir, name } => outcome(&mut m, vol.rmdir(*dir, name.as_bytes()), done),
        Op::Rename { d1, n1, d2, n2, flags } => {
            let fl = RenameFlags { noreplace: *flags == 1, exchange: *flags == 2, whiteout: false };
            outcome(&mut m, vol.rename(*d1, n1.as_bytes(), *d2, n2.as_bytes(), fl), done)
        }
        Op::Link { ino, dir, name } => outcome(&mut m, vol.link(*ino, *dir, name.as_bytes()), attr),
        Op::Write { ino, off, len, byte } => outcome(&mut m, vol.write(*ino, *off, &vec![*byte; *len]), Outcome::Wrote),
        Op::Truncate { ino, size } => {
            outcome(&mut m, vol.setattr(*ino, &SetAttr { size: Some(*size), ..Default::default() }), attr)
        }
        Op::Fallocate { ino, off, len, mode } => {
            outcome(&mut m, vol.fallocate(*ino, *off, *len, *mode > 0, *mode == 2), done)
        }
        Op::ReaddirPlus { dir } => outcome(&mut m, vol.readdir_plus(*dir, 0, 100_000), |ents| {
            Outcome::EntriesPlus(
                ents.into_iter()
                    .filter(|(e, _)| e.name != b"." && e.name != b"..")
                    .map(|(e, a)| {
                        let s =
                            a.map_or(Seen { ino: e.ino, kind: e.ft, size: None, nlink: u32::MAX }, |a| Seen::of(&a));
                        (e.name, s)
                    })
                    .collect(),
            )
        }),
        Op::SetXattr { ino, name, len, byte } => {
            outcome(&mut m, vol.setxattr(*ino, name.as_bytes(), &vec![*byte; *len], XattrMode::Any), done)
        }
        Op::RemoveXattr { ino, name } => outcome(&mut m, vol.removexattr(*ino, name.as_bytes()), done),
        Op::GetXattr { ino, name } => outcome(&mut m, vol.getxattr(*ino, name.as_bytes()), Outcome::Data),
        Op::Readdir { dir } => outcome(&mut m, vol.readdir(*dir, 0, 100_000), |ents| {
            Outcome::Entries(
                ents.into_iter().filter(|e| e.name != b"." && e.name != b"..").map(|e| (e.name, e.ino)).collect(),
            )
        }),
        Op::Lookup { dir, name } => outcome(&mut m, vol.lookup(*dir, name.as_bytes()), attr),
        Op::Getattr { ino } => outcome(&mut m, vol.getattr(*ino), attr),
        Op::Read { ino } => outcome(&mut m, vol.read(*ino, 0, 1 << 22), Outcome::Data),
    };
    (o, m)
}

#[derive(Clone, Debug)]
pub enum Kind {
    File(Vec<u8>),
    Dir(BTreeMap<Vec<u8>, u64>),
    Symlink(Vec<u8>),
}

#[derive(Clone, Debug)]
pub struct MNode {
    pub kind: Kind,
    pub xattrs: BTreeMap<Vec<u8>, Vec<u8>>,
    /// Links (a directory: 2 plus its subdirectories while it has a name, 0 after).
    pub nlink: u32,
    /// A directory's parent (kept after it is removed, as the volume keeps it).
    pub parent: u64,
}

/// The model: every inode ever made, by the volume's inode number.
#[derive(Clone, Debug)]
pub struct FsModel {
    pub nodes: HashMap<u64, MNode>,
    pub root: u64,
}

const ENOENT: i32 = libc::ENOENT;

impl FsModel {
    /// A fresh volume: an empty root.
    pub fn new(root: u64) -> FsModel {
        let mut nodes = HashMap::new();
        nodes.insert(root, MNode { kind: Kind::Dir(BTreeMap::new()), xattrs: BTreeMap::new(), nlink: 2, parent: root });
        FsModel { nodes, root }
    }

    fn node(&self, ino: u64) -> Result<&MNode, i32> {
        // An inode number the volume never gave out cannot be asked for by these tests.
        self.nodes.get(&ino).ok_or(libc::ESTALE)
    }

    fn is_dir(&self, ino: u64) -> bool {
        matches!(self.nodes[&ino].kind, Kind::Dir(_))
    }

    /// The entries of directory `d` (ENOTDIR if it is not one).
    fn entries(&self, d: u64) -> Result<&BTreeMap<Vec<u8>, u64>, i32> {
        match &self.node(d)?.kind {
            Kind::Dir(e) => Ok(e),
            _ => Err(libc::ENOTDIR),
        }
    }

    fn entries_mut(&mut self, d: u64) -> &mut BTreeMap<Vec<u8>, u64> {
        match &mut self.nodes.get_mut(&d).unwrap().kind {
            Kind::Dir(e) => e,
            _ => unreachable!("not a directory"),
        }
    }

    /// A directory that still has a name (or is the root).
    fn live_dir(&self, d: u64) -> Result<&BTreeMap<Vec<u8>, u64>, i32> {
        let e = self.entries(d)?;
        if self.nodes[&d].nlink == 0 {
            return Err(ENOENT);
        }
        Ok(e)
    }

    fn seen(&self, ino: u64) -> Seen {
        let n = &self.nodes[&ino];
        let (kind, size) = match &n.kind {
            Kind::File(d) => (FileType::RegularFile, Some(d.len() as u64)),
            Kind::Dir(_) => (FileType::Directory, None),
            Kind::Symlink(t) => (FileType::Symlink, Some(t.len() as u64)),
        };
        Seen { ino, kind, size, nlink: n.nlink }
    }

    /// Whether directory `d` is `anc` or below it, by parent fields (as the volume walks).
    fn within(&self, mut d: u64, anc: u64) -> bool {
        loop {
            if d == anc {
                return true;
            }
            if d == self.root {
                return false;
            }
            d = self.nodes[&d].parent;
        }
    }

    fn add(&mut self, dir: u64, name: &[u8], ino: u64, kind: Kind) -> Result<(), String> {
        if self.nodes.contains_key(&ino) {
            return Err(format!("inode number {ino} given out twice"));
        }
        let d = matches!(kind, Kind::Dir(_));
        self.nodes.insert(ino, MNode { kind, xattrs: BTreeMap::new(), nlink: if d { 2 } else { 1 }, parent: dir });
        self.entries_mut(dir).insert(name.to_vec(), ino);
        if d {
            self.nodes.get_mut(&dir).unwrap().nlink += 1;
        }
        Ok(())
    }

    /// Drop one name of `ino` (a directory loses both of its own).
    fn drop_link(&mut self, ino: u64) {
        let n = self.nodes.get_mut(&ino).unwrap();
        n.nlink = n.nlink.saturating_sub(if matches!(n.kind, Kind::Dir(_)) { 2 } else { 1 });
    }

    /// Apply `op`, given what the volume returned (a create's new inode number comes
    /// from there); returns what the volume should have returned, or an error when
    /// the volume's answer cannot be taken in at all (an inode number reused).
    pub fn apply(&mut self, op: &Op, got: &Outcome) -> Result<Outcome, String> {
        Ok(match self.step(op, got)? {
            Ok(o) => o,
            Err(e) => Outcome::Err(e),
        })
    }

    fn step(&mut self, op: &Op, got: &Outcome) -> Result<Result<Outcome, i32>, String> {
        let r = match op {
            Op::Create { dir, name } | Op::Mkdir { dir, name } | Op::Symlink { dir, name, .. } => {
                let exists = match self.live_dir(*dir) {
                    Ok(e) => e.contains_key(name.as_bytes()),
                    Err(e) => return Ok(Err(e)),
                };
                if exists {
                    return Ok(Err(libc::EEXIST));
                }
                let Outcome::Attr(Seen { ino, .. }) = got else {
                    // The volume failed where it should not have: expect a fresh inode.
                    return Ok(Ok(Outcome::Attr(Seen { ino: 0, kind: FileType::RegularFile, size: None, nlink: 1 })));
                };
                let kind = match op {
                    Op::Create { .. } => Kind::File(Vec::new()),
                    Op::Mkdir { .. } => Kind::Dir(BTreeMap::new()),
                    Op::Symlink { byte, len, .. } => Kind::Symlink(vec![*byte; *len]),
                    _ => unreachable!(),
                };
                self.add(*dir, name.as_bytes(), *ino, kind)?;
                Ok(Outcome::Attr(self.seen(*ino)))
            }
            Op::Unlink { dir, name } | Op::Rmdir { dir, name } => {
                let rm_dir = matches!(op, Op::Rmdir { .. });
                let t = match self.entries(*dir) {
                    Ok(e) => e.get(name.as_bytes()).copied(),
                    Err(e) => return Ok(Err(e)),
                };
                let Some(t) = t else { return Ok(Err(ENOENT)) };
                match (rm_dir, self.is_dir(t)) {
                    (true, false) => return Ok(Err(libc::ENOTDIR)),
                    (false, true) => return Ok(Err(libc::EISDIR)),
                    (true, true) if !self.entries(t).unwrap().is_empty() => return Ok(Err(libc::ENOTEMPTY)),
                    _ => {}
                }
                self.entries_mut(*dir).remove(name.as_bytes());
                if rm_dir {
                    self.nodes.get_mut(dir).unwrap().nlink -= 1;
                }
                self.drop_link(t);
                Ok(Outcome::Done)
            }
            Op::Rename { d1, n1, d2, n2, flags } => {
                self.rename(*d1, n1.as_bytes(), *d2, n2.as_bytes(), *flags)?.map(|_| Outcome::Done)
            }
            Op::Link { ino, dir, name } => {
                let exists = match self.live_dir(*dir) {
                    Ok(e) => e.contains_key(name.as_bytes()),
                    Err(e) => return Ok(Err(e)),
                };
                if self.is_dir(*ino) {
                    return Ok(Err(libc::EPERM));
                }
                if exists {
                    return Ok(Err(libc::EEXIST));
                }
                // A held unlinked inode may be linked again (the volume's holder holds all).
                self.entries_mut(*dir).insert(name.as_bytes().to_vec(), *ino);
                self.nodes.get_mut(ino).unwrap().nlink += 1;
                Ok(Outcome::Attr(self.seen(*ino)))
            }
            Op::Write { ino, off, len, byte } => match &mut self.nodes.get_mut(ino).unwrap().kind {
                Kind::Dir(_) => Err(libc::EISDIR),
                Kind::Symlink(_) => Err(libc::EINVAL),
                Kind::File(c) => {
                    let (off, end) = (*off as usize, *off as usize + *len);
                    if c.len() < end {
                        c.resize(end, 0);
                    }
                    c[off..end].fill(*byte);
                    Ok(Outcome::Wrote(*len))
                }
            },
            Op::Truncate { ino, size } => match &mut self.nodes.get_mut(ino).unwrap().kind {
                Kind::Dir(_) => Err(libc::EISDIR),
                Kind::Symlink(_) => Err(libc::EINVAL),
                Kind::File(c) => {
                    c.resize(*size as usize, 0);
                    Ok(Outcome::Done)
                }
            }
            .map(|_| Outcome::Attr(self.seen(*ino))),
            Op::Fallocate { ino, off, len, mode } => match &mut self.nodes.get_mut(ino).unwrap().kind {
                Kind::Dir(_) => Err(libc::EISDIR),
                Kind::Symlink(_) => Err(libc::EINVAL),
                Kind::File(c) => {
                    let end = (*off + *len) as usize;
                    match mode {
                        0 if c.len() < end => c.resize(end, 0),
                        2 => {
                            let e = end.min(c.len());
                            if (*off as usize) < e {
                                c[*off as usize..e].fill(0);
                            }
                        }
                        _ => {}
                    }
                    Ok(Outcome::Done)
                }
            },
            Op::ReaddirPlus { dir } => self
                .entries(*dir)
                .map(|e| Outcome::EntriesPlus(e.iter().map(|(n, &i)| (n.clone(), self.seen(i))).collect())),
            Op::SetXattr { ino, name, len, byte } => {
                self.nodes.get_mut(ino).unwrap().xattrs.insert(name.as_bytes().to_vec(), vec![*byte; *len]);
                Ok(Outcome::Done)
            }
            Op::RemoveXattr { ino, name } => match self.nodes.get_mut(ino).unwrap().xattrs.remove(name.as_bytes()) {
                Some(_) => Ok(Outcome::Done),
                None => Err(libc::ENODATA),
            },
            Op::GetXattr { ino, name } => match self.node(*ino).map(|n| n.xattrs.get(name.as_bytes())) {
                Ok(Some(v)) => Ok(Outcome::Data(v.clone())),
                Ok(None) => Err(libc::ENODATA),
                Err(e) => Err(e),
            },
            Op::Readdir { dir } => self.entries(*dir).map(|e| Outcome::Entries(e.clone())),
            Op::Lookup { dir, name } => match self.entries(*dir) {
                Err(e) => Err(e),
                Ok(e) => match e.get(name.as_bytes()) {
                    None => Err(ENOENT),
                    Some(&i) => Ok(Outcome::Attr(self.seen(i))),
                },
            },
            Op::Getattr { ino } => self.node(*ino).map(|_| Outcome::Attr(self.seen(*ino))),
            Op::Read { ino } => match &self.node(*ino).map(|n| &n.kind) {
                Err(e) => Err(*e),
                Ok(Kind::Dir(_)) => Err(libc::EISDIR),
                Ok(Kind::File(d)) | Ok(Kind::Symlink(d)) => Ok(Outcome::Data(d.clone())),
            },
        };
        Ok(r)
    }

    fn rename(&mut self, d1: u64, n1: &[u8], d2: u64, n2: &[u8], flags: u8) -> Result<Result<(), i32>, String> {
        let (noreplace, exchange) = (flags == 1, flags == 2);
        let r = (|| {
            self.entries(d1)?;
            self.entries(d2)?;
            // No name is made in, or taken from, a removed directory.
            self.live_dir(d1)?;
            self.live_dir(d2)?;
            let s = *self.entries(d1)?.get(n1).ok_or(ENOENT)?;
            let t = self.entries(d2)?.get(n2).copied();
            if noreplace && t.is_some() {
                return Err(libc::EEXIST);
            }
            if exchange && t.is_none() {
                return Err(ENOENT);
            }
            if t == Some(s) {
                return Ok(());
            }
            if self.is_dir(s) && d1 != d2 && self.within(d2, s) {
                return Err(libc::EINVAL);
            }
            if exchange {
                let t = t.unwrap();
                if self.is_dir(t) && d1 != d2 && self.within(d1, t) {
                    return Err(libc::EINVAL);
                }
                self.entries_mut(d1).insert(n1.to_vec(), t);
                self.entries_mut(d2).insert(n2.to_vec(), s);
                if d1 != d2 {
                    let (sd, td) = (self.is_dir(s), self.is_dir(t));
                    if sd && !td {
                        self.nodes.get_mut(&d1).unwrap().nlink -= 1;
                        self.nodes.get_mut(&d2).unwrap().nlink += 1;
                    } else if td && !sd {
                        self.nodes.get_mut(&d1).unwrap().nlink += 1;
                        self.nodes.get_mut(&d2).unwrap().nlink -= 1;
                    }
                    if sd {
                        self.nodes.get_mut(&s).unwrap().parent = d2;
                    }
                    if td {
                        self.nodes.get_mut(&t).unwrap().parent = d1;
                    }
                }
                return Ok(());
            }
            if let Some(t) = t {
                match (self.is_dir(s), self.is_dir(t)) {
                    (true, false) => return Err(libc::ENOTDIR),
                    (false, true) => return Err(libc::EISDIR),
                    (true, true) if !self.entries(t).unwrap().is_empty() => return Err(libc::ENOTEMPTY),
                    _ => {}
                }
            }
            self.entries_mut(d2).insert(n2.to_vec(), s);
            self.entries_mut(d1).remove(n1);
            if self.is_dir(s) {
                if d1 != d2 {
                    self.nodes.get_mut(&d1).unwrap().nlink -= 1;
                    self.nodes.get_mut(&d2).unwrap().nlink += 1;
                }
                self.nodes.get_mut(&s).unwrap().parent = d2;
            }
            if let Some(t) = t {
                if self.is_dir(t) {
                    self.nodes.get_mut(&d2).unwrap().nlink -= 1;
                }
                self.drop_link(t);
            }
            Ok(())
        })();
        Ok(r)
    }

    /// The namespace from the root, in the form of [`super::dump`].
    pub fn dump(&self) -> Dump {
        let mut out = Dump::new();
        let mut files: Vec<(String, u64)> = Vec::new();
        let mut stack = vec![(self.root, String::new())];
        while let Some((d, path)) = stack.pop() {
            for (name, &ino) in self.entries(d).unwrap() {
                let p = format!("{path}/{}", String::from_utf8_lossy(name));
                let n = &self.nodes[&ino];
                let node = match &n.kind {
                    Kind::Dir(_) => {
                        stack.push((ino, p.clone()));
                        Node::Dir
                    }
                    Kind::File(data) => {
                        files.push((p.clone(), ino));
                        Node::File { data: data.clone(), first_link: String::new(), nlink: n.nlink }
                    }
                    Kind::Symlink(t) => Node::Symlink(t.clone()),
                };
                out.insert(p, (node, n.xattrs.iter().map(|(k, v)| (k.clone(), v.clone())).collect()));
            }
        }
        set_first_links(&mut out, files);
        out
    }
}
