import re

import pytest

from tessera.api.quantity import Quantity
from tessera.cel import (
    CelCompileError,
    CelRuntimeError,
    DeviceView,
    SemverValue,
    compile_selector,
    device_activation,
)

DEV = device_activation(
    DeviceView(
        "gpu.tessera.dev",
        {
            "gpu.tessera.dev/uuid": "GPU-1f0e",
            "gpu.tessera.dev/productName": "NVIDIA H100 80GB HBM3",
            "gpu.tessera.dev/driverVersion": SemverValue.parse("535.161.8"),
            "gpu.tessera.dev/index": 3,
            "resource.kubernetes.io/pcieRoot": "pci0000:15",
        },
        {
            "gpu.tessera.dev/memory": Quantity.parse("81559Mi"),
            "gpu.tessera.dev/cores": Quantity.parse("100"),
        },
        True,
    )
)


@pytest.mark.parametrize(
    ("expr", "want"),
    [
        ('device.driver == "gpu.tessera.dev"', True),
        ('device.capacity["gpu.tessera.dev"].memory.compareTo(quantity("40Gi")) >= 0', True),
        (
            'device.capacity["gpu.tessera.dev"].memory.isLessThan(quantity("80Gi"))',
            True,
        ),  # 81559Mi < 81920Mi
        ('device.capacity["gpu.tessera.dev"].memory == quantity("81559Mi")', True),
        ('device.capacity["gpu.tessera.dev"].cores == quantity("100")', True),
        ('device.attributes["gpu.tessera.dev"].productName.lowerAscii().contains("h100")', True),
        (
            'device.attributes["gpu.tessera.dev"].driverVersion.isGreaterThan(semver("535.54.3"))',
            True,
        ),
        ('device.attributes["gpu.tessera.dev"].driverVersion == semver("535.161.8")', True),
        ('device.attributes["gpu.tessera.dev"].driverVersion.major() == 535', True),
        ('device.attributes["gpu.tessera.dev"].uuid in ["GPU-aaaa", "GPU-1f0e"]', True),
        ('device.attributes["resource.kubernetes.io"].pcieRoot == "pci0000:15"', True),
        ('has(device.attributes["gpu.tessera.dev"].numaNode)', False),
        ('device.attributes["other.example.com"].size() == 0', True),  # unknown domain: empty map
        ("device.allowMultipleAllocations", True),
        ('device.attributes["gpu.tessera.dev"].index > 2', True),
        ('quantity("1Gi").add(quantity("512Mi")) == quantity("1536Mi")', True),
        ('quantity("1500m").isInteger()', False),
        ('isSemver("v1.2", true) && !isSemver("v1.2")', True),
    ],
)
def test_selector_values(expr: str, want: bool) -> None:
    assert compile_selector(expr).evaluate(DEV) is want


@pytest.mark.parametrize(
    ("expr", "msg"),
    [
        ('device.attributes["gpu.tessera.dev"].numaNode == 0', "no such key: numaNode"),
        (
            'device.attributes["gpu.tessera.dev"].index',
            "CEL result of type int could not be converted to bool",
        ),
        ('quantity("8 Gi").sign() == 1', "not a valid quantity"),
    ],
)
def test_runtime_errors(expr: str, msg: str) -> None:
    with pytest.raises(CelRuntimeError, match=msg):
        compile_selector(expr).evaluate(DEV)


@pytest.mark.parametrize(
    ("expr", "msg"),
    [
        ("device.driver ==", "Syntax error: unexpected end of input"),
        (
            'device.capacity["gpu.tessera.dev"].memory >= quantity("40Gi")',
            re.escape(
                "found no matching overload for '_>=_' applied to '(kubernetes.Quantity, kubernetes.Quantity)'"
            ),
        ),
        ("noSuchVar", "undeclared reference to 'noSuchVar'"),
        ("1 + 1", "must evaluate to bool or the unknown type, not int"),
        ('ip("10.0.0.1").family() == 4', "not implemented by Tessera"),
    ],
)
def test_compile_errors(expr: str, msg: str) -> None:
    with pytest.raises(CelCompileError, match=msg):
        compile_selector(expr)


