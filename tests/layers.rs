//! The folders of `src/` are layers (docs/DESIGN.md, "Layers: the folders of `src/`"), and
//! this test holds the code to that. It parses every source file with `syn`, follows the
//! module tree from lib.rs and main.rs, and takes every path in code outside
//! `#[cfg(test)]` items: `use` trees whole (groups, renames, globs), paths in expressions,
//! types and patterns, and the paths among macro arguments. Each path is made absolute
//! from the module it is written in (`super::`, `self::`, names imported, names a glob
//! brings), followed through re-exports to the module that defines its item, and checked
//! against `LAYERS`.

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::Path;

use proc_macro2::{TokenStream, TokenTree};
use syn::ext::IdentExt;
use syn::punctuated::Punctuated;
use syn::spanned::Spanned;
use syn::visit::{self, Visit};
use syn::{Attribute, Ident, ImplItem, Item, Meta, Token, TraitItem, UseTree, Visibility};

/// A folder of `src/` (or `error.rs`): a layer.
struct Layer {
    name: &'static str,
    /// A layer uses only lower ones; two of one height do not use each other.
    height: u32,
    /// Its modules bottom up, a slice per level; a module uses only lower levels. Files
    /// of one folder-module (`engine/btree/*`) share its level and use each other. mod.rs
    /// declares and re-exports the folder's modules and may use them all; what it defines
    /// itself stands at `mod` (the top unless listed), or at its own name where listed.
    levels: &'static [&'static [&'static str]],
    /// Modules of one level may use each other.
    mutual: bool,
    /// The lower layers it may use other than through the public API; all if `None`.
    below: Option<&'static [&'static str]>,
}

const LAYERS: &[Layer] = &[
    Layer { name: "error", height: 0, levels: &[], mutual: false, below: None },
    Layer {
        name: "disk",
        height: 1,
        levels: &[&["codec", "hash"], &["format", "device"], &["fault", "valid", "overlay", "probe", "nbd", "rstat"]],
        mutual: false,
        below: None,
    },
    Layer {
        name: "engine",
        height: 2,
        levels: &[&["leaf", "deferred"], &["cache"], &["log", "space", "btree"], &["store"]],
        mutual: false,
        below: None,
    },
    // "None calls another, except through `acl` and `pages`".
    Layer {
        name: "fs",
        height: 3,
        levels: &[&["acl", "pages"], &["dir", "file", "xattr"]],
        mutual: false,
        below: None,
    },
    // No order inside: `Volume` (mod.rs) and its state are the hub of every file, its
    // methods are spread over the files, and each file takes `use super::*`.
    Layer {
        name: "volume",
        height: 4,
        levels: &[&[
            "mod",
            "ahead",
            "attrs",
            "charge",
            "commit",
            "contention",
            "data",
            "delta",
            "locks",
            "known",
            "mark",
            "mkfs",
            "namespace",
            "quota",
            "ranges",
            "readdir",
            "resize",
            "rstats",
            "tree",
            "trim",
            "types",
        ]],
        mutual: true,
        below: None,
    },
    // `Report` is what the walk fills in; the passes (`check`, mod.rs) drive the rest.
    Layer {
        name: "fsck",
        height: 5,
        levels: &[&["Report"], &["walk"], &["tally", "rstats"], &["repair"]],
        mutual: false,
        below: None,
    },
    // Four tools, independent of each other, and what they share.
    Layer {
        name: "tools",
        height: 5,
        levels: &[
            &["PathError", "ImportStats", "copy_contents", "copy_buffer", "go_on"],
            &["inspect", "import", "import_tar", "export"],
        ],
        mutual: false,
        below: None,
    },
    // The wire format and the small parts; the queue and the counters over them; the
    // transport; the options it is chosen by; the server; the session that starts it all.
    Layer {
        name: "fuse",
        height: 6,
        levels: &[
            &["wire", "mountinfo", "devfd", "fusermount", "lookups", "control", "blockers"],
            &["stats", "dirty_bound", "uring", "keep_awake"],
            &["transport"],
            &["FuseOptions", "MountFlags", "ReaddirPlus"],
            &["server"],
            &["session"],
        ],
        mutual: false,
        // DESIGN.md: "the public API and `volume`".
        below: Some(&["volume"]),
    },
];

