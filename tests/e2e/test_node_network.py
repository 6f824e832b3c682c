"""The real node's network gives a Helm chart what a real cluster gives it, on this host only.

* a pod reaches the API server through the ``kubernetes`` Service (``KUBERNETES_SERVICE_HOST``
  and ``_PORT``, its ServiceAccount token), as a chart's in-cluster clients do;
* the API server calls a mutating webhook behind a Service (``clientConfig.service``);
* a ClusterIP Service answers from the host and from another pod, a NodePort on the bridge
  address;
* nothing for the service or pod range leaves this host: the routes say so, and the guard
  table's egress counters stay 0 after traffic to a real ClusterIP, an unallocated one, a
  pod and an unallocated pod address, from the host and from a pod.

Every address is checked with ``ip route get`` before the host sends anything to it.
Needs root (marker ``node``); one kubelet per machine.
"""

from __future__ import annotations

import base64
import contextlib
import http.server
import ipaddress
import json
import shutil
import socket
import ssl
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, ClassVar

import pytest

from tessera.kube.client import ApiError
from tessera.kube.workloads import wait_for, wait_pod_running
from tessera.localcluster.nodenet import (
    BRIDGE,
    BRIDGE_ADDRESS,
    GUARD_TABLE,
    POD_RANGE,
    POD_SUBNET,
    SERVICE_RANGE,
    guard_counters,
)
from tessera.localcluster.pki import KUBERNETES_SERVICE_IP, make_serving_certificate

from .conftest import LiveNode

pytestmark = [pytest.mark.cluster, pytest.mark.node]

#: In the service range, allocated to nothing (the allocator picks from the start of the range).
UNALLOCATED_CLUSTER_IP = "10.96.250.250"
#: On the pods' subnet, with no pod (host-local hands out addresses from the start).
UNUSED_POD_IP = "10.213.0.250"
#: In the pod range, outside the node's subnet: unreachable.
OUTSIDE_POD_SUBNET = "10.213.7.7"
HTTP_PORT = 8080


def route_of(address: str) -> dict[str, Any]:
    """``ip -j route get ADDRESS`` (first entry); ``{"error": ...}`` when there is no route."""
    ip = shutil.which("ip") or shutil.which("ip", path="/usr/sbin:/sbin")
    assert ip is not None
    proc = subprocess.run(
        [ip, "-j", "route", "get", address], capture_output=True, text=True, check=False
    )
    if proc.returncode != 0:
        return {"error": proc.stderr.strip()}
    return json.loads(proc.stdout)[0]


def host_addresses() -> set[str]:
    ip = shutil.which("ip") or shutil.which("ip", path="/usr/sbin:/sbin")
    assert ip is not None
    links = json.loads(
        subprocess.run([ip, "-j", "addr"], capture_output=True, text=True, check=True).stdout
    )
    return {a["local"] for link in links for a in link.get("addr_info") or []}


def stays_here(address: str) -> None:
    """Fail before sending when a packet from this host to ``address`` could leave it: its
    route must be the bridge, loopback, or unreachable."""
    r = route_of(address)
    if "error" in r:
        assert "No route to host" in r["error"] or "unreachable" in r["error"].lower(), r
        return
    assert r.get("dev") in (BRIDGE, "lo"), f"{address} would leave by {r}: not sending"


def connect(address: str, port: int, timeout: float = 3.0) -> str:
    """Open a TCP connection from the host (after :func:`stays_here`); the outcome in words."""
    stays_here(address)
    with socket.socket() as s:
        s.settimeout(timeout)
        try:
            s.connect((address, port))
        except TimeoutError:
            return "timed out"
        except OSError as e:
            return e.strerror or str(e)
    return "connected"


def http_get(address: str, port: int, path: str = "/", timeout: float = 10.0) -> str:
    stays_here(address)
    with socket.create_connection((address, port), timeout=timeout) as s:
        s.sendall(f"GET {path} HTTP/1.0\r\nHost: {address}\r\n\r\n".encode())
        data = b""
        while chunk := s.recv(65536):
            data += chunk
    head, _, body = data.decode(errors="replace").partition("\r\n\r\n")
    assert head.startswith("HTTP/1.") and " 200 " in head.splitlines()[0], head
    return body


