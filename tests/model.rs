//! Model-based property test: random operation sequences run against the volume and an
//! in-memory model; results (including the errno of every failure) must agree, the
//! whole namespace must be identical after every reopen, and fsck must be clean.

mod common;

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use common::*;
use dxfs::block::MemDevice;
use dxfs::{OpenOptions, Volume};
use dxfs::{RenameFlags, SetAttr, XattrMode};
use proptest::prelude::*;

#[derive(Clone, Debug)]
enum Op {
    Create {
        d: usize,
        n: u8,
    },
    Mkdir {
        d: usize,
        n: u8,
    },
    Symlink {
        d: usize,
        n: u8,
        len: u16,
    },
    Write {
        f: usize,
        off: u32,
        len: u16,
        byte: u8,
    },
    Truncate {
        f: usize,
        size: u32,
    },
    Unlink {
        d: usize,
        n: u8,
    },
    Rmdir {
        d: usize,
        n: u8,
    },
    Rename {
        d1: usize,
        n1: u8,
        d2: usize,
        n2: u8,
        flags: u8,
    },
    Link {
        f: usize,
        d: usize,
        n: u8,
    },
    SetXattr {
        f: usize,
        n: u8,
        len: u16,
    },
    RemoveXattr {
        f: usize,
        n: u8,
    },
    /// Many entries at once, so index blocks split and merge.
    Bulk {
        d: usize,
        count: u16,
        create: bool,
    },
    Sync,
    Reopen,
}

fn op() -> impl Strategy<Value = Op> {
    let d = 0usize..64;
    let n = 0u8..8;
    prop_oneof![
        6 => (d.clone(), n.clone()).prop_map(|(d, n)| Op::Create { d, n }),
        3 => (d.clone(), n.clone()).prop_map(|(d, n)| Op::Mkdir { d, n }),
        1 => (d.clone(), n.clone(), 1u16..200).prop_map(|(d, n, len)| Op::Symlink { d, n, len }),
        8 => (0usize..64, 0u32..300_000, 0u16..20_000, any::<u8>()).prop_map(|(f, off, len, byte)| Op::Write { f, off, len, byte }),
        3 => (0usize..64, 0u32..300_000).prop_map(|(f, size)| Op::Truncate { f, size }),
        4 => (d.clone(), n.clone()).prop_map(|(d, n)| Op::Unlink { d, n }),
        2 => (d.clone(), n.clone()).prop_map(|(d, n)| Op::Rmdir { d, n }),
        4 => (d.clone(), n.clone(), d.clone(), n.clone(), 0u8..3).prop_map(|(d1, n1, d2, n2, flags)| Op::Rename { d1, n1, d2, n2, flags }),
        2 => (0usize..64, d.clone(), n.clone()).prop_map(|(f, d, n)| Op::Link { f, d, n }),
        2 => (0usize..64, 0u8..4, 0u16..600).prop_map(|(f, n, len)| Op::SetXattr { f, n, len }),
        1 => (0usize..64, 0u8..4).prop_map(|(f, n)| Op::RemoveXattr { f, n }),
        1 => (d.clone(), 1u16..600, any::<bool>()).prop_map(|(d, count, create)| Op::Bulk { d, count, create }),
        1 => Just(Op::Sync),
        1 => Just(Op::Reopen),
    ]
}

#[derive(Clone, Debug)]
enum Kind {
    File(Vec<u8>),
    Dir(BTreeMap<String, u64>),
    Symlink(Vec<u8>),
}

#[derive(Clone, Debug)]
struct MInode {
    kind: Kind,
    xattrs: BTreeMap<Vec<u8>, Vec<u8>>,
    parent: u64,
}

/// The model: inodes by model id, id 0 the root. `ino` maps model ids to real ones.
struct Model {
    inodes: HashMap<u64, MInode>,
    ino: HashMap<u64, u64>,
    next: u64,
}

type R = Result<(), i32>;

fn errno(r: dxfs::Result<impl Sized>) -> R {
    r.map(|_| ()).map_err(|e| e.errno())
}

