"""MIG: the profile tables of MIG-capable GPUs, which GPUs an operator publishes for dynamic MIG,
and the counters both static and dynamic MIG publish (KEP-4815 partitionable devices).

Pure code. Three things live here, each used by the publisher (:mod:`.slices`), the node driver
and the explanations (``tessera simulate`` / ``explain``), so all say the same:

- the **profile tables** (:data:`MIG_MODELS`, :func:`mig_model_for`): per GPU model, its memory
  and SM slices and every GPU-instance profile with its placements, memory and SMs;
- **dynamic MIG selection** (:class:`DynamicMIG`, :func:`parse_dynamic_mig`,
  :func:`dynamic_mig_models`): which GPUs of a node are partitioned on demand, and with which
  profiles;
- the **counter vocabulary** (:func:`memory_slice_counter`, :data:`COMPUTE_SLICES`, ...,
  :func:`describe_counters`) and the description the driver needs to realise an allocated
  device (:class:`MigPlacement`, :func:`mig_placement`).

Sources of the tables (each row is checked where a capture exists; see ``docs/mig.md``):

- profile names, memory/SM fractions, instance counts and ``+me`` rules: NVIDIA Multi-Instance
  GPU User Guide (r580), "Supported MIG Profiles", tables for A30, A100, H100, H200 and B200
  (https://docs.nvidia.com/datacenter/tesla/mig-user-guide/supported-mig-profiles.html);
- placements (start slice and size): the same guide, "Getting Started with MIG", the
  ``nvidia-smi mig -lgipp`` listing (A100: 1g ``{0..6}:1``, 1g with two memory slices
  ``{0,2,4,6}:2``, 2g ``{0,2,4}:2``, 3g ``{0,4}:4``, 4g ``{0}:4``, 7g ``{0}:8``; A30: ``{0..3}:1``,
  ``{0,2}:2``, ``{0}:4``); H100, H200 and B200 have the same 8-memory / 7-SM slice layout;
- memory (MiB) and SMs: what NVML reports per profile (``nvidia-smi mig -lgip``). These
  figures move a little between driver releases (the A100's 3g.20gb is 19968 MiB in NVIDIA's
  go-nvml mock and the corpus capture, 20096 MiB in other ``-lgip`` outputs), so each row takes
  the *smallest* figure seen in a real output: a placement device never promises more memory
  than its instance has. Per model: A100 40/80GB from NVIDIA's go-nvml mock
  (``pkg/nvml/mock/gpus/a100.go``), which agrees with the corpus A100-SXM4-40GB XML (3g.20gb:
  19968 MiB, 42 SMs) and A100-SXM4-80GB XML (1g.20gb: 19968 MiB, 14 SMs); A30 from
  ``nvidia-smi mig -lgip`` outputs (5.81 / 11.69 / 23.44 GiB; 14 / 28 / 56 SMs); H100 80GB from
  the corpus capture (driver 590.48.01: 1g.10gb 9984 MiB/16 SMs, 2g.20gb 20096/32,
  3g.40gb 40448/60) and a published ``-lgip`` of the same driver generation (1g.20gb 19.62 GiB/
  26 SMs, 4g.40gb 39.50/64, 7g.80gb 79.25/132); H200 from the ``-lgip`` in NVIDIA/mig-parted
  issue 120 (16.00 / 32.25 / 69.50 / 139.75 GiB; 16 / 26 / 32 / 60 / 64 / 132 SMs), whose every
  figure the corpus H200 capture's instances reach or exceed (1g.18gb 16384 MiB/16 SMs, 2g.35gb
  33280/32, 3g.71gb 71424); B200 from the ``-lgip`` in NVIDIA/mig-parted PR 187 (1g.23gb 20.50
  GiB/18 SMs, 1g.45gb and 2g.45gb 44.25/30 and 36) and the NVML figures NVIDIA's DRA driver
  published on a p6-b200.48xlarge, which agree with it (3g.90gb and 4g.90gb 91136 MiB/70 and 72,
  7g.180gb 182784/148; no B200 capture in the corpus yet).

The node driver may pass NVML's own figures instead (:class:`~.model.MigModel` on
``GPU.mig_model``); HAMi's register annotation already carries them (``migProfiles``).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

from .errors import SliceBuildError
from .model import GPU, MIB, MigModel, MigProfile

# ---- the profile tables ------------------------------------------------------------------------


def _p(name: str, c: int, m: int, starts: Sequence[int], mib: int, sms: int | None) -> MigProfile:
    return MigProfile(name, c, m, tuple(starts), mib, sms, name.endswith("+me"))


_ALL1 = range(7)  # 1g placements on the 8-memory-slice GPUs: 0..6
_EVEN = (0, 2, 4, 6)  # 1g profiles with two memory slices

_GUIDE = "NVIDIA MIG User Guide r580, Supported MIG Profiles and nvidia-smi mig -lgipp"

A100_40GB = MigModel(
    "A100 40GB",
    8,
    7,
    (
        _p("1g.5gb", 1, 1, _ALL1, 4864, 14),
        _p("1g.5gb+me", 1, 1, _ALL1, 4864, 14),
        _p("1g.10gb", 1, 2, _EVEN, 9856, 14),
        _p("2g.10gb", 2, 2, (0, 2, 4), 9856, 28),
        _p("3g.20gb", 3, 4, (0, 4), 19968, 42),
        _p("4g.20gb", 4, 4, (0,), 19968, 56),
        _p("7g.40gb", 7, 8, (0,), 40192, 98),
    ),
    f"{_GUIDE}; memory/SMs: NVIDIA go-nvml mock a100.go = corpus A100-SXM4-40GB XML",
)
A100_80GB = MigModel(
    "A100 80GB",
    8,
    7,
    (
        _p("1g.10gb", 1, 1, _ALL1, 9856, 14),
        _p("1g.10gb+me", 1, 1, _ALL1, 9856, 14),
        _p("1g.20gb", 1, 2, _EVEN, 19968, 14),
        _p("2g.20gb", 2, 2, (0, 2, 4), 19968, 28),
        _p("3g.40gb", 3, 4, (0, 4), 40192, 42),
        _p("4g.40gb", 4, 4, (0,), 40192, 56),
        _p("7g.80gb", 7, 8, (0,), 80384, 98),
    ),
    f"{_GUIDE}; memory/SMs: NVIDIA go-nvml mock a100.go = corpus A100-SXM4-80GB XML",
)
A30_24GB = MigModel(
    "A30",
    4,
    4,
    (
        _p("1g.6gb", 1, 1, (0, 1, 2, 3), 5952, 14),
        _p("1g.6gb+me", 1, 1, (0, 1, 2, 3), 5952, 14),
        _p("2g.12gb", 2, 2, (0, 2), 11968, 28),
        _p("2g.12gb+me", 2, 2, (0, 2), 11968, 28),
        _p("4g.24gb", 4, 4, (0,), 24000, 56),
    ),
    f"{_GUIDE}; memory/SMs: nvidia-smi mig -lgip on A30 (5.81/11.69/23.44 GiB)",
)
H100_80GB = MigModel(
    "H100 80GB",
    8,
    7,
    (
        _p("1g.10gb", 1, 1, _ALL1, 9984, 16),
        _p("1g.10gb+me", 1, 1, _ALL1, 9984, 16),
        _p("1g.20gb", 1, 2, _EVEN, 20096, 26),
        _p("2g.20gb", 2, 2, (0, 2, 4), 20096, 32),
        _p("3g.40gb", 3, 4, (0, 4), 40448, 60),
        _p("4g.40gb", 4, 4, (0,), 40448, 64),
        _p("7g.80gb", 7, 8, (0,), 81152, 132),
    ),
    f"{_GUIDE}; memory/SMs: corpus H100 MIG capture (590.48.01) and nvidia-smi mig -lgip",
)
H200_141GB = MigModel(
    "H200 141GB",
    8,
    7,
    (
        _p("1g.18gb", 1, 1, _ALL1, 16384, 16),
        _p("1g.18gb+me", 1, 1, _ALL1, 16384, 16),
        _p("1g.35gb", 1, 2, _EVEN, 33024, 26),
        _p("2g.35gb", 2, 2, (0, 2, 4), 33024, 32),
        _p("3g.71gb", 3, 4, (0, 4), 71168, 60),
        _p("4g.71gb", 4, 4, (0,), 71168, 64),
        _p("7g.141gb", 7, 8, (0,), 143104, 132),
    ),
    f"{_GUIDE}; memory/SMs: nvidia-smi mig -lgip in NVIDIA/mig-parted#120 (the corpus capture's instances hold "
    "as much or more)",
)
B200_180GB = MigModel(
    "B200 180GB",
    8,
    7,
    (
        _p("1g.23gb", 1, 1, _ALL1, 20992, 18),
        _p("1g.23gb+me", 1, 1, _ALL1, 20992, 18),
        _p("1g.45gb", 1, 2, _EVEN, 45312, 30),
        _p("2g.45gb", 2, 2, (0, 2, 4), 45312, 36),
        _p("3g.90gb", 3, 4, (0, 4), 91136, 70),
        _p("4g.90gb", 4, 4, (0,), 91136, 72),
        _p("7g.180gb", 7, 8, (0,), 182784, 148),
    ),
    f"{_GUIDE}; memory/SMs: nvidia-smi mig -lgip in NVIDIA/mig-parted#187 and NVML figures NVIDIA's DRA driver "
    "published on a B200",
)

#: Every model Tessera has a table for, in lookup order.
MIG_MODELS: tuple[MigModel, ...] = (
    A100_40GB,
    A100_80GB,
    A30_24GB,
    H100_80GB,
    H200_141GB,
    B200_180GB,
)

_A100 = re.compile(r"\bA100\b", re.IGNORECASE)
_80GB = re.compile(r"80\s*GB", re.IGNORECASE)
_A30 = re.compile(r"\bA30\b", re.IGNORECASE)
_H100 = re.compile(r"\bH100\b", re.IGNORECASE)
_NVL_94_96 = re.compile(r"\bNVL\b|94\s*GB|96\s*GB", re.IGNORECASE)
_H200 = re.compile(r"\bH200\b", re.IGNORECASE)
_B200 = re.compile(r"(?<![A-Z0-9])B200\b", re.IGNORECASE)
#: MIG-capable products without a table here (NVIDIA MIG User Guide, "Supported GPUs").
_MIG_CAPABLE_WITHOUT_TABLE = re.compile(
    r"\bH100\b|\bH20\b|\bH800\b|\bGH200\b|\bGB200\b|\bB300\b|\bGB300\b|\bA800\b|RTX PRO [56]000",
    re.IGNORECASE,
)
KNOWN_MODELS = "A100 40GB, A100 80GB, A30, H100 80GB, H200 141GB, B200 180GB"


def mig_model_for(product_name: str, memory_bytes: int | None = None) -> MigModel | None:
    """The profile table of a GPU model, from its product name as nvidia-smi prints it
    (``NVIDIA A100-PCIE-40GB``, ``NVIDIA H100 80GB HBM3``, ``NVIDIA H200``, ``NVIDIA B200``);
    ``memory_bytes`` tells an A100 80GB whose name does not say so. None for a GPU without a
    table (not MIG-capable, or a MIG-capable model Tessera has no table for: H100 NVL/94GB, H20,
    GH200, GB200, RTX PRO Blackwell; :func:`is_mig_capable` tells them apart)."""
    name = product_name
    if _A100.search(name):
        big = bool(_80GB.search(name)) or (
            memory_bytes is not None and memory_bytes > 60 * 1024 * MIB
        )
        return A100_80GB if big else A100_40GB
    if _A30.search(name):
        return A30_24GB
    if _H100.search(name) and not _NVL_94_96.search(name):
        if memory_bytes is None or memory_bytes <= 85 * 1024 * MIB:
            return H100_80GB
        return None
    if _H200.search(name) and not re.search(r"\bGH200\b", name, re.IGNORECASE):
        return H200_141GB
    if _B200.search(name):
        return B200_180GB
    return None


def is_mig_capable(product_name: str) -> bool:
    """True for a product NVIDIA lists as MIG-capable (with or without a table here)."""
    return mig_model_for(product_name) is not None or bool(
        _MIG_CAPABLE_WITHOUT_TABLE.search(product_name)
    )


def nvml_gpu_instance_profile(p: MigProfile) -> str:
    """The NVML GPU-instance profile constant to create ``p`` with (``nvml.h``
    ``NVML_GPU_INSTANCE_PROFILE_*``; ``nvmlDeviceGetGpuInstanceProfileInfo`` then gives the
    profile id for ``nvmlDeviceCreateGpuInstanceWithPlacement``)."""
    if p.compute_slices == 1 and p.memory_slices == 2:
        return "NVML_GPU_INSTANCE_PROFILE_1_SLICE_REV2"
    rev = "_REV1" if p.media_extensions else ""
    return f"NVML_GPU_INSTANCE_PROFILE_{p.compute_slices}_SLICE{rev}"


def nvml_compute_instance_profile(p: MigProfile) -> str:
    """The NVML compute-instance profile constant of one compute instance that takes the whole
    GPU instance (``NVML_COMPUTE_INSTANCE_PROFILE_<n>_SLICE``)."""
    return f"NVML_COMPUTE_INSTANCE_PROFILE_{p.compute_slices}_SLICE"


_PROFILE_NAME = re.compile(r"^(?P<c>[1-8])g\.\d+gb(?P<me>\+me)?$")


def model_from_profiles(name: str, profiles: Iterable[Mapping[str, Any]], where: str) -> MigModel:
    """A :class:`~.model.MigModel` from NVML-style profile records, as HAMi's register annotation
    carries them (``migProfiles``: ``{"name", "memoryMB", "placements": [{"start", "size"}]}``).
    Raises ``ValueError`` (one line, prefixed with ``where``) for a record it cannot read."""
    out: list[MigProfile] = []
    for k, rec in enumerate(profiles):
        if not isinstance(rec, Mapping):
            raise ValueError(f"{where}: migProfiles[{k}] is not an object")
        pname = rec.get("name")
        m = _PROFILE_NAME.match(pname) if isinstance(pname, str) else None
        mem = rec.get("memoryMB")
        places = rec.get("placements")
        if m is None or not isinstance(mem, int) or isinstance(mem, bool) or mem <= 0:
            raise ValueError(
                f"{where}: migProfiles[{k}] needs a profile name like 2g.10gb and memoryMB > 0"
            )
        if not isinstance(places, list) or not places:
            raise ValueError(f"{where}: migProfiles[{k}] ({pname}) lists no placements")
        starts: list[int] = []
        sizes: set[int] = set()
        for pl in places:
            s, z = (pl.get("start"), pl.get("size")) if isinstance(pl, Mapping) else (None, None)
            if not (isinstance(s, int) and isinstance(z, int) and s >= 0 and z > 0):
                raise ValueError(f"{where}: migProfiles[{k}] ({pname}) has a bad placement {pl!r}")
            starts.append(s)
            sizes.add(z)
        if len(sizes) != 1:
            raise ValueError(f"{where}: migProfiles[{k}] ({pname}) has placements of several sizes")
        out.append(
            MigProfile(
                str(pname),
                int(m.group("c")),
                sizes.pop(),
                tuple(sorted(starts)),
                mem,
                None,
                bool(m.group("me")),
            )
        )
    if not out:
        raise ValueError(f"{where}: migProfiles is empty")
    mem_slices = max(s + p.memory_slices for p in out for s in p.starts)
    compute = max(p.compute_slices for p in out)
    out.sort(key=_profile_order)
    return MigModel(
        name, mem_slices, compute, tuple(out), "NVML, as HAMi's register annotation reports it"
    )


def _profile_order(p: MigProfile) -> tuple[int, int, int, bool, str]:
    """Smallest first: memory, then SM slices, then memory slices, +me last."""
    return (p.memory_mib, p.compute_slices, p.memory_slices, p.media_extensions, p.name)


# ---- counters (KEP-4815) -----------------------------------------------------------------------

#: Counter of the SM slices of a dynamic-MIG GPU (value: 7, or 4 on A30).
COMPUTE_SLICES = "compute-slices"
#: Counter of the media-extension set of a dynamic-MIG GPU (value 1; ``+me`` profiles take it).
MEDIA_EXTENSIONS = "media-extensions"
_MEMORY_SLICE = re.compile(r"^memory-slice-(\d+)$")
_GI_MEMORY = re.compile(r"^gi-(\d+)-memory$")


def memory_slice_counter(k: int) -> str:
    """The counter of memory slice ``k`` of a dynamic-MIG GPU (value 1: one instance at most)."""
    return f"memory-slice-{k}"


def gi_memory_counter(gpu_instance_id: int) -> str:
    """The counter of a static GPU instance's memory, shared by its compute instances."""
    return f"gi-{gpu_instance_id}-memory"


