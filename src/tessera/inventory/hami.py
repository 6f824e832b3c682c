"""HAMi's node-register annotation ``hami.io/node-nvidia-register``.

Two encodings (HAMi ``pkg/device/devices.go``):

- since v2.8, JSON: ``[{"id", "index", "count", "devmem", "devcore", "type", "numa", "mode",
  "health"[, "migProfiles"]}, ...]``;
- before, colon-terminated records ``UUID,count,devmem,devcore,type,numa,health[,index,mode]:``.

``devmem`` is MiB *after* HAMi's ``deviceMemoryScaling`` (equal to the physical memory unless an
operator set a scaling); ``type`` is the NVML name prefixed with ``NVIDIA-`` (removed here).
``count``, ``devcore`` and ``health`` are HAMi scheduling settings and are not carried.
``mode: mig`` means HAMi creates MIG instances per pod (dynamic MIG): the GPU is marked
``mig_on_demand``, and the profiles NVML gave HAMi (``migProfiles``: name, ``memoryMB``,
placements) become its ``mig_model``.
"""

from __future__ import annotations

import json
import re
from typing import Any

from ._records import RawGPU
from .errors import MalformedInputError, MissingFieldError
from .model import small_int

KEY = "hami.io/node-nvidia-register"
_LINE = re.compile(r"^\s*(?P<key>[\w./-]+)\s*[:=]\s*(?P<val>.*)$")


def _product(type_: str | None) -> str | None:
    if type_ is None:
        return None
    return type_[len("NVIDIA-") :] if type_.startswith("NVIDIA-") else type_


def _int(v: Any) -> int | None:
    return small_int(v)


#: HAMi's ``DeviceInfo`` (``pkg/device/devices.go``) field types, as Go's ``encoding/json``
#: decodes them: a value of another JSON type (``"id": 5``, ``"devmem": 2.0``) makes HAMi's
#: scheduler drop the node's whole register annotation. ``null`` leaves a field unset.
_GO_FIELDS: dict[str, tuple[str, int, int]] = {
    "id": ("string", 0, 0),
    "type": ("string", 0, 0),
    "mode": ("string", 0, 0),
    "devicevendor": ("string", 0, 0),
    "index": ("integer", 0, 2**64 - 1),  # uint
    "count": ("integer", -(2**31), 2**31 - 1),  # int32
    "devmem": ("integer", -(2**31), 2**31 - 1),
    "devcore": ("integer", -(2**31), 2**31 - 1),
    "numa": ("integer", -(2**63), 2**63 - 1),  # int
    "health": ("boolean", 0, 0),
    "migProfiles": ("array", 0, 0),
    "migtemplate": ("array", 0, 0),
    "custominfo": ("object", 0, 0),
}
_JSON_TYPES = {"string": str, "boolean": bool, "array": list, "object": dict}


def _field_problem(key: str, value: Any) -> str | None:
    """Why HAMi's Go decoder refuses ``value`` for ``DeviceInfo.<key>``, or None."""
    kind, low, high = _GO_FIELDS.get(key, ("", 0, 0))
    if not kind or value is None:
        return None
    if kind == "integer":
        if isinstance(value, bool) or not isinstance(value, int):
            return f"must be a whole number (HAMi decodes it into a Go integer), got {value!r:.40}"
        if not low <= value <= high:
            return f"{value} is out of range ({low} to {high})"
        return None
    if not isinstance(value, _JSON_TYPES[kind]):
        return f"must be a JSON {kind} (as HAMi writes it), got {value!r:.40}"
    return None


def register_value(text: str) -> tuple[str, int] | None:
    """(annotation value, 1-based line) of ``hami.io/node-nvidia-register`` in ``key: value``
    lines, or of a bare value; None if the text holds neither."""
    for n, line in enumerate(text.splitlines(), start=1):
        m = _LINE.match(line)
        if m and m.group("key") == KEY:
            return m.group("val").strip().strip("'\""), n
    stripped = text.strip()
    if stripped.startswith("[") and '"devmem"' in stripped:
        return stripped, 1
    if re.match(r"^GPU-[0-9a-fA-F-]{36},\d+,\d+,", stripped):
        return stripped, 1
    return None


