"""The device plugin's kubelet side over real gRPC on unix sockets: registration with a
kubelet's ``v1beta1.Registration`` server (the generated stubs on both ends), ``ListAndWatch``
read by a ``v1beta1.DevicePlugin`` client, and registration again after the kubelet restarts
(its socket re-created, the plugin's removed). GPUs: the 8x H100 of a corpus inventory."""

from __future__ import annotations

import threading
from concurrent import futures
from pathlib import Path
from typing import Any

import grpc
import pytest

from tessera.deviceplugin.plugin import DevicePlugin, DevicePluginConfig
from tessera.driver.kubelet import deviceplugin_stubs
from tessera.driver.publish import GpuRecord
from tessera.inventory import load_inventory

pytestmark = pytest.mark.legacy

H100 = "inventories/gpud__nvidia-query_testdata__nvidia-smi-q.535.161.08.8xH100-80GB-HBM3.txt"


class Kubelet:
    """A kubelet's Registration service on ``<dir>/kubelet.sock``, recording each request."""

    def __init__(self, directory: Path) -> None:
        pb2, pb2_grpc = deviceplugin_stubs()
        self.requests: list[Any] = []
        kubelet = self

        class Registration(pb2_grpc.RegistrationServicer):  # type: ignore[misc,name-defined]
            def Register(self, request: Any, context: Any) -> Any:
                kubelet.requests.append(request)
                return pb2.Empty()

        self.path = directory / "kubelet.sock"
        self.server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
        pb2_grpc.add_RegistrationServicer_to_server(Registration(), self.server)
        self.server.add_insecure_port(f"unix://{self.path}")
        self.server.start()

    def stop(self) -> None:
        self.server.stop(grace=0).wait()
        self.path.unlink(missing_ok=True)


def test_registers_streams_the_slots_and_registers_again_after_a_kubelet_restart(
    corpus: Path, tmp_path: Path
) -> None:
    pb2, pb2_grpc = deviceplugin_stubs()
    dp_dir = tmp_path / "device-plugins"
    dp_dir.mkdir()
    kubelet = Kubelet(dp_dir)
    cfg = DevicePluginConfig(
        node_name="n1",
        device_plugin_dir=dp_dir,
        state_dir=tmp_path / "state",
        cdi_dir=tmp_path / "cdi",
        dev_root=tmp_path,
        library=None,
        driver="gpu.tessera.dev",
        split=10,
    )
    plugin = DevicePlugin(cfg, client=None, log=lambda _: None)  # type: ignore[arg-type]
    gpus = load_inventory(corpus / H100)
    plugin.records = [GpuRecord(g, g.index) for g in gpus]
    plugin.health = {g.uuid: g.index != 4 for g in gpus}
    try:
        plugin._serve()
        [req] = kubelet.requests
        assert (req.version, req.endpoint, req.resource_name) == (
            "v1beta1",
            "tessera-gpu.sock",
            "nvidia.com/gpu",
        )
        with grpc.insecure_channel(f"unix://{dp_dir / 'tessera-gpu.sock'}") as ch:
            stream = pb2_grpc.DevicePluginStub(ch).ListAndWatch(pb2.Empty(), timeout=10)
            first = next(stream)
            stream.cancel()
        assert len(first.devices) == 80
        assert [d.ID for d in first.devices[:2]] == [f"{gpus[0].uuid}-0", f"{gpus[0].uuid}-1"]
        unhealthy = {d.ID.rsplit("-", 1)[0] for d in first.devices if d.health == "Unhealthy"}
        assert unhealthy == {gpus[4].uuid}
        # a stream whose client is gone ends (no server thread kept per kubelet restart)
        active = [True]
        stream_of_gone = plugin.list_and_watch(lambda: active[0])
        assert len(next(stream_of_gone).devices) == 80
        active[0] = False
        rest: list[Any] = []
        reader = threading.Thread(target=lambda: rest.extend(stream_of_gone), daemon=True)
        reader.start()
        reader.join(timeout=10)
        assert not reader.is_alive() and rest == []
        # The kubelet restarts: its socket is new and the plugins' sockets are gone.
        kubelet.stop()
        (dp_dir / "tessera-gpu.sock").unlink()
        kubelet = Kubelet(dp_dir)
        plugin._watch_kubelet()
        assert (dp_dir / "tessera-gpu.sock").exists()
        assert [r.resource_name for r in kubelet.requests] == ["nvidia.com/gpu"]
        plugin._watch_kubelet()  # nothing changed: not registered again
        assert len(kubelet.requests) == 1
    finally:
        plugin.stop()
        kubelet.stop()
    assert not (dp_dir / "tessera-gpu.sock").exists()
