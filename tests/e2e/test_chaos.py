"""A chaos campaign on the real node: ``tessera driver`` (a process) against the real kubelet,
containerd and control plane of ``tessera cluster up --kubelet``, while a stream of pods with
claims (8 GiB / 20-core shares of the fake H100s, and dynamic-MIG 1g.10gb instances of GPU 0)
is created and deleted (the first two pods, a MIG one and a share, live through the whole
campaign), faults are injected at random:

``kill-driver``
    SIGKILL of the driver, started again after a random 0-2 s;
``restart-kubelet``
    the kubelet stopped (SIGTERM) and started again with the same flags and root dir
    (:meth:`Cluster.restart_component`): the pods' containers must keep running (checked: the same
    containerd tasks before and after);
``restart-apiserver``
    kube-apiserver restarted in place (etcd keeps everything); the test's own stream retries
    what the API server refused meanwhile, as any client does;
``reboot``
    a simulated reboot (:func:`_reboot`);
``full-disk``
    the driver's state directory (a tmpfs of 8 MiB mounted for the test) filled up, a pod
    created, its prepare failing (``No space left on device``), then the space given back.

Each kind comes once in the first five steps (in a seeded order), then at random. The seed is
printed (``TESSERA_CHAOS_SEED`` replays one), the size is ``TESSERA_CHAOS_STEPS`` (default 6:
about 3 minutes on 2 cores; ``make chaos`` runs 40).

Then, against the API server and the node:

* every pod is Running, its container seeing its own claim (the limits file names the claim's
  UID; ``CUDA_VISIBLE_DEVICES`` is the UUID the claim's CDI spec hands out, a MIG one that
  exists in the fake NVML), or it is not Running with a **clear event**: an Event of the pod
  from the kubelet, reason ``FailedPrepareDynamicResources``, whose message carries the
  driver's one line naming the claim (``ResourceClaim <ns>/<claim>: ...``);
* no claim prepared twice at once: sampled after every step, each claim UID has one entry in
  the driver's checkpoint with one plan digest between reboots (a retried prepare answers the
  recorded plan; only a reboot may re-plan a MIG claim, whose instance is new), every live
  dynamic-MIG instance of GPU 0 in the fake NVML's state is named by a checkpoint entry, no
  placement by two, every prepared claim's instance exists (a ``preparing`` entry may name one
  still to be made: after a reboot, until the kubelet's retry), and at the end the kubelet's
  own record (``dra_manager_state``) lists each claim once,
  with the CDI device IDs the driver's checkpoint recorded;
* after every pod is deleted: no claim directory (limits file, region), CDI spec, checkpoint
  entry, temporary file or dynamic-MIG instance is left, and the kubelet's record holds none of
  the claims.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import shutil
import subprocess
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, TypeVar

import pytest

from tessera.inventory import load_inventory
from tessera.kube.client import ApiError
from tessera.kube.workloads import WaitTimeout, wait_for
from tessera.localcluster.fake_nvml import mig_minors_text, nvml_config

from .conftest import LiveNode
from .driverkit import *  # noqa: F403 (fixtures)
from .driverkit import H100, node_slices
from .test_driver_kubelet import DRIVER, NodeDriverProcess, probe_image, probe_pod, section

pytestmark = [pytest.mark.cluster, pytest.mark.node, pytest.mark.chaos]
__all__ = ["probe_image"]

STEPS = int(os.environ.get("TESSERA_CHAOS_STEPS", "6"))
SEED = int(os.environ.get("TESSERA_CHAOS_SEED") or random.SystemRandom().randrange(1 << 32))
FAULTS = ("kill-driver", "restart-kubelet", "restart-apiserver", "reboot", "full-disk")
#: live pods at most (the node has two cores, shared)
MAX_PODS = 5
#: seconds the pods get to be Running once the last fault is healed
CONVERGE = float(os.environ.get("TESSERA_CHAOS_CONVERGE", "240"))
STATE_TMPFS = "8m"
MIG_SELECTOR = (
    f'device.attributes["{DRIVER}"].type == "mig" && '
    f'device.attributes["{DRIVER}"].profile == "1g.10gb"'
)

T = TypeVar("T")


def _retry(what: str, fn: Callable[[], T], timeout: float = 90) -> T:
    """``fn()``, retried while the API server cannot be reached or answers 5xx (it restarts)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            return fn()
        except ApiError as e:
            if e.status not in (0, 500, 502, 503, 504) or time.monotonic() > deadline:
                raise
        except OSError:
            if time.monotonic() > deadline:
                raise
        time.sleep(0.5)