/// Uses the rules forbid but allowed: (file, what it uses: a path prefix, as written from
/// the crate root or as followed to its module; why).
const EXCEPTIONS: &[(&str, &str, &str)] = &[
    // DESIGN.md's table lets the frontend use `engine::leaf`'s `Sharded` table: the
    // kernel's inode references are counted in shards like the volume's own tables.
    ("fuse/lookups.rs", "crate::engine::leaf::Sharded", "allowed by DESIGN.md"),
    // The files open for writing, looked up at every write open and release.
    ("fuse/server/mod.rs", "crate::engine::leaf::Sharded", "allowed by DESIGN.md"),
];

fn layer(name: &str) -> Option<&'static Layer> {
    LAYERS.iter().find(|l| l.name == name)
}

/// Where `place` (a module of the layer or a name of its mod.rs) stands in it.
fn level(layer: &Layer, place: &str) -> usize {
    layer.levels.iter().position(|l| l.contains(&place)).unwrap_or(layer.levels.len())
}

/// A module: a file, or a `mod name { … }` inside one.
#[derive(Default)]
struct Module {
    file: String,
    /// Its modules, and the other items it defines.
    children: BTreeSet<String>,
    defined: BTreeSet<String>,
    /// The names it makes public and does not hide from the docs (the crate root's: the API).
    api: BTreeSet<String>,
    /// Its `use` items: the name each binds (`None`: a glob) and its path as written.
    imports: Vec<(Option<String>, Vec<String>)>,
    /// Every path its code uses, as written.
    uses: Vec<Use>,
}

struct Use {
    path: Vec<String>,
    /// `use path::*`.
    glob: bool,
    line: usize,
}

/// The (module, name) pairs a lookup went through.
type Seen = BTreeSet<(Vec<String>, String)>;

/// A crate's modules by path below `crate`.
struct Crate {
    modules: BTreeMap<Vec<String>, Module>,
}

/// A test-only item: `#[cfg(test)]`, `#[cfg(all(test, …))]`.
fn test_only(attrs: &[Attribute]) -> bool {
    fn needs_test(m: &Meta) -> bool {
        let list = |l: &syn::MetaList| l.parse_args_with(Punctuated::<Meta, Token![,]>::parse_terminated).ok();
        match m {
            Meta::Path(p) => p.is_ident("test"),
            Meta::List(l) if l.path.is_ident("all") => list(l).is_some_and(|l| l.iter().any(needs_test)),
            Meta::List(l) if l.path.is_ident("any") => {
                list(l).is_some_and(|l| !l.is_empty() && l.iter().all(needs_test))
            }
            _ => false,
        }
    }
    attrs.iter().any(|a| a.path().is_ident("cfg") && a.parse_args::<Meta>().is_ok_and(|m| needs_test(&m)))
}

fn doc_hidden(attrs: &[Attribute]) -> bool {
    attrs.iter().any(|a| a.path().is_ident("doc") && a.parse_args::<Ident>().is_ok_and(|i| i == "hidden"))
}

