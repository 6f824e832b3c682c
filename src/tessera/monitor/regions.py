"""The region directory: one directory per prepared claim, as the node driver keeps it.

Layout (the contract between the driver and the monitor, defined once in
:mod:`tessera.enforcement.layout`; ``<region-dir>`` is the driver's ``<state-dir>/claims``)::

    <region-dir>/<claim-uid>/region      the claim's usage region (required; tessera_region.h)
    <region-dir>/<claim-uid>/limits      the claim's limits file (optional; its ``claim`` line
                                         names namespace/name and uid)
    <region-dir>/<claim-uid>/claim.json  optional metadata (see :func:`parse_claim_json`)

Every entry is read on its own: a region that is missing, truncated or of another version
gives that share an error and leaves the others alone. Metadata files are cached by
modification time; regions are read on every call (they change with every allocation).
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from tessera.enforcement.layout import DEFAULT_CLAIMS_DIR, LIMITS_FILE, META_FILE, REGION_FILE
from tessera.enforcement.limits import LimitsError, read_limits
from tessera.enforcement.region import RegionError, RegionSnapshot, read_region

#: Where the driver keeps its claims' regions by default (``--region-dir``).
DEFAULT_REGION_DIR = DEFAULT_CLAIMS_DIR
META_VERSION = 1
#: Seconds a claim directory may lack a readable region before it is reported: the driver
#: creates the directory, then the region, then the limits file.
REGION_GRACE_SECONDS = 5.0


@dataclass(frozen=True)
class PodRef:
    """A pod that uses a claim, and the names of its containers that reference the claim
    (``container_indexes``: their positions in ``spec.containers``, HAMi's
    ``container_index``; empty where unknown)."""

    namespace: str
    name: str
    uid: str = ""
    containers: tuple[str, ...] = ()
    container_indexes: tuple[int, ...] = ()


@dataclass(frozen=True)
class ShareMeta:
    """What the region directory says about a claim (empty strings where it says nothing).

    ``devices`` maps GPU UUID (lower case) to the DRA device name in the pool.
    """

    uid: str
    namespace: str = ""
    name: str = ""
    driver: str = ""
    pool: str = ""
    devices: Mapping[str, str] = field(default_factory=dict)
    pods: tuple[PodRef, ...] = ()


@dataclass(frozen=True)
class ShareReading:
    """One claim directory as read now: its metadata, and the region snapshot or why not.

    ``error`` is one line naming the file and what is wrong (``snapshot`` is then None);
    ``meta_error`` is a problem with ``limits``/``claim.json`` (the region may still be fine).
    """

    path: str
    meta: ShareMeta
    snapshot: RegionSnapshot | None
    error: str | None = None
    meta_error: str | None = None


class MetadataError(ValueError):
    """A ``claim.json`` that is not the documented shape (message names file and field)."""


def parse_claim_json(data: str, where: str, uid: str) -> ShareMeta:
    """Parse the driver's ``claim.json``: a JSON object, every field optional::

        {"version": 1, "uid": "...", "namespace": "team-a", "name": "train-0-gpu-7x2kq",
         "driver": "gpu.tessera.dev", "pool": "node-1",
         "devices": [{"uuid": "GPU-...", "device": "gpu-0"}],
         "pods": [{"namespace": "team-a", "name": "train-0", "uid": "...", "containers": ["main"]}]}

    ``uid`` (the directory name) is used when the file gives none. Raises
    :class:`MetadataError` naming the file and field.
    """
    try:
        doc = json.loads(data)
    except json.JSONDecodeError as e:
        raise MetadataError(f"{where}: not JSON ({e.msg} at line {e.lineno})") from None
    if not isinstance(doc, dict):
        raise MetadataError(f"{where}: expected a JSON object")
    version = doc.get("version", META_VERSION)
    if version != META_VERSION:
        raise MetadataError(
            f"{where}: version {version!r} is not supported (this monitor reads version {META_VERSION})"
        )

    def text(obj: Mapping[str, Any], key: str, at: str) -> str:
        v = obj.get(key, "")
        if not isinstance(v, str):
            raise MetadataError(f"{where}: {at}{key}: expected a string, got {type(v).__name__}")
        return v

    devices: dict[str, str] = {}
    for i, d in enumerate(doc.get("devices") or []):
        if not isinstance(d, dict):
            raise MetadataError(f"{where}: devices[{i}]: expected an object with uuid and device")
        devices[text(d, "uuid", f"devices[{i}].").lower()] = text(d, "device", f"devices[{i}].")
    pods: list[PodRef] = []
    for i, p in enumerate(doc.get("pods") or []):
        if not isinstance(p, dict):
            raise MetadataError(
                f"{where}: pods[{i}]: expected an object with namespace, name, uid, containers"
            )
        ctrs = p.get("containers") or []
        if not isinstance(ctrs, list) or not all(isinstance(c, str) for c in ctrs):
            raise MetadataError(
                f"{where}: pods[{i}].containers: expected a list of container names"
            )
        pods.append(
            PodRef(
                text(p, "namespace", f"pods[{i}]."),
                text(p, "name", f"pods[{i}]."),
                text(p, "uid", f"pods[{i}]."),
                tuple(ctrs),
            )
        )
    return ShareMeta(
        uid=text(doc, "uid", "") or uid,
        namespace=text(doc, "namespace", ""),
        name=text(doc, "name", ""),
        driver=text(doc, "driver", ""),
        pool=text(doc, "pool", ""),
        devices=devices,
        pods=tuple(pods),
    )


class RegionDir:
    """Reader of a region directory; :meth:`read` is safe to call from several threads."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._meta: dict[str, tuple[tuple[int, int, int, int], ShareMeta, str | None]] = {}
        self._lock = threading.Lock()

    def read(self, check_liveness: bool = True) -> list[ShareReading]:
        """Every claim directory, sorted by name. A directory without a ``region`` file is
        skipped while it is younger than :data:`REGION_GRACE_SECONDS` (the driver is still
        preparing it); after that it is a reading with an ``error`` saying so. Raises
        ``OSError`` only when the region directory itself cannot be listed."""
        out: list[ShareReading] = []
        with os.scandir(self.path) as it:
            entries = sorted(e.name for e in it if e.is_dir(follow_symlinks=False))
        for name in entries:
            d = os.path.join(self.path, name)
            region = os.path.join(d, REGION_FILE)
            if not os.path.lexists(region):
                try:
                    age = time.time() - os.stat(d).st_mtime
                except OSError:
                    continue  # removed meanwhile (unprepared)
                if age < REGION_GRACE_SECONDS:
                    continue
                meta, meta_error = self._metadata(d, name)
                out.append(
                    ShareReading(
                        d,
                        meta,
                        None,
                        f"{d}: no usage region ({REGION_FILE}) in this claim directory: the "
                        f"node driver writes <state-dir>/claims/<uid>/{REGION_FILE}; check that "
                        "--region-dir is the driver's <state-dir>/claims",
                        meta_error,
                    )
                )
                continue
            meta, meta_error = self._metadata(d, name)
            try:
                snap = read_region(region, check_liveness=check_liveness)
            except RegionError as e:
                out.append(
                    ShareReading(
                        d, meta, None, f"{region}: not a usable usage region: {e}", meta_error
                    )
                )
                continue
            except OSError as e:
                out.append(
                    ShareReading(
                        d, meta, None, f"{region}: cannot read: {e.strerror or e}", meta_error
                    )
                )
                continue
            out.append(ShareReading(d, meta, snap, None, meta_error))
        with self._lock:
            for gone in set(self._meta) - set(entries):
                del self._meta[gone]
        return out

    def _metadata(self, d: str, name: str) -> tuple[ShareMeta, str | None]:
        stamp = (_stamp(os.path.join(d, LIMITS_FILE)), _stamp(os.path.join(d, META_FILE)))
        key = (*stamp[0], *stamp[1])
        with self._lock:
            hit = self._meta.get(name)
        if hit is not None and hit[0] == key:
            return hit[1], hit[2]
        meta, err = _load_meta(d, name)
        with self._lock:
            self._meta[name] = (key, meta, err)
        return meta, err


