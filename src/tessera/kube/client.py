"""A small Kubernetes REST client over HTTPS (stdlib only).

It speaks to any kind the API server serves: resource names and scopes come from API
discovery (``/api/v1``, ``/apis/<group>/<version>``), objects are plain ``dict``\\ s in the
API's JSON shape (so every field of the newest API is kept, where a typed client's models drop
the fields they do not know). It covers what Tessera's tooling, tests and node driver need:
get, list (paginated), watch, create, server-side apply (also of the status subresource),
delete, status updates, access reviews and raw GETs (health endpoints).

Authentication: a client certificate, or a bearer token (given, or read from a file and
re-read as it rotates, like a projected ServiceAccount token); :meth:`KubeClient.in_cluster`
builds the client a pod gets (``KUBERNETES_SERVICE_HOST``/``_PORT``, the ServiceAccount's
token and CA).

Errors: every failed request raises :class:`ApiError` carrying the HTTP status, the
``Status.reason`` (``NotFound``, ``Invalid``, ``AlreadyExists`` ...) and the server's
message, which for validation failures names the object and the offending field.
"""

from __future__ import annotations

import base64
import binascii
import http.client
import json
import os
import select
import ssl
import threading
import urllib.parse
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from tessera.api.errors import TesseraError

Obj = dict[str, Any]
Page = list[Obj]


class KubeconfigError(TesseraError, ValueError):
    """The kubeconfig file is missing, unreadable or lacks a field this client needs."""


class ApiError(RuntimeError):
    """An API request failed.

    ``status`` is the HTTP status (0 when the server could not be reached), ``reason`` the
    ``Status.reason`` of the reply (e.g. ``NotFound``, ``Invalid``, ``AlreadyExists``,
    ``Conflict``), ``message`` the server's explanation.
    """

    def __init__(self, verb: str, what: str, status: int, reason: str, message: str) -> None:
        self.verb = verb
        self.what = what
        self.status = status
        self.reason = reason
        self.message = message
        super().__init__(f"{verb} {what}: {status} {reason}: {message}")


def api_problem(e: ApiError, server: str) -> str:
    """One line for a failed read, saying how to fix it: unreachable server, missing
    permission (the read-only ClusterRole ``deploy/rbac/tessera-reader.yaml``), other errors."""
    if e.status == 0:
        return (
            f"cannot reach the API server {server}: {e.message}: check the kubeconfig's server and that the "
            "cluster runs"
        )
    if e.status in (401, 403):
        return (
            f"the API server {server} refused {e.verb} {e.what} ({e.status} {e.reason}: {e.message}): "
            "grant the read-only ClusterRole in deploy/rbac/tessera-reader.yaml to this user or ServiceAccount"
        )
    return f"the API server {server} answered {e.verb} {e.what} with {e.status} {e.reason}: {e.message}"


@dataclass(frozen=True)
class Resource:
    """Discovery facts about one kind: its plural resource name and whether it is namespaced."""

    api_version: str
    kind: str
    plural: str
    namespaced: bool


def describe(obj: Mapping[str, Any]) -> str:
    """``Kind namespace/name`` (or ``Kind name``) for messages."""
    meta = obj.get("metadata") or {}
    name = meta.get("name") or meta.get("generateName", "<unnamed>")
    ns = meta.get("namespace")
    return f"{obj.get('kind', '<no kind>')} {ns + '/' if ns else ''}{name}"


#: Where a pod finds its ServiceAccount's token and the cluster CA (in-cluster configuration).
SERVICE_ACCOUNT_DIR = Path("/var/run/secrets/kubernetes.io/serviceaccount")