def raw_gpus_from_hami(text: str, source: str) -> list[RawGPU]:
    """Raw GPU records from the annotation (either encoding). Raises
    :class:`MalformedInputError` for bad JSON or a record with too few fields,
    :class:`MissingFieldError` when no ``hami.io/node-nvidia-register`` is present."""
    found = register_value(text)
    if found is None:
        raise MissingFieldError(
            f"no {KEY} annotation (HAMi's NVIDIA inventory) in this text",
            source=source,
            field=KEY,
        )
    value, line = found
    raws: list[RawGPU] = []
    if value.startswith("["):
        try:
            items = json.loads(value)
        except ValueError as err:  # JSONDecodeError, or a number past Python's digit limit
            msg = (
                f"{err.msg} at character {err.pos}"
                if isinstance(err, json.JSONDecodeError)
                else "a number too long"
            )
            raise MalformedInputError(
                f"annotation value is not valid JSON ({msg})",
                source=source,
                field=KEY,
                line=line,
            ) from None
        if not isinstance(items, list):
            raise MalformedInputError(
                "JSON value is not a list", source=source, field=KEY, line=line
            )
        for pos, item in enumerate(items):
            if not isinstance(item, dict):
                raise MalformedInputError(
                    f"entry {pos} is not an object", source=source, field=KEY, line=line
                )
            for key, val in item.items():
                why = _field_problem(key, val)
                if why is not None:
                    raise MalformedInputError(
                        f"entry {pos}: {key} {why}", source=source, field=KEY, line=line
                    )
            idx = _int(item.get("index"))
            devmem = _int(item.get("devmem"))
            raws.append(
                RawGPU(
                    index=idx if idx is not None else pos,
                    uuid=item.get("id"),
                    product_name=_product(item.get("type")),
                    memory=str(devmem) if devmem is not None else None,
                    numa_node=_int(item.get("numa")),
                    mig_enabled=item.get("mode") == "mig",
                    mig_on_demand=item.get("mode") == "mig",
                    mig_profiles=item.get("migProfiles") if item.get("mode") == "mig" else None,
                    line=line,
                )
            )
        return raws
    for pos, record in enumerate(r for r in value.split(":") if r.strip()):
        parts = [p.strip() for p in record.split(",")]
        if len(parts) < 7:
            raise MalformedInputError(
                f"record {pos} {record!r} has {len(parts)} fields; expected "
                "UUID,count,devmem,devcore,type,numa,health[,index,mode]",
                source=source,
                field=KEY,
                line=line,
            )
        idx = _int(parts[7]) if len(parts) > 7 else None
        raws.append(
            RawGPU(
                index=idx if idx is not None else pos,
                uuid=parts[0],
                product_name=_product(parts[4]),
                memory=parts[2],
                numa_node=_int(parts[5]),
                mig_enabled=len(parts) > 8 and parts[8] == "mig",
                mig_on_demand=len(parts) > 8 and parts[8] == "mig",
                line=line,
            )
        )
    return raws


def register_sharing(value: str) -> dict[str, tuple[int | None, bool]]:
    """Per GPU UUID of a ``hami.io/node-nvidia-register`` value (either encoding), what HAMi
    schedules by and the inventory does not carry: ``(count, health)``, ``count`` the most
    containers that may share the GPU (HAMi's ``deviceSplitCount``; None when absent) and
    ``health`` False for a GPU the device plugin reports unhealthy. Entries without a UUID are
    left out; a value that is not readable gives {} (:func:`raw_gpus_from_hami` says why)."""
    out: dict[str, tuple[int | None, bool]] = {}
    text = value.strip()
    if text.startswith("["):
        try:
            items = json.loads(text)
        except ValueError:
            return {}
        for item in items if isinstance(items, list) else []:
            if isinstance(item, dict) and isinstance(item.get("id"), str):
                out[item["id"]] = (_int(item.get("count")), item.get("health") is not False)
        return out
    for record in (r for r in text.split(":") if r.strip()):
        parts = [p.strip() for p in record.split(",")]
        if len(parts) >= 7 and parts[0]:
            out[parts[0]] = (_int(parts[1]), parts[6].lower() != "false")
    return out
