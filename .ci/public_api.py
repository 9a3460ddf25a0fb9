#!/usr/bin/env python3
"""The library's public API, one line per item, checked against api/public-api.txt.

The API changes only on purpose (issue 41): CI renders what rustdoc (nightly, JSON
output) says a user of the crate can name, and fails when it differs from the checked-in
baseline. After a planned change, `python3 .ci/public_api.py --bless` rewrites the
baseline, and the diff goes into the same commit as the change.

    python3 .ci/public_api.py            # check (exit 1 and a diff when it differs)
    python3 .ci/public_api.py --bless    # write api/public-api.txt

It builds with the default features (what `cargo add dxfs` gives). Items under
`#[doc(hidden)]` (`dxfs::internals`) and the `testing` feature are not part of the API
and do not appear.
"""

import difflib
import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BASELINE = os.path.join(ROOT, "api", "public-api.txt")


def rustdoc_json():
    env = dict(os.environ, RUSTDOCFLAGS="-Z unstable-options --output-format json")
    # Its own target directory: the stable builds' artifacts stay valid.
    target = os.path.join(ROOT, "target", "public-api")
    subprocess.run(
        ["cargo", "+nightly", "doc", "--lib", "--no-deps", "--quiet", "--target-dir", target],
        cwd=ROOT,
        env=env,
        check=True,
    )
    with open(os.path.join(target, "doc", "dxfs.json")) as f:
        return json.load(f)


