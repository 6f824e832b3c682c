"""Bounds on what Tessera reads, so that no input can make it hang or grow without limit.

Each bound is checked where the input is read and refused with a :class:`ManifestError` that
names the file (and line, object or field) and says how to raise the bound where a user might
need to. ``docs/limits.md`` lists them.
"""

from __future__ import annotations

from dataclasses import dataclass

#: Nesting depth of any YAML or JSON document (mappings and lists). Kubernetes objects nest
#: about 15 deep; libyaml itself stops at 1000. Not adjustable.
MAX_DEPTH = 100

#: Integer literals: Kubernetes numbers are 64-bit, so a literal of more digits than this
#: cannot be a valid field value (and Python refuses to convert more than 4,300).
MAX_INT_DIGITS = 20


@dataclass(frozen=True)
class Limits:
    """Adjustable bounds (the command line's ``--max-input-size`` and ``--max-pods``).

    ``max_input_bytes``: bytes read from all inputs of one command together (files, directories,
    standard input), 512 MiB by default. ``max_pods``: Pods after expanding workloads
    (``replicas``, ``parallelism``), 200,000 by default.
    """

    max_input_bytes: int = 512 * 2**20
    max_pods: int = 200_000


DEFAULT_LIMITS = Limits()


def alias_ratio_allowed(decoded: int) -> float:
    """go-yaml's rule (what kubectl and the API server apply): the share of decoded nodes that
    may come from alias expansion, 99% for small documents down to 10% past 4,000,000 nodes."""
    low, high = 400_000, 4_000_000
    if decoded <= low:
        return 0.99
    if decoded >= high:
        return 0.10
    return 0.99 - 0.89 * (decoded - low) / (high - low)


def excessive_aliasing(decoded: int, aliased: int) -> bool:
    """True when ``aliased`` of ``decoded`` nodes came from aliases beyond go-yaml's allowance."""
    return aliased > 100 and decoded > 1000 and aliased / decoded > alias_ratio_allowed(decoded)
