"""Format detection and the public parse/load entry points."""

from __future__ import annotations

import re
from dataclasses import replace
from pathlib import Path

from . import capture, hami, query_csv
from ._records import RawGPU, build_gpus
from .errors import InventoryError, MalformedInputError, UnsupportedFormatError
from .model import GPU, Topology, normalize_bus_id
from .smi_text import raw_gpus_from_smi_text
from .smi_xml import parse_smi_xml
from .topo import is_topo_matrix, parse_topo_matrix

_NVSMI_LOG = "==============NVSMI LOG=============="
_SMI_TABLE = re.compile(r"^\|\s*NVIDIA-SMI\s+\S+.*Driver Version:", re.MULTILINE)
_LIST_LINE = re.compile(r"^GPU \d+: .*\(UUID: [^)]+\)\s*$", re.MULTILINE)
_NVLINK_LINE = re.compile(r"^\s*Link \d+: ", re.MULTILINE)
_LSPCI_LINE = re.compile(
    r"^[0-9a-fA-F]{4}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}\.[0-7] .+\[[0-9a-f]{4}\]", re.MULTILINE
)
_FORMATS = (
    "`nvidia-smi -q -x` XML, `nvidia-smi -q` text, `--query-gpu=... --format=csv` with uuid, "
    "name and memory.total, or HAMi's hami.io/node-nvidia-register annotation"
)

INVENTORY_FORMATS = ("nvidia-smi-xml", "nvidia-smi-q", "capture", "query-gpu-csv", "hami")


def detect_inventory_format(text: str) -> str | None:
    """One of :data:`INVENTORY_FORMATS`, or None when the text is none of them."""
    head = text.lstrip("\ufeff \t\r\n")
    if (
        head.startswith("<?xml")
        or head.startswith("<nvidia_smi_log")
        or "<nvidia_smi_log" in text[:4096]
    ):
        return "nvidia-smi-xml"
    if capture.is_capture(text):
        return "capture"
    if _NVSMI_LOG in text:
        return "nvidia-smi-q"
    if hami.register_value(text) is not None:
        return "hami"
    if query_csv.find_header(text.splitlines()) is not None:
        return "query-gpu-csv"
    return None


def _unsupported(text: str, source: str) -> InventoryError:
    """The most precise error for text that is not an inventory we read."""
    if not text.strip():
        return UnsupportedFormatError(
            f"empty input; give {_FORMATS}", source=source, field="format"
        )
    if _SMI_TABLE.search(text):
        return UnsupportedFormatError(
            "the plain `nvidia-smi` table shows no GPU UUIDs, so GPUs cannot be identified; "
            "capture `nvidia-smi -q -x` (or `nvidia-smi -q`) instead",
            source=source,
            field="uuid",
        )
    if _LIST_LINE.search(text):
        if _NVLINK_LINE.search(text):
            return UnsupportedFormatError(
                "this is `nvidia-smi nvlink --status` output, not an inventory (no memory); "
                "capture `nvidia-smi -q -x`",
                source=source,
                field="memory.total",
            )
        return UnsupportedFormatError(
            "`nvidia-smi -L` lists names and UUIDs but no memory; capture `nvidia-smi -q -x`",
            source=source,
            field="memory.total",
        )
    if is_topo_matrix(text):
        return UnsupportedFormatError(
            "this is an `nvidia-smi topo -m` matrix, not an inventory; give it as the "
            "node's topology: --node NAME=INVENTORY:TOPOLOGY (or `topology:` in a cluster file)",
            source=source,
            field="format",
        )
    if "<" in text[:200] and ">" in text[:400]:
        return UnsupportedFormatError(
            f"XML or markup that is not <nvidia_smi_log>; give {_FORMATS}",
            source=source,
            field="format",
        )
    return UnsupportedFormatError(
        f"not a GPU inventory; give {_FORMATS}", source=source, field="format"
    )


def _from_capture(text: str, source: str) -> list[GPU]:
    secs = capture.sections(text)
    q = capture.find(secs, "query (-q)")
    if q is None:
        raise UnsupportedFormatError(
            "capture has no `query (-q)` section (nvidia-smi -q); capture it with -q",
            source=source,
            field="query (-q)",
        )
    raws = raw_gpus_from_smi_text(q.body, source, line_offset=q.first_line - 1)
    listing = capture.find(secs, "list (-L)")
    migs = capture.mig_listing(listing.body) if listing else {}
    csv_sec = capture.find(secs, "query-gpu")
    caps: dict[str, str] = {}
    if csv_sec is not None:
        try:
            _, rows, _ = query_csv.query_csv_rows(csv_sec.body, source, csv_sec.first_line - 1)
        except UnsupportedFormatError:
            rows = []
        for row in rows:
            bus, cap = normalize_bus_id(row.get("pci.bus_id")), row.get("compute_cap")
            if bus and cap:
                caps[bus] = cap
    enriched: list[RawGPU] = []
    for raw in raws:
        listed = sorted(i for g, i in migs if g == raw.index)
        queried = sorted(m.index for m in raw.migs or [])
        if listing is not None and raw.mig_enabled and listed != queried:
            raise MalformedInputError(
                f"GPU {raw.index}: `nvidia-smi -L` lists MIG devices {listed} but `nvidia-smi -q` "
                f"{queried}: instances were created or destroyed while capturing; capture again",
                source=source,
                field="MIG Device",
                line=raw.line,
            )
        for m in raw.migs or []:
            if (raw.index, m.index) in migs:
                m.profile, m.uuid = migs[(raw.index, m.index)]
        bus = normalize_bus_id(raw.bus_id)
        enriched.append(
            replace(raw, compute_capability=caps.get(bus or "", raw.compute_capability))
        )
    return build_gpus(enriched, source, masked=capture.is_masked(text))