def counter_set_name(gpu_index: int) -> str:
    """The counter set of one GPU (static GPU instances with several compute instances, or the
    slices of a dynamic-MIG GPU): ``gpu-<index>``, as the GPU's devices are named."""
    return f"gpu-{gpu_index}"


def _fmt(v: Fraction, bytes_: bool) -> str:
    if bytes_:
        from tessera.api.quantity import Quantity

        return Quantity(v, "BinarySI").canonical()
    return str(int(v)) if v.denominator == 1 else str(float(v))


def describe_counters(
    counter_set: str,
    published: Mapping[str, Fraction],
    available: Mapping[str, Fraction],
    needed: Mapping[str, Fraction] | None = None,
    *,
    all_counters: bool = False,
) -> list[str]:
    """Lines such as ``memory slices of gpu-0: 7 of 8 used`` for one counter set:
    ``published`` its values, ``available`` what is left (below 0 counts as 0).

    With ``needed`` (what one device consumes) only the counters that cannot give it are
    described, memory slices with the ones it needs that are taken; without, the counters in
    use (every counter with ``all_counters``). Memory slices are summed, compute slices and
    media extensions counted, a static GPU instance's shared memory given in bytes. The one
    wording ``tessera explain``, ``simulate`` and ``lint`` use for counters.
    """
    out: list[str] = []

    def left(c: str) -> Fraction:
        return max(available.get(c, published.get(c, Fraction(0))), Fraction(0))

    slices = sorted((int(m.group(1)), c) for c in published if (m := _MEMORY_SLICE.match(c)))
    if slices:
        used = [k for k, c in slices if left(c) < published[c]]
        taken = [k for k, c in slices if needed is not None and c in needed and left(c) < needed[c]]
        if taken or (needed is None and (used or all_counters)):
            text = f"memory slices of {counter_set}: {len(used)} of {len(slices)} used"
            if taken:
                which = ", ".join(map(str, taken))
                text += f" (slice{'s' if len(taken) > 1 else ''} {which} needed, in use)"
            out.append(text)
    for c in sorted(published):
        if _MEMORY_SLICE.match(c):
            continue
        pub, have = published[c], left(c)
        if needed is not None:
            if c not in needed or have >= needed[c]:
                continue
        elif have >= pub and not all_counters:
            continue
        gi = _GI_MEMORY.match(c)
        if gi:
            out.append(
                f"memory of GPU instance {gi.group(1)} of {counter_set} (shared by its compute "
                f"instances): {_fmt(pub - have, True)} of {_fmt(pub, True)} in use"
            )
        elif c == COMPUTE_SLICES:
            out.append(
                f"compute slices of {counter_set}: {_fmt(pub - have, False)} of {_fmt(pub, False)} used"
            )
        elif c == MEDIA_EXTENSIONS:
            if have < pub:
                out.append(
                    f"media extensions of {counter_set}: in use (a +me instance or the whole GPU)"
                )
        else:
            # Another driver's counter: no unit known; binary suffixes read best for memory-like
            # amounts (8Gi) and leave plain counts as they are (1000, 3).
            out.append(
                f"counter {c} of {counter_set}: {_fmt(pub - have, True)} of {_fmt(pub, True)} used"
            )
    return out


