//! `dxfs debug ls|stat|htree|extents|xattrs|log`: print what `dxfs::tools::inspect` finds,
//! as text or (with --json) as one JSON document.

use std::path::Path;
use std::sync::Arc;

use serde_json::{json, Value};

use dxfs::block::{BlockDevice, FileDevice};
use dxfs::tools::inspect::Inspector;

use super::fail;

/// What to inspect.
#[derive(Clone, Copy)]
pub enum What {
    Ls,
    Stat,
    Htree,
    Extents,
    Xattrs,
    Log,
    Block(u64),
}

fn name(n: &[u8]) -> String {
    String::from_utf8_lossy(n).into_owned()
}

fn gather(image: &Path, path: &str, what: What) -> dxfs::Result<(Value, String)> {
    let dev = Arc::new(FileDevice::open(image, true)?) as Arc<dyn BlockDevice>;
    let mut ins = Inspector::open(dev)?;
    Ok(match what {
        What::Ls => {
            let list = ins.ls(path)?;
            let text = list.iter().map(|e| format!("{:>10} {:<12} {}\n", e.ino, e.file_type, name(&e.name))).collect();
            let j = list.iter().map(|e| json!({"name": name(&e.name), "inode": e.ino, "type": e.file_type})).collect();
            (Value::Array(j), text)
        }
        What::Stat => {
            let i = ins.stat(path)?;
            let t = |t: (i64, u32)| json!({"sec": t.0, "nsec": t.1});
            let j = json!({
                "inode": i.ino, "type": i.file_type, "mode": i.mode, "uid": i.uid, "gid": i.gid,
                "nlink": i.nlink, "size": i.size, "blocks": i.blocks,
                "atime": t(i.atime), "mtime": t(i.mtime), "ctime": t(i.ctime), "crtime": t(i.crtime),
                "generation": i.generation, "flags": i.flags, "rdev": i.rdev, "parent": i.parent,
                "xattr_block": i.xattr_block, "xattr_filter": i.xattr_filter,
                "xattr_inline_len": i.xattr_inline_len, "data": i.data,
            });
            let text = format!(
                "Inode: {}  Type: {}  Mode: {:o}  Links: {}\nUser: {}  Group: {}  Size: {}  Blocks: {}\n\
                 atime: {}.{:09}  mtime: {}.{:09}  ctime: {}.{:09}  crtime: {}.{:09}\n\
                 Generation: {}  Flags: {:#x}  Rdev: {:#x}  Parent: {}\n\
                 Xattr block: {}  Xattr filter: {:#010x}  Inline xattr bytes: {}  Data: {}\n",
                i.ino,
                i.file_type,
                i.mode,
                i.nlink,
                i.uid,
                i.gid,
                i.size,
                i.blocks,
                i.atime.0,
                i.atime.1,
                i.mtime.0,
                i.mtime.1,
                i.ctime.0,
                i.ctime.1,
                i.crtime.0,
                i.crtime.1,
                i.generation,
                i.flags,
                i.rdev,
                i.parent,
                i.xattr_block,
                i.xattr_filter,
                i.xattr_inline_len,
                i.data
            );
            (j, text)
        }
        What::Htree => {
            let h = ins.htree(path)?;
            let leaves: Vec<Value> = h
                .leaves
                .iter()
                .map(|l| {
                    json!({"block": l.block, "entries": l.entries, "bytes_used": l.bytes_used,
                           "fill": l.fill, "first_hash": l.first_hash, "last_hash": l.last_hash})
                })
                .collect();
            let j = json!({"depth": h.depth, "root": h.root, "entries": h.entries, "max_disp": h.max_disp,
                           "leaf_count": h.leaves.len(), "leaves": leaves});
            let mut text = format!(
                "depth {}  root block {}  entries {}  leaves {}  max displacement {}\n",
                h.depth,
                h.root,
                h.entries,
                h.leaves.len(),
                h.max_disp
            );
            for l in &h.leaves {
                text += &format!(
                    "leaf {:>10}  {:>4} entries  {:5.1}% full  hashes {:#018x}..={:#018x}\n",
                    l.block,
                    l.entries,
                    l.fill * 100.0,
                    l.first_hash,
                    l.last_hash
                );
            }
            (j, text)
        }
        What::Extents => {
            let list = ins.extents(path)?;
            let j = list
                .iter()
                .map(|e| json!({"logical": e.logical, "physical": e.physical, "length": e.length, "unwritten": e.unwritten}))
                .collect();
            let text = list
                .iter()
                .map(|e| {
                    format!(
                        "{:>12} -> {:>12}  {:>8} blocks{}\n",
                        e.logical,
                        e.physical,
                        e.length,
                        if e.unwritten { "  unwritten" } else { "" }
                    )
                })
                .collect();
            (Value::Array(j), text)
        }
        What::Xattrs => {
            let x = ins.xattrs(path)?;
            let names: Vec<Value> = x
                .names
                .iter()
                .map(|n| json!({"name": name(&n.name), "value_len": n.value_len, "bits": n.bits}))
                .collect();
            let j = json!({"filter": x.filter, "filter_enabled": x.filter_enabled, "hashes": x.hashes, "names": names});
            let mut text = format!(
                "filter {:#010x} ({}, {} bits per name)\n",
                x.filter,
                if x.filter_enabled { "kept" } else { "off" },
                x.hashes
            );
            for n in &x.names {
                text += &format!("{:#010x}  {:>6} bytes  {}\n", n.bits, n.value_len, name(&n.name));
            }
            (j, text)
        }
        What::Block(n) => {
            let b = ins.block(n)?;
            let fields: serde_json::Map<String, Value> =
                b.fields.iter().map(|(k, v)| (k.to_string(), json!(v))).collect();
            let j = json!({"block": b.block, "kind": b.kind, "checksum_ok": b.checksum_ok, "in_use": b.in_use,
                           "fields": fields});
            let check = match b.checksum_ok {
                Some(true) => ", checksum ok",
                Some(false) => ", CHECKSUM BAD",
                None => "",
            };
            let mut text =
                format!("block {}: {}{check}, {}\n", b.block, b.kind, if b.in_use { "in use" } else { "free" });
            for (k, v) in &b.fields {
                text += &format!("  {k:<14} {v}\n");
            }
            (j, text)
        }
        What::Log => {
            let areas = ins.log()?;
            let j = areas
                .iter()
                .map(|a| {
                    json!({"area": a.area, "start": a.start, "valid": a.valid, "sequence": a.sequence,
                           "blocks": a.blocks, "newest": a.newest, "body_ok": a.body_ok, "targets": a.targets})
                })
                .collect();
            let text = areas
                .iter()
                .map(|a| match (a.sequence, a.blocks) {
                    (Some(s), Some(b)) => format!(
                        "area {} (block {}): commit {s}, {b} blocks{}{}\n  targets: {}\n",
                        a.area,
                        a.start,
                        if a.newest { " (newest)" } else { "" },
                        if a.body_ok == Some(false) { ", body fails its checksum" } else { "" },
                        runs(&a.targets)
                    ),
                    _ => format!("area {} (block {}): no valid commit block\n", a.area, a.start),
                })
                .collect();
            (Value::Array(j), text)
        }
    })
}

/// Block numbers as comma-separated runs: "1, 130-131, 4000".
fn runs(blocks: &[u64]) -> String {
    let mut sorted = blocks.to_vec();
    sorted.sort_unstable();
    let mut parts: Vec<String> = Vec::new();
    let mut i = 0;
    while i < sorted.len() {
        let mut j = i;
        while j + 1 < sorted.len() && sorted[j + 1] == sorted[j] + 1 {
            j += 1;
        }
        parts.push(if i == j { sorted[i].to_string() } else { format!("{}-{}", sorted[i], sorted[j]) });
        i = j + 1;
    }
    if parts.is_empty() {
        "none".into()
    } else {
        parts.join(", ")
    }
}

pub fn run(image: &Path, path: &str, what: What, as_json: bool) -> i32 {
    match gather(image, path, what) {
        Ok((j, text)) => {
            if as_json {
                println!("{j}");
            } else {
                print!("{text}");
            }
            0
        }
        Err(e) => fail(format!("{}: {path}: {e}", image.display()), 8),
    }
}