@dataclass
class ChaosNode:
    """The driver's node for the campaign: its root (state dir on a tmpfs, fake NVML with GPU 0
    dynamic MIG, stand-in device nodes), the running driver, and what the campaign saw."""

    node: LiveNode
    root: Path
    nvml_lib: Path
    driver: NodeDriverProcess | None = None
    faults: Counter[str] = field(default_factory=Counter)
    #: claim uid -> {reboot epoch: digests seen}
    digests: dict[str, dict[int, set[str]]] = field(default_factory=dict)
    epoch: int = 0
    samples: int = 0

    @property
    def state(self) -> Path:
        return self.root / "state"

    @property
    def mig_state(self) -> Path:
        return self.root / "mig-state"

    @property
    def gpu0(self) -> str:
        return load_inventory(H100)[0].uuid

    def start_driver(self) -> None:
        self.driver = NodeDriverProcess(
            self.node,
            self.root,
            self.nvml_lib,
            options=["--dynamic-mig", "[0]", "--mig-minors", str(self.root / "mig-minors")],
        )

    def kill_driver(self) -> None:
        assert self.driver is not None
        self.driver.proc.kill()
        self.driver.proc.wait()

    def wait_registered(self) -> None:
        """Until the kubelet has registered the driver, and not again for 3 s. A kubelet that
        starts while the registration socket of a SIGKILLed driver is still there (a reboot)
        registers the new driver on that path once it serves, then sees the socket replaced
        and deregisters and registers it again: pods that come in between fail with ``DRA
        driver gpu.tessera.dev is not registered`` and wait out a back-off of over a minute."""
        try:
            self.node.wait_plugin_registered(DRIVER, timeout=120)
            stable: list[int] = []

            def settled() -> bool | None:
                assert self.driver is not None
                stable.append(self.driver.output.count("registered with the kubelet"))
                return True if len(stable) > 6 and len(set(stable[-7:])) == 1 else None

            wait_for(settled, timeout=60, interval=0.5, what="the kubelet's registration to settle")
            self.node.wait_plugin_registered(DRIVER, timeout=120)
        except Exception:
            out = self.driver.output[-4000:] if self.driver else ""
            pytest.fail(f"the kubelet did not register the driver again; its log:\n{out}")

    def checkpoint(self) -> dict[str, Any]:
        path = self.state / "checkpoint.json"
        return dict(json.loads(path.read_text())["claims"]) if path.exists() else {}

    def live_instances(self) -> list[tuple[int, int]]:
        """GPU 0's GPU instances in the fake NVML's state: (start, size)."""
        out = []
        text = self.mig_state.read_text() if self.mig_state.exists() else ""
        for ln in text.splitlines():
            f = ln.split()
            if f[:2] == ["gi", self.gpu0]:
                kv = dict(x.split("=", 1) for x in f[3:] if "=" in x)
                out.append((int(kv["start"]), int(kv["size"])))
        return sorted(out)

    def sample(self) -> None:
        """The no-double-prepare evidence of one moment (see the module docstring)."""
        self.samples += 1
        # An instance is made after its entry is written and destroyed before its entry is
        # removed: the two reads may straddle one of those, a lasting difference cannot. A
        # `preparing` entry names placements still to be made (after a reboot destroyed them,
        # until the kubelet's retry), so only a prepared claim's instances must all exist.
        for _ in range(20):
            live = self.live_instances()
            cp = self.checkpoint()
            named: list[tuple[int, int]] = []
            answered: list[tuple[int, int]] = []
            for entry in cp.values():
                slots = (entry.get("plan") or {}).get("mig") or entry.get("slots") or []
                mine = [(s["start"], s["size"]) for s in slots if s["gpuUUID"] == self.gpu0]
                named += mine
                if entry["state"] == "prepared":
                    answered += mine
            if set(live) <= set(named) and set(answered) <= set(live):
                break
            time.sleep(0.5)
        else:
            raise AssertionError(
                f"GPU 0's MIG instances {live} do not match the checkpoint's: it names "
                f"{sorted(named)}, its prepared claims {sorted(answered)} (an instance leaked, or "
                f"a prepared claim's instance is gone); checkpoint: {json.dumps(cp)[:3000]}"
            )
        assert len(named) == len(set(named)), f"two checkpoint entries name one placement: {named}"
        for uid, entry in cp.items():
            plan = entry.get("plan")
            if plan is None:
                continue
            # a share's plan never changes; a MIG claim's may only at a reboot (a new instance)
            epoch = self.epoch if plan.get("mig") else 0
            seen = self.digests.setdefault(uid, {}).setdefault(epoch, set())
            seen.add(plan["digest"])
            assert len(seen) == 1, (
                f"claim {plan['namespace']}/{plan['name']} ({uid}) was prepared with two "
                f"different plans{' without a reboot in between' if plan.get('mig') else ''}: "
                f"digests {sorted(seen)}"
            )