/// An item's attributes, visibility and name.
fn parts(item: &Item) -> (&[Attribute], Option<&Visibility>, Option<&Ident>) {
    match item {
        Item::Const(i) => (&i.attrs, Some(&i.vis), Some(&i.ident)),
        Item::Enum(i) => (&i.attrs, Some(&i.vis), Some(&i.ident)),
        Item::ExternCrate(i) => (&i.attrs, Some(&i.vis), Some(i.rename.as_ref().map_or(&i.ident, |r| &r.1))),
        Item::Fn(i) => (&i.attrs, Some(&i.vis), Some(&i.sig.ident)),
        Item::ForeignMod(i) => (&i.attrs, None, None),
        Item::Impl(i) => (&i.attrs, None, None),
        Item::Macro(i) => (&i.attrs, None, i.ident.as_ref()),
        Item::Mod(i) => (&i.attrs, Some(&i.vis), Some(&i.ident)),
        Item::Static(i) => (&i.attrs, Some(&i.vis), Some(&i.ident)),
        Item::Struct(i) => (&i.attrs, Some(&i.vis), Some(&i.ident)),
        Item::Trait(i) => (&i.attrs, Some(&i.vis), Some(&i.ident)),
        Item::TraitAlias(i) => (&i.attrs, Some(&i.vis), Some(&i.ident)),
        Item::Type(i) => (&i.attrs, Some(&i.vis), Some(&i.ident)),
        Item::Union(i) => (&i.attrs, Some(&i.vis), Some(&i.ident)),
        Item::Use(i) => (&i.attrs, Some(&i.vis), None),
        _ => (&[], None, None),
    }
}

fn text(i: &Ident) -> String {
    i.unraw().to_string()
}

/// The paths of a `use` tree: the name each binds (`None`: a glob), the path, its line.
fn flatten(tree: &UseTree) -> Vec<(Option<String>, Vec<String>, usize)> {
    type Out = Vec<(Option<String>, Vec<String>, usize)>;
    fn bind(prefix: &[String], ident: &Ident, rename: Option<&Ident>, out: &mut Out) {
        let mut path = prefix.to_vec();
        if ident != "self" {
            path.push(text(ident));
        }
        let bound = rename.map(text).or_else(|| path.last().cloned());
        out.push((bound, path, ident.span().start().line));
    }
    fn walk(t: &UseTree, prefix: &mut Vec<String>, out: &mut Out) {
        match t {
            UseTree::Path(p) => {
                prefix.push(text(&p.ident));
                walk(&p.tree, prefix, out);
                prefix.pop();
            }
            UseTree::Name(n) => bind(prefix, &n.ident, None, out),
            UseTree::Rename(r) => bind(prefix, &r.ident, Some(&r.rename), out),
            UseTree::Glob(g) => out.push((None, prefix.clone(), g.span().start().line)),
            UseTree::Group(g) => g.items.iter().for_each(|t| walk(t, prefix, out)),
        }
    }
    let mut out = Vec::new();
    walk(tree, &mut Vec::new(), &mut out);
    out
}

/// Collects the paths of code outside `#[cfg(test)]` items.
struct Paths<'a>(&'a mut Vec<Use>);

impl Paths<'_> {
    fn add(&mut self, path: Vec<String>, glob: bool, line: usize) {
        if !path.is_empty() {
            self.0.push(Use { path, glob, line });
        }
    }

    /// The paths of two or more segments among a macro's tokens (`format!("{}", a::b)`).
    fn tokens(&mut self, tokens: TokenStream) {
        let tts: Vec<TokenTree> = tokens.into_iter().collect();
        let mut i = 0;
        while i < tts.len() {
            match &tts[i] {
                TokenTree::Group(g) => self.tokens(g.stream()),
                TokenTree::Ident(id) => {
                    let mut path = vec![id.to_string()];
                    while let (Some(TokenTree::Punct(a)), Some(TokenTree::Punct(b)), Some(TokenTree::Ident(n))) =
                        (tts.get(i + 1), tts.get(i + 2), tts.get(i + 3))
                    {
                        if a.as_char() != ':' || b.as_char() != ':' {
                            break;
                        }
                        path.push(text(n));
                        i += 3;
                    }
                    if path.len() > 1 {
                        self.add(path, false, id.span().start().line);
                    }
                }
                _ => {}
            }
            i += 1;
        }
    }
}

