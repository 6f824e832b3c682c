from fractions import Fraction

import pytest

from tessera.api.quantity import Quantity, QuantityError


@pytest.mark.parametrize(
    ("text", "value", "canonical"),
    [
        ("1Ki", 1024, "1Ki"),
        ("1024Mi", 2**30, "1Gi"),
        ("1.5Gi", 3 * 2**29, "1536Mi"),
        ("0.5Gi", 2**29, "512Mi"),
        ("81559Mi", 81559 * 2**20, "81559Mi"),
        ("2Ti", 2 * 2**40, "2Ti"),
        ("1Pi", 2**50, "1Pi"),
        ("1Ei", 2**60, "1Ei"),
        ("1500m", Fraction(3, 2), "1500m"),
        ("100", 100, "100"),
        ("1k", 1000, "1k"),
        ("12M", 12_000_000, "12M"),
        ("3G", 3 * 10**9, "3G"),
        ("4T", 4 * 10**12, "4T"),
        ("5P", 5 * 10**15, "5P"),
        ("2E", 2 * 10**18, "2E"),
        ("7u", Fraction(7, 10**6), "7u"),
        ("9n", Fraction(9, 10**9), "9n"),
        ("1e3", 1000, "1e3"),
        ("5E-2", Fraction(1, 20), "50e-3"),
        ("0.1n", Fraction(1, 10**9), "1n"),  # rounded up to nano precision, as upstream
        ("-1Ki", -1024, "-1Ki"),
        ("+20", 20, "20"),
        (".5", Fraction(1, 2), "500m"),
        ("1000Mi", 1000 * 2**20, "1000Mi"),
        ("512", 512, "512"),
    ],
)
def test_parse_and_canonical(text: str, value: Fraction, canonical: str) -> None:
    q = Quantity.parse(text)
    assert q.value == value
    assert q.canonical() == canonical


@pytest.mark.parametrize(
    "bad", ["", "Gi", "1GB", "1.2.3", "one", "1 Gi", "1e", "--1", "8gi", "1Kib", "0x10"]
)
def test_rejects_invalid(bad: str) -> None:
    with pytest.raises(QuantityError, match="not a valid quantity"):
        Quantity.parse(bad)


def test_number_as_the_api_server_reads_it_and_rejects_bool() -> None:
    # `memory: 1.5` in a manifest is a JSON number; the API server stores it as 1500m.
    assert Quantity.parse(1.5).canonical() == "1500m"  # type: ignore[arg-type]
    assert Quantity.parse(1e3).canonical() == "1k"  # type: ignore[arg-type]
    with pytest.raises(QuantityError, match="not a quantity"):
        Quantity.parse(float("inf"))  # type: ignore[arg-type]
    with pytest.raises(QuantityError, match="boolean"):
        Quantity.parse(True)


def test_exact_arithmetic_and_ordering() -> None:
    a, b = Quantity.parse("1Gi"), Quantity.parse("1024Mi")
    assert a == b and hash(a) == hash(b)
    assert (a + Quantity.parse("512Mi")).canonical() == "1536Mi"
    assert (a - Quantity.parse("1Gi")).value == 0
    assert Quantity.parse("999m") < Quantity.parse("1")
    assert Quantity.parse("1500m").value_int() == 2  # Value() rounds up
    assert Quantity.parse("1500m").milli_value() == 1500
    assert Quantity.parse("1k").cmp(Quantity.parse("1Ki")) == -1


def test_out_of_range() -> None:
    with pytest.raises(QuantityError, match="out of range"):
        Quantity.parse("16Ei")


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("1e-999999999", Fraction(1, 10**9)),  # below 1n: rounded up to 1n, at once
        ("-0.1n", Fraction(-1, 10**9)),  # magnitude rounded up, as upstream
        ("0." + "0" * 5000 + "1", Fraction(1, 10**9)),
        ("123456789012345678901234567890e-20", Fraction(123456789012345679, 10**8)),
        ("9223372036854775807", 2**63 - 1),
        ("0.0000000001Ki", Fraction(103, 10**9)),
    ],
)
def test_parse_bounded_forms(text: str, value: Fraction) -> None:
    assert Quantity.parse(text).value == value


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("1e999999999", "out of range"),  # used to hang computing 10**999999999
        (
            "1" * 5000,
            "(5000 characters) is out of range",
        ),  # used to raise ValueError (int digits limit)
        ("9223372036854775808", "out of range"),
        ("8Ei", "out of range"),
        ("1e2147483648", "exponent out of range"),
        (2**70, "out of range"),
    ],
)
def test_parse_refuses_out_of_range_fast(text: str | int, message: str) -> None:
    with pytest.raises(QuantityError, match=message.replace("(", r"\(").replace(")", r"\)")):
        Quantity.parse(text)


@pytest.mark.parametrize(
    ("text", "value"),
    [
        # The values of upstream's v1.37 TestAllocator cases for kubernetes PRs #140518/#140702.
        ("1000000000000000000002", 10**21 + 2),
        ("10000000000000000000", 10**19),
        ("-9223372036854775808", -(2**63)),
        ("1e21", 10**21),
        ("1000E", 10**21),
        ("1.5e30", 15 * 10**29),
        (2**70, 2**70),
        ("9" * 64, 10**64 - 1),
        (1e21, 10**21),  # a YAML/JSON number
    ],
)
def test_parse_beyond_int64_keeps_decimal_values(text: str | int | float, value: int) -> None:
    """resource.ParseQuantity keeps decimal values past 2^63-1 exactly (inf.Dec), and the API
    server stores them in ResourceSlices and capacity requests."""
    q = Quantity.parse(text, beyond_int64=True)
    assert q.value == value
    assert Quantity.parse(q.canonical(), beyond_int64=True).value == value


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("16Ei", r"out of range for a Kubernetes quantity \(max 2\^63-1\)"),  # BinarySI: bounded
        ("1e65", "at most 64 digits before the decimal point"),
        ("1e999999999", "at most 64 digits before the decimal point"),  # at once, no 10**999999999
        ("1" * 5000, "at most 64 digits"),
    ],
)
def test_parse_beyond_int64_still_bounded(text: str, message: str) -> None:
    with pytest.raises(QuantityError, match=message):
        Quantity.parse(text, beyond_int64=True)
    with pytest.raises(QuantityError, match="out of range"):
        Quantity.parse(text)  # without beyond_int64: the 2^63-1 bound


def test_claim_validation_accepts_decimal_capacity_requests_past_int64() -> None:
    """The API server stores a capacity request past 2^63-1 in decimal form (ParseQuantity keeps
    it); a BinarySI one past it is still reported."""
    from tessera.api.validation import claim_spec_problems

    def spec(v: str) -> dict[str, object]:
        return {
            "devices": {
                "requests": [
                    {
                        "name": "req-0",
                        "exactly": {
                            "deviceClassName": "c",
                            "capacity": {"requests": {"memory": v}},
                        },
                    }
                ]
            }
        }

    assert claim_spec_problems(spec("1000000000000000000000")) == []
    (p,) = claim_spec_problems(spec("16Ei"))
    assert p.field == "spec.devices.requests[0].exactly.capacity.requests[memory]"
    assert "out of range" in p.message