def pod(name: str, namespace: str, image: str, script: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace, "labels": {"app": name}},
        "spec": {
            "terminationGracePeriodSeconds": 1,
            "containers": [
                {
                    "name": "main",
                    "image": image,
                    "imagePullPolicy": "Never",
                    "command": ["sh", "-c", script],
                }
            ],
        },
    }


@pytest.fixture(scope="module")
def net_image(kube_node: LiveNode) -> str:
    """busybox (sh, wget, httpd, nc, timeout; its ``wget -T`` crashes: ``timeout`` instead), the host's ``openssl`` with its libraries, and a page
    for httpd to serve. busybox's own TLS gets "alert code 40: handshake failure" from
    kube-apiserver v1.37.2 (seen here); with ``openssl`` on the PATH, busybox's wget runs
    ``openssl s_client`` for https instead, as it does on the host."""  # noqa: E501
    openssl = shutil.which("openssl")
    assert openssl is not None, "openssl not found (apt-get install openssl)"
    return kube_node.image(
        "net-probe",
        {"/www/index.html": b"served by a pod\n", "/usr/bin/openssl": Path(openssl)},
        libraries_for=["/usr/bin/openssl"],
    ).ref


@pytest.fixture
def web(kube_node: LiveNode, node_namespace: str, net_image: str) -> dict[str, Any]:
    """A pod serving ``/www`` on port 8080 behind a ClusterIP Service (port 80) and a
    NodePort; returns the Service once the host reaches it."""
    client = kube_node.client
    client.create(pod("web", node_namespace, net_image, f"exec httpd -f -v -p {HTTP_PORT} -h /www"))
    client.create(
        {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": {"name": "web", "namespace": node_namespace},
            "spec": {
                "type": "NodePort",
                "selector": {"app": "web"},
                "ports": [{"port": 80, "targetPort": HTTP_PORT, "protocol": "TCP"}],
            },
        }
    )
    wait_pod_running(client, "web", node_namespace)

    def ready() -> dict[str, Any] | None:
        slices = client.list(
            "discovery.k8s.io/v1",
            "EndpointSlice",
            node_namespace,
            label_selector="kubernetes.io/service-name=web",
        )
        ok = any(
            (e.get("conditions") or {}).get("ready")
            for s in slices
            for e in s.get("endpoints") or []
        )
        return client.get("v1", "Service", "web", node_namespace) if ok else None

    service = wait_for(ready, timeout=60, what="an endpoint for Service web")
    # kube-proxy syncs its rules at most once a second (minSyncPeriod): the endpoint is in
    # its rules a moment after it is in the EndpointSlice.
    wait_for(
        lambda: True if connect(service["spec"]["clusterIP"], 80) == "connected" else None,
        timeout=30,
        interval=0.5,
        what="kube-proxy's rules for Service web",
    )
    return service


def sleeper(kube_node: LiveNode, namespace: str, image: str, name: str = "client") -> str:
    kube_node.client.create(pod(name, namespace, image, "exec sleep 3600"))
    wait_pod_running(kube_node.client, name, namespace)
    return name


def in_pod(kube_node: LiveNode, name: str, namespace: str, script: str) -> tuple[int, str]:
    """Run ``sh -c script`` in the pod; (exit status, stdout and stderr)."""
    proc = kube_node.kubectl(
        "exec", "-n", namespace, name, "--", "sh", "-c", script, check=False, timeout=60
    )
    return proc.returncode, proc.stdout + proc.stderr


