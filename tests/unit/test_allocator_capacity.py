"""Capacity arithmetic, after upstream's consumable_capacity_test.go (catalogue section Q)."""

from __future__ import annotations

from fractions import Fraction

import pytest

from tessera.allocator import (
    AllocatedState,
    CapacityArithmeticError,
    consumed_amount,
    violates_policy,
)
from tessera.allocator.model import Capacity, RequestPolicy
from tessera.api.quantity import Quantity


def q(v: str | int) -> Quantity:
    return Quantity.parse(str(v))


def cap(
    value: int,
    default: int | None = None,
    *,
    mn: int | None = None,
    mx: int | None = None,
    step: int | None = None,
    values: tuple[int, ...] = (),
    policy: bool = True,
) -> Capacity:
    if not policy:
        return Capacity(q(value))
    return Capacity(
        q(value),
        RequestPolicy(
            default=q(default) if default is not None else None,
            valid_values=tuple(q(v) for v in values),
            range_min=q(mn) if mn is not None else None,
            range_max=q(mx) if mx is not None else None,
            range_step=q(step) if step is not None else None,
        ),
    )


DEV = ("driver-a", "pool-1", "device-x")


def share(share_id: str, c0: int) -> dict:
    return {
        "request": "r",
        "driver": DEV[0],
        "pool": DEV[1],
        "device": DEV[2],
        "shareID": share_id,
        "consumedCapacity": {"capacity-0": str(c0)},
    }


def test_consumed_capacity_add_and_sub_back_to_empty() -> None:
    st = AllocatedState()
    assert not st.aggregated
    st.add_result(share("s1", 1))
    assert st.aggregated[DEV] == {"capacity-0": Fraction(1)}
    assert st.is_allocated(DEV)
    st.remove_result(share("s1", 1))
    assert DEV not in st.aggregated
    assert not st.is_allocated(DEV)


def test_consumed_capacity_collection_insert_twice_remove_once() -> None:
    st = AllocatedState()
    st.add_result(share("s1", 1))
    st.add_result(share("s2", 1))
    assert st.aggregated[DEV]["capacity-0"] == 2
    st.remove_result(share("s1", 1))
    assert st.aggregated[DEV]["capacity-0"] == 1
    st.remove_result(share("s2", 1))
    assert DEV not in st.aggregated


def test_admin_results_never_count() -> None:
    st = AllocatedState()
    st.add_result(
        {"request": "r", "driver": DEV[0], "pool": DEV[1], "device": DEV[2], "adminAccess": True}
    )
    assert not st.is_allocated(DEV)


def test_consumed_capacity_from_request() -> None:
    """GetConsumedCapacityFromRequest: every capacity of the device, requested or not."""
    device = {
        "capacity-0": cap(2, 2, mn=1),  # requested 1 -> 1
        "capacity-1": cap(2, 1, mn=1),  # not requested -> default 1
        "dummy": cap(1, policy=False),  # requested 1, no policy -> 1
    }
    requests = {"capacity-0": q(1), "dummy": q(1)}
    got = {k: consumed_amount(c, requests.get(k)).value for k, c in device.items()}
    assert got == {"capacity-0": 1, "capacity-1": 1, "dummy": 1}


@pytest.mark.parametrize(
    ("capacity", "amount", "violates"),
    [
        (cap(2, policy=False), 1, False),  # no policy
        (cap(2, 1, mn=1, mx=2), 1, False),
        (cap(2, 1, mn=1, mx=1), 2, True),  # over max
        (cap(2, 1, values=(1,)), 1, False),
        (cap(2, 1, values=(1,)), 2, True),  # not a valid value
        (cap(4, 2, mn=2, step=2, mx=4), 3, True),  # off the step grid
        (cap(4, 2, mn=2, step=2, mx=4), 4, False),
        (cap(1, 0, values=(0,)), 0, False),  # equal to default never violates
    ],
)
def test_violates_policy(capacity: Capacity, amount: int, violates: bool) -> None:
    assert violates_policy(capacity, q(amount)) is violates


