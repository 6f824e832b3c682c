"""``nvidia-smi topo -m`` matrices (tab- or space-separated, with or without NIC columns,
legends, ANSI underline codes, empty affinity columns, truncated excerpts)."""

from __future__ import annotations

import re

from .errors import MalformedInputError, UnsupportedFormatError
from .model import Topology

_ANSI = re.compile(r"\x1b\[[0-9;]*m")
_GPU = re.compile(r"^GPU([0-9]{1,4})$")
_CELL = re.compile(r"^(X|NV\d+|SYS|NODE|PHB|PXB|PIX|SOC|PSB|N/A)$")
_TRAILING = ("CPU Affinity", "NUMA Affinity", "GPU NUMA ID")
_NUMA = re.compile(r"^[0-9]{1,9}$")
#: What nvidia-smi writes as a GPU's NUMA Affinity: one node, or nodes such as ``6-7`` / ``0,2``
#: (no single node: read as none), or N/A.
_NUMA_NODES = re.compile(r"^[0-9]{1,9}(-[0-9]{1,9})?(,[0-9]{1,9}(-[0-9]{1,9})?)*$")


def _clean(line: str) -> str:
    return _ANSI.sub("", line).expandtabs(8).rstrip()


def _header_index(lines: list[str]) -> int | None:
    for i, line in enumerate(lines):
        if line[:1].isspace() and line.split()[:1] == ["GPU0"]:
            return i
    return None


def is_topo_matrix(text: str) -> bool:
    lines = [_clean(x) for x in text.splitlines()]
    h = _header_index(lines)
    return h is not None and any(x.split()[:1] == ["GPU0"] for x in lines[h + 1 :])


def parse_topo_matrix(text: str, source: str, line_offset: int = 0) -> Topology:
    """Parse a ``topo -m`` matrix.

    GPU-to-GPU cells become ``links`` (NIC rows and columns are ignored); the "NUMA Affinity"
    column becomes ``numa``. Rows missing from a truncated excerpt leave ``complete`` False and
    their pairs are filled from the other GPU's row when it is present. Raises
    :class:`MalformedInputError` naming line and column for an unknown cell, a row shorter than
    the header, or two rows that disagree about one pair.
    """
    raw_lines = text.splitlines()
    lines = [_clean(x) for x in raw_lines]
    h = _header_index(lines)
    if h is None:
        raise UnsupportedFormatError(
            "no `nvidia-smi topo -m` header line (GPU0 GPU1 ... CPU Affinity)",
            source=source,
            field="topo -m",
        )
    header = lines[h]
    label_pos = {lab: header.find(lab) for lab in _TRAILING if header.find(lab) >= 0}
    first_label = min(label_pos.values()) if label_pos else len(header)
    columns = header[:first_label].split()
    gpu_cols = [int(m.group(1)) for c in columns if (m := _GPU.match(c))]
    if gpu_cols != list(range(len(gpu_cols))) or columns[: len(gpu_cols)] != [
        f"GPU{i}" for i in gpu_cols
    ]:
        raise MalformedInputError(
            f"header columns {columns[: len(gpu_cols) + 1]} are not GPU0..GPU<n-1> first",
            source=source,
            field="topo -m header",
            line=h + 1 + line_offset,
        )
    n = len(gpu_cols)
    labels = sorted(label_pos, key=lambda lab: label_pos[lab])
    links: dict[tuple[int, int], str] = {}
    numa: dict[int, int | None] = {g: None for g in range(n)}
    rows: set[int] = set()
    for k in range(h + 1, len(lines)):
        line = lines[k]
        tokens = [(m.group(0), m.start()) for m in re.finditer(r"\S+", line)]
        if not tokens:
            continue
        m = _GPU.match(tokens[0][0])
        if not m:
            if tokens[0][0].startswith("Legend"):
                break
            continue  # NIC / mlx5 rows
        i = int(m.group(1))
        lineno = k + 1 + line_offset
        if i >= n:
            raise MalformedInputError(
                f"row GPU{i} but the header has only GPU0..GPU{n - 1}",
                source=source,
                field="topo -m",
                line=lineno,
            )
        cells = tokens[1 : 1 + len(columns)]
        if len(cells) < len(columns):
            raise MalformedInputError(
                f"row GPU{i} has {len(cells)} cells for {len(columns)} columns; the line is cut",
                source=source,
                field="topo -m",
                line=lineno,
            )
        rows.add(i)
        for j, (cell, col) in enumerate(cells[:n]):
            if not _CELL.match(cell):
                raise MalformedInputError(
                    f"cell GPU{i}/GPU{j} is {cell!r}, not X, NV#, PIX, PXB, PHB, NODE or SYS",
                    source=source,
                    field="topo -m",
                    line=lineno,
                    column=col + 1,
                )
            if i == j or cell in ("X", "N/A"):
                continue
            for a, b in ((i, j), (j, i)):
                if links.setdefault((a, b), cell) != cell:
                    raise MalformedInputError(
                        f"GPU{i}/GPU{j} is {cell} here but {links[(a, b)]} in row GPU{j}",
                        source=source,
                        field="topo -m",
                        line=lineno,
                        column=col + 1,
                    )
        trailing = _assign_trailing(tokens[1 + len(columns) :], labels, label_pos)
        value = trailing.get("NUMA Affinity")
        if value is not None and value != "N/A" and not _NUMA_NODES.match(value):
            shown = value if len(value) <= 20 else f"{value[:12]}... ({len(value)} characters)"
            raise MalformedInputError(
                f"NUMA Affinity of GPU{i} is {shown!r}, not NUMA node numbers (at most 9 "
                "digits each, e.g. 0 or 6-7) or N/A",
                source=source,
                field="topo -m",
                line=lineno,
            )
        numa[i] = int(value) if value is not None and _NUMA.match(value) else None
    if not rows:
        raise MalformedInputError(
            "header but no GPU rows; the excerpt is cut right after the header",
            source=source,
            field="topo -m",
            line=h + 1 + line_offset,
        )
    return Topology(gpus=n, links=links, numa=numa, complete=rows == set(range(n)))


def _assign_trailing(
    tokens: list[tuple[str, int]], labels: list[str], label_pos: dict[str, int]
) -> dict[str, str]:
    """Affinity values to their columns: in order when every column has a value, else by the
    nearest header column (empty columns leave no token)."""
    if len(tokens) == len(labels):
        return {lab: tok for lab, (tok, _) in zip(labels, tokens, strict=True)}
    out: dict[str, str] = {}
    for tok, col in tokens:
        if labels:
            lab = min(labels, key=lambda lab: abs(label_pos[lab] - col))
            out.setdefault(lab, tok)
    return out
