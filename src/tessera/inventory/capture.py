"""Multi-section captures (nvidia_gpu_exporter ``internal/captures``): a header, then sections

::

    ################################################################################
    # <phase> :: <name>
    # $ <command>
    ################################################################################
    <raw output>
"""

from __future__ import annotations

import itertools
import re
from dataclasses import dataclass

_RULE = re.compile(r"^#{20,}\s*$")
_TITLE = re.compile(r"^# (?P<phase>[^:]+?) :: (?P<name>.+?)\s*$")
_MASKED = re.compile(r"^masked:\s*yes\s*$", re.IGNORECASE)
_MIG_LINE = re.compile(
    r"^\s*MIG\s+(?P<profile>\S+)\s+Device\s+(?P<idx>[0-9]{1,9}):\s*\(UUID:\s*(?P<uuid>[^)\s]+)\)"
)
_GPU_LINE = re.compile(r"^GPU (?P<idx>[0-9]{1,9}): .*\(UUID: (?P<uuid>[^)\s]+)\)")


@dataclass(frozen=True)
class Section:
    phase: str
    name: str
    body: str
    first_line: int  # 1-based line number of the body's first line in the whole file


def is_capture(text: str) -> bool:
    lines = text.splitlines()
    return any(_RULE.match(a) and _TITLE.match(b) for a, b in itertools.pairwise(lines))


def sections(text: str) -> list[Section]:
    """The titled sections, in file order."""
    lines = text.splitlines()
    out: list[Section] = []
    i = 0
    while i < len(lines):
        title = _TITLE.match(lines[i + 1]) if i + 1 < len(lines) and _RULE.match(lines[i]) else None
        if title is None:
            i += 1
            continue
        j = i + 2
        while j < len(lines) and not _RULE.match(lines[j]):
            j += 1  # the "# $ command" lines
        start = j + 1
        k = start
        while k < len(lines) and not (
            _RULE.match(lines[k]) and k + 1 < len(lines) and _TITLE.match(lines[k + 1])
        ):
            k += 1
        out.append(
            Section(title.group("phase"), title.group("name"), "\n".join(lines[start:k]), start + 1)
        )
        i = k
    return out


def find(secs: list[Section], name_prefix: str) -> Section | None:
    """The first section whose name starts with ``name_prefix`` (e.g. ``"query (-q)"``)."""
    return next((s for s in secs if s.name.startswith(name_prefix)), None)


def is_masked(text: str) -> bool:
    """True when the capture header says ``masked: yes`` (identifiers replaced)."""
    for line in text.splitlines():
        if _TITLE.match(line):
            return False  # the header ended
        if _MASKED.match(line):
            return True
    return False


def mig_listing(body: str) -> dict[tuple[int, int], tuple[str, str]]:
    """From ``nvidia-smi -L``: ``{(gpu index, MIG device index): (profile, MIG uuid)}``."""
    out: dict[tuple[int, int], tuple[str, str]] = {}
    gpu = -1
    for line in body.splitlines():
        g = _GPU_LINE.match(line)
        if g:
            gpu = int(g.group("idx"))
            continue
        m = _MIG_LINE.match(line)
        if m and gpu >= 0:
            out[(gpu, int(m.group("idx")))] = (m.group("profile"), m.group("uuid"))
    return out