def summarize_counters(published: Mapping[str, Fraction]) -> str:
    """What a counter set holds, in words: ``8 memory slices, 7 compute slices, media
    extensions`` (a dynamic-MIG GPU) or ``memory of GPU instance 2`` (shared by compute
    instances)."""
    parts: list[str] = []
    n_slices = sum(1 for c in published if _MEMORY_SLICE.match(c))
    if n_slices:
        parts.append(f"{n_slices} memory slices")
    for c in sorted(published):
        if _MEMORY_SLICE.match(c):
            continue
        gi = _GI_MEMORY.match(c)
        if gi:
            parts.append(f"memory of GPU instance {gi.group(1)} ({_fmt(published[c], True)})")
        elif c == COMPUTE_SLICES:
            parts.append(f"{_fmt(published[c], False)} compute slices")
        elif c == MEDIA_EXTENSIONS:
            parts.append("media extensions")
        else:
            parts.append(f"{c} {_fmt(published[c], False)}")
    return ", ".join(parts)


# ---- dynamic MIG: which GPUs -------------------------------------------------------------------


@dataclass(frozen=True)
class DynamicMIG:
    """Which GPUs of a node are partitioned on demand, and with which profiles.

    ``gpus``: None for every MIG-capable GPU of the node, else GPU indices and/or UUIDs.
    ``profiles``: None for every profile of each GPU's table, else the profile names allowed
    (HAMi's ``migProfileAllowlist``): a GPU gets the listed profiles its model has.
    """

    gpus: tuple[int | str, ...] | None = None
    profiles: tuple[str, ...] | None = None