def test_routes_keep_both_ranges_on_this_host(kube_node: LiveNode) -> None:
    """The service range goes to the bridge with the bridge address as source, the pods'
    subnet is on the bridge, the rest of the pod range is unreachable; the guard table is
    in place."""
    for address in (KUBERNETES_SERVICE_IP, UNALLOCATED_CLUSTER_IP):
        r = route_of(address)
        assert r["dev"] == BRIDGE and r["prefsrc"] == BRIDGE_ADDRESS, r
    assert route_of(UNUSED_POD_IP)["dev"] == BRIDGE
    assert "No route to host" in route_of(OUTSIDE_POD_SUBNET)["error"]
    assert ipaddress.ip_address(UNUSED_POD_IP) in ipaddress.ip_network(POD_SUBNET)
    assert ipaddress.ip_address(OUTSIDE_POD_SUBNET) in ipaddress.ip_network(POD_RANGE)
    assert ipaddress.ip_address(UNALLOCATED_CLUSTER_IP) in ipaddress.ip_network(SERVICE_RANGE)
    counters = guard_counters()
    assert {k for k in counters if k.startswith("egress-")} == {
        "egress-output",
        "egress-postrouting",
        "egress-postrouting-dnat",
        "egress-forward",
    }, f"guard table {GUARD_TABLE} incomplete: {counters}"
    # The kubernetes Service's endpoint is the API server at the bridge address.
    ep = kube_node.client.get("v1", "Endpoints", "kubernetes", "default")
    addresses = [a["ip"] for s in ep["subsets"] for a in s["addresses"]]
    assert addresses == [BRIDGE_ADDRESS], ep
    node = kube_node.client.get("v1", "Node", kube_node.name)
    internal = [a["address"] for a in node["status"]["addresses"] if a["type"] == "InternalIP"]
    assert internal == [BRIDGE_ADDRESS]


def test_a_pod_reaches_the_api_server_through_the_kubernetes_service(
    kube_node: LiveNode, node_namespace: str, net_image: str
) -> None:
    """As an in-cluster client: KUBERNETES_SERVICE_HOST:PORT (10.96.0.1:443), TLS, the
    pod's ServiceAccount token; the API server says who the token is."""
    name = sleeper(kube_node, node_namespace, net_image)
    code, env = in_pod(
        kube_node, name, node_namespace, 'echo "$KUBERNETES_SERVICE_HOST:$KUBERNETES_SERVICE_PORT"'
    )
    assert code == 0 and env.strip() == f"{KUBERNETES_SERVICE_IP}:443", env
    review = json.dumps(
        {"apiVersion": "authentication.k8s.io/v1", "kind": "SelfSubjectReview", "metadata": {}}
    )
    sa = "/var/run/secrets/kubernetes.io/serviceaccount"
    code, out = in_pod(
        kube_node,
        name,
        node_namespace,
        f"wget -q -O - --no-check-certificate "
        f'--header "Authorization: Bearer $(cat {sa}/token)" '
        f'--header "Content-Type: application/json" '
        f"--post-data '{review}' "
        f"https://$KUBERNETES_SERVICE_HOST:$KUBERNETES_SERVICE_PORT/apis/authentication.k8s.io/v1/selfsubjectreviews",
    )
    assert code == 0, out
    user = json.loads(out)["status"]["userInfo"]
    assert user["username"] == f"system:serviceaccount:{node_namespace}:default", user


def test_a_cluster_ip_service_answers_the_host_and_pods(
    kube_node: LiveNode, node_namespace: str, net_image: str, web: dict[str, Any]
) -> None:
    """kube-proxy's rules: host -> ClusterIP -> pod (the path of the API server to a
    webhook pod), pod -> ClusterIP -> another pod (forwarded on the bridge), and the
    NodePort on the bridge address."""
    cluster_ip = web["spec"]["clusterIP"]
    node_port = web["spec"]["ports"][0]["nodePort"]
    assert http_get(cluster_ip, 80) == "served by a pod\n"
    assert http_get(BRIDGE_ADDRESS, node_port) == "served by a pod\n"
    name = sleeper(kube_node, node_namespace, net_image)
    code, out = in_pod(
        kube_node, name, node_namespace, f"timeout 10 wget -q -O - http://{cluster_ip}/"
    )
    assert (code, out) == (0, "served by a pod\n")


class _Webhook(http.server.BaseHTTPRequestHandler):
    """Answers every AdmissionReview with a patch adding a label; records each request."""

    seen: ClassVar[list[dict[str, Any]]] = []

    def do_POST(self) -> None:
        review = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        self.seen.append({"peer": self.client_address[0], "request": review["request"]})
        patch = [{"op": "add", "path": "/metadata/labels", "value": {"webhook": "via-service"}}]
        body = json.dumps(
            {
                "apiVersion": "admission.k8s.io/v1",
                "kind": "AdmissionReview",
                "response": {
                    "uid": review["request"]["uid"],
                    "allowed": True,
                    "patchType": "JSONPatch",
                    "patch": base64.b64encode(json.dumps(patch).encode()).decode(),
                },
            }
        ).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: Any) -> None:
        pass


