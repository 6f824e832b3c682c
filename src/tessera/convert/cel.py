"""CEL text for device selectors on Tessera devices (``resource.k8s.io/v1`` ``selectors[].cel``).

Only builds strings; evaluation lives in :mod:`tessera.cel`. Every string literal goes through
:func:`cel_string`, so user-supplied annotation values can never change an expression's shape.
"""

from __future__ import annotations

from collections.abc import Sequence

from tessera import DRIVER_NAME

ATTRS = f'device.attributes["{DRIVER_NAME}"]'
CAPACITY = f'device.capacity["{DRIVER_NAME}"]'

_ESCAPES = {"\\": "\\\\", '"': '\\"', "\n": "\\n", "\r": "\\r", "\t": "\\t"}


def cel_string(text: str) -> str:
    """A double-quoted CEL string literal whose value is exactly ``text``.

    Backslash, double quote, newline, CR and tab get their short escapes; any other control
    character (U+0000..U+001F, U+007F) becomes ``\\uXXXX``. Other characters stay as they are
    (CEL source is UTF-8).
    """
    out = ['"']
    for ch in text:
        if ch in _ESCAPES:
            out.append(_ESCAPES[ch])
        elif ord(ch) < 0x20 or ord(ch) == 0x7F:
            out.append(f"\\u{ord(ch):04x}")
        else:
            out.append(ch)
    out.append('"')
    return "".join(out)


def cel_list(items: Sequence[str]) -> str:
    """A CEL list literal of string literals: ``["a", "b"]``."""
    return "[" + ", ".join(cel_string(i) for i in items) + "]"


def lower_ascii(text: str) -> str:
    """Lower-case A-Z only, exactly like CEL's ``lowerAscii()`` (non-ASCII letters unchanged)."""
    return "".join(chr(ord(c) + 32) if "A" <= c <= "Z" else c for c in text)


# Every attribute read is guarded with has(): a device without the attribute (a MIG device
# without a UUID, another driver's device) must simply not match. An unguarded read is a CEL
# runtime error, which aborts scheduling of the whole pod (dra-spec.md 3.2).


def attrs(driver: str = DRIVER_NAME) -> str:
    """``device.attributes["<driver>"]``: the attributes of a driver's domain."""
    return ATTRS if driver == DRIVER_NAME else f"device.attributes[{cel_string(driver)}]"


def has_attr(name: str, driver: str = DRIVER_NAME) -> str:
    """``has(device.attributes["gpu.tessera.dev"].<name>)`` (another ``driver``'s domain when
    given)."""
    return f"has({attrs(driver)}.{name})"


def attr_in(name: str, values: Sequence[str], driver: str = DRIVER_NAME) -> str:
    """The device's string attribute ``name`` of ``driver`` is one of ``values`` (guarded)."""
    return f"{has_attr(name, driver)} && {attrs(driver)}.{name} in {cel_list(values)}"


def attr_not_in(name: str, values: Sequence[str], driver: str = DRIVER_NAME) -> str:
    """The device has no attribute ``name``, or its value is none of ``values``."""
    return f"!({attr_in(name, values, driver)})"


def uuid_in(uuids: Sequence[str]) -> str:
    """The device's GPU is in ``uuids`` (exact match): its ``uuid``, or for a MIG device its
    parent's (``parentUUID``), as HAMi compares the physical GPU's UUID in MIG mode too."""
    items = cel_list(uuids)
    return (
        f"({has_attr('uuid')} && {ATTRS}.uuid in {items}) || "
        f"({has_attr('parentUUID')} && {ATTRS}.parentUUID in {items})"
    )


def uuid_not_in(uuids: Sequence[str]) -> str:
    """Neither the device's ``uuid`` nor its ``parentUUID`` is in ``uuids``."""
    return f"!({uuid_in(uuids)})"


def profile_in(profiles: Sequence[str]) -> str:
    """The device is a MIG device of one of ``profiles`` (``profile`` attribute)."""
    return f"{has_attr('profile')} && {ATTRS}.profile in {cel_list(profiles)}"


def _product_contains(needle: str, driver: str = DRIVER_NAME) -> str:
    return f"{attrs(driver)}.productName.lowerAscii().contains({cel_string(lower_ascii(needle))})"


def product_contains_any(needles: Sequence[str], driver: str = DRIVER_NAME) -> str:
    """``productName`` exists and contains any needle, case-insensitively (OR)."""
    alts = " || ".join(_product_contains(n, driver) for n in needles)
    return f"{has_attr('productName', driver)} && ({alts})"


def product_contains_none(needles: Sequence[str], driver: str = DRIVER_NAME) -> str:
    """No needle is a case-insensitive substring of ``productName`` (AND of negations)."""
    inner = " && ".join(f"!{_product_contains(n, driver)}" for n in needles)
    return f"!{has_attr('productName', driver)} || ({inner})"


def type_is(device_type: str, driver: str = DRIVER_NAME) -> str:
    """The device's ``type`` attribute is ``device_type`` (``gpu`` or ``mig`` for Tessera;
    another driver's own type with ``driver``)."""
    return f"{has_attr('type', driver)} && {attrs(driver)}.type == {cel_string(device_type)}"


def capacity_is(name: str, quantity: str, driver: str = DRIVER_NAME) -> str:
    """The device publishes capacity ``name`` of ``driver`` equal to ``quantity`` (guarded)."""
    cap = CAPACITY if driver == DRIVER_NAME else f"device.capacity[{cel_string(driver)}]"
    return f"has({cap}.{name}) && {cap}.{name} == quantity({cel_string(quantity)})"


def memory_is(quantity: str) -> str:
    """The device publishes a memory capacity equal to ``quantity`` (a canonical Quantity).
    Guarded like attribute reads: a device without ``memory`` (memory unknown) must not match."""
    return f"has({CAPACITY}.memory) && {CAPACITY}.memory == quantity({cel_string(quantity)})"