def parse_dynamic_mig(value: Any, where: str) -> DynamicMIG | None:
    """The operator's dynamic-MIG setting, as a cluster file's node ``dynamicMIG:`` or the node
    driver's configuration gives it:

    - ``false`` / absent: no GPU (None); ``true`` or ``all``: every MIG-capable GPU;
    - a list of GPU indices and/or UUIDs: ``[0, 1, "GPU-..."]``;
    - ``{gpus: all | [...], profiles: [1g.5gb, 3g.20gb, ...]}``: those GPUs, only those profiles.

    Raises ``ValueError`` whose message is one line starting with ``where`` and naming the fix.
    """
    if value is None or value is False:
        return None
    if value is True or value == "all":
        return DynamicMIG()
    if isinstance(value, list):
        return DynamicMIG(gpus=_gpu_list(value, where))
    if isinstance(value, dict):
        unknown = sorted(set(value) - {"gpus", "profiles"})
        if unknown:
            raise ValueError(
                f"{where}: unknown key(s) {', '.join(map(str, unknown))}; use gpus and profiles"
            )
        gpus_v = value.get("gpus", "all")
        gpus = None if gpus_v in ("all", True) else _gpu_list(gpus_v, f"{where}.gpus")
        prof_v = value.get("profiles")
        profiles: tuple[str, ...] | None = None
        if prof_v is not None:
            if (
                not isinstance(prof_v, list)
                or not prof_v
                or not all(isinstance(p, str) for p in prof_v)
            ):
                raise ValueError(
                    f"{where}.profiles: give a list of MIG profile names such as [1g.5gb, 3g.20gb]"
                )
            profiles = tuple(dict.fromkeys(p.strip() for p in prof_v))
        return DynamicMIG(gpus=gpus, profiles=profiles)
    raise ValueError(
        f"{where}: {value!r} is not a dynamic-MIG setting; write true, a list of GPU indices or "
        "UUIDs, or {gpus: [...], profiles: [...]}"
    )


