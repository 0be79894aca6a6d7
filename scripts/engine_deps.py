#!/usr/bin/env python3
"""Folder-level dependency graph of crates/engine/src, checked against the
layer order: a folder may import (`use crate::x` or a `crate::x::` path)
only folders below it. Also reports calls of `Pool` methods defined in a
higher folder (an `impl Pool` in an upper folder is fine; a lower folder
calling into it is a hidden loop).

    python3 scripts/engine_deps.py          # graph; exit 1 on an upward edge
    python3 scripts/engine_deps.py --files  # per-file imports as well
"""
import os
import re
import sys
from collections import defaultdict

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "crates", "engine", "src")
# Lowest first. `error` is a leaf every folder may use; `lib.rs` is the root.
LAYERS = ["error", "device", "members", "map", "space", "meta", "pool",
          "integrity", "commit", "io", "volumes", "service"]
RANK = {name: i for i, name in enumerate(LAYERS)}


def folder_of(rel):
    """`device/label.rs` -> device, `error.rs` -> error, `lib.rs` -> None."""
    parts = rel.split(os.sep)
    if len(parts) > 1:
        return parts[0]
    name = parts[0][:-3]
    return None if name == "lib" else name


def strip_comments(src):
    return "\n".join(line.split("//")[0] for line in src.split("\n"))


def sources():
    for d, _, files in os.walk(ROOT):
        for f in sorted(files):
            if f.endswith(".rs"):
                path = os.path.join(d, f)
                yield os.path.relpath(path, ROOT), open(path).read()


def pool_blocks(src):
    return [m.group(1) for m in re.finditer(r"^impl Pool \{\n(.*?)^\}", src, re.M | re.S)]


def pool_methods(files):
    """Pool method name -> folder defining it."""
    defs = {}
    for rel, src in files:
        for block in pool_blocks(src):
            for m in re.finditer(r"^    (?:pub(?:\([a-z]+\))? )?fn ([a-z_0-9]+)", block, re.M):
                defs[m.group(1)] = folder_of(rel)
    return defs


def method_calls(src, methods):
    """Pool methods called: `self.m(` inside `impl Pool` (self is the pool)."""
    code = "\n".join(strip_comments(b) for b in pool_blocks(src))
    return {n for n in methods if re.search(r"\bself\.%s\(" % n, code)}


def main():
    files = list(sources())
    imports = defaultdict(set)  # folder -> folders it names
    per_file = {}
    for rel, src in files:
        me = folder_of(rel)
        named = set(re.findall(r"crate::([a-z_]+)", strip_comments(src)))
        per_file[rel] = sorted(named)
        for other in named:
            if me is not None and other != me:
                imports[me].add(other)
    methods = pool_methods(files)
    upward_calls = []
    for rel, src in files:
        me = folder_of(rel)
        if me is None:
            continue
        for name in sorted(method_calls(src, methods)):
            home = methods[name]
            if home != me and RANK[home] > RANK[me]:
                upward_calls.append("%s calls Pool::%s (%s/)" % (rel, name, home))

    bad = []
    print("engine folder dependencies (lowest first; -> = imports):")
    for f in LAYERS:
        deps = sorted(imports.get(f, ()), key=lambda d: RANK.get(d, 99))
        print("  %-10s -> %s" % (f, ", ".join(deps) if deps else "(nothing)"))
        for d in deps:
            if d not in RANK:
                bad.append("%s imports unknown folder %s" % (f, d))
            elif RANK[d] >= RANK[f]:
                bad.append("%s imports %s, which is not below it" % (f, d))
    unknown = sorted(set(imports) - set(RANK))
    for u in unknown:
        bad.append("folder %s is not in LAYERS" % u)
    if "--files" in sys.argv:
        print("\nper file:")
        for rel in sorted(per_file):
            print("  %-26s %s" % (rel, " ".join(per_file[rel])))
    for line in upward_calls:
        bad.append(line)
    if bad:
        print("\nNOT one-way:")
        for b in bad:
            print("  " + b)
        return 1
    print("\none-way: every folder imports and calls only folders below it")
    return 0


if __name__ == "__main__":
    sys.exit(main())
