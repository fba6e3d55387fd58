#!/usr/bin/env python3
"""Finds import circles between the source files of each crate (issue 31: "no crate has an
import circle, down to the files of one folder").

A file's module is named by its path (`src/kernels/dots/lowbit.rs` is `kernels::dots::lowbit`;
`mod.rs` and `lib.rs` name their folder). Every path a file names that starts with `crate::`,
`super::` or `self::` (counted from the inline `mod` a path sits in) is resolved to the longest module it reaches,
and that module is one of the file's dependencies; a path into a file's own inline `mod`s is
not. A folder's `mod.rs` depends on its children only through what it names (declaring a child
is not an import). Prints each strongly connected component of more than one file and exits 1
if there is one.

Usage: scripts/check-layers.py [CRATE_DIR ...]   (default: every crates/*)
"""
import os
import re
import sys

PATH = re.compile(r"\b((?:crate|super|self)(?:::(?:\{[^{}]*\}|[A-Za-z_][A-Za-z0-9_]*))+)")


def modules(src):
    mods = {}
    for root, _, files in os.walk(src):
        for f in files:
            if not f.endswith(".rs"):
                continue
            p = os.path.join(root, f)
            rel = os.path.relpath(p, src)[:-3].split(os.sep)
            if rel[-1] in ("mod", "lib", "main"):
                rel = rel[:-1]
            mods[tuple(rel)] = p
    return mods


def strip_comments(text):
    text = re.sub(r"//[^\n]*", "", text)
    return re.sub(r"/\*.*?\*/", "", text, flags=re.S)


def expand(path):
    """`a::{b, c::d}` -> [a::b, a::c::d] (one level of braces is enough here)."""
    m = re.match(r"^(.*?)::\{([^{}]*)\}(.*)$", path)
    if not m:
        return [path]
    return [f"{m.group(1)}::{part.strip()}" for part in m.group(2).split(",") if part.strip()]


def resolve(mod, path, mods):
    parts = path.split("::")
    if parts[0] == "crate":
        base, rest = [], parts[1:]
    else:
        base = list(mod)
        rest = parts
        while rest and rest[0] in ("super", "self"):
            if rest[0] == "super":
                base = base[:-1]
            rest = rest[1:]
    full = base + [r.split(" ")[0] for r in rest if r and r != "self"]
    for n in range(len(full), -1, -1):
        if tuple(full[:n]) in mods:
            return tuple(full[:n])
    return None


def deps_of(mod, path, mods):
    text = strip_comments(open(path).read())
    text = re.sub(r'"(?:\\.|[^"\\])*"', '""', text)
    is_dir_mod = os.path.basename(path) in ("mod.rs", "lib.rs", "main.rs")
    out = set()
    depth, inline = 0, []  # brace depth; depths at which the enclosing inline `mod`s opened
    for line in text.split("\n"):
        for m in PATH.finditer(line):
            p = m.group(1)
            nested = len(inline)
            if p.startswith("self") and nested:
                continue  # a path inside one of the file's inline modules
            if p.startswith("super"):
                supers = len(re.match(r"^(?:super::)*", p + "::").group(0)) // 7
                if supers <= nested:
                    continue
                p = "::".join(p.split("::")[nested:])
            for q in expand(p):
                target = resolve(mod, q, mods)
                if target is not None and target != mod and not (
                    len(target) > len(mod) and target[: len(mod)] == mod and not is_dir_mod
                ):
                    out.add(target)
        if re.match(r"^\s*(pub(\([^)]*\))? )?mod \w+ \{", line):
            inline.append(depth)
        depth += line.count("{") - line.count("}")
        while inline and depth <= inline[-1]:
            inline.pop()
    return out


def sccs(graph):
    index, low, stack, on, res, counter = {}, {}, [], set(), [], [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            res.append(comp)

    sys.setrecursionlimit(100000)
    for v in graph:
        if v not in index:
            visit(v)
    return [c for c in res if len(c) > 1]


def main():
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    crates = sys.argv[1:] or sorted(
        os.path.join(root, "crates", c) for c in os.listdir(os.path.join(root, "crates"))
    )
    bad = 0
    for crate in crates:
        for src in ("src",):
            d = os.path.join(crate, src)
            if not os.path.isdir(d):
                continue
            mods = modules(d)
            graph = {m: deps_of(m, p, mods) for m, p in mods.items()}
            for comp in sccs(graph):
                bad += 1
                names = sorted("::".join(c) or "crate" for c in comp)
                print(f"{os.path.basename(crate)}: import circle: {', '.join(names)}")
                for c in sorted(comp):
                    inner = sorted("::".join(t) or "crate" for t in graph[c] if t in comp)
                    print(f"    {'::'.join(c) or 'crate'} -> {', '.join(inner)}")
    if bad:
        sys.exit(1)
    print(f"no import circles in {len(crates)} crates")


main()
