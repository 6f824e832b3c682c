"""The pods on the device plugin's node, as ``Allocate`` reads them: from memory.

``Allocate`` chooses its pod among the node's pods (:func:`.allocate.choose_pod`). Listing them
from the API server at every call cost a round trip that grows with the pods on the node
(issue 25's target: ``Allocate`` p99 ≤ 20 ms); :class:`NodePods` keeps them instead, with the
project's informer (:class:`tessera.kube.watch.Informer`, ``fieldSelector=spec.nodeName=<node>``:
the pods the kubelet itself watches). A choice made from memory is the one a fresh list would
give, because:

1. **The cache is one consistent moment.** The watch delivers events in ``resourceVersion``
   order, so at version V the cache holds every change of the node's pods up to V and none
   after (:meth:`tessera.kube.watch.Informer.snapshot`). A pod bound after another is never
   seen before it; and the scheduler extender binds one HAMi pod per node at a time
   (:func:`tessera.extender.legacy.allocating_pod`), so there is one candidate to see.
2. **The plugin's own writes count at once.** The reply of each write to a pod (the pod as
   the API server stored it, version W) stands for the pod until the cache reaches W
   (:meth:`NodePods.wrote`; versions of one resource are ordered numbers, KEP-5504): the next
   container of a pod, allocated right after the first, finds the first's entry erased.
3. **A pod the cache has not seen yet is waited for, then read.** The kubelet calls
   ``Allocate`` for a pod it has seen bound, and the cache may lag behind the bind: when the
   cache has no candidate, ``Allocate`` waits for the cache's next changes (at most
   ``wait_seconds``), then lists the node's pods from the API server (:meth:`NodePods.fresh`)
   and decides on that.
4. **A write that finds the pod changed reads afresh.** Every write carries the pod's
   ``resourceVersion``; a conflict (HTTP 409) makes the next try list the node's pods.

When the cache cannot answer (before its first list, or an API server whose versions are not
numbers), ``Allocate`` lists the node's pods as before.
"""

from __future__ import annotations

import threading
import time

from tessera.kube.client import KubeClient, Obj
from tessera.kube.watch import Informer, object_key, version_number

#: Seconds ``Allocate`` waits for the pod cache to show a pod bound a moment ago before it
#: lists the node's pods from the API server.
DEFAULT_WAIT_SECONDS = 1.0


class NodePods:
    """The pods whose ``spec.nodeName`` is ``node``, kept by an informer on ``client`` (or
    ``informer``, one made for this node's pods: :meth:`informer_for`), with this plugin's own
    writes (module doc). :meth:`start` starts the informer; :meth:`cached` reads it."""

    def __init__(
        self,
        client: KubeClient,
        node: str,
        *,
        informer: Informer | None = None,
        wait_seconds: float = DEFAULT_WAIT_SECONDS,
    ) -> None:
        self.client = client
        self.node = node
        self.wait_seconds = wait_seconds
        self.selector = f"spec.nodeName={node}"
        self.informer = informer if informer is not None else self.informer_for(client, node)
        self.informer.on_change = self._on_change
        self._changed = threading.Condition()
        self._wrote: dict[tuple[str, str], tuple[int, Obj]] = {}
        self._lock = threading.Lock()

    @staticmethod
    def informer_for(client: KubeClient, node: str) -> Informer:
        """An informer of the pods on ``node`` (not started)."""
        return Informer(client, "v1", "Pod", field_selector=f"spec.nodeName={node}")

    def start(self, timeout: float) -> bool:
        """Start the informer and wait up to ``timeout`` seconds for its first list; whether it
        came (until it does, :meth:`cached` is None)."""
        self.informer.start()
        return self.informer.wait_synced(timeout)

    def stop(self) -> None:
        self.informer.stop()

    def _on_change(self, _type: str, _obj: Obj) -> None:
        with self._changed:
            self._changed.notify_all()

    def fresh(self) -> list[Obj]:
        """The node's pods as the API server lists them now. Raises ``ApiError``."""
        return self.client.list("v1", "Pod", None, field_selector=self.selector)

    def cached(self) -> tuple[list[Obj], int] | None:
        """The node's pods from memory, this plugin's writes the cache has not seen yet in
        place of its copies, and the cache's generation then (for :meth:`wait`); None when the
        cache cannot answer (no first list yet, or a ``resourceVersion`` that is not a
        number). The pods are shared: do not change them."""
        if not self.informer.synced:
            return None
        generation = self.informer.generation
        pods, version = self.informer.snapshot()
        at = version_number(version)
        if at is None:
            return None
        with self._lock:
            mine: dict[tuple[str, str], Obj] = {}
            for key, (written, pod) in list(self._wrote.items()):
                if written <= at:
                    del self._wrote[key]  # the cache has this write (or what came after it)
                else:
                    mine[key] = pod
        if mine:
            pods = [mine.pop(object_key(p), p) for p in pods] + list(mine.values())
        return pods, generation

    def wait(self, generation: int, deadline: float) -> bool:
        """Wait until the cache changes after ``generation`` (:meth:`cached`'s), or until the
        ``time.monotonic()`` ``deadline``; False when the deadline came first."""
        with self._changed:
            while self.informer.generation == generation:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._changed.wait(left)
        return True

    def wrote(self, pod: Obj) -> None:
        """Record the reply of this plugin's write to one of the node's pods (the pod as the
        API server stored it): :meth:`cached` gives it until the cache has caught up with it.
        A reply whose ``resourceVersion`` is not a number is not kept."""
        written = version_number(str((pod.get("metadata") or {}).get("resourceVersion") or ""))
        if written is None:
            return
        key = object_key(pod)
        with self._lock:
            if written > self._wrote.get(key, (0, pod))[0]:
                self._wrote[key] = (written, pod)


__all__ = ["DEFAULT_WAIT_SECONDS", "NodePods"]
