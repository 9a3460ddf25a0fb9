//! Shared helpers for the integration tests.
#![allow(dead_code)]

pub mod model;
pub mod mutate;

use std::path::Path;
use std::sync::Arc;

use dxfs::block::{BlockDevice, MemDevice};
use dxfs::{mkfs, MkfsOptions, OpenOptions, Volume};

/// Write `chunk` again and again into `ino` from `offset` until a write fails; returns
/// the offset reached and the error.
pub fn write_until_error(vol: &Volume, ino: u64, mut offset: u64, chunk: &[u8]) -> (u64, dxfs::Error) {
    loop {
        match vol.write(ino, offset, chunk) {
            Ok(n) => offset += n as u64,
            Err(e) => return (offset, e),
        }
    }
}

/// A fresh volume of `blocks` 4 KiB blocks in memory.
pub fn mem_volume(blocks: u64) -> (Arc<MemDevice>, Volume) {
    let dev = Arc::new(MemDevice::new(blocks));
    mkfs(dev.clone(), &MkfsOptions::default()).expect("mkfs");
    let vol = Volume::open(dev.clone(), OpenOptions::default()).expect("open");
    (dev, vol)
}

/// Run fsck (read-only) and fail the test with its findings unless clean.
pub fn assert_clean(dev: Arc<dyn BlockDevice>) {
    let r = dxfs::fsck::check(dev, false, &mut |_| {}).expect("fsck ran");
    assert!(r.errors.is_empty() && r.fixed.is_empty(), "fsck found problems: {:#?}", r.errors);
}

/// Close a volume and check its device.
pub fn close_and_check(dev: Arc<MemDevice>, vol: Volume) {
    vol.close().expect("close");
    assert_clean(dev);
}

use std::collections::BTreeMap;

/// What a path holds, for comparing a volume with a model.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Node {
    Dir,
    /// Contents, and the first path (in sorted order) of the same inode: hard links.
    File {
        data: Vec<u8>,
        first_link: String,
        nlink: u32,
    },
    Symlink(Vec<u8>),
    Other(u32),
}

/// A canonical dump of the whole namespace: path -> (node, sorted xattrs).
pub type Dump = BTreeMap<String, (Node, Vec<(Vec<u8>, Vec<u8>)>)>;

/// Walk the volume from the root.
pub fn dump(vol: &Volume) -> Dump {
    use dxfs::FileType;
    let mut out = Dump::new();
    let mut stack = vec![(vol.root(), String::new())];
    let mut files = Vec::new();
    while let Some((ino, path)) = stack.pop() {
        let mut pos = 0;
        loop {
            let ents = vol.readdir(ino, pos, 1000).expect("readdir");
            if ents.is_empty() {
                break;
            }
            for e in &ents {
                pos = e.next;
                if e.name == b"." || e.name == b".." {
                    continue;
                }
                let p = format!("{path}/{}", String::from_utf8_lossy(&e.name));
                let a = vol.getattr(e.ino).expect("getattr");
                let mut xs: Vec<(Vec<u8>, Vec<u8>)> = vol
                    .listxattr(e.ino)
                    .expect("listxattr")
                    .into_iter()
                    .map(|n| {
                        let v = vol.getxattr(e.ino, &n).expect("getxattr of a listed name");
                        (n, v)
                    })
                    .collect();
                xs.sort();
                let node = match e.ft {
                    FileType::Directory => {
                        stack.push((e.ino, p.clone()));
                        Node::Dir
                    }
                    FileType::RegularFile => {
                        files.push((p.clone(), e.ino));
                        let data = vol.read(e.ino, 0, a.size as usize).expect("read");
                        assert_eq!(data.len() as u64, a.size, "{p}: short read");
                        Node::File { data, first_link: String::new(), nlink: a.nlink }
                    }
                    FileType::Symlink => Node::Symlink(vol.readlink(e.ino).expect("readlink")),
                    _ => Node::Other(a.mode),
                };
                out.insert(p, (node, xs));
            }
        }
    }
    set_first_links(&mut out, files);
    out
}

/// Fill in each file's `first_link`: the first of its paths in sorted order. `files` are
/// (path, inode) of every regular file in `out`.
pub fn set_first_links(out: &mut Dump, mut files: Vec<(String, u64)>) {
    files.sort();
    let mut first: std::collections::HashMap<u64, String> = std::collections::HashMap::new();
    for (p, ino) in &files {
        first.entry(*ino).or_insert_with(|| p.clone());
    }
    for (p, ino) in files {
        if let Some((Node::File { first_link, .. }, _)) = out.get_mut(&p) {
            *first_link = first[&ino].clone();
        }
    }
}

/// Open a crash image and return its namespace; fsck must find it clean before the
/// open (the image as cut) and after it (the recovered volume).
pub fn recover(img: Vec<u8>) -> Result<Dump, String> {
    let dev = Arc::new(MemDevice::from_bytes(img));
    let r = dxfs::fsck::check(dev.clone(), false, &mut |_| {}).map_err(|e| format!("fsck -n failed to run: {e}"))?;
    if !r.errors.is_empty() {
        return Err(format!("fsck -n: {:?}", r.errors));
    }
    // A read-only open replays in memory only (metadata in the cache, logged file data
    // over the device): it must see what a read-write open's replay writes home.
    let ro = Volume::open(dev.clone(), OpenOptions { read_only: true, ..OpenOptions::default() })
        .map_err(|e| format!("read-only open: {e}"))?;
    let seen = dump(&ro);
    drop(ro);
    let vol = Volume::open(dev.clone(), OpenOptions::default()).map_err(|e| format!("open: {e}"))?;
    let d = dump(&vol);
    vol.close().map_err(|e| format!("close: {e}"))?;
    if seen != d {
        return Err("a read-only open sees another state than the recovery writes home".into());
    }
    let r = dxfs::fsck::check(dev, false, &mut |_| {}).map_err(|e| format!("fsck failed to run: {e}"))?;
    if !r.errors.is_empty() {
        return Err(format!("fsck after recovery: {:?}", r.errors));
    }
    Ok(d)
}

/// Run the `dxfs` command; returns its exit code, stdout and stderr.
pub fn dxfs(args: &[&str]) -> (i32, String, String) {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_dxfs"))
        .args(args)
        // This host's records of the volumes it left: the test's, not /var/lib/dxfs.
        .env("DXFS_STATE_DIR", Path::new(env!("CARGO_TARGET_TMPDIR")).join("dxfs-state"))
        .output()
        .expect("run dxfs");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// A complete tar header of one entry (owner root), checksummed.
pub fn tar_entry(kind: tar::EntryType, name: &str, mode: u32, mtime: u64, size: u64) -> tar::Header {
    let mut h = tar::Header::new_gnu();
    h.set_path(name).unwrap();
    h.set_entry_type(kind);
    h.set_mode(mode);
    h.set_uid(0);
    h.set_gid(0);
    h.set_mtime(mtime);
    h.set_size(size);
    h.set_cksum();
    h
}