class KubeClient:
    """HTTPS client for one API server, authenticated with a client certificate or a bearer
    token.

    ``server`` is the base URL (``https://127.0.0.1:6443``); ``ca_file`` the PEM bundle
    that signed the server certificate; ``cert_file``/``key_file`` the client certificate;
    ``token`` a bearer token, or ``token_file`` a file holding one (re-read before every
    request, as projected ServiceAccount tokens are rotated).
    Thread-safe. A GET or HEAD reuses an idle kept-alive connection of an earlier request
    (at most :attr:`MAX_IDLE` are kept) and, when that connection turns out closed by the
    server (any failure but a timeout), is sent once more on a new one; every other verb opens its own connection, so a
    write is never sent twice. A write whose caller waits on it (``request(..., kept=True)``)
    takes a kept connection the server has not closed (nothing to read on its socket: the
    server sends nothing unasked but the end of the connection), and is still sent once: a
    failure is its error. ``timeout`` is per request, seconds.
    """

    #: Idle connections kept for reuse (one TLS handshake saved per GET).
    MAX_IDLE = 16
    #: The verbs sent on a kept connection (replayable: sending one twice changes nothing).
    REUSE_VERBS = frozenset({"GET", "HEAD"})

    def __init__(
        self,
        server: str,
        *,
        ca_file: Path | None = None,
        ca_data: bytes | None = None,
        cert_file: Path | None = None,
        key_file: Path | None = None,
        cert_data: bytes | None = None,
        key_data: bytes | None = None,
        token: str | None = None,
        token_file: Path | None = None,
        timeout: float = 30.0,
    ) -> None:
        url = urllib.parse.urlsplit(server)
        if url.scheme != "https" or not url.hostname:
            raise KubeconfigError(f"server {server!r}: must be an https:// URL with a host")
        self.server = server.rstrip("/")
        self._host = url.hostname
        self._port = url.port or 443
        self._prefix = url.path.rstrip("/")
        self.timeout = timeout
        ctx = ssl.create_default_context(ssl.Purpose.SERVER_AUTH)
        if ca_file is not None:
            ctx.load_verify_locations(cafile=str(ca_file))
        if ca_data is not None:
            ctx.load_verify_locations(cadata=ca_data.decode())
        if cert_file is not None and key_file is not None:
            ctx.load_cert_chain(str(cert_file), str(key_file))
        elif cert_data is not None and key_data is not None:
            load_cert_chain_data(ctx, cert_data, key_data)
        self._ssl = ctx
        self._token = token
        self._token_file = token_file
        self._discovery: dict[str, dict[str, Resource]] = {}
        self._lock = threading.Lock()
        self._idle: list[http.client.HTTPSConnection] = []
        self._idle_lock = threading.Lock()
        self._idle_pid = os.getpid()

    # ---- construction -----------------------------------------------------------------
    @classmethod
    def from_kubeconfig(cls, path: Path, *, timeout: float = 30.0) -> KubeClient:
        """Build a client from the current context of a kubeconfig file.

        Supports ``certificate-authority(-data)`` and ``client-certificate(-data)`` /
        ``client-key(-data)``. Raises :class:`KubeconfigError` naming the missing field.
        """
        try:
            cfg = yaml.safe_load(Path(path).read_text())
        except OSError as e:
            raise KubeconfigError(f"kubeconfig {path}: cannot read: {e}") from e
        if not isinstance(cfg, dict):
            raise KubeconfigError(f"kubeconfig {path}: not a YAML mapping")
        ctx_name = cfg.get("current-context")

        def pick(section: str, name: str | None) -> dict[str, Any]:
            for entry in cfg.get(section) or []:
                if name is None or entry.get("name") == name:
                    return dict(entry.get(section[:-1]) or {})
            raise KubeconfigError(f"kubeconfig {path}: {section}: no entry named {name!r}")

        context = pick("contexts", ctx_name)
        cluster = pick("clusters", context.get("cluster"))
        user = pick("users", context.get("user"))
        base = Path(path).parent

        def rel(p: str | None) -> Path | None:
            return None if p is None else (base / p if not os.path.isabs(p) else Path(p))

        def b64(v: str | None) -> bytes | None:
            return None if v is None else base64.b64decode(v)

        if "server" not in cluster:
            raise KubeconfigError(
                f"kubeconfig {path}: clusters[{context.get('cluster')}].server is missing"
            )
        for unsupported in ("exec", "auth-provider"):
            if user.get(unsupported):
                raise KubeconfigError(
                    f"kubeconfig {path}: users[{context.get('user')}].{unsupported} is not supported: "
                    "use a kubeconfig with a client certificate or a (ServiceAccount) token"
                )
        try:
            return cls(
                cluster["server"],
                ca_file=rel(cluster.get("certificate-authority")),
                ca_data=b64(cluster.get("certificate-authority-data")),
                cert_file=rel(user.get("client-certificate")),
                key_file=rel(user.get("client-key")),
                cert_data=b64(user.get("client-certificate-data")),
                key_data=b64(user.get("client-key-data")),
                token=user.get("token"),
                token_file=rel(user.get("tokenFile")),
                timeout=timeout,
            )
        except (OSError, ssl.SSLError, binascii.Error) as e:
            raise KubeconfigError(
                f"kubeconfig {path}: cannot load its certificates or key: {e}"
            ) from e

    @classmethod
    def in_cluster(cls, *, timeout: float = 30.0, sa_dir: Path = SERVICE_ACCOUNT_DIR) -> KubeClient:
        """The client a pod uses: ``KUBERNETES_SERVICE_HOST``/``_PORT`` and the pod's
        ServiceAccount token and CA under ``sa_dir``. Raises :class:`KubeconfigError` when
        not running in a pod."""
        host = os.environ.get("KUBERNETES_SERVICE_HOST")
        port = os.environ.get("KUBERNETES_SERVICE_PORT", "443")
        token_file = sa_dir / "token"
        if not host or not token_file.is_file():
            raise KubeconfigError(
                "not running in a pod (no KUBERNETES_SERVICE_HOST or no ServiceAccount token in "
                f"{sa_dir}): give --kubeconfig FILE"
            )
        if ":" in host:
            host = f"[{host}]"
        return cls(
            f"https://{host}:{port}",
            ca_file=sa_dir / "ca.crt",
            token_file=token_file,
            timeout=timeout,
        )

    # ---- raw requests -----------------------------------------------------------------
    def request(
        self,
        verb: str,
        path: str,
        *,
        body: Any = None,
        content_type: str = "application/json",
        query: Mapping[str, str] | None = None,
        what: str | None = None,
        timeout: float | None = None,
        kept: bool = False,
    ) -> Any:
        """Send one request; return the decoded JSON reply (or text for non-JSON replies).

        ``path`` is the URL path below the server (``/api/v1/nodes``); ``kept``: a write goes
        on a kept connection the server has not closed, when there is one (the class doc; a
        GET or HEAD always does). Raises :class:`ApiError` for HTTP status >= 400 or when the
        server cannot be reached.
        """
        url = self._prefix + path
        if query:
            url += "?" + urllib.parse.urlencode(query)
        # Go's compact form with sorted keys: the API server keeps the bytes of a RawExtension
        # (opaque device parameters) as sent and compares them byte for byte with the re-encoded
        # object when an immutable spec is updated, so other spacing or key order makes a later metadata
        # patch of a ResourceClaimTemplate "field is immutable".
        data = (
            None
            if body is None
            else json.dumps(body, separators=(",", ":"), sort_keys=True).encode()
        )
        headers = {"Accept": "application/json"}
        token = self._bearer_token()
        if token:
            headers["Authorization"] = f"Bearer {token}"
        if data is not None:
            headers["Content-Type"] = content_type
        seconds = timeout or self.timeout
        replayable = verb in self.REUSE_VERBS
        conn = self._kept(seconds, open_only=not replayable) if replayable or kept else None
        while True:
            reused = conn is not None
            if conn is None:
                conn = http.client.HTTPSConnection(
                    self._host, self._port, context=self._ssl, timeout=seconds
                )
            try:
                conn.request(verb, url, body=data, headers=headers)
                resp = conn.getresponse()
                raw = resp.read()
            except (OSError, http.client.HTTPException) as e:
                conn.close()
                conn = None
                if reused and replayable and not isinstance(e, TimeoutError):
                    continue  # closed by the server while idle: once more, on a new connection
                raise ApiError(verb, what or path, 0, "Unreachable", f"{self.server}: {e}") from e
            self._keep(conn, resp)
            break
        text = raw.decode(errors="replace")
        try:
            payload: Any = json.loads(text) if text else None
        except json.JSONDecodeError:
            payload = text
        if resp.status >= 400:
            if isinstance(payload, dict) and payload.get("kind") == "Status":
                raise ApiError(
                    verb,
                    what or path,
                    resp.status,
                    payload.get("reason", ""),
                    payload.get("message", ""),
                )
            raise ApiError(verb, what or path, resp.status, resp.reason, text.strip()[:2000])
        return payload

    def _kept(
        self, timeout: float, *, open_only: bool = False
    ) -> http.client.HTTPSConnection | None:
        """An idle kept connection (its timeout set to ``timeout`` seconds), or None;
        ``open_only``: one the server has not closed (others are closed and dropped)."""
        while True:
            with self._idle_lock:
                if self._idle_pid != os.getpid():  # a forked child: not its TLS state
                    self._idle, self._idle_pid = [], os.getpid()
                conn = self._idle.pop() if self._idle else None
            if conn is None or not open_only or not _closed_by_peer(conn):
                break
            conn.close()
        if conn is not None:
            conn.timeout = timeout
            if conn.sock is not None:
                conn.sock.settimeout(timeout)
        return conn

    def _keep(self, conn: http.client.HTTPSConnection, resp: http.client.HTTPResponse) -> None:
        """Keep ``conn`` for a later GET when the server left it open, else close it."""
        if resp.will_close or conn.sock is None:
            conn.close()
            return
        with self._idle_lock:
            if len(self._idle) < self.MAX_IDLE and self._idle_pid == os.getpid():
                self._idle.append(conn)
                return
        conn.close()

    def close(self) -> None:
        """Close the kept idle connections (the client stays usable)."""
        with self._idle_lock:
            idle, self._idle = self._idle, []
        for conn in idle:
            conn.close()

    def _bearer_token(self) -> str | None:
        if self._token_file is not None:
            try:
                return self._token_file.read_text().strip()
            except OSError as e:
                raise ApiError(
                    "read",
                    str(self._token_file),
                    0,
                    "Unauthorized",
                    f"cannot read the token file: {e}",
                ) from e
        return self._token

    # ---- discovery --------------------------------------------------------------------
    def resource(self, api_version: str, kind: str) -> Resource:
        """Discovery lookup for ``kind`` in ``api_version``.

        Raises :class:`ApiError` (reason ``NotFound``) if the API server does not serve it.
        """
        with self._lock:
            table = self._discovery.get(api_version)
        if table is None:
            path = "/api/v1" if api_version == "v1" else f"/apis/{api_version}"
            doc = self.request("GET", path, what=f"API group version {api_version}")
            table = {}
            for r in doc.get("resources", []):
                if "/" in r["name"]:
                    continue  # subresource
                table[r["kind"]] = Resource(
                    api_version, r["kind"], r["name"], bool(r["namespaced"])
                )
            with self._lock:
                self._discovery[api_version] = table
        if kind not in table:
            raise ApiError(
                "discover",
                f"{kind} in {api_version}",
                404,
                "NotFound",
                f"the API server does not serve kind {kind} in {api_version}; served kinds: {', '.join(sorted(table))}",
            )
        return table[kind]

    def _path(self, res: Resource, namespace: str | None, name: str | None = None) -> str:
        base = "/api/v1" if res.api_version == "v1" else f"/apis/{res.api_version}"
        if res.namespaced:
            if not namespace:
                raise ValueError(f"{res.kind} is namespaced: give a namespace")
            base += f"/namespaces/{namespace}"
        base += f"/{res.plural}"
        return base + (f"/{name}" if name else "")

    def _obj_path(self, obj: Mapping[str, Any], with_name: bool = True) -> str:
        try:
            api_version, kind = obj["apiVersion"], obj["kind"]
        except KeyError as e:
            raise ValueError(f"{describe(obj)}: field {e.args[0]} is missing") from None
        res = self.resource(api_version, kind)
        meta = obj.get("metadata") or {}
        ns = meta.get("namespace") or ("default" if res.namespaced else None)
        name = meta.get("name") if with_name else None
        if with_name and not name:
            raise ValueError(f"{describe(obj)}: metadata.name is missing")
        return self._path(res, ns, name)

    # ---- verbs ------------------------------------------------------------------------
    def get(self, api_version: str, kind: str, name: str, namespace: str | None = None) -> Obj:
        """GET one object. Raises :class:`ApiError` (status 404) if it does not exist."""
        res = self.resource(api_version, kind)
        ns = namespace or ("default" if res.namespaced else None)
        return self.request(
            "GET",
            self._path(res, ns, name),
            what=f"{kind} {ns + '/' if ns and res.namespaced else ''}{name}",
        )

    def list(
        self,
        api_version: str,
        kind: str,
        namespace: str | None = None,
        *,
        label_selector: str | None = None,
        field_selector: str | None = None,
        page_size: int | None = 500,
    ) -> list[Obj]:
        """List objects (all namespaces when ``namespace`` is None for a namespaced kind),
        following ``continue`` tokens in pages of ``page_size`` (None: one request)."""
        res = self.resource(api_version, kind)
        base = "/api/v1" if api_version == "v1" else f"/apis/{api_version}"
        path = (
            f"{base}/namespaces/{namespace}/{res.plural}"
            if res.namespaced and namespace
            else f"{base}/{res.plural}"
        )
        query = {}
        if label_selector:
            query["labelSelector"] = label_selector
        if field_selector:
            query["fieldSelector"] = field_selector
        if page_size:
            query["limit"] = str(page_size)
        items: list[Obj] = []
        while True:
            doc = self.request("GET", path, query=query, what=f"{kind} list")
            items.extend(doc.get("items") or [])
            cont = (doc.get("metadata") or {}).get("continue")
            if not cont:
                break
            query["continue"] = cont
        for item in items:  # list items carry no apiVersion/kind
            item.setdefault("apiVersion", api_version)
            item.setdefault("kind", kind)
        return items

    def list_pages(
        self,
        api_version: str,
        kind: str,
        namespace: str | None = None,
        *,
        limit: int = 500,
        field_selector: str | None = None,
    ) -> Iterator[Page]:
        """List objects a page of at most ``limit`` at a time (the API's ``limit``/``continue``
        chunking), all namespaces when ``namespace`` is None. Yields each page's items (with
        apiVersion/kind set). An expired continue token raises :class:`ApiError` (410)."""
        res = self.resource(api_version, kind)
        base = "/api/v1" if api_version == "v1" else f"/apis/{api_version}"
        path = (
            f"{base}/namespaces/{namespace}/{res.plural}"
            if res.namespaced and namespace
            else f"{base}/{res.plural}"
        )
        cont = ""
        while True:
            query = {"limit": str(limit)}
            if cont:
                query["continue"] = cont
            if field_selector:
                query["fieldSelector"] = field_selector
            doc = self.request("GET", path, query=query, what=f"{kind} list")
            items: Page = doc.get("items") or []
            for item in items:
                item.setdefault("apiVersion", api_version)
                item.setdefault("kind", kind)
            yield items
            cont = (doc.get("metadata") or {}).get("continue") or ""
            if not cont:
                return

    def watch(
        self,
        api_version: str,
        kind: str,
        namespace: str | None = None,
        *,
        resource_version: str | None = None,
        field_selector: str | None = None,
        label_selector: str | None = None,
        timeout_seconds: int = 300,
    ) -> Iterator[tuple[str, Obj]]:
        """Watch objects: yields ``(type, object)`` for each event (``ADDED``, ``MODIFIED``,
        ``DELETED``, ``BOOKMARK``) until the server ends the watch (after about
        ``timeout_seconds``). A watch that expired raises :class:`ApiError` with status 410
        (list again, then watch from the list's resourceVersion)."""
        res = self.resource(api_version, kind)
        base = "/api/v1" if api_version == "v1" else f"/apis/{api_version}"
        path = (
            f"{base}/namespaces/{namespace}/{res.plural}"
            if res.namespaced and namespace
            else f"{base}/{res.plural}"
        )
        query = {
            "watch": "1",
            "timeoutSeconds": str(timeout_seconds),
            "allowWatchBookmarks": "true",
        }
        if resource_version:
            query["resourceVersion"] = resource_version
        if field_selector:
            query["fieldSelector"] = field_selector
        if label_selector:
            query["labelSelector"] = label_selector
        headers = {"Accept": "application/json"}
        bearer = self._bearer_token()
        if bearer:
            headers["Authorization"] = f"Bearer {bearer}"
        conn = http.client.HTTPSConnection(
            self._host, self._port, context=self._ssl, timeout=timeout_seconds + 30
        )
        try:
            try:
                conn.request(
                    "GET",
                    self._prefix + path + "?" + urllib.parse.urlencode(query),
                    headers=headers,
                )
                resp = conn.getresponse()
            except (OSError, http.client.HTTPException) as e:
                raise ApiError(
                    "WATCH", f"{kind} list", 0, "Unreachable", f"{self.server}: {e}"
                ) from e
            if resp.status >= 400:
                text = resp.read().decode(errors="replace")
                try:
                    st = json.loads(text)
                except json.JSONDecodeError:
                    st = {}
                raise ApiError(
                    "WATCH",
                    f"{kind} list",
                    resp.status,
                    st.get("reason", resp.reason),
                    st.get("message", text[:500]),
                )
            while True:
                try:
                    line = resp.readline()
                except (OSError, http.client.HTTPException):
                    return
                if not line:
                    return
                if not line.strip():
                    continue
                ev = json.loads(line)
                obj = ev.get("object") or {}
                if ev.get("type") == "ERROR":
                    raise ApiError(
                        "WATCH",
                        f"{kind} list",
                        int(obj.get("code", 500)),
                        obj.get("reason", ""),
                        obj.get("message", ""),
                    )
                obj.setdefault("apiVersion", api_version)
                obj.setdefault("kind", kind)
                yield ev.get("type", ""), obj
        finally:
            conn.close()

    def create(self, obj: Mapping[str, Any]) -> Obj:
        """POST ``obj``; return the stored object. ``AlreadyExists`` raises :class:`ApiError`."""
        path = self._obj_path(obj, with_name=False)
        return self.request("POST", path, body=obj, what=describe(obj))

    def apply(
        self, obj: Mapping[str, Any], *, field_manager: str = "tessera", force: bool = True
    ) -> Obj:
        """Server-side apply ``obj`` (create or update); return the stored object."""
        path = self._obj_path(obj)
        query = {"fieldManager": field_manager}
        if force:
            query["force"] = "true"
        return self.request(
            "PATCH",
            path,
            body=obj,
            content_type="application/apply-patch+yaml",
            query=query,
            what=describe(obj),
        )

    def apply_status(
        self, obj: Mapping[str, Any], *, field_manager: str = "tessera", force: bool = True
    ) -> Obj:
        """Server-side apply ``obj`` to the ``status`` subresource (list-map entries of other
        field managers are kept, e.g. other drivers' ``ResourceClaim.status.devices``)."""
        path = self._obj_path(obj)
        query = {"fieldManager": field_manager}
        if force:
            query["force"] = "true"
        return self.request(
            "PATCH",
            path + "/status",
            body=obj,
            content_type="application/apply-patch+yaml",
            query=query,
            what=describe(obj) + " status",
        )

    def allowed(
        self,
        verb: str,
        resource: str,
        *,
        group: str = "",
        subresource: str = "",
        namespace: str = "",
        name: str = "",
    ) -> tuple[bool, str]:
        """Ask the API server whether this client may ``verb`` the ``resource``
        (SelfSubjectAccessReview). Returns ``(allowed, reason)``."""
        attrs = {"verb": verb, "resource": resource, "group": group}
        if subresource:
            attrs["subresource"] = subresource
        if namespace:
            attrs["namespace"] = namespace
        if name:
            attrs["name"] = name
        review = self.request(
            "POST",
            "/apis/authorization.k8s.io/v1/selfsubjectaccessreviews",
            body={
                "apiVersion": "authorization.k8s.io/v1",
                "kind": "SelfSubjectAccessReview",
                "spec": {"resourceAttributes": attrs},
            },
            what=f"access review {verb} {resource}",
        )
        st = review.get("status") or {}
        return bool(st.get("allowed")), str(st.get("reason") or st.get("evaluationError") or "")

    def update_status(self, obj: Mapping[str, Any]) -> Obj:
        """PUT the ``status`` subresource with ``obj`` (which must carry a resourceVersion)."""
        path = self._obj_path(obj)
        return self.request("PUT", path + "/status", body=obj, what=describe(obj) + " status")

    def patch_status(self, obj: Mapping[str, Any], patch: Mapping[str, Any]) -> Obj:
        """JSON-merge-patch the ``status`` subresource of ``obj`` (identified by kind/name)."""
        path = self._obj_path(obj)
        return self.request(
            "PATCH",
            path + "/status",
            body=patch,
            content_type="application/merge-patch+json",
            what=describe(obj) + " status",
        )

    def delete(
        self,
        api_version: str,
        kind: str,
        name: str,
        namespace: str | None = None,
        *,
        missing_ok: bool = True,
    ) -> None:
        """DELETE one object; a missing object is fine unless ``missing_ok`` is False."""
        res = self.resource(api_version, kind)
        ns = namespace or ("default" if res.namespaced else None)
        try:
            self.request("DELETE", self._path(res, ns, name), what=f"{kind} {name}")
        except ApiError as e:
            if not (missing_ok and e.status == 404):
                raise

    @contextmanager
    def stream(
        self, path: str, *, query: Mapping[str, str] | None = None, timeout: float | None = None
    ) -> Iterator[http.client.HTTPResponse]:
        """GET ``path`` and yield the open response, for a watch (``?watch=1``): read it line
        by line (one JSON event per line). Raises :class:`ApiError` for status >= 400 or an
        unreachable server; the connection is closed on exit."""
        url = self._prefix + path + ("?" + urllib.parse.urlencode(query) if query else "")
        headers = {"Accept": "application/json"}
        token = self._bearer_token()
        if token:
            headers["Authorization"] = f"Bearer {token}"
        conn = http.client.HTTPSConnection(
            self._host, self._port, context=self._ssl, timeout=timeout or self.timeout
        )
        try:
            try:
                conn.request("GET", url, headers=headers)
                resp = conn.getresponse()
            except (OSError, http.client.HTTPException) as e:
                raise ApiError("GET", path, 0, "Unreachable", f"{self.server}: {e}") from e
            if resp.status >= 400:
                text = resp.read().decode(errors="replace")
                try:
                    payload = json.loads(text)
                except json.JSONDecodeError:
                    payload = None
                if isinstance(payload, dict) and payload.get("kind") == "Status":
                    raise ApiError(
                        "GET",
                        path,
                        resp.status,
                        payload.get("reason", ""),
                        payload.get("message", ""),
                    )
                raise ApiError("GET", path, resp.status, resp.reason, text.strip()[:2000])
            yield resp
        finally:
            conn.close()

    def collection_path(self, api_version: str, kind: str, namespace: str | None = None) -> str:
        """The URL path of a kind's collection (all namespaces when ``namespace`` is None)."""
        res = self.resource(api_version, kind)
        base = "/api/v1" if api_version == "v1" else f"/apis/{api_version}"
        return (
            f"{base}/namespaces/{namespace}/{res.plural}"
            if res.namespaced and namespace
            else f"{base}/{res.plural}"
        )

    def raw_get(self, path: str, *, timeout: float | None = None) -> Any:
        """GET an arbitrary path (``/readyz``, ``/version``); JSON decoded or text."""
        return self.request("GET", path, timeout=timeout)


