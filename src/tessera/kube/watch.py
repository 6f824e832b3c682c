"""A list-and-watch cache of one kind (what client-go calls an informer), on :class:`KubeClient`.

:class:`Informer` lists the objects, then watches from the list's ``resourceVersion`` in a
background thread: ``ADDED``/``MODIFIED`` replace an object, ``DELETED`` removes it,
``BOOKMARK`` advances the version; a ``410 Gone`` (the version is too old) or any error starts
over with a fresh list after a short back-off. Readers take :meth:`Informer.items` (a snapshot)
and :attr:`Informer.generation` (bumped on every change), so derived views can be cached;
:meth:`Informer.snapshot` gives the objects with the ``resourceVersion`` they are current at.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from tessera.kube.client import ApiError, KubeClient, Obj

log = logging.getLogger(__name__)


def object_key(obj: Obj) -> tuple[str, str]:
    """``(namespace, name)`` of an object ("" for cluster-scoped)."""
    meta = obj.get("metadata") or {}
    return str(meta.get("namespace") or ""), str(meta.get("name") or "")


class Informer:
    """Keeps every object of ``kind`` in ``api_version`` (optionally in one ``namespace``, or
    matching ``label_selector`` and ``field_selector``, the API's ``labelSelector`` and
    ``fieldSelector``, e.g. ``spec.nodeName=<node>`` for the pods of one node) up to date.

    ``on_change`` (optional) is called in the watch thread after every change, with the event
    type and the object. :meth:`start` returns at once; :meth:`wait_synced` waits for the first
    list. :meth:`stop` ends the thread. ``watch_timeout`` (seconds) bounds one watch request.
    """

    def __init__(
        self,
        client: KubeClient,
        api_version: str,
        kind: str,
        *,
        namespace: str | None = None,
        label_selector: str | None = None,
        field_selector: str | None = None,
        on_change: Callable[[str, Obj], None] | None = None,
        watch_timeout: int = 300,
    ) -> None:
        self.client = client
        self.api_version = api_version
        self.kind = kind
        self.namespace = namespace
        self.label_selector = label_selector
        self.field_selector = field_selector
        self.on_change = on_change
        self.watch_timeout = watch_timeout
        self.generation = 0
        self.resource_version = ""
        self._objects: dict[tuple[str, str], Obj] = {}
        self._lock = threading.Lock()
        self._synced = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # ---- readers ------------------------------------------------------------------------
    def items(self) -> list[Obj]:
        """A snapshot of the objects (the dicts themselves are shared: do not mutate them)."""
        with self._lock:
            return list(self._objects.values())

    def snapshot(self) -> tuple[list[Obj], str]:
        """The objects (as :meth:`items`) and the ``resourceVersion`` the cache is current at,
        read together: every change up to that version is in the objects, none after it (the
        watch delivers events in ``resourceVersion`` order). ``""`` before the first list."""
        with self._lock:
            return list(self._objects.values()), self.resource_version

    def get(self, namespace: str, name: str) -> Obj | None:
        with self._lock:
            return self._objects.get((namespace, name))

    @property
    def synced(self) -> bool:
        """The first list has completed."""
        return self._synced.is_set()

    def wait_synced(self, timeout: float) -> bool:
        return self._synced.wait(timeout)

    # ---- life cycle ---------------------------------------------------------------------
    def start(self) -> Informer:
        self._thread = threading.Thread(target=self._run, name=f"informer-{self.kind}", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()

    def _run(self) -> None:
        backoff = 0.2
        while not self._stop.is_set():
            try:
                self._list()
                backoff = 0.2
                self._watch()
            except ApiError as e:
                if e.status != 410:
                    log.warning("%s informer: %s; retrying in %.1fs", self.kind, e, backoff)
            except (OSError, ValueError) as e:
                log.warning("%s informer: %s; retrying in %.1fs", self.kind, e, backoff)
            if self._stop.wait(backoff):
                return
            backoff = min(backoff * 2, 10.0)

    def _query(self) -> dict[str, str]:
        q: dict[str, str] = {}
        if self.label_selector:
            q["labelSelector"] = self.label_selector
        if self.field_selector:
            q["fieldSelector"] = self.field_selector
        return q

    def _list(self) -> None:
        path = self.client.collection_path(self.api_version, self.kind, self.namespace)
        doc = self.client.request("GET", path, query=self._query(), what=f"{self.kind} list")
        items = doc.get("items") or []
        objects = {}
        for item in items:
            item.setdefault("apiVersion", self.api_version)
            item.setdefault("kind", self.kind)
            objects[object_key(item)] = item
        with self._lock:
            self._objects = objects
            self.resource_version = str((doc.get("metadata") or {}).get("resourceVersion") or "")
            self.generation += 1
        self._synced.set()
        if self.on_change is not None:
            self.on_change("SYNC", {})

    def _watch(self) -> None:
        path = self.client.collection_path(self.api_version, self.kind, self.namespace)
        while not self._stop.is_set():
            query = {
                **self._query(),
                "watch": "1",
                "allowWatchBookmarks": "true",
                "resourceVersion": self.resource_version,
                "timeoutSeconds": str(self.watch_timeout),
            }
            with self.client.stream(path, query=query, timeout=self.watch_timeout + 30) as resp:
                while not self._stop.is_set():
                    line = resp.readline()
                    if not line:
                        break  # the server ended this watch: start the next one
                    self._event(json.loads(line))

    def _event(self, event: dict[str, Any]) -> None:
        etype = str(event.get("type") or "")
        obj = event.get("object") or {}
        if etype == "ERROR":
            raise ApiError(
                "WATCH",
                self.kind,
                int(obj.get("code") or 0),
                str(obj.get("reason") or ""),
                str(obj.get("message") or ""),
            )
        rv = str((obj.get("metadata") or {}).get("resourceVersion") or "")
        with self._lock:
            if rv:
                self.resource_version = rv
            if etype == "BOOKMARK":
                return
            obj.setdefault("apiVersion", self.api_version)
            obj.setdefault("kind", self.kind)
            if etype == "DELETED":
                self._objects.pop(object_key(obj), None)
            elif etype in ("ADDED", "MODIFIED"):
                self._objects[object_key(obj)] = obj
            else:
                return
            self.generation += 1
        if self.on_change is not None:
            self.on_change(etype, obj)


def version_number(resource_version: str) -> int | None:
    """``resource_version`` as the number the API server's versions of one resource are
    ordered by (KEP-5504 "Comparable Resource Version", GA in Kubernetes 1.35; every etcd-backed
    API server writes them so): a positive integer without leading zeros. ``None`` for anything
    else (an aggregated API's own versions, ``""``, ``"0"``): such versions compare only as
    equal or not."""
    if (
        not (resource_version.isascii() and resource_version.isdigit())
        or resource_version[0] == "0"
    ):
        return None
    return int(resource_version)


def wait_until(check: Callable[[], bool], timeout: float, interval: float = 0.05) -> bool:
    """Poll ``check`` until it is true or ``timeout`` seconds passed; return its last value."""
    deadline = time.monotonic() + timeout
    while True:
        if check():
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(interval)