@pytest.mark.parametrize(
    ("requested", "capacity", "want"),
    [
        (None, cap(1, policy=False), 1),  # no request, no policy: the full value
        (None, cap(1, None), 1),  # empty policy: the full value
        (None, cap(2, 1, mn=1), 1),  # no request: the default
        (None, cap(2, 1, values=(1,)), 1),
        (2, cap(2, 1, mn=1), 2),  # range without step: as requested
        (1, cap(2, 2, mn=2), 2),  # below min: min
        (2, cap(3, 1, mn=1, step=2), 3),  # rounded up to min + k*step
        (2, cap(2, 1, mn=1, step=1), 2),
        (2, cap(3, 1, values=(1, 2, 3)), 2),
        (2, cap(3, 1, values=(1, 3)), 3),  # smallest valid value >= request
        (3, cap(3, 1, values=(1, 2)), 3),  # above every value: kept, then rejected by the policy
    ],
)
def test_calculate_consumed_capacity(requested: int | None, capacity: Capacity, want: int) -> None:
    got = consumed_amount(capacity, q(requested) if requested is not None else None)
    assert got.value == want


def test_kept_amount_above_valid_values_violates() -> None:
    c = cap(3, 1, values=(1, 2))
    assert violates_policy(c, consumed_amount(c, q(3)))


def test_fractional_range_uses_exact_arithmetic() -> None:
    """DRAFractionalCapacityRange: milli-unit steps round exactly, no float error."""
    c = Capacity(
        q("1"),
        RequestPolicy(
            default=q("100m"), range_min=q("100m"), range_step=q("100m"), range_max=q("1")
        ),
    )
    got = consumed_amount(c, q("250m"))
    assert got.value == Fraction(3, 10)
    assert not violates_policy(c, got)


def _wide(v: str) -> Quantity:
    return Quantity.parse(v, beyond_int64=True)


@pytest.mark.parametrize(
    ("policy", "requested", "fractional", "message"),
    [
        # Value() step arithmetic (upstream roundUpRange, Kubernetes v1.37, PR #140442): the
        # DRAFractionalCapacityRange gate off, as in the conformance scenarios that do not name it.
        (
            RequestPolicy(range_min=q(2), range_step=q(2)),
            "18446744073709551616",
            False,
            "request 18446744073709551616 exceeds MaxInt64",
        ),
        (
            RequestPolicy(range_min=q(0), range_step=q(100)),
            "9223372036854775807",
            False,
            "rounding request 9223372036854775807 up to the next step passes MaxInt64",
        ),
        # Milli-unit arithmetic: the gate on (the 1.37 default) and bounds exact in milli-units,
        # whole ones included (upstream useMilli does not ask for a fractional bound).
        (
            RequestPolicy(range_min=q(2), range_step=q(2)),
            "10000000000000000",
            True,
            "request 10P is not a representable milli value",
        ),
        (
            RequestPolicy(range_min=q(2), range_step=q(2)),
            "2.0005",
            True,
            "request 2000500u is not a representable milli value",
        ),
        (
            RequestPolicy(range_min=q("100m"), range_step=q("100m")),
            "10000000000000000",
            True,
            "request 10P is not a representable milli value",
        ),
        (
            RequestPolicy(range_min=q("100m"), range_step=q("300m")),
            "9223372036854775807m",
            True,
            "rounding request 9223372036854775807m up to the next step passes the milli-value range",
        ),
    ],
)
def test_unrepresentable_request_raises(
    policy: RequestPolicy, requested: str, fractional: bool, message: str
) -> None:
    with pytest.raises(CapacityArithmeticError, match="cannot be represented") as e:
        consumed_amount(
            Capacity(_wide("36893488147419103232"), policy), _wide(requested), fractional
        )
    assert message in str(e.value)


def test_request_just_within_int64_is_rounded() -> None:
    got = consumed_amount(
        Capacity(_wide("36893488147419103232"), RequestPolicy(range_min=q(1), range_step=q(2))),
        q("9223372036854775807"),
        fractional=False,
    )
    assert got.value == 2**63 - 1  # 1 + 2n lands exactly on MaxInt64: representable


def test_fractional_gate_off_uses_whole_units() -> None:
    """DRAFractionalCapacityRange off: Value() rounds 200m, 100m and the request up to 1, so a
    200m request against min 200m step 100m consumes 1 (upstream
    consumable-capacity-fractional-range-gate-disabled); on: exactly 200m, and 250m -> 300m."""
    pol = RequestPolicy(
        default=q("200m"), range_min=q("200m"), range_step=q("100m"), range_max=q(1)
    )
    c = Capacity(q(1), pol)
    assert consumed_amount(c, q("200m"), fractional=False).value == 1
    assert consumed_amount(c, q("200m"), fractional=True).value == Fraction(1, 5)
    assert consumed_amount(c, q("250m"), fractional=True).value == Fraction(3, 10)
