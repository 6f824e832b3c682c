#!/usr/bin/env python3
"""Check the layers of libtessera-enforce: the file-level graph of its objects.

An edge a -> b means that a.o refers to a symbol b.o defines (a call, or the address of a
function or of data), read with ``nm`` from objects compiled one per source file. The check
fails when the graph has a cycle, when a file calls into a layer above its own (the core into a
feature, a feature into the interposition layer), when an object is in no layer, or when a
source file includes the header of a layer above its own.

    c_layers.py [--src DIR] OBJDIR --layer core log limits ... --layer feature mem ... \
        --layer interposition hooks loader

Layers are given bottom first; a file's name is its source's without ``.c``. ``--edges``
prints the graph. Run by ``make -C native check`` and tests/native/test_c_layers.py.
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

# The headers of src/ and the layer each belongs to (a header not listed is the core's).
HEADER_LAYER = {"feature.h": "feature", "hooks.h": "interposition"}
INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.M)

Graph = dict[str, dict[str, set[str]]]


def object_graph(objdir: Path) -> Graph:
    """a -> b -> the symbols a.o uses that b.o defines."""
    defined: dict[str, str] = {}
    used: dict[str, set[str]] = {}
    for obj in sorted(objdir.glob("*.o")):
        name = obj.stem
        out = subprocess.run(
            ["nm", "-P", str(obj)], capture_output=True, text=True, check=True
        ).stdout
        used[name] = set()
        for line in out.splitlines():
            parts = line.split()
            if len(parts) < 2:
                continue
            sym, kind = parts[0], parts[1]
            if kind == "U":
                used[name].add(sym)
            elif kind in "TDBRGSVW":
                defined.setdefault(sym, name)
    graph: Graph = {name: defaultdict(set) for name in used}
    for name, syms in used.items():
        for sym in syms:
            owner = defined.get(sym)
            if owner is not None and owner != name:
                graph[name][owner].add(sym)
    return graph


def find_cycle(graph: Graph) -> list[str] | None:
    """One cycle as a list of files (first == last), or None."""
    state: dict[str, int] = {}  # 1 on the stack, 2 done
    stack: list[str] = []

    def visit(n: str) -> list[str] | None:
        state[n] = 1
        stack.append(n)
        for m in sorted(graph.get(n, {})):
            if state.get(m) == 1:
                return [*stack[stack.index(m) :], m]
            if m not in state:
                found = visit(m)
                if found:
                    return found
        stack.pop()
        state[n] = 2
        return None

    for n in sorted(graph):
        if n not in state:
            found = visit(n)
            if found:
                return found
    return None


def problems(graph: Graph, layers: list[tuple[str, list[str]]]) -> list[str]:
    """Everything wrong with graph against the layers (bottom first); empty when it is right."""
    rank = {}
    for i, (_, files) in enumerate(layers):
        for f in files:
            rank[f] = i
    names = [name for name, _ in layers]
    out = []
    for f in sorted(graph):
        if f not in rank:
            out.append(f"{f}.o is in no layer (add it to one in native/Makefile)")
    for f in sorted(set(rank) - set(graph)):
        out.append(f"{f}.o is missing")
    for a in sorted(graph):
        for b in sorted(graph[a]):
            if a in rank and b in rank and rank[b] > rank[a]:
                syms = " ".join(sorted(graph[a][b]))
                out.append(f"{a} ({names[rank[a]]}) calls up into {b} ({names[rank[b]]}): {syms}")
    cycle = find_cycle(graph)
    if cycle:
        out.append("cycle: " + " -> ".join(cycle))
    return out


def include_problems(src: Path, layers: list[tuple[str, list[str]]]) -> list[str]:
    """A source file that includes the header of a layer above its own."""
    rank = {f: i for i, (_, files) in enumerate(layers) for f in files}
    names = [name for name, _ in layers]
    out = []
    for f, i in sorted(rank.items()):
        path = src / f"{f}.c"
        if not path.exists():
            continue
        for header in INCLUDE.findall(path.read_text()):
            layer = HEADER_LAYER.get(header, names[0])
            if layer in names and names.index(layer) > i:
                out.append(f"{f}.c ({names[i]}) includes {header} ({layer})")
    return out


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("objdir", type=Path)
    ap.add_argument("--src", type=Path, help="the sources, for the include check")
    ap.add_argument("--layer", nargs="+", action="append", required=True, metavar="NAME")
    ap.add_argument("--edges", action="store_true", help="print the graph")
    args = ap.parse_args(argv)
    layers = [(group[0], group[1:]) for group in args.layer]
    graph = object_graph(args.objdir)
    if args.edges:
        for a in sorted(graph):
            for b in sorted(graph[a]):
                print(f"{a} -> {b}: {' '.join(sorted(graph[a][b]))}")
    found = problems(graph, layers)
    if args.src:
        found += include_problems(args.src, layers)
    for p in found:
        print(f"c_layers: {p}", file=sys.stderr)
    if found:
        return 1
    n = sum(len(v) for v in graph.values())
    print(f"c_layers: {len(graph)} files, {n} edges, acyclic, no call up a layer")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