def _sh(*argv: str) -> None:
    subprocess.run(argv, check=True, capture_output=True)


@pytest.fixture
def chaos_node(
    kube_node: LiveNode, fake_nvml_lib: Path, node_device_class: str, request: pytest.FixtureRequest
) -> Iterator[ChaosNode]:
    if os.geteuid() != 0:
        pytest.fail("the chaos test mounts a tmpfs for the driver's state: run it as root")
    root = Path(tempfile.mkdtemp(prefix="tessera-chaos-", dir="/tmp"))
    # The fake machine: the corpus 8x H100, GPU 0 in MIG mode partitioned on demand.
    gpus = [replace(g, mig_enabled=True) if g.index == 0 else g for g in load_inventory(H100)]
    (root / "nvml.cfg").write_text(
        nvml_config(gpus, mig_state=root / "mig-state", mig_log=root / "mig-log")
    )
    minors = mig_minors_text(len(gpus))
    (root / "mig-minors").write_text(minors)
    dev = root / "devroot" / "dev"
    (dev / "nvidia-caps").mkdir(parents=True)
    for name in [f"nvidia{g.index}" for g in gpus] + [
        "nvidiactl",
        "nvidia-uvm",
        "nvidia-uvm-tools",
    ]:
        os.mknod(dev / name, 0o666 | 0o020000, os.makedev(1, 3))
    for ln in minors.splitlines():
        os.mknod(
            dev / "nvidia-caps" / f"nvidia-cap{ln.split()[1]}", 0o444 | 0o020000, os.makedev(1, 3)
        )
    (root / "state").mkdir()
    _sh(
        "mount",
        "-t",
        "tmpfs",
        "-o",
        f"size={STATE_TMPFS},mode=0755",
        "tessera-chaos",
        str(root / "state"),
    )
    c = ChaosNode(kube_node, root, fake_nvml_lib)
    try:
        c.start_driver()
        c.wait_registered()
        yield c
    finally:
        if c.driver is not None:
            c.driver.stop()
            if request.session.testsfailed:
                kept = Path(f"/tmp/tessera-chaos-{SEED}-driver.log")
                shutil.copy(c.driver.log, kept)
                print(f"chaos: the failed campaign's driver log: {kept}")
        for s in node_slices(kube_node.client, kube_node.name):
            with contextlib.suppress(ApiError):
                kube_node.client.delete(
                    "resource.k8s.io/v1", "ResourceSlice", s["metadata"]["name"]
                )
        subprocess.run(["umount", "-l", str(root / "state")], check=False)
        shutil.rmtree(root, ignore_errors=True)


# ---- the faults -----------------------------------------------------------------------------


def _tasks(node: LiveNode) -> dict[str, str]:
    """containerd's tasks of the node (the pods' containers and sandboxes): id -> status."""
    r = subprocess.run(
        [
            str(node.node.ctr),
            "--address",
            str(node.node.containerd_socket),
            "--namespace",
            "k8s.io",
            "tasks",
            "ls",
        ],
        capture_output=True,
        text=True,
        check=True,
    )
    lines = r.stdout.splitlines()[1:]
    return {ln.split()[0]: ln.split()[-1] for ln in lines if ln.strip()}