def _gpu_list(value: Any, where: str) -> tuple[int | str, ...]:
    if not isinstance(value, list) or not value:
        raise ValueError(f"{where}: give a non-empty list of GPU indices or UUIDs (or all)")
    out: list[int | str] = []
    for v in value:
        if isinstance(v, bool) or not isinstance(v, int | str) or (isinstance(v, int) and v < 0):
            raise ValueError(f"{where}: {v!r} is neither a GPU index nor a GPU UUID")
        out.append(v.strip() if isinstance(v, str) else v)
    return tuple(out)


def dynamic_mig_models(
    gpus: Sequence[GPU], dynamic: DynamicMIG | None, where: str
) -> dict[int, MigModel]:
    """``{GPU index: the MigModel it is published with}`` for the GPUs partitioned on demand.

    ``dynamic`` None means the inventory's own word: GPUs it marks ``mig_on_demand`` (a HAMi
    node in MIG mode) whose model has profiles. Otherwise the GPUs ``dynamic.gpus`` names (every
    MIG-capable one when None), restricted to ``dynamic.profiles``. A GPU's profiles come from
    the inventory (``GPU.mig_model``) when it carries them, else from :func:`mig_model_for`.

    Raises :class:`~.errors.SliceBuildError` (one line naming ``where``, the GPU and the fix)
    for a GPU index or UUID the node does not have, a GPU that is not MIG-capable or has no
    table, a GPU marked dynamic that already holds MIG instances, and a profile that no
    dynamic GPU of the node has.
    """
    if dynamic is None:
        return {g.index: m for g in gpus if g.mig_on_demand and (m := _model(g)) is not None}
    chosen: list[GPU] = []
    if dynamic.gpus is None:
        chosen = [g for g in gpus if _model(g) is not None]
        if not chosen:
            names = ", ".join(sorted({g.product_name for g in gpus})) or "none"
            raise SliceBuildError(
                f"dynamic MIG is set for every GPU but no GPU of the node is MIG-capable ({names}); "
                f"Tessera has MIG tables for {KNOWN_MODELS}",
                source=where,
                field="dynamicMIG",
            )
    else:
        by_index = {g.index: g for g in gpus}
        by_uuid = {g.uuid.lower(): g for g in gpus}
        for ref in dynamic.gpus:
            g = by_index.get(ref) if isinstance(ref, int) else by_uuid.get(ref.lower())
            if g is None:
                have = ", ".join(str(i) for i in sorted(by_index))
                raise SliceBuildError(
                    f"no GPU {ref!r} on this node (its GPUs: {have}, or their UUIDs)",
                    source=where,
                    field="dynamicMIG",
                )
            if g not in chosen:
                chosen.append(g)
    out: dict[int, MigModel] = {}
    for g in chosen:
        model = _model(g)
        what = f"GPU {g.index} ({g.product_name})"
        if model is None:
            if is_mig_capable(g.product_name):
                raise SliceBuildError(
                    f"{what} is MIG-capable but Tessera has no MIG profile table for it (it has "
                    f"{KNOWN_MODELS}); leave it out of dynamicMIG",
                    source=where,
                    field="dynamicMIG",
                )
            raise SliceBuildError(
                f"{what} is not MIG-capable, so it cannot be partitioned on demand; leave it out "
                f"of dynamicMIG (MIG GPUs: {KNOWN_MODELS})",
                source=where,
                field="dynamicMIG",
            )
        if g.mig_devices:
            raise SliceBuildError(
                f"{what} is marked for dynamic MIG but already holds {len(g.mig_devices)} MIG "
                "instance(s) the node driver did not make: destroy them (nvidia-smi mig -dci; "
                "nvidia-smi mig -dgi) or leave the GPU static",
                source=where,
                field="dynamicMIG",
            )
        out[g.index] = model
    if dynamic.profiles is not None:
        known = {p.name for m in out.values() for p in m.profiles}
        for name in dynamic.profiles:
            if name not in known:
                have = ", ".join(sorted({m.name for m in out.values()}))
                listed = ", ".join(p.name for m in out.values() for p in m.profiles)
                raise SliceBuildError(
                    f"profile {name!r} does not exist on this node's dynamic MIG GPUs ({have}); "
                    f"their profiles: {listed}",
                    source=where,
                    field="dynamicMIG.profiles",
                )
        allowed = set(dynamic.profiles)
        for i, m in list(out.items()):
            kept = tuple(p for p in m.profiles if p.name in allowed)
            out[i] = MigModel(
                m.name, m.memory_slices, m.compute_slices, kept or m.profiles[-1:], m.source
            )
    return out