def parse_inventory(
    text: str, source: str = "<input>", warnings: list[str] | None = None
) -> list[GPU]:
    """Parse a GPU inventory, detecting its format from the content.

    Formats: ``nvidia-smi -q -x`` XML; ``nvidia-smi -q`` text; nvidia_gpu_exporter multi-section
    captures (their ``-q`` section, with MIG profiles/UUIDs from ``-L`` and ``compute_cap`` from
    the ``--query-gpu`` section); ``--query-gpu`` CSV carrying ``uuid``, ``name`` and
    ``memory.total``; HAMi's ``hami.io/node-nvidia-register`` annotation (JSON or colon form).

    Returns the GPUs in nvidia-smi index order (memory in bytes). ``source`` names the input in
    errors and seeds synthesized UUIDs (its last path component). Raises an
    :class:`InventoryError` subclass with a one-line message naming ``source`` and the field:
    :class:`UnsupportedFormatError` (plain ``nvidia-smi`` table: no UUIDs; ``topo -m``; random
    text), :class:`MalformedInputError` (truncated XML with line/column), or
    :class:`MissingFieldError` (no uuid / name / memory). What is read but looks wrong (an XML
    ``attached_gpus`` count that differs from the GPUs listed) is appended to ``warnings``.
    """
    text = text.removeprefix("\ufeff")  # a UTF-8 byte order mark (Windows editors write one)
    fmt = detect_inventory_format(text)
    if fmt == "nvidia-smi-xml":
        return parse_smi_xml(text, source, warnings)
    if fmt == "capture":
        return _from_capture(text, source)
    if fmt == "nvidia-smi-q":
        return build_gpus(raw_gpus_from_smi_text(text, source), source)
    if fmt == "hami":
        return build_gpus(hami.raw_gpus_from_hami(text, source), source)
    if fmt == "query-gpu-csv":
        return build_gpus(query_csv.raw_gpus_from_query_csv(text, source), source)
    raise _unsupported(text, source)


def parse_topology(text: str, source: str = "<input>") -> Topology:
    """Parse GPU interconnect topology, detecting the format from the content.

    Reads ``nvidia-smi topo -m`` matrices, alone or as the ``topo -m`` section of a capture.
    ``nvidia-smi nvlink --status`` (links per GPU, but not which peer each reaches) and
    ``lspci -nn`` (no links at all) raise :class:`UnsupportedFormatError` saying to capture
    ``topo -m``; so does any other text. Malformed matrices raise :class:`MalformedInputError`
    with the line (and column).
    """
    text = text.removeprefix("\ufeff")
    if capture.is_capture(text):
        sec = capture.find(capture.sections(text), "topo -m")
        if sec is None:
            raise UnsupportedFormatError(
                "capture has no `topo -m` section", source=source, field="topo -m"
            )
        return parse_topo_matrix(sec.body, source, line_offset=sec.first_line - 1)
    if is_topo_matrix(text):
        return parse_topo_matrix(text, source)
    if _LIST_LINE.search(text) and _NVLINK_LINE.search(text):
        raise UnsupportedFormatError(
            "`nvidia-smi nvlink --status` lists each GPU's active links and speeds but not the "
            "GPU at the other end, so NVLink domains cannot be told; capture `nvidia-smi topo -m`",
            source=source,
            field="links",
        )
    if len(_LSPCI_LINE.findall(text)) >= 2:
        raise UnsupportedFormatError(
            "`lspci -nn` lists PCI devices but no GPU-to-GPU links; capture `nvidia-smi topo -m`",
            source=source,
            field="links",
        )
    if not text.strip():
        raise UnsupportedFormatError(
            "empty input; give `nvidia-smi topo -m` output", source=source, field="format"
        )
    raise UnsupportedFormatError(
        "not an `nvidia-smi topo -m` matrix (no header line `GPU0 GPU1 ... CPU Affinity`)",
        source=source,
        field="format",
    )


#: An inventory or topology larger than this is not nvidia-smi output (a 64-GPU ``-q -x`` is
#: about 1 MiB); reading stops there, so ``/dev/zero`` cannot fill the memory.
MAX_INVENTORY_BYTES = 64 * 2**20


def _read(path: str | Path) -> str:
    p = Path(path)
    try:
        with p.open("rb") as f:
            data = f.read(MAX_INVENTORY_BYTES + 1)
    except OSError as err:
        raise UnsupportedFormatError(
            f"cannot read the file ({err.strerror or err})", source=str(path), field="file"
        ) from None
    if len(data) > MAX_INVENTORY_BYTES:
        raise UnsupportedFormatError(
            f"larger than {MAX_INVENTORY_BYTES // 2**20} MiB: not nvidia-smi output",
            source=str(path),
            field="file",
        )
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as err:
        raise UnsupportedFormatError(
            f"not UTF-8 text (byte {err.start}); save nvidia-smi output as text",
            source=str(path),
            field="encoding",
        ) from None


def load_inventory(path: str | Path, warnings: list[str] | None = None) -> list[GPU]:
    """Read ``path`` (UTF-8) and :func:`parse_inventory` it with ``source=str(path)``."""
    return parse_inventory(_read(path), str(path), warnings)


def load_topology(path: str | Path) -> Topology:
    """Read ``path`` (UTF-8) and :func:`parse_topology` it with ``source=str(path)``."""
    return parse_topology(_read(path), str(path))
