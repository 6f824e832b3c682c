"""The allocator's refusal record in words (tessera.scheduler.words): every kind of refusal the
record holds has words, and the words carry the record's numbers in each capacity's format."""

from __future__ import annotations

from fractions import Fraction

import pytest

from tessera.allocator import record
from tessera.api.quantity import Quantity
from tessera.scheduler import words

GI = 2**30


def _kinds(cls: type) -> set[type]:
    """The record's refusal kinds (``slots=True`` dataclasses leave their first class object
    behind among the subclasses: only the ones the module names count)."""
    out = set()
    for sub in cls.__subclasses__():
        if getattr(record, sub.__name__, None) is sub:
            out.add(sub)
        out |= _kinds(sub)
    return out


def test_every_refusal_kind_has_words() -> None:
    kinds = _kinds(record.Refusal)
    assert len(kinds) >= 13
    assert kinds <= set(words._TEXT), sorted(k.__name__ for k in kinds - set(words._TEXT))


def test_a_kind_without_words_is_named() -> None:
    class Newcomer(record.Refusal):
        pass

    with pytest.raises(TypeError, match="no words for refusal Newcomer"):
        words.refusal_text(Newcomer())


def _use(name: str, needs: int, total: int, allocated: int, fmt: str = "BinarySI", **kw):
    return record.CapacityUse(
        name=name,
        requested=kw.get("requested", Quantity(Fraction(needs), fmt)),  # type: ignore[arg-type]
        needs=Fraction(needs),
        total=Fraction(total),
        allocated=Fraction(allocated),
        in_call=Fraction(kw.get("in_call", 0)),
        format=fmt,  # type: ignore[arg-type]
    )


def test_capacity_short_text_and_key() -> None:
    r = record.CapacityShort(
        uses=(
            _use("memory", 10 * GI, 80 * GI, 72 * GI),
            _use("cores", 50, 100, 20, fmt="DecimalSI"),
        )
    )
    # memory: 8Gi free, short by 2Gi; cores 80 free of 100: not short, so not named.
    assert words.refusal_text(r) == "memory short by 2Gi (needs 10Gi, 8Gi free of 80Gi)"
    assert words.refusal_key(r) == "memory short (needs 10Gi)"


def test_capacity_never_names_the_policy_default() -> None:
    r = record.CapacityShort(uses=(_use("memory", 96 * GI, 80 * GI, 0, requested=None),))
    assert words.refusal_text(r) == (
        "memory: needs 96Gi, more than the device has (80Gi) "
        "(policy default: the request names no memory)"
    )


def test_taint_and_attribute_values() -> None:
    t = record.Tainted(key_="gpu.tessera.dev/xid", value="79", effect="NoSchedule", request="gpu")
    assert words.refusal_text(t) == (
        "taint gpu.tessera.dev/xid=79:NoSchedule not tolerated: add a toleration to request gpu"
    )
    c = record.ConstraintFailed(
        index=0,
        kind="matchAttribute",
        attribute="gpu.tessera.dev/nvlinkDomain",
        value='a"b',
        chosen=(("gpu-0", "x"),),
    )
    assert words.refusal_text(c) == (
        'constraint #0 matchAttribute gpu.tessera.dev/nvlinkDomain: nvlinkDomain = "a\\"b" '
        'differs from the devices picked before it (gpu-0: "x")'
    )
    assert words.attribute_value([True, Quantity(Fraction(GI), "BinarySI")]) == (
        '[true, quantity("1Gi")]'
    )
