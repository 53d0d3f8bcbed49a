"""Fails when two source files of a crate import each other, directly or round a loop.

Layers import downward; within a crate, files split by concern should too, so that a
module can be read (and changed) with only the ones below it in mind. The compiler
allows loops between sibling modules, so this checks them: every `crate::`, `super::`
and `self::` path outside comments and test modules is an edge from its file to the
file that defines the module it names (a module and its own submodules excepted).

    python3 tests/import_loops.py server/src server/core/src client/src ...
"""
import os
import re
import sys


def module_of(root, path):
    parts = os.path.relpath(path, root)[:-3].split(os.sep)
    if parts[-1] in ("mod", "lib", "main"):
        parts = parts[:-1]
    return tuple(parts)


def edges(root):
    files = {}
    for d, _, names in os.walk(root):
        for n in names:
            if n.endswith(".rs"):
                files[module_of(root, os.path.join(d, n))] = os.path.join(d, n)
    out = {}
    for m, path in files.items():
        text = re.split(r"#\[cfg\(test\)\]\s*mod tests", open(path).read())[0]
        text = "\n".join(l for l in text.split("\n") if not l.strip().startswith("//"))
        # `super::{a, b::c}` names a and b::c.
        for pre, inner in re.findall(r"\b((?:crate|super|self)(?:::super)*)::\{([^}]*)\}", text):
            for item in inner.split(","):
                item = item.strip().split(" as ")[0]
                if item:
                    text += f"\n{pre}::{item}"
        deps = set()
        for p in re.findall(r"\b((?:crate|super|self)(?:::[A-Za-z_][A-Za-z0-9_]*)+)", text):
            parts = p.split("::")
            if parts[0] == "crate":
                base, parts = (), parts[1:]
            else:
                base = m
                if parts[0] == "self":
                    parts = parts[1:]
                while parts and parts[0] == "super":
                    base, parts = base[:-1], parts[1:]
            target = base
            for part in parts:
                if target + (part,) not in files:
                    break
                target += (part,)
            related = target == m[: len(target)] or m == target[: len(m)]
            if target in files and not related:
                deps.add(target)
        out[m] = deps
    return out


def loops(graph):
    found, seen = [], set()
    for start in sorted(graph):
        stack = [(start, [start])]
        while stack:
            node, path = stack.pop()
            for n in sorted(graph[node]):
                if n == start:
                    key = frozenset(path)
                    if key not in seen:
                        seen.add(key)
                        found.append(path + [start])
                elif n not in path and n > start:
                    stack.append((n, path + [n]))
    return found


bad = 0
for root in sys.argv[1:]:
    for cycle in loops(edges(root)):
        bad += 1
        print(f"{root}: " + " -> ".join("/".join(p) or "(root)" for p in cycle))
sys.exit(1 if bad else 0)
