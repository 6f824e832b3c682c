"""The limits file: what the containers of one claim may use on each GPU.

The driver writes it at NodePrepareResources time (:func:`write_limits`) and mounts it
read-only at :data:`LIMITS_PATH` in every container of the claim; the enforcement library
(``native/src/limits.c``) parses it. The format is defined in ``native/include/tessera_limits.h``;
this module and the C parser accept exactly the same files and produce the same canonical
text (``tests/native`` round-trips and fuzzes both).

Versions. The first statement is ``version <N>``; a reader (the library, :func:`parse_limits`)
reads every version from :data:`MIN_VERSION` to :data:`VERSION` and refuses a newer one with
"version N is newer than this library reads (versions 1..2)". Each version adds statements
(:data:`STATEMENT_SINCE`)::

    version 1   claim, region, context-overhead, shares, gpu
    version 2   + unlimited

The writer puts down the lowest version that expresses the content (:func:`required_version`,
the one place that decides), so a claim using no newer statement stays readable by an older
library; the node driver refuses to prepare a claim whose file the installed library could not
read (:mod:`tessera.enforcement.library`, docs/install.md "Supported skew"). A version-1 file
with ``unlimited`` lines is what drivers before version 2 wrote (the statement was added inside
version 1): both readers accept it, with the same meaning, so a container restarted on a claim
such a driver prepared keeps working under a newer library; no writer of version 2 emits it.

Format, version 2 (printable ASCII, one statement per line)::

    version <1|2>
    claim <namespace>/<name> <uid>            (optional)
    region <absolute path>
    context-overhead <bytes>                  (optional, default 0)
    shares <absolute path>                    (optional: the node's per-GPU shares directory)
    gpu <UUID> memory <bytes> cores <0-100> [policy strict|work-conserving]   (1..16 lines)
    unlimited <UUID>                          (version 2; 0..32 lines)

``policy`` (default ``strict``, omitted from the canonical text) says what ``cores`` promises:
under ``strict`` it is a cap, under ``work-conserving`` the guaranteed share, and the claim may
also use GPU time the others leave idle. ``shares`` names the directory, mounted read-only,
where the node driver keeps for each GPU the cores guaranteed to its limited claims
(:mod:`tessera.enforcement.shares`); a best-effort GPU (``cores 0``) is held to what they leave
only when it is given (docs/enforcement.md section 5).

An ``unlimited`` line names a device of the claim that the container may use without limit (a
whole GPU or MIG device, or an ``adminAccess`` result). The library refuses contexts and memory
on a CUDA device whose UUID is in neither kind of line: it is not this claim's (a second claim's
GPU, whose limits file the container does not see, docs/enforcement.md section 1).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from tessera import COMPUTE_POLICIES
from tessera.enforcement._files import write_atomic

LIMITS_PATH = "/etc/tessera/limits"
"""Fixed path of the limits file inside a container. The library accepts only a readable
regular file owned by root and not writable by group or others there (:func:`write_limits`
writes mode 0444); anything else at the path (a symlink, dangling or not, a directory, a FIFO,
another owner's file) makes it refuse GPU memory."""
LIMITS_ENV = "TESSERA_LIMITS_FILE"
"""Environment fallback, read by the library only when nothing at all is at
:data:`LIMITS_PATH` (neither the file nor one of its directories exists)."""
VERSION = 2
"""The newest limits file version this module (and the library built with it) reads and writes
(``TESSERA_LIMITS_VERSION`` in ``tessera_limits.h``)."""
MIN_VERSION = 1
"""The oldest version read (``TESSERA_LIMITS_VERSION_MIN``)."""
STATEMENT_SINCE: dict[str, int] = {"unlimited": 2}
"""The statements added after version 1, with the version that added each. A new statement
comes with a new :data:`VERSION` and an entry here."""
MAX_GPUS = 16
MAX_UNLIMITED = 32

DEFAULT_CONTEXT_OVERHEAD = 512 << 20
"""Bytes the driver writes as ``context-overhead`` unless told otherwise (``tessera driver
--context-overhead``), and what ``tessera simulate`` reports: the device memory one CUDA
context takes with the runtime's modules, which no allocation call shows. A claim's ``memory``
is its whole footprint on the GPU, as the host's nvidia-smi counts its processes: every context
is charged this much of it, so an application with one context can allocate
``memory - context_overhead`` (:func:`allocatable`). HAMi's maintainers put a task's context
at 100-500 MB (HAMi#1026); 512 MiB covers a CUDA 12 context with lazily loaded modules on
current data-centre GPUs. ``native/gpu-check`` measures it on a real GPU."""


def allocatable(memory: int, context_overhead: int, contexts: int = 1) -> int:
    """What an application of a share of ``memory`` bytes can allocate when its processes
    hold ``contexts`` CUDA contexts on the GPU, each charged ``context_overhead`` bytes:
    ``memory - contexts * context_overhead``, floored at 0. The enforcement library refuses
    allocations past it and reports it as free (``cuMemGetInfo``, NVML) to a fresh process."""
    return max(0, memory - contexts * context_overhead)


"""DRA's limit on the results of one claim (``resource.k8s.io/v1`` AllocationResultsMaxSize)."""
MAX_LINE = 4095
MAX_PATH = 4095
MAX_FILE = 1024 * 1024
CLAIM_MAX = 512
_MAX_TOKENS = 8
POLICIES = COMPUTE_POLICIES
"""Values of a ``gpu`` line's ``policy`` (the first is the default)."""
_U64_MAX = 2**64 - 1
_HEX = "0123456789abcdefABCDEF"


class LimitsError(ValueError):
    """A limits file (or a :class:`Limits` value) that the enforcement library would reject.

    ``line`` is the 1-based line number the problem was found on (0 for whole-value problems).
    """

    def __init__(self, line: int, message: str) -> None:
        super().__init__(f"line {line}: {message}")
        self.line = line
        self.message = message


@dataclass(frozen=True)
class GpuLimit:
    """Limits of the claim on one GPU.

    ``uuid``: ``GPU-``/``MIG-`` + 8-4-4-4-12 hex (normalised to lower case by the parser);
    ``memory``: bytes, >= 1; ``cores``: percent of the GPU's SMs, 0..100 (0 = best effort,
    100 = whole GPU); ``policy``: one of :data:`POLICIES`, what ``cores`` promises (a cap, or
    a guaranteed share that may also use idle GPU time).
    """

    uuid: str
    memory: int
    cores: int
    policy: str = POLICIES[0]


@dataclass(frozen=True)
class Limits:
    """One limits file.

    ``region``: absolute path of the claim's usage region (see :mod:`tessera.enforcement.region`);
    ``gpus``: 1..16 :class:`GpuLimit` in file order; ``context_overhead``: bytes charged per
    CUDA context; ``claim``: ``"<namespace>/<name>"`` and ``claim_uid``: the ResourceClaim UID,
    both informational and either both set or both ``None``; ``unlimited``: 0..32 UUIDs of
    the claim's devices the container may use without limit (``unlimited`` lines, file order);
    ``shares``: absolute path of the node's per-GPU shares directory, or ``None``;
    ``version``: the version the file declares (set by :func:`parse_limits`), or ``None`` for
    a value to write: :func:`format_limits` then writes :func:`required_version`.
    """

    region: str
    gpus: tuple[GpuLimit, ...]
    context_overhead: int = 0
    claim: str | None = None
    claim_uid: str | None = None
    unlimited: tuple[str, ...] = ()
    shares: str | None = None
    version: int | None = None


def new_statements(limits: Limits, version: int) -> tuple[str, ...]:
    """The statements of :data:`STATEMENT_SINCE` that ``limits`` uses and ``version`` does not
    have (``("unlimited",)`` for a value with ``unlimited`` devices and ``version`` 1), in
    :data:`STATEMENT_SINCE` order."""
    used = {"unlimited": bool(limits.unlimited)}
    return tuple(s for s, since in STATEMENT_SINCE.items() if used[s] and since > version)


def required_version(limits: Limits) -> int:
    """The lowest limits file version that expresses ``limits`` (1..:data:`VERSION`): 2 when
    it has ``unlimited`` devices, else 1. What :func:`format_limits` writes for a value without
    a ``version``, and what a library must read for the claim (the driver checks it)."""
    return max([MIN_VERSION, *(STATEMENT_SINCE[s] for s in new_statements(limits, MIN_VERSION))])


def _u64(tok: str) -> int | None:
    if not 1 <= len(tok) <= 20 or not all("0" <= c <= "9" for c in tok):
        return None
    v = int(tok)
    return v if v <= _U64_MAX else None


def _uuid(tok: str) -> str | None:
    if len(tok) != 40 or tok[:4] not in ("GPU-", "MIG-"):
        return None
    out = [tok[:4]]
    for k, c in enumerate(tok[4:]):
        if k in (8, 13, 18, 23):
            if c != "-":
                return None
            out.append("-")
        elif c in _HEX:
            out.append(c.lower())
        else:
            return None
    return "".join(out)


def _new_uuid(tok: str, lineno: int, gpus: list[GpuLimit], unlimited: list[str]) -> str:
    """The UUID of a ``gpu`` or ``unlimited`` line, not listed before on either kind of line.
    Raises :class:`LimitsError` for a malformed or repeated UUID."""
    uuid = _uuid(tok)
    if uuid is None:
        raise LimitsError(lineno, "bad GPU UUID")
    if any(g.uuid == uuid for g in gpus) or uuid in unlimited:
        raise LimitsError(lineno, f"duplicate gpu {uuid}")
    return uuid


def normalise_uuid(uuid: str) -> str | None:
    """``uuid`` as the limits file holds it (``GPU-``/``MIG-`` + lower-case 8-4-4-4-12 hex), or
    ``None`` when it is not in that form (e.g. the old ``MIG-GPU-<uuid>/<gi>/<ci>`` names)."""
    return _uuid(uuid)


def parse_limits(data: bytes | str) -> Limits:
    """Parse the text of a limits file.

    ``data``: the file's bytes (``str`` is encoded as ASCII first; non-ASCII is an error).
    Returns the :class:`Limits`. Raises :class:`LimitsError` (with the line number) on anything
    the C parser rejects.
    """
    if isinstance(data, str):
        try:
            data = data.encode("ascii")
        except UnicodeEncodeError as e:
            raise LimitsError(0, "non-ASCII text") from e
    lines = data.split(b"\n")
    if lines and lines[-1] == b"":
        lines.pop()  # a final newline ends the last line; it does not start another
    version: int | None = None
    region: str | None = None
    claim: tuple[str, str] | None = None
    overhead: int | None = None
    shares: str | None = None
    gpus: list[GpuLimit] = []
    unlimited: list[str] = []
    lineno = 0
    for raw in lines:
        lineno += 1
        if len(raw) > MAX_LINE:
            raise LimitsError(lineno, f"line longer than {MAX_LINE} bytes")
        if raw.endswith(b"\r"):
            raw = raw[:-1]
        for b in raw:
            if b == 0:
                raise LimitsError(lineno, "NUL byte")
            if (b < 0x20 and b != 0x09) or b >= 0x7F:
                raise LimitsError(lineno, f"control or non-ASCII byte 0x{b:02x}")
        line = raw.decode("ascii")
        stripped = line.strip(" \t")
        if not stripped or stripped.startswith("#"):
            continue
        toks = [t for t in stripped.replace("\t", " ").split(" ") if t]
        if len(toks) > _MAX_TOKENS:
            raise LimitsError(lineno, "too many fields")
        key = toks[0]
        if version is None:
            v = _u64(toks[1]) if len(toks) == 2 and key == "version" else None
            if v is None:
                raise LimitsError(lineno, "expected 'version <N>' first")
            if v > VERSION:
                raise LimitsError(
                    lineno,
                    f"version {v} is newer than this library reads (versions "
                    f"{MIN_VERSION}..{VERSION}): upgrade the node's enforcement library",
                )
            if v < MIN_VERSION:
                raise LimitsError(
                    lineno,
                    f"version {v} is not a limits file version (this library reads versions "
                    f"{MIN_VERSION}..{VERSION})",
                )
            version = v
            continue
        if key == "version":
            raise LimitsError(lineno, "duplicate 'version'")
        if key == "region":
            if region is not None:
                raise LimitsError(lineno, "duplicate 'region'")
            if len(toks) != 2:
                raise LimitsError(lineno, "expected 'region <absolute path>'")
            if not toks[1].startswith("/"):
                raise LimitsError(lineno, "region path must be absolute")
            if len(toks[1]) > MAX_PATH:
                raise LimitsError(lineno, "region path too long")
            region = toks[1]
        elif key == "claim":
            if claim is not None:
                raise LimitsError(lineno, "duplicate 'claim'")
            if len(toks) != 3:
                raise LimitsError(lineno, "expected 'claim <namespace>/<name> <uid>'")
            if len(toks[1]) + 1 + len(toks[2]) >= CLAIM_MAX:
                raise LimitsError(lineno, "claim too long")
            if "/" not in toks[1]:
                raise LimitsError(lineno, "claim must be <namespace>/<name>")
            claim = (toks[1], toks[2])
        elif key == "context-overhead":
            if overhead is not None:
                raise LimitsError(lineno, "duplicate 'context-overhead'")
            v = _u64(toks[1]) if len(toks) == 2 else None
            if v is None:
                raise LimitsError(lineno, "expected 'context-overhead <bytes>'")
            overhead = v
        elif key == "shares":
            if shares is not None:
                raise LimitsError(lineno, "duplicate 'shares'")
            if len(toks) != 2:
                raise LimitsError(lineno, "expected 'shares <absolute path>'")
            if not toks[1].startswith("/"):
                raise LimitsError(lineno, "shares path must be absolute")
            if len(toks[1]) > MAX_PATH:
                raise LimitsError(lineno, "shares path too long")
            shares = toks[1]
        elif key == "gpu":
            if (
                len(toks) not in (6, 8)
                or toks[2] != "memory"
                or toks[4] != "cores"
                or (len(toks) == 8 and toks[6] != "policy")
            ):
                raise LimitsError(
                    lineno,
                    "expected 'gpu <UUID> memory <bytes> cores <0-100>' "
                    "[policy strict|work-conserving]",
                )
            if len(gpus) == MAX_GPUS:
                raise LimitsError(lineno, f"more than {MAX_GPUS} gpus")
            uuid = _new_uuid(toks[1], lineno, gpus, unlimited)
            mem = _u64(toks[3])
            if mem is None or mem == 0:
                raise LimitsError(lineno, "memory must be a positive byte count")
            cores = _u64(toks[5])
            if cores is None or cores > 100:
                raise LimitsError(lineno, "cores must be 0..100")
            policy = toks[7] if len(toks) == 8 else POLICIES[0]
            if policy not in POLICIES:
                raise LimitsError(lineno, "policy must be strict or work-conserving")
            gpus.append(GpuLimit(uuid, mem, cores, policy))
        elif key == "unlimited":
            if len(toks) != 2:
                raise LimitsError(lineno, "expected 'unlimited <UUID>'")
            if len(unlimited) == MAX_UNLIMITED:
                raise LimitsError(lineno, f"more than {MAX_UNLIMITED} unlimited devices")
            unlimited.append(_new_uuid(toks[1], lineno, gpus, unlimited))
        else:
            raise LimitsError(lineno, f"unknown keyword '{key[:32]}'")
    if version is None:
        raise LimitsError(lineno, "empty file (expected 'version <N>')")
    if region is None:
        raise LimitsError(lineno, "missing 'region'")
    if not gpus:
        raise LimitsError(lineno, "no 'gpu' lines")
    return Limits(
        region=region,
        gpus=tuple(gpus),
        context_overhead=overhead or 0,
        claim=claim[0] if claim else None,
        claim_uid=claim[1] if claim else None,
        unlimited=tuple(unlimited),
        shares=shares,
        version=version,
    )


def format_limits(limits: Limits) -> str:
    """Canonical text of ``limits`` (exactly what the C ``tessera_limits_format`` prints).

    The ``version`` line is ``limits.version`` when set (a value read from a file keeps the
    version it declares), else :func:`required_version`: the lowest that expresses the content.
    Raises :class:`LimitsError` when the result would not parse (e.g. a relative region path,
    cores outside 0..100, a bad UUID, whitespace inside a field, more than 16 GPUs, a version
    outside :data:`MIN_VERSION`..:data:`VERSION`).
    """
    if (limits.claim is None) != (limits.claim_uid is None):
        raise LimitsError(0, "claim and claim_uid must be given together")
    norm = replace(
        limits,
        gpus=tuple(replace(g, uuid=_uuid(g.uuid) or g.uuid) for g in limits.gpus),
        unlimited=tuple(_uuid(u) or u for u in limits.unlimited),
        version=required_version(limits) if limits.version is None else limits.version,
    )
    out = [f"version {norm.version}\n"]
    if norm.claim is not None:
        out.append(f"claim {norm.claim} {norm.claim_uid}\n")
    out.append(f"region {norm.region}\n")
    out.append(f"context-overhead {norm.context_overhead}\n")
    if norm.shares is not None:
        out.append(f"shares {norm.shares}\n")
    for g in norm.gpus:
        pol = "" if g.policy == POLICIES[0] else f" policy {g.policy}"
        out.append(f"gpu {g.uuid} memory {g.memory} cores {g.cores}{pol}\n")
    for u in norm.unlimited:
        out.append(f"unlimited {u}\n")
    text = "".join(out)
    # The writer never emits what the library would refuse or read differently.
    if parse_limits(text) != norm:
        raise LimitsError(0, "a field contains blanks or does not survive a round trip")
    return text


def read_limits(path: str) -> Limits:
    """Read and parse the limits file at ``path`` (at most 1 MiB).

    Raises :class:`LimitsError` on bad content and ``OSError`` when it cannot be read.
    """
    with open(path, "rb") as f:
        data = f.read(MAX_FILE + 1)
    if len(data) > MAX_FILE:
        raise LimitsError(0, f"{path}: larger than {MAX_FILE} bytes")
    return parse_limits(data)


def write_limits(path: str, limits: Limits, mode: int = 0o444, *, sync: bool = True) -> None:
    """Write ``limits`` in canonical form to ``path`` atomically (temp file + rename).

    The file gets permissions ``mode`` (read-only by default). Nothing half-written is left
    behind on error. ``sync=False`` skips the fsync (see ``write_atomic``). Raises
    :class:`LimitsError` for an invalid value and ``OSError`` for I/O.
    """
    write_atomic(path, format_limits(limits).encode("ascii"), mode, ".limits.", sync=sync)
