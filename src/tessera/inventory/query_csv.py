"""``nvidia-smi --query-gpu=... --format=csv[,nounits]`` output."""

from __future__ import annotations

import csv
import io
import re

from ._records import RawGPU
from .errors import MissingFieldError, UnsupportedFormatError
from .model import small_int

_FIELD = re.compile(r"^(?P<name>[a-z_][a-z0-9_.]*)(?: \[(?P<unit>[^\]]+)\])?$", re.IGNORECASE)
_KNOWN_FIELDS = {
    "timestamp",
    "name",
    "uuid",
    "index",
    "memory.total",
    "memory.used",
    "memory.free",
    "pci.bus_id",
    "driver_version",
    "pstate",
    "temperature.gpu",
    "utilization.gpu",
}
REQUIRED = ("uuid", "name", "memory.total")
QUERY_HINT = (
    "nvidia-smi --query-gpu=index,uuid,name,memory.total,pci.bus_id,driver_version,compute_cap,"
    "mig.mode.current --format=csv"
)


def find_header(lines: list[str]) -> int | None:
    """Index of the first line that is a ``--query-gpu`` CSV header (field names, optional
    ``[unit]``), or None."""
    for i, line in enumerate(lines):
        if not line.strip() or line.lstrip().startswith(("$", "#")):
            continue
        names = [f.strip() for f in line.split(",")]
        matches = [_FIELD.match(n) for n in names]
        if (
            len(names) >= 2
            and all(matches)
            and any(m.group("name") in _KNOWN_FIELDS for m in matches if m)
        ):
            return i
    return None


def _value(text: str | None) -> str | None:
    if text is None:
        return None
    v = text.strip()
    return None if v in ("", "[N/A]", "N/A", "[Not Supported]", "[Unknown Error]") else v


def query_csv_rows(
    text: str, source: str, line_offset: int = 0
) -> tuple[list[str], list[dict[str, str | None]], int]:
    """(field names, rows as ``{field: value}``, header line number). Raises
    :class:`UnsupportedFormatError` without a header line."""
    lines = text.splitlines()
    h = find_header(lines)
    if h is None:
        raise UnsupportedFormatError("no --query-gpu CSV header line", source=source, field="csv")
    reader = csv.reader(io.StringIO("\n".join(lines[h:])), skipinitialspace=True)
    header = next(reader)
    names = []
    for f in header:
        m = _FIELD.match(f.strip())
        names.append(m.group("name") if m else f.strip())
    rows = []
    for rec in reader:
        if not rec or all(not c.strip() for c in rec):
            continue
        if len(rec) != len(names):
            break  # the table ended (capture sections, trailing prose)
        rows.append({n: _value(v) for n, v in zip(names, rec, strict=True)})
    return names, rows, h + 1 + line_offset


def raw_gpus_from_query_csv(text: str, source: str) -> list[RawGPU]:
    """Raw GPU records from ``--query-gpu`` CSV.

    Needs the columns ``uuid``, ``name`` and ``memory.total``; uses ``index``, ``pci.bus_id``,
    ``driver_version``, ``compute_cap`` and ``mig.mode.current`` when present. Repeated samples
    of one GPU (``-l``/``-lms`` loops) count once. Raises :class:`MissingFieldError` naming the
    missing columns and the query to run instead.
    """
    names, rows, header_line = query_csv_rows(text, source)
    missing = [f for f in REQUIRED if f not in names]
    if missing:
        raise MissingFieldError(
            f"--query-gpu CSV lacks the column(s) {', '.join(missing)} needed to identify and size "
            f"each GPU; capture `{QUERY_HINT}` or `nvidia-smi -q -x`",
            source=source,
            field=", ".join(missing),
            line=header_line,
        )
    raws: list[RawGPU] = []
    seen: set[str] = set()
    for row in rows:
        uuid = row.get("uuid")
        if uuid is not None:
            if uuid in seen:
                continue
            seen.add(uuid)
        idx = row.get("index")
        raws.append(
            RawGPU(
                index=small_int(idx, len(raws)),  # type: ignore[arg-type]
                uuid=uuid,
                product_name=row.get("name"),
                # The column is present (checked above): no value means nvidia-smi had none to
                # give ([N/A] / [Not Supported] on unified-memory GPUs such as the GB10).
                memory=row.get("memory.total") or "[N/A]",
                memory_reserved=row.get("memory.reserved"),
                compute_capability=row.get("compute_cap"),
                driver_version=row.get("driver_version"),
                bus_id=row.get("pci.bus_id"),
                mig_enabled=(row.get("mig.mode.current") or "").lower() == "enabled",
                line=header_line,
            )
        )
    raws.sort(key=lambda r: r.index)  # rows may come in any order; GPUs are returned by index
    if not raws:
        raise MissingFieldError(
            "--query-gpu CSV has a header but no GPU rows",
            source=source,
            field="csv",
            line=header_line,
        )
    return raws
