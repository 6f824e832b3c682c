"""Seeded mutations of real input files, for the fuzz test (``tests/fuzz/test_fuzz.py``).

Two families: text mutations (bytes flipped, lines cut, duplicated or swapped, the file
truncated, hostile tokens inserted, a BOM, CRLF, a non-UTF-8 byte) and, for YAML, structural
ones (a value replaced by one of another type or a hostile one, a key misspelt, dropped or
added). Everything is drawn from one ``random.Random(seed)``, so a failure is replayed from its
seed alone.
"""

from __future__ import annotations

import random
from typing import Any

import yaml

HUGE_INT = "9" * 5000
HOSTILE_TOKENS = [
    "{{ .Values.image }}",
    "{{ $labels.gpu }}",
    "\x00",
    "&a [*a, *a, *a]",
    "1e999999999",
    "-1e-999999999",
    HUGE_INT,
    "[" * 600 + "]" * 600,
    "- ",
    ": ",
    "\t",
    "!!binary aGk=",
    "!!python/object:os.system",
    "? [a, b]\n: c",
    "<<: *x",
    "~",
    "'",
    '"',
    "---",
    "...",
    "%YAML 1.1",
    "]]]>",
    "<!DOCTYPE x [<!ENTITY e SYSTEM 'file:///etc/passwd'>]>",
    "&e;",
    ",,,,",
    "GPU-00000000-0000-0000-0000-000000000000",
    "NV18",
    "N/A",
]
HOSTILE_VALUES: list[Any] = [
    "text",
    "",
    0,
    -1,
    2**63,
    10**40,
    1.5,
    float("inf"),
    True,
    None,
    [],
    ["a", 1],
    {},
    {"unknown": 1},
    "1e999999999",
    "4Gi",
    "-4Gi",
    "9" * 30,
    "a" * 300,
    "0x1F",
    [[[[["deep"]]]]],
    "${HOME}",
    "{{ .Values.x }}",
]


def _text_mutation(rng: random.Random, data: bytes) -> bytes:
    op = rng.randrange(12)
    if not data:
        return rng.choice(HOSTILE_TOKENS).encode()
    lines = data.split(b"\n")
    if op == 0:  # flip a byte
        i = rng.randrange(len(data))
        return data[:i] + bytes([data[i] ^ (1 << rng.randrange(8))]) + data[i + 1 :]
    if op == 1:  # truncate
        return data[: rng.randrange(len(data))]
    if op == 2 and len(lines) > 1:  # delete a line
        del lines[rng.randrange(len(lines))]
        return b"\n".join(lines)
    if op == 3:  # duplicate a line
        i = rng.randrange(len(lines))
        lines.insert(i, lines[i])
        return b"\n".join(lines)
    if op == 4 and len(lines) > 1:  # swap two lines
        i, j = rng.randrange(len(lines)), rng.randrange(len(lines))
        lines[i], lines[j] = lines[j], lines[i]
        return b"\n".join(lines)
    if op == 5:  # insert a hostile token
        i = rng.randrange(len(data) + 1)
        return data[:i] + rng.choice(HOSTILE_TOKENS).encode() + data[i:]
    if op == 6:
        return b"\xef\xbb\xbf" + data
    if op == 7:
        return data.replace(b"\n", b"\r\n")
    if op == 8:  # a byte that is not UTF-8
        i = rng.randrange(len(data) + 1)
        return data[:i] + rng.choice([b"\xff", b"\xc3", b"\x80", b"\xfe\xff"]) + data[i:]
    if op == 9:  # a number grown past every bound
        digits = [i for i, c in enumerate(data) if 48 <= c <= 57]
        if digits:
            i = rng.choice(digits)
            return (
                data[:i]
                + rng.choice([HUGE_INT.encode(), b"-", b"99999999999999999999999"])
                + data[i:]
            )
        return data
    if op == 10:  # a line indented wrongly
        i = rng.randrange(len(lines))
        lines[i] = rng.choice([b"  ", b"\t", b""]) + lines[i].lstrip()
        return b"\n".join(lines)
    return data * 2  # everything twice (duplicate documents, rows or GPUs)


def _paths(obj: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    out = [prefix]
    if isinstance(obj, dict):
        for k, v in obj.items():
            out.extend(_paths(v, (*prefix, k)))
    elif isinstance(obj, list):
        for i, v in enumerate(obj):
            out.extend(_paths(v, (*prefix, i)))
    return out


def _typo(rng: random.Random, key: str) -> str:
    if not key:
        return "x"
    op = rng.randrange(4)
    if op == 0:
        return key + "s"
    if op == 1 and key.endswith("s"):
        return key[:-1]
    if op == 2 and len(key) > 1:
        i = rng.randrange(len(key))
        return key[:i] + key[i + 1 :]
    return key.capitalize() if key[:1].islower() else key.lower()


def _structural_mutation(rng: random.Random, docs: list[Any]) -> list[Any] | None:
    candidates = [(d, p) for d, doc in enumerate(docs) for p in _paths(doc) if p]
    if not candidates:
        return None
    d, path = rng.choice(candidates)
    parent: Any = docs[d]
    for step in path[:-1]:
        parent = parent[step]
    last = path[-1]
    op = rng.randrange(4)
    if op == 0 or op == 3:
        parent[last] = rng.choice(HOSTILE_VALUES)
    elif op == 1 and isinstance(parent, dict):
        parent[_typo(rng, str(last))] = parent.pop(last)
    elif op == 2:
        if isinstance(parent, dict):
            del parent[last]
        else:
            parent.pop(last)
    else:
        parent[last] = rng.choice(HOSTILE_VALUES)
    return docs


def mutate(rng: random.Random, data: bytes, *, yaml_like: bool) -> bytes:
    """One to three mutations of ``data``; structural ones for YAML when it parses."""
    for _ in range(rng.randint(1, 3)):
        if yaml_like and rng.random() < 0.6:
            try:
                docs = list(
                    yaml.load_all(
                        data.decode("utf-8"), Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader)
                    )
                )
            except (yaml.YAMLError, UnicodeDecodeError, ValueError, RecursionError):
                docs = []
            if docs:
                mutated = _structural_mutation(rng, docs)
                if mutated is not None:
                    try:
                        data = yaml.dump_all(
                            mutated,
                            Dumper=getattr(yaml, "CSafeDumper", yaml.SafeDumper),
                            sort_keys=False,
                        ).encode()
                        continue
                    except (yaml.YAMLError, RecursionError, ValueError):
                        pass
        data = _text_mutation(rng, data)
    return data