class Api:
    def __init__(self, doc):
        self.doc = doc
        self.index = doc["index"]
        self.lines = set()
        self.seen = set()

    def item(self, i):
        return self.index.get(str(i))

    # Types -------------------------------------------------------------------------

    def ty(self, t):
        if t is None:
            return "()"
        if isinstance(t, str):
            return "_" if t == "infer" else t
        (k, v), = t.items()
        if k == "resolved_path":
            return self.path(v)
        if k == "primitive" or k == "generic":
            return v
        if k == "borrowed_ref":
            lt = (v.get("lifetime") or "") + (" " if v.get("lifetime") else "")
            return "&" + lt + ("mut " if v.get("is_mutable") else "") + self.ty(v["type"])
        if k == "raw_pointer":
            return "*" + ("mut " if v.get("is_mutable") else "const ") + self.ty(v["type"])
        if k == "slice":
            return "[" + self.ty(v) + "]"
        if k == "array":
            return "[" + self.ty(v["type"]) + "; " + str(v["len"]) + "]"
        if k == "tuple":
            return "(" + ", ".join(self.ty(x) for x in v) + ")"
        if k == "impl_trait":
            return "impl " + " + ".join(self.bound(b) for b in v)
        if k == "dyn_trait":
            parts = [self.path(p["trait"]) for p in v["traits"]]
            if v.get("lifetime"):
                parts.append(v["lifetime"])
            return "dyn " + " + ".join(parts)
        if k == "qualified_path":
            tr = self.path(v["trait"]) if v.get("trait") else "_"
            return "<" + self.ty(v["self_type"]) + " as " + tr + ">::" + v["name"]
        if k == "function_pointer":
            sig = v["sig"]
            ins = ", ".join(self.ty(x[1]) for x in sig["inputs"])
            out = "" if sig.get("output") is None else " -> " + self.ty(sig["output"])
            return "fn(" + ins + ")" + out
        return json.dumps(t, sort_keys=True)

    def path(self, p):
        name = p.get("path") or p.get("name") or "?"
        return name + self.args(p.get("args"))

    def args(self, a):
        if not a:
            return ""
        if isinstance(a, str):
            return ""
        (k, v), = a.items()
        if k == "angle_bracketed":
            parts = []
            for g in v.get("args", []):
                if isinstance(g, str):
                    parts.append("_")
                    continue
                (gk, gv), = g.items()
                if gk == "type":
                    parts.append(self.ty(gv))
                elif gk == "lifetime":
                    parts.append(gv)
                else:
                    parts.append(json.dumps(gv, sort_keys=True))
            for c in v.get("constraints", v.get("bindings", [])):
                b = c.get("binding", {})
                if "equality" in b:
                    eq = b["equality"]
                    parts.append(c["name"] + " = " + (self.ty(eq["type"]) if "type" in eq else json.dumps(eq)))
                else:
                    parts.append(c["name"] + ": " + " + ".join(self.bound(x) for x in b.get("constraint", [])))
            return "<" + ", ".join(parts) + ">" if parts else ""
        if k == "parenthesized":
            ins = ", ".join(self.ty(x) for x in v["inputs"])
            out = "" if v.get("output") is None else " -> " + self.ty(v["output"])
            return "(" + ins + ")" + out
        return ""

    def bound(self, b):
        if isinstance(b, str):
            return b
        (k, v), = b.items()
        if k == "trait_bound":
            m = {"maybe": "?", "maybe_const": "~const "}.get(v.get("modifier"), "")
            return m + self.path(v["trait"])
        if k == "outlives":
            return v
        return json.dumps(b, sort_keys=True)

    def generics(self, g):
        params = []
        for p in g.get("params", []):
            kind = p["kind"]
            if "type" in kind:
                if kind["type"].get("is_synthetic"):
                    continue
                bs = kind["type"].get("bounds", [])
                params.append(p["name"] + (": " + " + ".join(self.bound(b) for b in bs) if bs else ""))
            elif "lifetime" in kind:
                params.append(p["name"])
            else:
                params.append("const " + p["name"])
        return "<" + ", ".join(params) + ">" if params else ""

    def where(self, g):
        preds = []
        for w in g.get("where_predicates", []):
            if "bound_predicate" in w:
                bp = w["bound_predicate"]
                preds.append(self.ty(bp["type"]) + ": " + " + ".join(self.bound(b) for b in bp["bounds"]))
        return " where " + ", ".join(preds) if preds else ""

    def fn(self, name, f):
        sig = f["sig"]
        ins = [pname + ": " + self.ty(pty) for pname, pty in sig["inputs"]]
        out = "" if sig.get("output") is None else " -> " + self.ty(sig["output"])
        h = f.get("header", {})
        q = ("const " if h.get("is_const") else "") + ("async " if h.get("is_async") else "")
        q += "unsafe " if h.get("is_unsafe") else ""
        return q + "fn " + name + self.generics(f["generics"]) + "(" + ", ".join(ins) + ")" + out + self.where(
            f["generics"]
        )

    # Items -------------------------------------------------------------------------

    def add(self, line):
        self.lines.add(line)

    def module(self, mid, path):
        m = self.item(mid)
        for cid in m["inner"]["module"]["items"]:
            self.member(cid, path)

    def member(self, cid, path, name=None):
        it = self.item(cid)
        if it is None:
            return
        inner = it["inner"]
        (kind, v), = inner.items()
        if kind == "use":
            target = self.item(v.get("id")) if v.get("id") is not None else None
            if target is None:
                self.add("pub use " + path + "::" + v["name"] + " = " + v["source"])
            elif v.get("is_glob"):
                if "module" in target["inner"]:
                    self.module(v["id"], path)
            else:
                self.member(v["id"], path, v["name"])
            return
        name = name or it.get("name")
        full = path + "::" + name
        key = (cid, full)
        if key in self.seen:
            return
        self.seen.add(key)
        if kind == "module":
            self.add("pub mod " + full)
            self.module(cid, full)
        elif kind == "struct":
            self.add("pub struct " + full + self.generics(v["generics"]))
            sk = v["kind"]
            if isinstance(sk, dict) and "plain" in sk:
                for f in sk["plain"]["fields"]:
                    fi = self.item(f)
                    if fi:
                        self.add("pub " + full + "." + fi["name"] + ": " + self.ty(fi["inner"]["struct_field"]))
            elif isinstance(sk, dict) and "tuple" in sk:
                for n, f in enumerate(sk["tuple"]):
                    fi = self.item(f) if f is not None else None
                    if fi:
                        self.add("pub " + full + "." + str(n) + ": " + self.ty(fi["inner"]["struct_field"]))
            self.impls(v["impls"], full)
        elif kind == "enum":
            self.add("pub enum " + full + self.generics(v["generics"]))
            for var in v["variants"]:
                vi = self.item(var)
                vk = vi["inner"]["variant"]["kind"]
                if isinstance(vk, dict) and "tuple" in vk:
                    fields = [self.ty(self.item(f)["inner"]["struct_field"]) for f in vk["tuple"] if f is not None]
                    self.add("pub " + full + "::" + vi["name"] + "(" + ", ".join(fields) + ")")
                elif isinstance(vk, dict) and "struct" in vk:
                    fields = [
                        self.item(f)["name"] + ": " + self.ty(self.item(f)["inner"]["struct_field"])
                        for f in vk["struct"]["fields"]
                    ]
                    self.add("pub " + full + "::" + vi["name"] + " { " + ", ".join(fields) + " }")
                else:
                    self.add("pub " + full + "::" + vi["name"])
            self.impls(v["impls"], full)
        elif kind == "function":
            self.add("pub " + self.fn(full, v))
        elif kind == "constant":
            self.add("pub const " + full + ": " + self.ty(v["type"]))
        elif kind == "static":
            self.add("pub static " + full + ": " + self.ty(v["type"]))
        elif kind == "type_alias":
            self.add("pub type " + full + self.generics(v["generics"]) + " = " + self.ty(v["type"]))
        elif kind == "trait":
            self.add("pub trait " + full + self.generics(v["generics"]))
            for ti in v["items"]:
                t = self.item(ti)
                if t and "function" in t["inner"]:
                    self.add("pub " + self.fn(full + "::" + t["name"], t["inner"]["function"]))
                elif t:
                    self.add("pub " + full + "::" + t["name"])
        elif kind in ("macro", "proc_macro"):
            self.add("pub macro " + full)
        else:
            self.add("pub " + kind + " " + full)

    def impls(self, ids, full):
        for iid in ids:
            im = self.item(iid)
            if im is None:
                continue
            v = im["inner"]["impl"]
            if v.get("is_synthetic") or v.get("blanket_impl") is not None:
                continue
            if v.get("trait") is not None:
                neg = "!" if v.get("is_negative") else ""
                self.add("impl " + neg + self.path(v["trait"]) + " for " + full)
                continue
            for mid in v["items"]:
                m = self.item(mid)
                if m is None or m.get("visibility") != "public":
                    continue
                if "function" in m["inner"]:
                    self.add("pub " + self.fn(full + "::" + m["name"], m["inner"]["function"]))
                elif "assoc_const" in m["inner"]:
                    self.add("pub const " + full + "::" + m["name"] + ": " + self.ty(m["inner"]["assoc_const"]["type"]))
                else:
                    self.add("pub " + full + "::" + m["name"])


