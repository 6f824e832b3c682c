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
        {"gpu.tessera.dev/memory": Quantity.parse("81559Mi"), "gpu.tessera.dev/cores": Quantity.parse("100")},
        True,
    )
)


@pytest.mark.parametrize(
    ("expr", "want"),
    [
        ('device.driver == "gpu.tessera.dev"', True),
        ('device.capacity["gpu.tessera.dev"].memory.compareTo(quantity("40Gi")) >= 0', True),
        ('device.capacity["gpu.tessera.dev"].memory.isLessThan(quantity("80Gi"))', True),  # 81559Mi < 81920Mi
        ('device.capacity["gpu.tessera.dev"].memory == quantity("81559Mi")', True),
        ('device.capacity["gpu.tessera.dev"].cores == quantity("100")', True),
        ('device.attributes["gpu.tessera.dev"].productName.lowerAscii().contains("h100")', True),
        ('device.attributes["gpu.tessera.dev"].driverVersion.isGreaterThan(semver("535.54.3"))', True),
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
        ('device.attributes["gpu.tessera.dev"].index', "CEL result of type int could not be converted to bool"),
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
        ('device.capacity["gpu.tessera.dev"].memory >= quantity("40Gi")',
         re.escape("found no matching overload for '_>=_' applied to '(kubernetes.Quantity, kubernetes.Quantity)'")),
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
