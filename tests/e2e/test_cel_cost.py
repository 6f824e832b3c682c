"""The API server of Kubernetes v1.37.2 decides which selectors are too expensive: Tessera's
estimate (tessera.cel.check_selector, used by lint and simulate) must accept and reject the
same ones, with the API server's wording."""

from __future__ import annotations

import pytest

from tessera.cel import TOO_COMPLEX, CelCostError, check_selector
from tessera.kube.client import ApiError

from .conftest import LiveCluster

pytestmark = pytest.mark.cluster


def _nested(n: int) -> str:
    return f"lists.range({n}).all(i, lists.range({n}).all(j, i != j || i == j))"


@pytest.mark.parametrize(
    "expr",
    [
        _nested(315),  # estimated 997302: the largest n that passes
        _nested(316),  # estimated 1003628
        _nested(1000),
        '["a", "b"].isSorted()',  # element strings of unknown size: the estimate saturates
        'device.attributes["gpu.tessera.dev"].?productName.orValue("").lowerAscii().contains("h100")',
        'cel.bind(g, device.attributes["gpu.tessera.dev"], g.?index.orValue(-1) >= 0)',
    ],
)
def test_cost_limit_agrees_with_the_api_server(kube_cluster: LiveCluster, expr: str) -> None:
    obj = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "DeviceClass",
        "metadata": {"name": "cost-probe"},
        "spec": {"selectors": [{"cel": {"expression": expr}}]},
    }
    try:
        check_selector(expr)
        tessera = None
    except CelCostError as e:
        tessera = f"spec.selectors[0].cel.expression: Forbidden: {e}"
    try:
        kube_cluster.client.create(obj)
        upstream = None
    except ApiError as e:
        upstream = str(e)
    finally:
        kube_cluster.client.delete("resource.k8s.io/v1", "DeviceClass", "cost-probe")
    if tessera is None:
        assert upstream is None
    else:
        assert upstream is not None and tessera in upstream and TOO_COMPLEX in upstream