def _stamp(path: str) -> tuple[int, int]:
    try:
        st = os.stat(path)
    except OSError:
        return (0, 0)
    return (st.st_mtime_ns, st.st_size)


def _load_meta(d: str, uid: str) -> tuple[ShareMeta, str | None]:
    """claim.json first, then the limits file's ``claim`` line, then the directory name."""
    meta = ShareMeta(uid=uid)
    error: str | None = None
    limits = os.path.join(d, LIMITS_FILE)
    if os.path.exists(limits):
        try:
            lim = read_limits(limits)
        except (LimitsError, OSError) as e:
            error = f"{limits}: {e}"
        else:
            if lim.claim:
                ns, _, nm = lim.claim.partition("/")
                meta = ShareMeta(uid=lim.claim_uid or uid, namespace=ns, name=nm)
    path = os.path.join(d, META_FILE)
    if os.path.exists(path):
        try:
            with open(path, encoding="utf-8") as f:
                from_json = parse_claim_json(f.read(), path, meta.uid)
        except (MetadataError, OSError, UnicodeDecodeError) as e:
            error = str(e) if isinstance(e, MetadataError) else f"{path}: cannot read: {e}"
        else:
            meta = ShareMeta(
                uid=from_json.uid,
                namespace=from_json.namespace or meta.namespace,
                name=from_json.name or meta.name,
                driver=from_json.driver,
                pool=from_json.pool,
                devices=from_json.devices,
                pods=from_json.pods,
            )
    return meta, error
