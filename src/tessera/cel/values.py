"""CEL values beyond Python's own: uint, optional, type values, Kubernetes Quantity and semver.

CEL ``int`` is Python ``int`` (checked to int64), ``double`` is ``float``, ``string`` ``str``,
``bytes`` ``bytes``, ``bool`` ``bool``, ``null`` ``None``, ``list`` ``list``, ``map`` ``dict``.
Pure: no I/O.
"""

from __future__ import annotations

import re
from typing import Any

from tessera.api.quantity import Quantity
from tessera.cel.syntax import UInt

__all__ = ["CelError", "OptionalValue", "QuantityValue", "SemverValue", "TypeValue", "UInt"]


class CelError(Exception):
    """A CEL runtime error value (cel-go's ``types.Err``): raised, or held in a comprehension's
    accumulator until read. ``str()`` is cel-go's message."""


class CostLimitExceeded(CelError):
    """Evaluation went past the runtime cost limit (cel-go's ``EvalCancelledError``)."""


class OptionalValue:
    """CEL ``optional_type(T)``: ``optional.of(v)`` or ``optional.none()``."""

    __slots__ = ("has", "value")

    def __init__(self, has: bool, value: Any = None) -> None:
        self.has, self.value = has, value

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, OptionalValue):
            return False
        if not self.has or not other.has:
            return self.has == other.has
        from tessera.cel.interp import cel_equal

        return cel_equal(self.value, other.value)

    def __hash__(self) -> int:
        return hash((self.has, repr(self.value)))

    def __repr__(self) -> str:
        return f"optional.of({self.value!r})" if self.has else "optional.none()"


NONE = OptionalValue(False)


class TypeValue:
    """A CEL type as a value (``type(x)``, ``int``, ``string`` ...), compared by name."""

    __slots__ = ("name",)

    def __init__(self, name: str) -> None:
        self.name = name

    def __eq__(self, other: object) -> bool:
        return isinstance(other, TypeValue) and other.name == self.name

    def __hash__(self) -> int:
        return hash(("type", self.name))

    def __repr__(self) -> str:
        return self.name


class QuantityValue:
    """CEL ``kubernetes.Quantity``: equality and member functions only, no ``<`` operators."""

    __slots__ = ("q",)

    def __init__(self, q: Quantity) -> None:
        self.q = q

    def __eq__(self, other: object) -> bool:
        return isinstance(other, QuantityValue) and self.q.value == other.q.value

    def __hash__(self) -> int:
        return hash(self.q.value)

    def __repr__(self) -> str:
        return f"quantity({self.q.canonical()!r})"


_SEMVER = re.compile(
    r"^(0|[1-9]\d*)\.(0|[1-9]\d*)\.(0|[1-9]\d*)"
    r"(?:-((?:0|[1-9]\d*|\d*[a-zA-Z-][0-9a-zA-Z-]*)(?:\.(?:0|[1-9]\d*|\d*[a-zA-Z-][0-9a-zA-Z-]*))*))?"
    r"(?:\+([0-9a-zA-Z-]+(?:\.[0-9a-zA-Z-]+)*))?$"
)


class SemverValue:
    """CEL ``kubernetes.Semver`` (semver 2.0.0). Build metadata is ignored in comparisons."""

    __slots__ = ("major", "minor", "patch", "pre", "text")

    def __init__(self, major: int, minor: int, patch: int, pre: tuple[str, ...], text: str) -> None:
        self.major, self.minor, self.patch, self.pre, self.text = major, minor, patch, pre, text

    @classmethod
    def parse(cls, s: str, normalize: bool = False) -> SemverValue:
        """Strict semver; ``normalize`` accepts a ``v`` prefix, missing minor/patch, leading zeros.

        Raises ValueError naming the text when it is not a semantic version."""
        t = s
        if normalize:
            t = t[1:] if t.startswith("v") else t
            m0 = re.search(r"[-+]", t)
            core, sep, rest = (t[: m0.start()], m0.group(0), t[m0.end() :]) if m0 else (t, "", "")
            nums = core.split(".")
            while len(nums) < 3:
                nums.append("0")
            if all(n.isdigit() for n in nums):
                core = ".".join(str(int(n)) for n in nums)
            t = core + sep + rest
        m = _SEMVER.match(t)
        if not m:
            raise ValueError(f"{s!r} is not a semantic version (semver 2.0.0, e.g. 1.2.3)")
        pre = tuple(m.group(4).split(".")) if m.group(4) else ()
        return cls(int(m.group(1)), int(m.group(2)), int(m.group(3)), pre, t)

    def _key(self) -> tuple[Any, ...]:
        # Pre-release sorts before release; numeric identifiers before alphanumeric.
        pre: tuple[Any, ...] = tuple(
            (0, int(p), "") if p.isdigit() else (1, 0, p) for p in self.pre
        )
        return (self.major, self.minor, self.patch, 0 if self.pre else 1, pre)

    def cmp(self, other: SemverValue) -> int:
        """-1, 0 or 1 by semver precedence."""
        a, b = self._key(), other._key()
        return (a > b) - (a < b)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, SemverValue) and self.cmp(other) == 0

    def __hash__(self) -> int:
        return hash(self._key())

    def __repr__(self) -> str:
        return f"semver({self.text!r})"
