"""The REST client against the real API server: GETs share kept-alive connections, writes
do only when their caller asks (``kept=True``) and then only on a connection still open, and a
kept connection the server closed is replaced without the caller seeing it."""

from __future__ import annotations

import http.client
import socket
from collections.abc import Iterator
from typing import Any

import pytest

from tessera.kube.client import KubeClient

from .conftest import LiveCluster

pytestmark = pytest.mark.cluster


@pytest.fixture
def connects(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[int]]:
    """Counts the TLS connections opened (each one a handshake with the API server)."""
    opened: list[int] = []
    real = http.client.HTTPSConnection.connect

    def counted(self: http.client.HTTPSConnection) -> None:
        opened.append(1)
        real(self)

    monkeypatch.setattr(http.client.HTTPSConnection, "connect", counted)
    yield opened


def test_gets_reuse_one_connection_and_writes_open_their_own(
    kube_cluster: LiveCluster, connects: list[int]
) -> None:
    client = KubeClient.from_kubeconfig(kube_cluster.kubeconfig)
    names = [client.get("v1", "Namespace", "default")["metadata"]["name"] for _ in range(5)]
    assert names == ["default"] * 5
    assert len(connects) == 1
    cm: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": "kept-alive", "namespace": "default"},
        "data": {"a": "1"},
    }
    client.create(cm)
    client.create({**cm, "metadata": {**cm["metadata"], "name": "kept-alive-2"}})
    assert len(connects) == 3  # each write on a new connection
    try:
        assert client.get("v1", "ConfigMap", "kept-alive", "default")["data"] == {"a": "1"}
        assert len(connects) == 3  # a kept one (the writes' connections are kept too)
    finally:
        client.delete("v1", "ConfigMap", "kept-alive", "default")
        client.delete("v1", "ConfigMap", "kept-alive-2", "default")
        client.close()


def test_a_kept_connection_closed_under_it_is_replaced(
    kube_cluster: LiveCluster, connects: list[int]
) -> None:
    client = KubeClient.from_kubeconfig(kube_cluster.kubeconfig)
    client.get("v1", "Namespace", "default")
    assert len(client._idle) == 1
    sock = client._idle[0].sock
    assert sock is not None
    sock.shutdown(socket.SHUT_RDWR)  # what the client sees when the server closed it idle
    assert client.get("v1", "Namespace", "kube-system")["metadata"]["name"] == "kube-system"
    assert len(connects) == 2
    client.close()
    assert client._idle == []


def test_a_kept_write_takes_an_open_kept_connection_and_never_a_closed_one(
    kube_cluster: LiveCluster, connects: list[int]
) -> None:
    client = KubeClient.from_kubeconfig(kube_cluster.kubeconfig)
    path = "/api/v1/namespaces/default/configmaps"
    cm: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": "kept-write", "namespace": "default"},
        "data": {"a": "1"},
    }
    client.get("v1", "Namespace", "default")
    assert len(connects) == 1
    try:
        client.request("POST", path, body=cm, kept=True)
        assert len(connects) == 1  # the GET's connection
        [kept] = client._idle
        assert kept.sock is not None
        kept.sock.shutdown(socket.SHUT_RDWR)  # as the server closing it idle leaves it
        second = {**cm, "metadata": {**cm["metadata"], "name": "kept-write-2"}}
        client.request("POST", path, body=second, kept=True)
        assert len(connects) == 2  # not on the closed one: a new connection, sent once
        assert client.get("v1", "ConfigMap", "kept-write-2", "default")["data"] == {"a": "1"}
    finally:
        client.delete("v1", "ConfigMap", "kept-write", "default")
        client.delete("v1", "ConfigMap", "kept-write-2", "default")
        client.close()
