"""Tables that fit the terminal, and short names that still tell things apart.

Every table is as wide as the terminal (rich's width: the terminal, else ``$COLUMNS``, else 80
columns). Cells wrap at spaces and fold (never cut) words that do not fit. Where a table is too
wide, the rare cells wider than their column's typical width fold first, then text columns
narrow, and identifier columns (device keys, UUIDs, shareIDs) last. ``-o wide`` prints every
table at its natural width instead, whatever the terminal.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from rich.cells import cell_len
from rich.console import Console
from rich.table import Table

from tessera import DRIVER_NAME

#: Shortest prefix shown for a GPU UUID (``GPU-`` and its first 8 hex digits) and a shareID.
UUID_MIN = 12
SHARE_ID_MIN = 8
#: Narrowest a text column / an identifier column is made before the table exceeds the width.
TEXT_FLOOR = 10
IDENT_FLOOR = 8
#: Fewer rows than this have no outliers (see :meth:`FitTable.typical_widths`).
OUTLIER_ROWS = 4


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


@dataclass
class FitTable:
    """A titled table of plain-text cells, laid out only when printed (:func:`print_tables`).

    ``columns`` = ``[(header, is_identifier)]``. Over the terminal's width, columns give way as
    :func:`_fit` says: outliers, then text columns (down to :data:`TEXT_FLOOR` characters), then
    identifier columns (device keys, UUIDs, shareIDs; down to :data:`IDENT_FLOOR`). No cell is
    ever cut: what does not fit wraps or folds onto the next line.
    """

    title: str
    columns: Sequence[tuple[str, bool]]
    caption: str | None = None
    rows: list[tuple[str, ...]] = field(default_factory=list)

    def add_row(self, *cells: str) -> None:
        if len(cells) != len(self.columns):
            raise ValueError(f"{self.title}: {len(cells)} cells for {len(self.columns)} columns")
        self.rows.append(cells)

    def natural_widths(self) -> list[int]:
        """Per column, the widest cell (or the header's longest word): no wrapping needed."""
        return [max(c) for c in self._cell_widths()]

    def typical_widths(self) -> list[int]:
        """Per column, the width three cells in four fit in (at least the header's longest
        word): a wider cell is an outlier that may fold rather than widen every row. With
        fewer than :data:`OUTLIER_ROWS` rows there are no outliers (the natural width)."""
        out = []
        for c in self._cell_widths():
            head, cells = c[0], sorted(c[1:])
            if len(cells) < OUTLIER_ROWS:
                out.append(max([head, *cells]))
            else:
                out.append(max(head, cells[(3 * (len(cells) - 1)) // 4]))
        return out

    def _cell_widths(self) -> list[list[int]]:
        """Per column: the header's longest word, then every cell's width."""
        return [
            [max((cell_len(w) for w in header.split()), default=1)]
            + [cell_len(r[i]) for r in self.rows]
            for i, (header, _) in enumerate(self.columns)
        ]

    def overhead(self) -> int:
        """Columns of borders and padding around the cells."""
        return 3 * len(self.columns) + 1

    def render(self, width: int | None) -> Table:
        """The rich Table, its columns sized for ``width`` terminal columns (None: natural)."""
        widths = self.natural_widths()
        if width is not None:
            idents = [ident for _, ident in self.columns]
            widths = _fit(widths, self.typical_widths(), idents, width - self.overhead())
        t = Table(
            title=self.title, title_justify="left", caption=self.caption, caption_justify="left"
        )
        for (header, _), w in zip(self.columns, widths, strict=True):
            t.add_column(header, width=w, overflow="fold")
        for r in self.rows:
            t.add_row(*r)
        return t


def _fit(widths: list[int], typical: list[int], ident: list[bool], available: int) -> list[int]:
    """Narrow columns one character at a time until their sum fits ``available``, in three
    rounds, each taking first the column furthest above that round's floor: every column down
    to its ``typical`` width (its outliers fold), then text columns down to
    :data:`TEXT_FLOOR`, then identifier columns down to :data:`IDENT_FLOOR`. What still does
    not fit (a very narrow terminal) is left for rich to squeeze."""
    out = list(widths)
    floors = [
        list(typical),
        [TEXT_FLOOR if not i else w for i, w in zip(ident, typical, strict=True)],
        [IDENT_FLOOR if i else TEXT_FLOOR for i in ident],
    ]
    for floor in floors:
        while sum(out) > available:
            cands = [i for i, w in enumerate(out) if w > floor[i]]
            if not cands:
                break
            widest = max(cands, key=lambda i: out[i] - floor[i])
            out[widest] -= 1
    return out


def print_tables(tables: Sequence[FitTable], *, wide: bool, footer: str | None = None) -> None:
    """Print ``tables`` (and a ``footer`` line) to stdout, sized to the terminal's width; with
    ``wide``, at their natural width (wider than the terminal if need be) so nothing wraps."""
    console = Console()
    if wide:
        need = max((sum(t.natural_widths()) + t.overhead() for t in tables), default=0)
        if need > console.width:
            console = Console(width=need)
    for t in tables:
        console.print(t.render(None if wide else console.width))
    if footer is not None:
        console.print(footer)