impl Model {
    fn dirs(&self) -> Vec<u64> {
        let mut v: Vec<u64> =
            self.inodes.iter().filter(|(_, i)| matches!(i.kind, Kind::Dir(_))).map(|(k, _)| *k).collect();
        v.sort();
        v
    }
    fn files(&self) -> Vec<u64> {
        let mut v: Vec<u64> =
            self.inodes.iter().filter(|(_, i)| matches!(i.kind, Kind::File(_))).map(|(k, _)| *k).collect();
        v.sort();
        v
    }
    fn entries(&self, d: u64) -> &BTreeMap<String, u64> {
        match &self.inodes[&d].kind {
            Kind::Dir(e) => e,
            _ => unreachable!(),
        }
    }
    fn entries_mut(&mut self, d: u64) -> &mut BTreeMap<String, u64> {
        match &mut self.inodes.get_mut(&d).unwrap().kind {
            Kind::Dir(e) => e,
            _ => unreachable!(),
        }
    }
    fn is_dir(&self, id: u64) -> bool {
        matches!(self.inodes[&id].kind, Kind::Dir(_))
    }
    fn links(&self, id: u64) -> usize {
        self.inodes
            .values()
            .filter_map(|i| if let Kind::Dir(e) = &i.kind { Some(e) } else { None })
            .map(|e| e.values().filter(|v| **v == id).count())
            .sum()
    }
    fn drop_if_unlinked(&mut self, id: u64) {
        if self.links(id) == 0 {
            self.inodes.remove(&id);
            self.ino.remove(&id);
        }
    }
    /// Whether `d` is `anc` or below it.
    fn within(&self, mut d: u64, anc: u64) -> bool {
        loop {
            if d == anc {
                return true;
            }
            if d == 0 {
                return false;
            }
            d = self.inodes[&d].parent;
        }
    }
    fn add(&mut self, parent: u64, name: &str, kind: Kind, real: u64) {
        let id = self.next;
        self.next += 1;
        self.inodes.insert(id, MInode { kind, xattrs: BTreeMap::new(), parent });
        self.ino.insert(id, real);
        self.entries_mut(parent).insert(name.to_string(), id);
    }

    fn dump(&self) -> Dump {
        let mut out = Dump::new();
        let mut files: Vec<(String, u64)> = Vec::new();
        let mut stack = vec![(0u64, String::new())];
        while let Some((d, path)) = stack.pop() {
            for (name, id) in self.entries(d) {
                let p = format!("{path}/{name}");
                let i = &self.inodes[id];
                let node = match &i.kind {
                    Kind::Dir(_) => {
                        stack.push((*id, p.clone()));
                        Node::Dir
                    }
                    Kind::File(data) => {
                        files.push((p.clone(), *id));
                        Node::File { data: data.clone(), first_link: String::new(), nlink: self.links(*id) as u32 }
                    }
                    Kind::Symlink(t) => Node::Symlink(t.clone()),
                };
                out.insert(p, (node, i.xattrs.iter().map(|(k, v)| (k.clone(), v.clone())).collect()));
            }
        }
        set_first_links(&mut out, files);
        out
    }
}

fn name(n: u8) -> String {
    format!("n{n}")
}