def _reboot(c: ChaosNode) -> None:
    """A simulated reboot of the node, as far as the driver and the kubelet can tell: the
    driver and the kubelet are SIGKILLed (power off), every container and sandbox of the pods
    SIGKILLed through containerd, what lives in tmpfs on a real node wiped (the driver's CDI
    specs, its claim directories with their limits files and usage regions) and GPU 0's
    dynamic MIG instances destroyed in the fake NVML's state; then the kubelet starts again
    with its root dir (its DRA checkpoint survives, on disk, as the driver's checkpoint does)
    and the driver starts. The kubelet then makes new sandboxes and calls NodePrepareResources
    again for the claims of its pods.

    Not simulated: containerd itself keeps running (its state, in /run on a real host, is not
    lost; the kubelet sees exited containers rather than none), the rest of the host's tmpfs,
    the kernel, a GPU that leaves the bus or enumerates at another index (that is
    ``test_driver_reboot.py``), and the API server and etcd, which a node's reboot does not
    touch."""
    node = c.node
    c.kill_driver()
    node.cluster.stop_component("kubelet", kill=True)
    ctr = [
        str(node.node.ctr),
        "--address",
        str(node.node.containerd_socket),
        "--namespace",
        "k8s.io",
    ]
    for task in _tasks(node):
        subprocess.run(
            [*ctr, "tasks", "kill", "--all", "--signal", "SIGKILL", task],
            capture_output=True,
            check=False,
        )
    wait_for(
        lambda: True if all(s != "RUNNING" for s in _tasks(node).values()) else None,
        timeout=60,
        what="the pods' containers to stop",
    )
    for spec in node.cdi_spec_dir.glob(f"{DRIVER}-*"):
        spec.unlink()
    shutil.rmtree(c.state / "claims", ignore_errors=True)
    if c.mig_state.exists():
        c.mig_state.write_text(
            "".join(
                ln
                for ln in c.mig_state.read_text().splitlines(keepends=True)
                if not (ln.split()[:1] in (["gi"], ["ci"]) and ln.split()[1] == c.gpu0)
            )
        )
    c.epoch += 1
    node.cluster.start_component("kubelet")
    c.start_driver()


@contextlib.contextmanager
def _full_disk(c: ChaosNode) -> Iterator[None]:
    """The state directory's tmpfs full but for 32 KiB (under one usage region) while inside:
    kept full by a thread that fills again what an unprepare frees meanwhile (a pod deleted
    just before gives back its claim's region)."""
    fillers: list[Path] = []
    stop = threading.Event()

    def fill() -> None:
        free = os.statvfs(c.state)
        room = free.f_bavail * free.f_frsize - 32 * 1024
        if room > (0 if not fillers else 64 * 1024):  # (not a file for every page freed)
            filler = c.state / f"filler-{len(fillers)}"
            fillers.append(filler)
            with open(filler, "wb") as f, contextlib.suppress(OSError):
                os.posix_fallocate(f.fileno(), 0, room)

    def keep_full() -> None:
        while not stop.wait(0.05):
            fill()

    fill()
    t = threading.Thread(target=keep_full, daemon=True)
    t.start()
    try:
        yield
    finally:
        stop.set()
        t.join()
        for f in fillers:
            f.unlink(missing_ok=True)


# ---- the pods ---------------------------------------------------------------------------------


