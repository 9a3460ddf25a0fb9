//! The folders of `src/` are layers (docs/DESIGN.md, "Layers: the folders of src/"), and
//! this test holds the code to that: it reads every `crate::…` path outside test modules
//! and fails on one that reaches a higher layer, or sideways to a sibling at the same
//! level of a layer. (`super::` stays inside a module; `dxfs::` is the public API.)

use std::fs;
use std::path::{Path, PathBuf};

/// (layer, level within the layer) of a module path below `crate::`; `None` for paths
/// that name the crate root's re-exports (the public API, usable by the top layers).
fn rank(module: &[&str]) -> Option<(u32, u32)> {
    let first = *module.first()?;
    let second = module.get(1).copied().unwrap_or("");
    Some(match first {
        "error" => (0, 0),
        "disk" => (
            1,
            match second {
                "codec" | "hash" => 0,
                "format" | "device" => 1,
                "fault" => 2,
                _ => 3, // disk/mod.rs
            },
        ),
        "engine" => (
            2,
            match second {
                "leaf" | "deferred" => 0,
                "cache" => 1,
                "log" | "space" | "btree" => 2,
                "store" => 3,
                _ => 4,
            },
        ),
        "fs" => (
            3,
            match second {
                "acl" => 0,
                "dir" | "file" | "xattr" => 1,
                _ => 2,
            },
        ),
        "volume" => (4, 0),
        "fsck" | "tools" => (5, 0),
        "fuse" => (6, 0),
        _ => return None,
    })
}

/// The module path of a source file: `src/engine/btree/node.rs` → engine, btree, node.
fn module_of(rel: &Path) -> Vec<String> {
    let mut parts: Vec<String> = rel.iter().map(|p| p.to_string_lossy().into_owned()).collect();
    if let Some(last) = parts.last_mut() {
        *last = last.trim_end_matches(".rs").to_string();
    }
    if parts.last().is_some_and(|l| l == "mod") {
        parts.pop();
    }
    parts
}

/// Where `importer` may not use `target`: a higher layer, or a sibling module at the same
/// or a higher level of its own layer (files of one module — a folder below the layer's
/// own modules — may use each other).
fn violation(importer: &[String], target: &[&str]) -> Option<String> {
    let me: Vec<&str> = importer.iter().map(|s| s.as_str()).collect();
    let (Some(mine), Some(theirs)) = (rank(&me), rank(target)) else { return None };
    if theirs.0 > mine.0 {
        return Some("upward, to a higher layer".into());
    }
    let same_module = me.len() >= 2 && target.len() >= 2 && me[..2] == target[..2];
    if theirs.0 == mine.0 && !same_module && mine.0 != 4 && mine.0 != 5 && mine.0 != 6 && theirs.1 >= mine.1 {
        return Some("sideways or upward inside a layer".into());
    }
    None
}

/// The `crate::a::b` paths of a source text, outside `#[cfg(test)]` modules.
fn crate_paths(text: &str) -> Vec<(usize, Vec<String>)> {
    let mut out = Vec::new();
    for (n, line) in text.lines().enumerate() {
        if line.starts_with("#[cfg(test)]") {
            // Test modules come last in this code base; they may reach anywhere.
            break;
        }
        let code = line.split("//").next().unwrap_or("");
        let mut rest = code;
        while let Some(i) = rest.find("crate::") {
            let tail = &rest[i + "crate::".len()..];
            let path: Vec<String> = tail
                .split("::")
                .map(|seg| seg.chars().take_while(|c| c.is_alphanumeric() || *c == '_').collect::<String>())
                .take_while(|seg| !seg.is_empty() && seg.chars().next().is_some_and(|c| c.is_lowercase()))
                .collect();
            if !path.is_empty() {
                out.push((n + 1, path));
            }
            rest = tail;
        }
    }
    out
}

fn sources(dir: &Path, out: &mut Vec<PathBuf>) {
    for e in fs::read_dir(dir).unwrap().flatten() {
        let p = e.path();
        if p.is_dir() {
            sources(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

#[test]
fn imports_follow_the_layers() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    sources(&src, &mut files);
    files.sort();
    let mut bad = Vec::new();
    let mut checked = 0;
    for f in &files {
        let rel = f.strip_prefix(&src).unwrap();
        let module = module_of(rel);
        if module.first().is_some_and(|m| m == "cli" || m == "lib" || m == "main") {
            continue; // the binary uses `dxfs::`; lib.rs is the root that re-exports
        }
        for (line, path) in crate_paths(&fs::read_to_string(f).unwrap()) {
            let target: Vec<&str> = path.iter().map(|s| s.as_str()).collect();
            checked += 1;
            if let Some(why) = violation(&module, &target) {
                bad.push(format!("{}:{line}: crate::{} ({why})", rel.display(), path.join("::")));
            }
        }
    }
    assert!(checked > 100, "only {checked} imports found: the parser is broken");
    assert!(bad.is_empty(), "imports against the layers:\n{}", bad.join("\n"));
}

/// The checker itself: it must catch what it is for.
#[test]
fn the_checker_catches_upward_and_sideways_imports() {
    let m = |s: &str| module_of(Path::new(s));
    let paths = |t: &str| crate_paths(t).into_iter().map(|(_, p)| p).collect::<Vec<_>>();
    let v = |importer: &str, text: &str| {
        paths(text).iter().any(|p| violation(&m(importer), &p.iter().map(|s| s.as_str()).collect::<Vec<_>>()).is_some())
    };
    assert!(v("engine/space.rs", "use crate::volume::Volume;"), "engine → volume is upward");
    assert!(v("disk/format.rs", "use crate::engine::btree::TreeRoot;"), "disk → engine is upward");
    assert!(v("fs/dir.rs", "let m = crate::fs::file::usage_mark(st);"), "dir → file is sideways");
    assert!(v("engine/log.rs", "use crate::engine::store::Store;"), "log → store is upward in the engine");
    assert!(v("engine/btree/node.rs", "use crate::engine::store::Store;"), "btree → store");
    assert!(!v("engine/store.rs", "use crate::engine::btree::NodeStore;"), "store → btree is down");
    assert!(!v("fs/dir.rs", "use crate::engine::store::Store;"), "fs → engine is down");
    assert!(!v("volume/data.rs", "use crate::fs::file;"), "volume → fs is down");
    assert!(!v("engine/btree/balance.rs", "use crate::engine::btree::NodeStore;"), "inside one module");
    assert!(!v("fs/dir.rs", "// crate::volume::Volume in a comment"), "comments do not count");
    assert!(!v("fs/dir.rs", "#[cfg(test)]\nuse crate::volume::Volume;"), "test modules do not count");
}