/// Apply one op to both; return (volume result, model result).
fn step(vol: &Volume, m: &mut Model, op: &Op) -> (R, R) {
    let dirs = m.dirs();
    let files = m.files();
    let pick = |v: &Vec<u64>, i: usize| v[i % v.len()];
    match op {
        Op::Create { d, n } | Op::Mkdir { d, n } | Op::Symlink { d, n, .. } => {
            let d = pick(&dirs, *d);
            let nm = name(*n);
            let exists = m.entries(d).contains_key(&nm);
            let real = m.ino[&d];
            let r = match op {
                Op::Create { .. } => vol.create(real, nm.as_bytes(), 0o644, 0, 0),
                Op::Mkdir { .. } => vol.mkdir(real, nm.as_bytes(), 0o755, 0, 0),
                Op::Symlink { len, .. } => vol.symlink(real, nm.as_bytes(), &vec![b't'; *len as usize], 0, 0),
                _ => unreachable!(),
            };
            let want = if exists { Err(libc::EEXIST) } else { Ok(()) };
            if let Ok(a) = &r {
                if !exists {
                    let kind = match op {
                        Op::Create { .. } => Kind::File(Vec::new()),
                        Op::Mkdir { .. } => Kind::Dir(BTreeMap::new()),
                        Op::Symlink { len, .. } => Kind::Symlink(vec![b't'; *len as usize]),
                        _ => unreachable!(),
                    };
                    m.add(d, &nm, kind, a.ino);
                }
            }
            (errno(r), want)
        }
        Op::Write { f, off, len, byte } => {
            if files.is_empty() {
                return (Ok(()), Ok(()));
            }
            let f = pick(&files, *f);
            let data = vec![*byte; *len as usize];
            let r = vol.write(m.ino[&f], *off as u64, &data);
            if let Kind::File(c) = &mut m.inodes.get_mut(&f).unwrap().kind {
                if *len > 0 {
                    let end = *off as usize + *len as usize;
                    if c.len() < end {
                        c.resize(end, 0);
                    }
                    c[*off as usize..end].copy_from_slice(&data);
                }
            }
            (errno(r), Ok(()))
        }
        Op::Truncate { f, size } => {
            if files.is_empty() {
                return (Ok(()), Ok(()));
            }
            let f = pick(&files, *f);
            let r = vol.setattr(m.ino[&f], &SetAttr { size: Some(*size as u64), ..Default::default() });
            if let Kind::File(c) = &mut m.inodes.get_mut(&f).unwrap().kind {
                c.resize(*size as usize, 0);
            }
            (errno(r), Ok(()))
        }
        Op::Unlink { d, n } | Op::Rmdir { d, n } => {
            let d = pick(&dirs, *d);
            let nm = name(*n);
            let rm_dir = matches!(op, Op::Rmdir { .. });
            let target = m.entries(d).get(&nm).copied();
            let want = match target {
                None => Err(libc::ENOENT),
                Some(t) if rm_dir && !m.is_dir(t) => Err(libc::ENOTDIR),
                Some(t) if !rm_dir && m.is_dir(t) => Err(libc::EISDIR),
                Some(t) if rm_dir && !m.entries(t).is_empty() => Err(libc::ENOTEMPTY),
                Some(_) => Ok(()),
            };
            let real = m.ino[&d];
            let r = if rm_dir { vol.rmdir(real, nm.as_bytes()) } else { vol.unlink(real, nm.as_bytes()) };
            if want.is_ok() {
                let t = m.entries_mut(d).remove(&nm).unwrap();
                m.drop_if_unlinked(t);
            }
            (errno(r), want)
        }
        Op::Rename { d1, n1, d2, n2, flags } => {
            let (d1, d2) = (pick(&dirs, *d1), pick(&dirs, *d2));
            let (nm1, nm2) = (name(*n1), name(*n2));
            let fl = RenameFlags { noreplace: *flags == 1, exchange: *flags == 2, whiteout: false };
            let r = vol.rename(m.ino[&d1], nm1.as_bytes(), m.ino[&d2], nm2.as_bytes(), fl);
            let src = m.entries(d1).get(&nm1).copied();
            let dst = m.entries(d2).get(&nm2).copied();
            let want: R = (|| {
                let s = src.ok_or(libc::ENOENT)?;
                if fl.noreplace && dst.is_some() {
                    return Err(libc::EEXIST);
                }
                if fl.exchange && dst.is_none() {
                    return Err(libc::ENOENT);
                }
                if dst == Some(s) {
                    return Ok(());
                }
                if m.is_dir(s) && d1 != d2 && m.within(d2, s) {
                    return Err(libc::EINVAL);
                }
                if fl.exchange {
                    let t = dst.unwrap();
                    if m.is_dir(t) && d1 != d2 && m.within(d1, t) {
                        return Err(libc::EINVAL);
                    }
                    m.entries_mut(d1).insert(nm1.clone(), t);
                    m.entries_mut(d2).insert(nm2.clone(), s);
                    if m.is_dir(s) {
                        m.inodes.get_mut(&s).unwrap().parent = d2;
                    }
                    if m.is_dir(t) {
                        m.inodes.get_mut(&t).unwrap().parent = d1;
                    }
                    return Ok(());
                }
                if let Some(t) = dst {
                    if m.is_dir(s) && !m.is_dir(t) {
                        return Err(libc::ENOTDIR);
                    }
                    if !m.is_dir(s) && m.is_dir(t) {
                        return Err(libc::EISDIR);
                    }
                    if m.is_dir(t) && !m.entries(t).is_empty() {
                        return Err(libc::ENOTEMPTY);
                    }
                }
                m.entries_mut(d1).remove(&nm1);
                m.entries_mut(d2).insert(nm2.clone(), s);
                if m.is_dir(s) {
                    m.inodes.get_mut(&s).unwrap().parent = d2;
                }
                if let Some(t) = dst {
                    m.drop_if_unlinked(t);
                }
                Ok(())
            })();
            (errno(r), want)
        }
        Op::Link { f, d, n } => {
            if files.is_empty() {
                return (Ok(()), Ok(()));
            }
            let f = pick(&files, *f);
            let d = pick(&dirs, *d);
            let nm = name(*n);
            let r = vol.link(m.ino[&f], m.ino[&d], nm.as_bytes());
            let want = if m.entries(d).contains_key(&nm) { Err(libc::EEXIST) } else { Ok(()) };
            if want.is_ok() {
                m.entries_mut(d).insert(nm, f);
            }
            (errno(r), want)
        }
        Op::SetXattr { f, n, .. } | Op::RemoveXattr { f, n } => {
            let all: Vec<u64> = {
                let mut v: Vec<u64> = m.inodes.keys().copied().collect();
                v.sort();
                v
            };
            let id = all[*f % all.len()];
            let xn = format!("user.x{n}").into_bytes();
            let real = m.ino[&id];
            let xs = &mut m.inodes.get_mut(&id).unwrap().xattrs;
            if let Op::SetXattr { len, .. } = op {
                let val = vec![*n; *len as usize];
                let r = vol.setxattr(real, &xn, &val, XattrMode::Any);
                xs.insert(xn, val);
                (errno(r), Ok(()))
            } else {
                let r = vol.removexattr(real, &xn);
                let want = if xs.remove(&xn).is_some() { Ok(()) } else { Err(libc::ENODATA) };
                (errno(r), want)
            }
        }
        Op::Bulk { d, count, create } => {
            let d = pick(&dirs, *d);
            let real = m.ino[&d];
            for i in 0..*count {
                let nm = format!("bulk-{i}-{}", "x".repeat(i as usize % 40));
                let exists = m.entries(d).get(&nm).copied();
                if *create {
                    let r = vol.create(real, nm.as_bytes(), 0o600, 0, 0);
                    let want = if exists.is_some() { Err(libc::EEXIST) } else { Ok(()) };
                    if let (Ok(a), None) = (&r, exists) {
                        m.add(d, &nm, Kind::File(Vec::new()), a.ino);
                    }
                    let got = errno(r);
                    if got != want {
                        return (got, want);
                    }
                } else if let Some(t) = exists {
                    let r = if m.is_dir(t) { vol.rmdir(real, nm.as_bytes()) } else { vol.unlink(real, nm.as_bytes()) };
                    if r.is_err() {
                        return (Err(-2), Ok(()));
                    }
                    m.entries_mut(d).remove(&nm);
                    m.drop_if_unlinked(t);
                }
            }
            (Ok(()), Ok(()))
        }
        Op::Sync => (errno(vol.sync()), Ok(())),
        Op::Reopen => unreachable!("handled by the runner"),
    }
}