def _closed_by_peer(conn: http.client.HTTPConnection) -> bool:
    """Whether an idle kept connection has something to read: the server closed it (an idle
    HTTP/1.1 connection gets nothing else), or it is in a state no request should be sent in."""
    sock = conn.sock
    if sock is None:
        return True
    poller = select.poll()
    poller.register(sock, select.POLLIN | select.POLLPRI)
    return bool(poller.poll(0))


def load_cert_chain_data(ctx: ssl.SSLContext, cert: bytes, key: bytes) -> None:
    """Load a PEM certificate chain and its private key given as bytes into ``ctx``.

    ``ssl`` loads a certificate chain only from file paths; the bytes go to anonymous
    in-memory files (``memfd_create``, read back through ``/proc/self/fd``), so nothing is
    written to a file system: a container with a read-only root and no ``/tmp`` loads them the
    same. Raises ``ssl.SSLError`` (not PEM, or the key does not match) or ``OSError``.
    """
    fds: list[int] = []
    try:
        paths = []
        for name, data in (("tls.crt", cert), ("tls.key", key)):
            fd = os.memfd_create(name, os.MFD_CLOEXEC)
            fds.append(fd)
            os.write(fd, data)
            paths.append(f"/proc/self/fd/{fd}")
        ctx.load_cert_chain(paths[0], paths[1])
    finally:
        for fd in fds:
            os.close(fd)
