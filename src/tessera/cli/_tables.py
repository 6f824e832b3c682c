"""Plain tables as kubectl prints them, and short names that still tell things apart.

A table is a title line, an upper-case header and one line per row: left-aligned columns three
spaces apart, no borders, no cell ever wrapped onto a second line, so every row can be read with
``grep`` and ``awk``. Identifier columns (pods, containers, device keys, UUIDs, shareIDs,
quantities) are never cut: where they alone are wider than the terminal, the line is longer.
Only free text (a pending pod's reason, a GPU model, counter lines, lists of pods) is cut to fit
the terminal (``$COLUMNS``, else the terminal's width, else 80 columns), ending in
``...``; free text sits in the last columns. ``-o wide`` cuts nothing.
"""

from __future__ import annotations

import os
import sys
import textwrap
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

import click
from rich.cells import cell_len, set_cell_size

from tessera import DRIVER_NAME

#: Shortest prefix shown for a GPU UUID (``GPU-`` and its first 8 hex digits) and a shareID.
UUID_MIN = 12
SHARE_ID_MIN = 8
#: Between two columns, as kubectl prints them.
GAP = "   "
#: Narrowest a free-text column is cut to (its header's width, if wider).
FREE_FLOOR = 10
#: What ends a cut cell.
CUT = "..."


def device_key(driver: str, pool: str, device: str) -> str:
    """The name both tables use for one device: ``<pool>/<device>`` for Tessera's driver (the
    pool is the node: ``h100-node/gpu-5``), ``<driver>/<pool>/<device>`` for any other."""
    return f"{pool}/{device}" if driver == DRIVER_NAME else f"{driver}/{pool}/{device}"


def device_key_of(device_id: str) -> str:
    """:func:`device_key` of a ``driver/pool/device`` id (a pool may itself hold ``/``)."""
    driver, _, rest = device_id.partition("/")
    pool, _, device = rest.rpartition("/")
    return device_key(driver, pool, device)


def unique_prefixes(values: Iterable[str], minimum: int) -> dict[str, str]:
    """``{value: shortest prefix of at least minimum characters that no other value shares}``.

    The part that tells two values apart is never cut: ``GPU-12345678-aaaa-bbbb-cccc-
    dddddddddd01`` and ``...02`` both keep their last digits. A value that is a prefix of
    another stays whole.
    """
    distinct = sorted(set(values))
    out: dict[str, str] = {}
    for i, v in enumerate(distinct):
        need = minimum
        for j in (i - 1, i + 1):
            if 0 <= j < len(distinct):
                other = distinct[j]
                common = 0
                while common < min(len(v), len(other)) and v[common] == other[common]:
                    common += 1
                need = max(need, common + 1)
        out[v] = v[:need]
    return out


def terminal_width() -> int:
    """``$COLUMNS`` when set, else the width of the terminal standard output is, else 80."""
    env = os.environ.get("COLUMNS", "")
    if env.isdigit() and int(env) > 0:
        return int(env)
    try:
        if sys.stdout.isatty():
            return os.get_terminal_size(sys.stdout.fileno()).columns
    except (OSError, ValueError, AttributeError):
        pass
    return 80


def clip(text: str, width: int) -> str:
    """``text`` cut to ``width`` terminal cells, ending in ``...`` when it was longer."""
    if cell_len(text) <= width:
        return text
    if width <= len(CUT):
        return set_cell_size(text, width)
    return set_cell_size(text, width - len(CUT)).rstrip() + CUT


@dataclass
class FitTable:
    """A titled table of one-line cells, laid out only when printed (:func:`print_tables`).

    ``columns`` = ``[(header, free_text)]``: a free-text column may be cut to fit the
    terminal (:meth:`widths`); every other column is printed whole. Headers print upper-case.
    """

    title: str
    columns: Sequence[tuple[str, bool]]
    caption: str | None = None
    #: printed after the rows when a free-text cell was cut (what shows it whole)
    cut_caption: str | None = None
    rows: list[tuple[str, ...]] = field(default_factory=list)

    def add_row(self, *cells: str) -> None:
        if len(cells) != len(self.columns):
            raise ValueError(f"{self.title}: {len(cells)} cells for {len(self.columns)} columns")
        self.rows.append(tuple(" ".join(c.split()) for c in cells))  # one line per cell

    def natural_widths(self) -> list[int]:
        """Per column, the widest cell or header: nothing cut."""
        return [
            max([cell_len(header), *(cell_len(r[i]) for r in self.rows)])
            for i, (header, _) in enumerate(self.columns)
        ]

    def widths(self, width: int | None) -> list[int]:
        """Column widths for a terminal of ``width`` columns (None: natural). Over the width,
        free-text columns give way one cell at a time, the widest first, down to
        :data:`FREE_FLOOR` (or their header); identifier columns never do."""
        out = self.natural_widths()
        if width is None:
            return out
        floors = [
            max(FREE_FLOOR, cell_len(h)) if free else w
            for (h, free), w in zip(self.columns, out, strict=True)
        ]
        while sum(out) + len(GAP) * (len(out) - 1) > width:
            cands = [i for i, w in enumerate(out) if w > floors[i]]
            if not cands:
                break
            widest = max(cands, key=lambda i: out[i] - floors[i])
            out[widest] -= 1
        return out

    def lines(self, width: int | None) -> list[str]:
        """The title, the header and the rows, each one line (trailing blanks removed)."""
        widths = self.widths(width)

        def line(cells: Sequence[str]) -> str:
            parts = [
                set_cell_size(clip(c, w), w) if i < len(cells) - 1 else clip(c, w)
                for i, (c, w) in enumerate(zip(cells, widths, strict=True))
            ]
            return GAP.join(parts).rstrip()

        out = [self.title, line([h.upper() for h, _ in self.columns])]
        out.extend(line(r) for r in self.rows)
        if self.caption:  # free text: wrapped at words to the terminal (whole with -o wide)
            out.extend(textwrap.wrap(self.caption, width) if width else [self.caption])
        cut = any(cell_len(c) > w for r in self.rows for c, w in zip(r, widths, strict=True))
        if cut and self.cut_caption:
            out.append(self.cut_caption)
        return out


def print_tables(tables: Sequence[FitTable], *, wide: bool, footer: str | None = None) -> None:
    """Print ``tables`` (a blank line between two) and a ``footer`` line to stdout, free text
    cut to the terminal's width; with ``wide``, nothing cut."""
    width = None if wide else terminal_width()
    for k, t in enumerate(tables):
        if k:
            click.echo("")
        for text in t.lines(width):
            click.echo(text)
    if footer is not None:
        click.echo(footer)