fn run(ops: &[Op], small_log: bool) -> Result<(), TestCaseError> {
    let dev = Arc::new(MemDevice::new(16_384));
    // A tiny log makes deltas commit by themselves in the middle of sequences.
    let o = dxfs::MkfsOptions { log_blocks: small_log.then_some(64), ..Default::default() };
    dxfs::mkfs(dev.clone(), &o).unwrap();
    // With the normal log, dirty pages are also flushed ahead of the commit from 2 on
    // (with the tiny log a flush would find no room).
    let opts = OpenOptions { flush_from: if small_log { 0 } else { 2 }, ..OpenOptions::default() };
    let mut vol = Volume::open(dev.clone(), opts.clone()).unwrap();
    let mut m = Model { inodes: HashMap::new(), ino: HashMap::new(), next: 1 };
    m.inodes.insert(0, MInode { kind: Kind::Dir(BTreeMap::new()), xattrs: BTreeMap::new(), parent: 0 });
    m.ino.insert(0, vol.root());
    for (k, op) in ops.iter().enumerate() {
        if let Op::Reopen = op {
            vol.close().unwrap();
            assert_clean(dev.clone());
            vol = Volume::open(dev.clone(), opts.clone()).unwrap();
            prop_assert_eq!(dump(&vol), m.dump(), "after reopen at step {}", k);
            continue;
        }
        let (got, want) = step(&vol, &mut m, op);
        prop_assert_eq!(got, want, "step {}: {:?}", k, op);
    }
    prop_assert_eq!(dump(&vol), m.dump());
    vol.close().unwrap();
    assert_clean(dev.clone());
    let vol = Volume::open(dev.clone(), OpenOptions::default()).unwrap();
    prop_assert_eq!(dump(&vol), m.dump(), "after the final reopen");
    Ok(())
}

fn cases() -> u32 {
    std::env::var("DXFS_MODEL_CASES").ok().and_then(|s| s.parse().ok()).unwrap_or(256)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: cases(), max_shrink_iters: 2000, ..ProptestConfig::default() })]
    #[test]
    fn volume_matches_model(ops in proptest::collection::vec(op(), 1..120), small_log in any::<bool>()) {
        run(&ops, small_log)?;
    }
}