@dataclass
class Stream:
    c: ChaosNode
    ns: str
    image: str
    rng: random.Random
    pods: dict[str, str] = field(default_factory=dict)  # live pod -> kind (share / mig)
    created: int = 0
    deleted: int = 0
    kinds: Counter[str] = field(default_factory=Counter)
    keep: list[str] = field(default_factory=list)

    def create(self, kind: str | None = None) -> str:
        # the first two pods are one of each kind; then a MIG pod for two shares
        if kind is None and self.created < 2:
            kind = ("mig", "share")[self.created]
            self.keep.append(f"p{self.created}-{kind}")
        kind = kind or self.rng.choice(["share", "share", "mig"])
        name = f"p{self.created}-{kind}"
        self.created += 1
        drv = self.c.driver
        assert drv is not None
        pod = probe_pod(name, self.ns, self.image, drv, self.c.node.name, [1 << 30], claim=name)
        client = self.c.node.client
        exactly: dict[str, Any] = {"deviceClassName": DRIVER}
        if kind == "mig":
            exactly["selectors"] = [{"cel": {"expression": MIG_SELECTOR}}]
        else:
            exactly["selectors"] = [
                {
                    "cel": {
                        "expression": f'device.attributes["{DRIVER}"].type == "gpu" && '
                        f'device.attributes["{DRIVER}"].index != 0'
                    }
                }
            ]
            exactly["capacity"] = {"requests": {"memory": "8Gi", "cores": "20"}}
        claim = {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaim",
            "metadata": {"name": name, "namespace": self.ns},
            "spec": {"devices": {"requests": [{"name": "gpu", "exactly": exactly}]}},
        }
        _retry(f"claim {name}", lambda: client.create(claim))
        _retry(f"pod {name}", lambda: client.create(pod))
        self.pods[name] = kind
        self.kinds[kind] += 1
        return name

    def delete(self) -> None:
        # the first two pods (a MIG one and a share) live through the whole campaign: every
        # fault finds prepared claims of both kinds
        name = self.rng.choice(sorted(set(self.pods) - set(self.keep)))
        client = self.c.node.client
        for kind, api in (("Pod", "v1"), ("ResourceClaim", "resource.k8s.io/v1")):
            with contextlib.suppress(ApiError):
                _retry(f"{kind} {name}", lambda a=api, k=kind: client.delete(a, k, name, self.ns))
        del self.pods[name]
        self.deleted += 1

    def churn(self) -> None:
        """One or two pods created, maybe one deleted (at most MAX_PODS live)."""
        if set(self.pods) - set(self.keep) and (
            len(self.pods) >= MAX_PODS or self.rng.random() < 0.4
        ):
            self.delete()
        for _ in range(self.rng.choice([1, 1, 2])):
            if len(self.pods) < MAX_PODS:
                self.create()


def _events(node: LiveNode, ns: str, pod: str) -> list[dict[str, Any]]:
    return [
        e
        for e in node.client.list("v1", "Event", ns)
        if (e.get("involvedObject") or {}).get("name") == pod
    ]


def _clear_event(node: LiveNode, ns: str, pod: str) -> str | None:
    """The pod's clear event (module docstring), or None."""
    for e in sorted(
        _events(node, ns, pod), key=lambda e: e.get("lastTimestamp") or "", reverse=True
    ):
        if e.get("reason") == "FailedPrepareDynamicResources" and (
            f"ResourceClaim {ns}/{pod}: " in (e.get("message") or "")
        ):
            return str(e["message"])
    return None


def _pod_story(node: LiveNode, ns: str, pod: str) -> str:
    """A pod's phase, conditions and events, for a failure's message."""
    status = node.client.get("v1", "Pod", pod, ns).get("status") or {}
    events = [(e.get("reason"), e.get("message")) for e in _events(node, ns, pod)]
    return f"phase {status.get('phase')}, conditions {status.get('conditions')}, events {events}"


def _cause(ns: str, message: str) -> str:
    """A FailedPrepareDynamicResources event's message, in a word (for the figures)."""
    if "No space left on device" in message:
        return "full disk"
    if f"ResourceClaim {ns}/" in message:
        return "driver refused"
    if "not registered" in message:
        return "driver not registered"
    if "Unavailable" in message or "connection refused" in message or "DeadlineExceeded" in message:
        return "driver unreachable"
    return "other: " + message[:200]


def _cdi_visible(node: LiveNode, uid: str) -> str:
    spec = json.loads((node.cdi_spec_dir / f"{DRIVER}-claim_{uid}.json").read_text())
    env = spec["containerEdits"]["env"]
    return str(next(e for e in env if e.startswith("NVIDIA_VISIBLE_DEVICES=")).split("=", 1)[1])


def _kubelet_record(node: LiveNode) -> list[dict[str, Any]]:
    """The kubelet's own DRA record: ``<root>/dra_manager_state``'s ClaimInfoStateList."""
    [path] = list(node.kubelet_root_dir.rglob("dra_manager_state"))
    outer = json.loads(path.read_text())
    data = outer["Data"] if isinstance(outer.get("Data"), str) else json.dumps(outer)
    return list(json.loads(data).get("ClaimInfoStateList") or [])


# ---- the campaign --------------------------------------------------------------------------------