impl<'ast> Visit<'ast> for Paths<'_> {
    fn visit_item(&mut self, i: &'ast Item) {
        if !test_only(parts(i).0) {
            visit::visit_item(self, i);
        }
    }
    fn visit_impl_item(&mut self, i: &'ast ImplItem) {
        let attrs: &[Attribute] = match i {
            ImplItem::Const(x) => &x.attrs,
            ImplItem::Fn(x) => &x.attrs,
            ImplItem::Type(x) => &x.attrs,
            ImplItem::Macro(x) => &x.attrs,
            _ => &[],
        };
        if !test_only(attrs) {
            visit::visit_impl_item(self, i);
        }
    }
    fn visit_trait_item(&mut self, i: &'ast TraitItem) {
        let attrs: &[Attribute] = match i {
            TraitItem::Const(x) => &x.attrs,
            TraitItem::Fn(x) => &x.attrs,
            TraitItem::Type(x) => &x.attrs,
            TraitItem::Macro(x) => &x.attrs,
            _ => &[],
        };
        if !test_only(attrs) {
            visit::visit_trait_item(self, i);
        }
    }
    fn visit_field(&mut self, f: &'ast syn::Field) {
        if !test_only(&f.attrs) {
            visit::visit_field(self, f);
        }
    }
    fn visit_variant(&mut self, v: &'ast syn::Variant) {
        if !test_only(&v.attrs) {
            visit::visit_variant(self, v);
        }
    }
    fn visit_arm(&mut self, a: &'ast syn::Arm) {
        if !test_only(&a.attrs) {
            visit::visit_arm(self, a);
        }
    }
    fn visit_local(&mut self, l: &'ast syn::Local) {
        if !test_only(&l.attrs) {
            visit::visit_local(self, l);
        }
    }
    fn visit_stmt_macro(&mut self, s: &'ast syn::StmtMacro) {
        if !test_only(&s.attrs) {
            visit::visit_stmt_macro(self, s);
        }
    }
    fn visit_item_use(&mut self, u: &'ast syn::ItemUse) {
        if u.leading_colon.is_none() {
            for (bound, path, line) in flatten(&u.tree) {
                self.add(path, bound.is_none(), line);
            }
        }
    }
    fn visit_path(&mut self, p: &'ast syn::Path) {
        if p.leading_colon.is_none() {
            let line = p.segments.first().map_or(0, |s| s.ident.span().start().line);
            self.add(p.segments.iter().map(|s| text(&s.ident)).collect(), false, line);
        }
        visit::visit_path(self, p);
    }
    fn visit_macro(&mut self, m: &'ast syn::Macro) {
        self.visit_path(&m.path);
        self.tokens(m.tokens.clone());
    }
    // `pub(in crate::volume)` names a scope, not something used; attributes are docs and cfgs.
    fn visit_visibility(&mut self, _: &'ast Visibility) {}
    fn visit_attribute(&mut self, _: &'ast Attribute) {}
}

/// The source file of `mod name;` declared where child modules live in `dir`.
fn file_of(dir: &str, name: &str, files: &BTreeMap<String, syn::File>) -> Option<String> {
    let base = if dir.is_empty() { name.to_string() } else { format!("{dir}/{name}") };
    [format!("{base}.rs"), format!("{base}/mod.rs")].into_iter().find(|f| files.contains_key(f))
}

impl Crate {
    /// The crate whose root is `root`; `reached` gets each of its files (false: tests only).
    fn load(root: &str, files: &BTreeMap<String, syn::File>, reached: &mut BTreeMap<String, bool>) -> Crate {
        let mut c = Crate { modules: BTreeMap::new() };
        reached.insert(root.into(), true);
        c.add(Vec::new(), "", root, &files[root].items, files, reached);
        c
    }

    fn add(
        &mut self,
        path: Vec<String>,
        dir: &str,
        file: &str,
        items: &[Item],
        files: &BTreeMap<String, syn::File>,
        reached: &mut BTreeMap<String, bool>,
    ) {
        let mut m = Module { file: file.into(), ..Default::default() };
        for item in items {
            let (attrs, vis, ident) = parts(item);
            let public = matches!(vis, Some(Visibility::Public(_))) && !doc_hidden(attrs);
            if let Item::Mod(sub) = item {
                let n = text(&sub.ident);
                let child_dir = if dir.is_empty() { n.clone() } else { format!("{dir}/{n}") };
                let child_path = [&path[..], std::slice::from_ref(&n)].concat();
                let (child_file, child_items, test) = match &sub.content {
                    Some((_, inner)) => (file.to_string(), &inner[..], test_only(attrs)),
                    None => {
                        assert!(!attrs.iter().any(|a| a.path().is_ident("path")), "{file}: `#[path]` is not followed");
                        let f = file_of(dir, &n, files).unwrap_or_else(|| panic!("{file}: no file for `mod {n}`"));
                        let test = test_only(attrs) || test_only(&files[&f].attrs);
                        reached.insert(f.clone(), !test);
                        let items = &files[&f].items[..];
                        (f, items, test)
                    }
                };
                if !test {
                    self.add(child_path, &child_dir, &child_file, child_items, files, reached);
                    m.children.insert(n.clone());
                    if public {
                        m.api.insert(n);
                    }
                }
                continue;
            }
            if test_only(attrs) {
                continue;
            }
            if let Item::Use(u) = item {
                let tree = if u.leading_colon.is_none() { flatten(&u.tree) } else { Vec::new() };
                for (bound, p, _) in tree {
                    if public {
                        m.api.extend(bound.clone());
                    }
                    m.imports.push((bound, p));
                }
            } else if let Some(i) = ident {
                m.defined.insert(text(i));
                if public {
                    m.api.insert(text(i));
                }
            }
            Paths(&mut m.uses).visit_item(item);
        }
        self.modules.insert(path, m);
    }

    /// What `name` stands for in `module`, from the crate root: an item or module of its
    /// own, a name it imports, or else one a glob import brings. Not followed further.
    fn lookup(&self, module: &[String], name: &str, seen: &mut Seen) -> Option<Vec<String>> {
        let m = self.modules.get(module)?;
        if !seen.insert((module.to_vec(), name.to_string())) || seen.len() > 256 {
            return None; // a cycle of glob imports
        }
        if m.children.contains(name) || m.defined.contains(name) {
            return Some([module, &[name.to_string()]].concat());
        }
        if let Some((_, p)) = m.imports.iter().find(|(n, _)| n.as_deref() == Some(name)) {
            return self.absolute(module, p, seen);
        }
        m.imports.iter().filter(|(n, _)| n.is_none()).find_map(|(_, p)| {
            let g = self.absolute(module, p, seen)?;
            self.lookup(&g, name, seen)?;
            Some([&g[..], &[name.to_string()]].concat())
        })
    }

    /// `path`, written in `module`, from the crate root; `None` if it leaves the crate
    /// (other crates, local variables, generic parameters).
    fn absolute(&self, module: &[String], path: &[String], seen: &mut Seen) -> Option<Vec<String>> {
        let (first, mut rest) = path.split_first()?;
        let mut base = match first.as_str() {
            "crate" => Vec::new(),
            "self" => module.to_vec(),
            "super" => {
                let mut b = module.to_vec();
                b.pop()?;
                while let Some(("super", r)) = rest.split_first().map(|(s, r)| (s.as_str(), r)) {
                    b.pop()?;
                    rest = r;
                }
                b
            }
            _ => self.lookup(module, first, seen)?,
        };
        base.extend(rest.iter().cloned());
        Some(base)
    }

    /// `path` (absolute) followed through re-exports to the module that defines its item.
    fn follow(&self, mut path: Vec<String>) -> Vec<String> {
        'hop: for _ in 0..16 {
            for i in 0..path.len() {
                let Some(m) = self.modules.get(&path[..i]) else { break 'hop };
                if m.children.contains(&path[i]) {
                    continue;
                }
                if m.defined.contains(&path[i]) {
                    break 'hop;
                }
                let Some(to) = self.lookup(&path[..i], &path[i], &mut BTreeSet::new()) else { break 'hop };
                path = [&to[..], &path[i + 1..]].concat();
                continue 'hop;
            }
            break;
        }
        path
    }

    /// Where `path` (absolute, followed) stands in `layer`: the module of the layer it is
    /// in, or a name of its mod.rs that the table places, or `mod`.
    fn place<'a>(&self, layer: &Layer, path: &'a [String]) -> &'a str {
        match path.get(1) {
            Some(n)
                if self.modules[&path[..1]].children.contains(n)
                    || layer.levels.iter().any(|l| l.contains(&n.as_str())) =>
            {
                n
            }
            _ => "mod",
        }
    }

    /// Why module `from` may not use `target` (followed; `written` is the path as written,
    /// from the crate root).
    fn rule(&self, from: &[String], written: &[String], target: &[String]) -> Option<&'static str> {
        let me = layer(from.first()?)?;
        let it = layer(target.first()?)?;
        if it.height > me.height {
            return Some("upward, to a higher layer");
        }
        if it.name != me.name {
            if it.height == me.height {
                return Some("sideways, to another layer of the same height");
            }
            // The public API: a path through the crate root's public names (`crate::Volume`,
            // `crate::block::…`), not the layer's own.
            let api =
                written.first().is_some_and(|n| n != me.name && self.modules[&Vec::<String>::new()].api.contains(n));
            return match me.below {
                Some(ok) if !ok.contains(&it.name) && !api => Some("past the public API, to a lower layer"),
                _ => None,
            };
        }
        if from.len() == 1 {
            return None; // mod.rs declares and re-exports its folder's modules
        }
        let (mine, theirs) = (self.place(me, from), self.place(it, target));
        let (a, b) = (level(me, mine), level(it, theirs));
        if mine == theirs || b < a || (b == a && me.mutual) {
            None
        } else if b == a {
            Some("sideways, inside the layer")
        } else {
            Some("upward, inside the layer")
        }
    }
}