def _model(g: GPU) -> MigModel | None:
    return g.mig_model or mig_model_for(g.product_name, g.memory_bytes)


# ---- what the driver creates for an allocated device ---------------------------------------------


@dataclass(frozen=True)
class MigPlacement:
    """What the node driver creates for one allocated dynamic-MIG device.

    - ``gpu_index`` / ``gpu_uuid``: the parent GPU;
    - ``profile``: the profile name; ``start`` / ``size``: the placement, in memory slices
      (``nvmlDeviceCreateGpuInstanceWithPlacement``);
    - ``gpu_instance_profile`` / ``compute_instance_profile``: the NVML constants to create the
      GPU instance and its one compute instance with;
    - ``shared``: the device is the whole GPU, which claims share: the instance is created for
      the first prepared share and destroyed when the last one is unprepared.
    """

    gpu_index: int
    gpu_uuid: str
    profile: str
    start: int
    size: int
    gpu_instance_profile: str
    compute_instance_profile: str
    shared: bool = False


def _attr(attrs: Mapping[str, Any], name: str) -> Any:
    from tessera import DRIVER_NAME

    a = attrs.get(name) or attrs.get(f"{DRIVER_NAME}/{name}")
    if not isinstance(a, Mapping):
        return None
    for k in ("int", "string", "bool"):
        if k in a:
            return a[k]
    return None


