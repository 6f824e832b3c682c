"""The device plugin's view of its node's pods (``tessera.deviceplugin.pods.NodePods``) over the
project's informer, fed the watch events an API server sends (``Informer._event``, the informer's
own reader of them): the plugin's write stands for its pod until the cache has caught up with
it, what came after it in the cache wins, a pod deleted after the write is gone, and a cache
whose versions are not numbers gives no answer (``Allocate`` then lists)."""

from __future__ import annotations

from typing import Any

import pytest

from tessera.deviceplugin.pods import NodePods
from tessera.kube.watch import Informer, version_number

pytestmark = pytest.mark.legacy

NODE = "n1"


def pod(name: str, rv: str, phase: str = "allocating") -> dict[str, Any]:
    return {
        "metadata": {
            "name": name,
            "namespace": "ns",
            "resourceVersion": rv,
            "annotations": {"hami.io/bind-phase": phase},
        },
        "spec": {"nodeName": NODE},
    }


def listed(informer: Informer, rv: str, *pods: dict[str, Any]) -> None:
    """The informer's first list, as ``Informer._list`` keeps it."""
    informer._objects = {("ns", p["metadata"]["name"]): p for p in pods}
    informer.resource_version = rv
    informer._synced.set()


def phases(view: tuple[list[dict[str, Any]], int] | None) -> dict[str, str]:
    assert view is not None
    return {
        p["metadata"]["name"]: p["metadata"]["annotations"]["hami.io/bind-phase"] for p in view[0]
    }


def test_own_writes_stand_until_the_cache_catches_up() -> None:
    informer = NodePods.informer_for(None, NODE)  # type: ignore[arg-type]  # never started
    pods = NodePods(None, NODE, informer=informer)  # type: ignore[arg-type]
    assert pods.cached() is None  # no first list yet: Allocate lists
    listed(informer, "100", pod("a", "90"), pod("b", "95"))
    assert phases(pods.cached()) == {"a": "allocating", "b": "allocating"}
    pods.wrote(pod("a", "105", "success"))  # the patch's reply: newer than the cache
    assert phases(pods.cached()) == {"a": "success", "b": "allocating"}
    # an event before the write (another pod) does not hide the write
    informer._event({"type": "MODIFIED", "object": pod("b", "103")})
    assert phases(pods.cached()) == {"a": "success", "b": "allocating"}
    # the write's own event, then a later change: the cache's copy wins from there on
    informer._event({"type": "MODIFIED", "object": pod("a", "105", "success")})
    informer._event({"type": "MODIFIED", "object": pod("a", "110", "failed")})
    assert phases(pods.cached()) == {"a": "failed", "b": "allocating"}
    assert pods._wrote == {}
    # a pod deleted after the plugin's write is gone, not brought back by the write
    pods.wrote(pod("b", "120", "success"))
    informer._event({"type": "DELETED", "object": pod("b", "125", "success")})
    assert phases(pods.cached()) == {"a": "failed"}
    # a write older than what the cache holds changes nothing
    pods.wrote(pod("a", "108", "success"))
    assert phases(pods.cached()) == {"a": "failed"}


def test_a_cache_whose_versions_are_not_numbers_gives_no_answer() -> None:
    informer = NodePods.informer_for(None, NODE)  # type: ignore[arg-type]
    pods = NodePods(None, NODE, informer=informer)  # type: ignore[arg-type]
    listed(informer, "a9f3", pod("a", "a9f2"))
    assert pods.cached() is None
    assert [version_number(v) for v in ("17", "0", "017", "", "1e3", "²")] == [
        17,
        None,
        None,
        None,
        None,
        None,
    ]


def test_wait_ends_at_a_change_or_the_deadline() -> None:
    import threading
    import time

    informer = NodePods.informer_for(None, NODE)  # type: ignore[arg-type]
    pods = NodePods(None, NODE, informer=informer)  # type: ignore[arg-type]
    listed(informer, "100", pod("a", "90"))
    seen = pods.cached()
    assert seen is not None
    assert pods.wait(seen[1], time.monotonic()) is False  # nothing changed, deadline now
    bound = threading.Timer(
        0.05, informer._event, [{"type": "ADDED", "object": pod("late", "101")}]
    )
    bound.start()
    assert pods.wait(seen[1], time.monotonic() + 30) is True
    bound.join()
    assert phases(pods.cached()) == {"a": "allocating", "late": "allocating"}