struct Finding {
    file: String,
    line: usize,
    /// The path as written, and what it names: from the root, then followed.
    written: String,
    named: String,
    target: String,
    why: &'static str,
}

/// Everything the checker finds: uses against the rules, and problems with the tree or
/// the tables; `checked` counts the paths into the crate it checked.
struct Report {
    findings: Vec<Finding>,
    problems: Vec<String>,
    checked: usize,
}

/// Checks src/, with `extra` text appended to some of its files (for the self-test).
fn check(extra: &[(&str, &str)]) -> Report {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut names = Vec::new();
    sources(&src, &mut names);
    let mut files = BTreeMap::new();
    for f in names {
        let rel = f.strip_prefix(&src).unwrap().to_string_lossy().replace('\\', "/");
        let mut text = fs::read_to_string(&f).unwrap();
        for (_, more) in extra.iter().filter(|(e, _)| *e == rel) {
            text = format!("{text}\n{more}\n");
        }
        let parsed = syn::parse_file(&text).unwrap_or_else(|e| panic!("src/{rel}: {e}"));
        files.insert(rel, parsed);
    }
    let mut reached = BTreeMap::new();
    let lib = Crate::load("lib.rs", &files, &mut reached);
    let bin = Crate::load("main.rs", &files, &mut reached);
    let mut problems: Vec<String> =
        files.keys().filter(|f| !reached.contains_key(*f)).map(|f| format!("src/{f} is in no module tree")).collect();

    // The table and the tree must agree: every module in a level, every name there.
    let root = &lib.modules[&Vec::<String>::new()];
    for child in &root.children {
        if layer(child).is_none() && lib.modules[&vec![child.clone()]].file != "lib.rs" {
            problems.push(format!("src/{child} is no layer of the rule table"));
        }
    }
    for l in LAYERS {
        let Some(m) = lib.modules.get(&vec![l.name.to_string()]) else {
            problems.push(format!("the rule table names layer {}, which is not there", l.name));
            continue;
        };
        let listed: BTreeSet<&str> = l.levels.iter().flat_map(|l| l.iter().copied()).collect();
        for c in m.children.iter().filter(|c| !listed.contains(c.as_str())) {
            problems.push(format!("{}::{c} is in no level of the rule table", l.name));
        }
        for n in listed.iter().filter(|n| **n != "mod" && !m.children.contains(**n) && !m.defined.contains(**n)) {
            problems.push(format!("the rule table names {}::{n}, which is not there", l.name));
        }
    }

    let mut found = BTreeMap::new();
    let mut checked = 0;
    let mut note = |file: &str, u: &Use, named: String, target: String, why| {
        let written = format!("{}{}", u.path.join("::"), if u.glob { "::*" } else { "" });
        found.entry((file.to_string(), written, named, target, why)).or_insert(u.line);
    };
    for (from, m) in &lib.modules {
        for u in &m.uses {
            let Some(abs) = lib.absolute(from, &u.path, &mut BTreeSet::new()) else { continue };
            if !u.glob && u.path.len() == 1 && lib.modules.contains_key(&abs) {
                continue; // `self`, or a local variable named like a module
            }
            if u.glob && from.starts_with(&abs) {
                continue; // `use super::*`: the names it brings are checked where used
            }
            let target = lib.follow(abs.clone());
            checked += 1;
            if let Some(why) = lib.rule(from, &abs, &target) {
                note(&m.file, u, format!("crate::{}", abs.join("::")), format!("crate::{}", target.join("::")), why);
            }
        }
    }
    // The binary: `dxfs::` paths, to the public API only.
    for m in bin.modules.values() {
        for u in m.uses.iter().filter(|u| u.path[0] == "dxfs") {
            checked += 1;
            if u.path.get(1).is_some_and(|n| !root.api.contains(n)) {
                note(&m.file, u, u.path.join("::"), u.path.join("::"), "the binary uses the public API only");
            }
        }
    }

    let mut used = vec![false; EXCEPTIONS.len()];
    let mut findings = Vec::new();
    for ((file, written, named, target, why), line) in found {
        let under = |p: &str, prefix: &str| p == prefix || p.starts_with(&format!("{prefix}::"));
        match EXCEPTIONS
            .iter()
            .position(|(f, prefix, _)| *f == file && (under(&named, prefix) || under(&target, prefix)))
        {
            Some(i) => used[i] = true,
            None => findings.push(Finding { file, line, written, named, target, why }),
        }
    }
    for ((f, prefix, why), _) in EXCEPTIONS.iter().zip(used).filter(|(_, used)| !used) {
        problems.push(format!("the exception for {f} using {prefix} ({why}) is no longer needed"));
    }
    Report { findings, problems, checked }
}