def test_semver_order() -> None:
    v = SemverValue.parse
    assert v("1.0.0-alpha").cmp(v("1.0.0")) == -1
    assert v("1.0.0-alpha.1").cmp(v("1.0.0-alpha.beta")) == -1
    assert v("2.0.0").cmp(v("10.0.0")) == -1
    assert SemverValue.parse("v535.161.08", normalize=True).text == "535.161.8"
    with pytest.raises(ValueError, match="not a semantic version"):
        v("535.161.08")


# --- the Kubernetes environment beyond cel-python: optional syntax, bind, libraries ---------------


@pytest.mark.parametrize(
    ("expr", "want"),
    [
        # optional syntax (cel.OptionalTypes, Kubernetes base environment since 1.28)
        ('device.attributes["gpu.tessera.dev"].?numaNode.orValue(-1) == -1', True),
        ('device.attributes["gpu.tessera.dev"].?index.orValue(-1) == 3', True),
        ('device.attributes["gpu.tessera.dev"][?"index"].hasValue()', True),
        (
            'device.attributes[?"other.example.com"].hasValue()',
            True,
        ),  # unknown domain: empty map, present
        ('device.attributes["gpu.tessera.dev"].?numaNode.hasValue()', False),
        (
            "optional.of(1).or(optional.of(2)).value() == 1 && optional.none().or(optional.of(2)).value() == 2",
            True,
        ),
        ("optional.ofNonZeroValue(0) == optional.none()", True),
        ('optional.of("a").optMap(s, s + "b").value() == "ab"', True),
        ("[?optional.none(), ?optional.of(1), 2] == [1, 2]", True),
        ('{?"a": optional.none(), "b": 1} == {"b": 1}', True),
        # cel.bind (ext.Bindings, enabled for DRA since 1.31)
        (
            'cel.bind(g, device.attributes["gpu.tessera.dev"], g.index == 3 && g.productName.startsWith("NVIDIA"))',
            True,
        ),
        ("cel.bind(a, 1, cel.bind(b, a + 1, a + b == 3))", True),
        # two-variable comprehensions (1.32)
        ("[10, 20].all(i, v, v == (i + 1) * 10)", True),
        ('{"a": 1, "b": 2}.exists(k, v, k == "b" && v == 2)', True),
        ("[1, 2, 3].existsOne(i, v, v > 2)", True),
        ("[1, 2].transformList(i, v, i + v) == [1, 3]", True),
        ('{"a": 1}.transformMap(k, v, v * 2) == {"a": 2}', True),
        # macros with filters
        ("[1, 2, 3].map(x, x > 1, x * 10) == [20, 30]", True),
        ("[1, 2, 3].filter(x, x % 2 == 1) == [1, 3]", True),
        ("[1, 2, 3].exists_one(x, x == 2)", True),
        # strings ext v2
        ('"a,b,c".split(",", 2) == ["a", "b,c"]', True),
        ('"hello".charAt(1) == "e" && "hello".substring(1, 3) == "el"', True),
        (
            '"  x ".trim() == "x" && "abcabc".lastIndexOf("bc") == 4 && "abc".indexOf("c", 1) == 2',
            True,
        ),
        ('["a", "b"].join("-") == "a-b" && "aXbX".replace("X", "-", 1) == "a-bX"', True),
        ('"%s has %d GPUs at %.1f".format(["node", 8, 1.25]) == "node has 8 GPUs at 1.2"', True),
        ('strings.quote("a\\"b") == "\\"a\\\\\\"b\\""', True),
        # lists ext v3, Kubernetes lists library, sets ext
        ("lists.range(4).slice(1, 3) == [1, 2] && [[1], [2, 3]].flatten() == [1, 2, 3]", True),
        (
            "[3, 1, 2].sort() == [1, 2, 3] && [1, 1, 2].distinct() == [1, 2] && [1, 2].reverse() == [2, 1]",
            True,
        ),
        ('["bb", "a"].sortBy(s, s.size()) == ["a", "bb"]', True),
        (
            "[1, 2, 3].isSorted() && [1, 2, 3].sum() == 6 && [4, 2].min() == 2 && [4, 2].max() == 4",
            True,
        ),
        ("[1, 2, 3].indexOf(2) == 1 && [1, 2, 1].lastIndexOf(1) == 2", True),
        (
            "sets.contains([1, 2, 3], [2, 3]) && sets.intersects([1], [1, 5]) && sets.equivalent([1, 1], [1])",
            True,
        ),
        # Kubernetes regex library
        ('"gpu-17-x".find("[0-9]+") == "17" && "a1b22".findAll("[0-9]+") == ["1", "22"]', True),
        # cross-type numeric comparisons (1.28) and heterogeneous equality
        ("1 < 2.5 && 2u > 1 && 1 == 1.0 && 1 == 1u", True),
        ('dyn(1) != "1"', True),
        ("type(1) == int && type(device.driver) == string", True),
    ],
)
def test_kubernetes_environment(expr: str, want: bool) -> None:
    assert compile_selector(expr).evaluate(DEV) is want