def mig_placement(device: Mapping[str, Any]) -> MigPlacement | None:
    """The MIG instance to create for ``device``, a device dict as :func:`build_resource_slices`
    publishes it; None for a device that needs none (a whole GPU without dynamic MIG, a static
    MIG device, which exists already). Pure: it reads the device's own attributes (``profile``,
    ``placementStart``, ``memorySlices``, ``computeSlices``, ``mediaExtensions``,
    ``parentIndex``/``parentUUID``, or ``migDynamic`` on a whole GPU)."""
    attrs = device.get("attributes") or {}
    start = _attr(attrs, "placementStart")
    if start is not None:
        c, m = _attr(attrs, "computeSlices"), _attr(attrs, "memorySlices")
        p = MigProfile(
            str(_attr(attrs, "profile")),
            int(c),
            int(m),
            (int(start),),
            0,
            None,
            bool(_attr(attrs, "mediaExtensions")),
        )
        return MigPlacement(
            int(_attr(attrs, "parentIndex")),
            str(_attr(attrs, "parentUUID")),
            p.name,
            int(start),
            p.memory_slices,
            nvml_gpu_instance_profile(p),
            nvml_compute_instance_profile(p),
        )
    if _attr(attrs, "migDynamic"):
        c, m = _attr(attrs, "computeSlices"), _attr(attrs, "memorySlices")
        p = MigProfile(str(_attr(attrs, "migProfile")), int(c), int(m), (0,), 0)
        return MigPlacement(
            int(_attr(attrs, "index")),
            str(_attr(attrs, "uuid")),
            p.name,
            0,
            p.memory_slices,
            nvml_gpu_instance_profile(p),
            nvml_compute_instance_profile(p),
            shared=True,
        )
    return None


def device_in_slices(slices: Iterable[Mapping[str, Any]], name: str) -> Mapping[str, Any] | None:
    """The device called ``name`` in a pool's ResourceSlices (the driver's own), or None."""
    for s in slices:
        for d in (s.get("spec") or {}).get("devices") or []:
            if d.get("name") == name:
                return d
    return None


def placement_device_name(gpu_index: int, profile: str, start: int) -> str:
    """``gpu-<index>-mig-<profile>-<start>`` as a DNS label: ``1g.5gb+me`` -> ``1g5gb-me``."""
    label = profile.replace(".", "").replace("+", "-")
    return f"gpu-{gpu_index}-mig-{label}-{start}"