@contextlib.contextmanager
def webhook_server(cert: Path, key: Path) -> Iterator[tuple[int, list[dict[str, Any]]]]:
    """An HTTPS webhook on the bridge address (a Service endpoint, as a pod's would be)."""
    seen: list[dict[str, Any]] = []
    handler = type("Handler", (_Webhook,), {"seen": seen})
    server = http.server.ThreadingHTTPServer((BRIDGE_ADDRESS, 0), handler)
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(cert, key)
    server.socket = ctx.wrap_socket(server.socket, server_side=True)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server.server_address[1], seen
    finally:
        server.shutdown()
        server.server_close()


def test_the_api_server_calls_a_webhook_behind_a_service(
    kube_node: LiveNode, node_namespace: str, tmp_path: Path
) -> None:
    """A MutatingWebhookConfiguration with ``clientConfig.service``: the API server resolves
    the Service to its ClusterIP and connects (kube-proxy DNATs it to the endpoint), checking
    the certificate for ``<service>.<namespace>.svc``."""
    client = kube_node.client
    svc = "hook"
    dns = (f"{svc}.{node_namespace}.svc", f"{svc}.{node_namespace}.svc.cluster.local")
    ca, serving = make_serving_certificate(tmp_path, "hook", dns=dns, ips=(BRIDGE_ADDRESS,))
    config_name = f"net-test-{node_namespace}"
    with webhook_server(serving.cert, serving.key) as (port, seen):
        client.create(
            {
                "apiVersion": "v1",
                "kind": "Service",
                "metadata": {"name": svc, "namespace": node_namespace},
                "spec": {"ports": [{"name": "https", "port": 443, "targetPort": port}]},
            }
        )
        client.create(
            {
                "apiVersion": "discovery.k8s.io/v1",
                "kind": "EndpointSlice",
                "metadata": {
                    "name": f"{svc}-host",
                    "namespace": node_namespace,
                    "labels": {"kubernetes.io/service-name": svc},
                },
                "addressType": "IPv4",
                "endpoints": [{"addresses": [BRIDGE_ADDRESS], "conditions": {"ready": True}}],
                "ports": [{"name": "https", "port": port, "protocol": "TCP"}],
            }
        )
        client.create(
            {
                "apiVersion": "admissionregistration.k8s.io/v1",
                "kind": "MutatingWebhookConfiguration",
                "metadata": {"name": config_name},
                "webhooks": [
                    {
                        "name": "label.net-test.tessera.dev",
                        "admissionReviewVersions": ["v1"],
                        "sideEffects": "None",
                        "failurePolicy": "Fail",
                        "timeoutSeconds": 10,
                        "namespaceSelector": {
                            "matchLabels": {"kubernetes.io/metadata.name": node_namespace}
                        },
                        "rules": [
                            {
                                "apiGroups": [""],
                                "apiVersions": ["v1"],
                                "operations": ["CREATE"],
                                "resources": ["configmaps"],
                            }
                        ],
                        "clientConfig": {
                            "service": {
                                "namespace": node_namespace,
                                "name": svc,
                                "path": "/mutate",
                                "port": 443,
                            },
                            "caBundle": base64.b64encode(ca.cert.read_bytes()).decode(),
                        },
                    }
                ],
            }
        )
        try:
            cluster_ip = client.get("v1", "Service", svc, node_namespace)["spec"]["clusterIP"]
            stays_here(cluster_ip)

            def mutated() -> dict[str, Any] | None:
                # The configuration and the endpoints reach the API server's and kube-proxy's
                # caches a moment after they are created.
                name = f"cm-{int(time.monotonic() * 1000)}"
                try:
                    cm = client.create(
                        {
                            "apiVersion": "v1",
                            "kind": "ConfigMap",
                            "metadata": {"name": name, "namespace": node_namespace},
                        }
                    )
                except ApiError as e:
                    if "failed calling webhook" in e.message:
                        return None
                    raise
                return cm if (cm["metadata"].get("labels") or {}).get("webhook") else None

            cm = wait_for(mutated, timeout=60, interval=1.0, what="the webhook to be called")
            assert cm["metadata"]["labels"] == {"webhook": "via-service"}
            assert seen and seen[-1]["request"]["kind"]["kind"] == "ConfigMap"
            # From this host (masqueraded: over lo the kernel picks the host's first global
            # address as source), never through another machine.
            assert seen[-1]["peer"] in host_addresses(), seen[-1]["peer"]
        finally:
            client.delete(
                "admissionregistration.k8s.io/v1", "MutatingWebhookConfiguration", config_name
            )