fn sources(dir: &Path, out: &mut Vec<std::path::PathBuf>) {
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
    let r = check(&[]);
    let bad: Vec<String> = r
        .findings
        .iter()
        .map(|f| {
            let via = if f.named == f.target { String::new() } else { format!(" (through {})", f.named) };
            format!("src/{}:{}: `{}` is {}{via}: {}", f.file, f.line, f.written, f.target, f.why)
        })
        .chain(r.problems)
        .collect();
    assert!(bad.is_empty(), "against the layers:\n{}", bad.join("\n"));
    assert!(r.checked > 5000, "only {} paths checked: the parser is broken", r.checked);
}

/// The checker itself: what breaks the layers is caught wherever it hides, and what the
/// rules allow passes. Each case is appended to a real file of src/.
#[test]
fn the_checker_catches_what_breaks_the_layers() {
    let cases = [
        // One upward use from each folder.
        ("disk/format.rs", "use crate::engine::btree::NodeStore;"),
        ("engine/log.rs", "fn f(_: &crate::engine::store::Store) {}"),
        ("fs/acl.rs", "use crate::fs::xattr::Xattr;"),
        ("volume/data.rs", "use crate::fsck::check;"),
        ("fsck/walk.rs", "const N: u32 = super::repair::MAX_DROP_PASSES;"),
        ("tools/inspect.rs", "use crate::fuse::FuseOptions;"),
        ("fuse/stats.rs", "use super::session::Mounted;"),
        // Through the crate root's re-exports, `super::super::`, a grouped import, after
        // a test module, in a macro call, through globs.
        ("fs/dir.rs", "fn g(_: &crate::Volume) {}"),
        ("engine/btree/node.rs", "use super::super::store::Tx;"),
        ("fs/file/read.rs", "use crate::{error::Error, fs::{acl, dir::name_key}};"),
        (
            "engine/deferred.rs",
            "#[cfg(test)]\nmod tests { use crate::volume::Volume; }\n\
            fn later() { crate::engine::store::Store::open(); }",
        ),
        ("disk/hash.rs", "fn m() { assert!(crate::engine::leaf::SLOTS > 0); }"),
        ("disk/codec.rs", "use crate::disk::format::*;"),
        ("fsck/walk.rs", "use super::*;\nfn hidden(_: Usage) {}"),
        // Sideways, and past the public API.
        ("tools/import.rs", "use crate::fsck::Report;"),
        ("fuse/server/ops.rs", "use crate::disk::format::Inode;"),
        ("cli/sync.rs", "use dxfs::internals::Journal;"),
        // Allowed: down, inside one folder-module, the volume's files, the public API,
        // test code, docs, comments, visibility scopes.
        ("engine/store/mod.rs", "use crate::engine::btree::NodeStore;"),
        ("fs/dir.rs", "use crate::engine::store::Store;"),
        ("engine/btree/balance.rs", "use super::super::btree::check::walk;"),
        ("volume/locks.rs", "use super::commit::unpin;"),
        ("fuse/server/reply.rs", "use crate::{block::MemDevice, volume::Attr, DirEntry};"),
        (
            "fs/dir.rs",
            "#[cfg(test)]\nuse crate::volume::Volume;\n#[cfg(all(test, unix))]\nfn t() { crate::volume::x(); }",
        ),
        ("fs/dir.rs", "/// See [`Volume`](crate::Volume).\npub(in crate::fs) fn scoped() {} // crate::volume::Volume"),
    ];
    let r = check(&cases);
    assert!(r.problems.is_empty(), "{}", r.problems.join("\n"));
    let found: Vec<String> = r
        .findings
        .iter()
        .map(|f| {
            let to = if f.target == f.written { String::new() } else { format!(" → {}", f.target) };
            format!("{}: {}{to}: {}", f.file, f.written, f.why)
        })
        .collect();
    let expected = [
        "cli/sync.rs: dxfs::internals::Journal: the binary uses the public API only",
        "disk/codec.rs: crate::disk::format::* → crate::disk::format: upward, inside the layer",
        "disk/format.rs: crate::engine::btree::NodeStore: upward, to a higher layer",
        "disk/hash.rs: crate::engine::leaf::SLOTS: upward, to a higher layer",
        "engine/btree/node.rs: super::super::store::Tx → crate::engine::store::tx::Tx: upward, inside the layer",
        "engine/deferred.rs: crate::engine::store::Store::open: upward, inside the layer",
        "engine/log.rs: crate::engine::store::Store: upward, inside the layer",
        "fs/acl.rs: crate::fs::xattr::Xattr: upward, inside the layer",
        "fs/dir.rs: crate::Volume → crate::volume::Volume: upward, to a higher layer",
        "fs/file/read.rs: crate::fs::dir::name_key: sideways, inside the layer",
        "fsck/walk.rs: Usage → crate::fsck::tally::Usage: upward, inside the layer",
        "fsck/walk.rs: super::repair::MAX_DROP_PASSES → crate::fsck::repair::MAX_DROP_PASSES: upward, inside the layer",
        "fuse/server/ops.rs: crate::disk::format::Inode: past the public API, to a lower layer",
        "fuse/stats.rs: super::session::Mounted → crate::fuse::session::Mounted: upward, inside the layer",
        "tools/import.rs: crate::fsck::Report: sideways, to another layer of the same height",
        "tools/inspect.rs: crate::fuse::FuseOptions: upward, to a higher layer",
        "volume/data.rs: crate::fsck::check: upward, to a higher layer",
    ];
    assert_eq!(found, expected);
}