def test_chaos_campaign(chaos_node: ChaosNode, probe_image: str, node_namespace: str) -> None:
    c, node, ns = chaos_node, chaos_node.node, node_namespace
    rng = random.Random(SEED)
    print(f"chaos: seed {SEED} (TESSERA_CHAOS_SEED={SEED} replays it), {STEPS} steps")
    started = time.monotonic()
    stream = Stream(c, ns, probe_image, rng)
    order = list(FAULTS)
    rng.shuffle(order)
    plan = [*order, *(rng.choice(FAULTS) for _ in range(max(0, STEPS - len(order))))][:STEPS]
    disk_events: list[str] = []
    for step, fault in enumerate(plan):
        stream.churn()
        time.sleep(rng.uniform(0.0, 3.0))  # the kubelet prepares meanwhile, or not yet
        t0 = time.monotonic()
        if fault == "kill-driver":
            c.kill_driver()
            time.sleep(rng.uniform(0.0, 2.0))
            c.start_driver()
        elif fault == "restart-kubelet":
            before = {t for t, s in _tasks(node).items() if s == "RUNNING"}
            node.cluster.restart_component("kubelet")
            after = {t for t, s in _tasks(node).items() if s == "RUNNING"}
            assert before <= after, (
                f"the kubelet restart stopped containers: {sorted(before - after)}"
            )
        elif fault == "restart-apiserver":
            node.cluster.restart_component("kube-apiserver")
        elif fault == "reboot":
            _reboot(c)
        elif fault == "full-disk":
            with _full_disk(c):
                name = stream.create("share")
                msg = wait_for(
                    lambda n=name: _clear_event(node, ns, n),
                    # the kubelet's first try may fail before the driver is called (its read of
                    # the claim refused by the node authorizer while its graph catches up after
                    # an API server restart; a registration gap): then its back-off, over a minute
                    timeout=150,
                    what=f"pod {ns}/{name}'s prepare to fail on the full disk",
                    last=lambda n=name: _pod_story(node, ns, n),
                )
                disk_events.append(msg)
                assert "No space left on device" in msg, (
                    f"a prepare on a full disk: {msg}; driver log:\n{c.driver.output[-3000:] if c.driver else ''}"
                )
        c.faults[fault] += 1
        if rng.random() < 0.5 and len(stream.pods) < MAX_PODS:
            stream.create()  # right after the fault, before the node has recovered
        c.wait_registered()
        c.sample()
        print(
            f"chaos: step {step + 1}: {fault} ({time.monotonic() - t0:.1f} s), {len(stream.pods)} pods"
        )

    # Every pod Running, or not with a clear event.
    converge_from = time.monotonic()

    def all_running() -> bool | None:
        c.sample()
        # Running, ready and its claim prepared: a pod's status can still say Running from
        # before a reboot until the new kubelet has synced it
        cp = c.checkpoint()
        for p in stream.pods:
            st = node.client.get("v1", "Pod", p, ns)["status"]
            ready = all(x.get("ready") for x in st.get("containerStatuses") or [{}])
            claim = node.client.get("resource.k8s.io/v1", "ResourceClaim", p, ns)
            state = (cp.get(claim["metadata"]["uid"]) or {}).get("state")
            if st.get("phase") != "Running" or not ready or state != "prepared":
                return None
        return True

    with contextlib.suppress(WaitTimeout):
        wait_for(all_running, timeout=CONVERGE, interval=2.0, what="every pod Running")
    converged = time.monotonic() - converge_from
    cp = c.checkpoint()
    not_running: dict[str, str] = {}
    for pod, kind in sorted(stream.pods.items()):
        obj = node.client.get("v1", "Pod", pod, ns)
        if obj["status"].get("phase") != "Running":
            event = _clear_event(node, ns, pod)
            assert event is not None, (
                f"pod {ns}/{pod} is {obj['status'].get('phase')} without a clear event: "
                f"{json.dumps(obj['status'])[:2000]}; its events: "
                f"{[(e.get('reason'), e.get('message')) for e in _events(node, ns, pod)]}"
            )
            not_running[pod] = event
            continue
        claim = node.client.get("resource.k8s.io/v1", "ResourceClaim", pod, ns)
        uid = claim["metadata"]["uid"]
        assert uid in cp and cp[uid]["state"] == "prepared", f"{pod}: claim {uid} not prepared"
        visible = _cdi_visible(node, uid)
        log = wait_for(
            lambda p=pod: (lambda out: out if "--- done" in out else None)(node.logs(p, ns)),
            timeout=60,
            what=f"pod {pod}'s log",
        )
        # (a MIG claim has no limits file: cat's complaint on stderr may land in any section)
        assert [ln for ln in section(log, "env") if ln.startswith("CUDA_")] == [
            f"CUDA_VISIBLE_DEVICES={visible}"
        ], (pod, log)
        if kind == "mig":
            assert visible.startswith("MIG-") and f"uuid={visible}" in c.mig_state.read_text()
        else:
            limits = section(log, "limits")
            assert f"claim {ns}/{pod} {uid}" in limits, (pod, limits)
            assert f"gpu {visible} memory {8 << 30} cores 20" in limits, (pod, limits)
    # The kubelet's record: each claim once, with the CDI devices the driver recorded.
    record = [r for r in _kubelet_record(node) if r.get("Namespace") == ns]
    uids = [r["ClaimUID"] for r in record]
    assert len(uids) == len(set(uids)), f"the kubelet records a claim twice: {uids}"
    for r in record:
        devices = ((r.get("DriverState") or {}).get(DRIVER) or {}).get("Devices") or []
        if r["ClaimUID"] in cp and cp[r["ClaimUID"]]["state"] == "prepared" and devices:
            ids = sorted(i for d in devices for i in d.get("CDIDeviceIDs") or [])
            want = sorted(
                i for d in cp[r["ClaimUID"]]["plan"]["devices"] for i in d["cdiDeviceIDs"]
            )
            assert ids == want, f"claim {r['ClaimName']}: kubelet has {ids}, driver recorded {want}"

    # What the kubelet reported on the way (figures): failed prepares by cause.
    causes: Counter[str] = Counter()
    for e in node.client.list("v1", "Event", ns):
        if e.get("reason") == "FailedPrepareDynamicResources":
            causes[_cause(ns, str(e.get("message")))] += int(e.get("count") or 1)

    # Delete everything: nothing may be left.
    pods = len(stream.pods)
    stream.keep.clear()
    while stream.pods:
        stream.delete()
    wait_for(
        lambda: True if not node.client.list("v1", "Pod", ns) else None,
        timeout=120,
        what="every pod deleted by the kubelet",
    )

    def leftovers() -> list[str]:
        out = [str(p) for p in node.cdi_spec_dir.glob(f"{DRIVER}-*")]
        claims = c.state / "claims"
        out += [str(p) for p in claims.iterdir()] if claims.is_dir() else []
        out += [str(p) for p in c.state.rglob(".*") if p.is_file()]
        out += [f"checkpoint entry {u}" for u in c.checkpoint()]
        out += [f"MIG instance start={s} size={z}" for s, z in c.live_instances()]
        out += [
            f"kubelet record of {r['ClaimName']}"
            for r in _kubelet_record(node)
            if r.get("Namespace") == ns
        ]
        return out

    with contextlib.suppress(WaitTimeout):
        wait_for(
            lambda: True if not leftovers() else None,
            timeout=120,
            interval=1.0,
            what="nothing left",
        )
    assert leftovers() == [], leftovers()
    elapsed = time.monotonic() - started
    mig_ops = (
        Counter(ln.split()[0] for ln in (c.root / "mig-log").read_text().splitlines())
        if (c.root / "mig-log").exists()
        else Counter()
    )
    print(
        f"chaos: seed {SEED}: {STEPS} steps in {elapsed:.0f} s; faults "
        + ", ".join(f"{k} {c.faults[k]}" for k in FAULTS)
        + f"; {stream.created} pods created ({dict(stream.kinds)}), {stream.deleted} deleted,"
        f" {pods} live at the end: {pods - len(not_running)} Running after {converged:.0f} s,"
        f" {len(not_running)} not Running with a clear event {not_running}; {c.samples} samples;"
        f" failed prepares reported by the kubelet, by cause: {dict(causes)}; fake NVML MIG"
        f" calls: {dict(mig_ops)}; full-disk events: {disk_events}"
    )