def test_nothing_for_the_ranges_leaves_this_host(
    kube_node: LiveNode, node_namespace: str, net_image: str, web: dict[str, Any]
) -> None:
    """Traffic to a real ClusterIP, an unallocated ClusterIP, a pod, a free pod address and
    an address in the pod range outside the node's subnet, from the host and from a pod:
    the guard table's egress counters stay 0 (nothing was about to leave). A pod has no
    default route."""
    before = guard_counters()
    cluster_ip = web["spec"]["clusterIP"]
    web_ip = kube_node.client.get("v1", "Pod", "web", node_namespace)["status"]["podIP"]
    assert ipaddress.ip_address(web_ip) in ipaddress.ip_network(POD_SUBNET)

    # From the host.
    assert http_get(cluster_ip, 80) == "served by a pod\n"
    assert http_get(web_ip, HTTP_PORT) == "served by a pod\n"
    assert connect(UNALLOCATED_CLUSTER_IP, 80) != "connected"
    assert connect(cluster_ip, 81) != "connected"  # a port the Service does not have
    assert connect(UNUSED_POD_IP, 80) != "connected"
    assert connect(OUTSIDE_POD_SUBNET, 80) == "No route to host"

    # From a pod.
    name = sleeper(kube_node, node_namespace, net_image)
    code, routes = in_pod(kube_node, name, node_namespace, "cat /proc/net/route")
    assert code == 0, routes
    destinations = {ln.split()[1] for ln in routes.splitlines()[1:] if ln.strip()}
    assert "00000000" not in destinations, f"a pod has a default route:\n{routes}"
    code, out = in_pod(
        kube_node, name, node_namespace, f"timeout 10 wget -q -O - http://{cluster_ip}/"
    )
    assert (code, out) == (0, "served by a pod\n")
    code, out = in_pod(
        kube_node, name, node_namespace, f"timeout 10 wget -q -O - http://{web_ip}:{HTTP_PORT}/"
    )
    assert (code, out) == (0, "served by a pod\n")
    for address in (UNALLOCATED_CLUSTER_IP, UNUSED_POD_IP, OUTSIDE_POD_SUBNET):
        code, out = in_pod(kube_node, name, node_namespace, f"nc -w 3 {address} 80 </dev/null")
        assert code != 0, f"{address}: {out}"

    after = guard_counters()
    egress = {k: after[k] - before.get(k, 0) for k in after if k.startswith("egress-")}
    assert egress and all(v == 0 for v in egress.values()), egress
    assert all(v == 0 for k, v in after.items() if k.startswith("egress-")), after


def test_an_image_that_was_not_imported_is_pulled_from_nowhere(
    kube_node: LiveNode, node_namespace: str
) -> None:
    """containerd's only registry host is a closed port on loopback (``certs.d/_default``):
    a pull fails there at once, without a DNS lookup. (The image names a registry on this
    host, so that even a containerd that ignored the configuration would not send anything
    off it.)"""
    client = kube_node.client
    spec = pod("pull", node_namespace, "localhost:5999/not-imported:1", "true")
    spec["spec"]["containers"][0]["imagePullPolicy"] = "IfNotPresent"
    client.create(spec)

    def pull_failed() -> str | None:
        status = client.get("v1", "Pod", "pull", node_namespace).get("status") or {}
        for c in status.get("containerStatuses") or []:
            waiting = (c.get("state") or {}).get("waiting") or {}
            if waiting.get("reason") in ("ErrImagePull", "ImagePullBackOff") and waiting.get(
                "message"
            ):
                return str(waiting["message"])
        return None

    message = wait_for(pull_failed, timeout=60, what="the pull of an image that is not there")
    assert "127.0.0.1:9" in message, message