@pytest.mark.parametrize(
    ("expr", "msg"),
    [
        ("optional.none().value() == 1", "optional.none() dereference"),
        ("9223372036854775807 + 1 > 0", "integer overflow"),
        ("1 / 0 == 1", "division by zero"),
        ("[1][1] == 1", "index out of bounds: 1"),
        (
            '{"a": 1}.transformMapEntry(k, v, {"b": v}).size() == 1 && [1, 1].transformMapEntry(i, v, {v: '
            "i}).size() == 1",
            "insert failed: key 1 already exists",
        ),
    ],
)
def test_more_runtime_errors(expr: str, msg: str) -> None:
    with pytest.raises(CelRuntimeError, match=re.escape(msg)):
        compile_selector(expr).evaluate(DEV)


def test_errors_are_absorbed_like_cel() -> None:
    # error && false is false, error || true is true, in either order (commutative logic).
    assert (
        compile_selector('device.attributes["gpu.tessera.dev"].numaNode == 0 && false').evaluate(
            DEV
        )
        is False
    )
    assert (
        compile_selector('false && device.attributes["gpu.tessera.dev"].numaNode == 0').evaluate(
            DEV
        )
        is False
    )
    assert (
        compile_selector('device.attributes["gpu.tessera.dev"].numaNode == 0 || true').evaluate(DEV)
        is True
    )
    # all() is false as soon as one element is false, even if another errors.
    assert compile_selector("[0, 1].all(x, 1 / x > 5)").evaluate(DEV) is False
    with pytest.raises(CelRuntimeError, match="no such key: numaNode"):
        compile_selector('device.attributes["gpu.tessera.dev"].numaNode == 0 || false').evaluate(
            DEV
        )


# --- cost: cel-go's estimate with the Kubernetes estimators, and the runtime limit ---------------


@pytest.mark.parametrize(
    ("expr", "estimate"),
    [
        ('device.driver == "gpu.tessera.dev"', 4),
        ('device.attributes["gpu.tessera.dev"].productName == "x"', 5),
        ('device.capacity["gpu.tessera.dev"].memory.compareTo(quantity("40Gi")) >= 0', 7),
        ("lists.range(1000).all(i, lists.range(1000).all(j, i != j || i == j))", 10016012),
    ],
)
def test_estimated_cost(expr: str, estimate: int) -> None:
    assert compile_selector(expr).cost.max == estimate


def test_cost_limit() -> None:
    from tessera.cel import MAX_COST, CelCostError, check_selector

    expensive = "lists.range(1000).all(i, lists.range(1000).all(j, i != j || i == j))"
    with pytest.raises(CelCostError, match=r"^too complex, exceeds cost limit$") as e:
        check_selector(expensive)
    assert e.value.estimate > MAX_COST
    # At runtime it stops at the limit with cel-go's message; a smaller limit stops sooner.
    with pytest.raises(CelRuntimeError, match=r"^operation cancelled: actual cost limit exceeded$"):
        compile_selector(expensive).evaluate(DEV)
    cheap = compile_selector('device.driver == "gpu.tessera.dev"')
    assert cheap.evaluate_cost(DEV) == (True, 4)
    with pytest.raises(CelRuntimeError, match="actual cost limit exceeded"):
        cheap.evaluate(DEV, cost_limit=3)