def render():
    doc = rustdoc_json()
    api = Api(doc)
    api.module(doc["root"], "dxfs")
    head = "# dxfs public API, generated by .ci/public_api.py: change it only on purpose\n"
    return head + "".join(line + "\n" for line in sorted(api.lines))


def main():
    text = render()
    if "--bless" in sys.argv[1:]:
        os.makedirs(os.path.dirname(BASELINE), exist_ok=True)
        with open(BASELINE, "w") as f:
            f.write(text)
        print("public API: %d lines written to %s" % (text.count("\n") - 1, os.path.relpath(BASELINE, ROOT)))
        return 0
    try:
        with open(BASELINE) as f:
            want = f.read()
    except FileNotFoundError:
        want = ""
    if text == want:
        print("public API: %d lines, as in %s" % (text.count("\n") - 1, os.path.relpath(BASELINE, ROOT)))
        return 0
    sys.stdout.writelines(
        difflib.unified_diff(want.splitlines(True), text.splitlines(True), "api/public-api.txt", "the code")
    )
    print(
        "public API: the code differs from api/public-api.txt. If the change is planned, run "
        "`python3 .ci/public_api.py --bless` and commit the baseline with it.",
        file=sys.stderr,
    )
    return 1


if __name__ == "__main__":
    sys.exit(main())
