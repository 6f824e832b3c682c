"""Why a pod (or a ResourceClaim) is pending, or where and why it fit: ``tessera explain``.

:func:`explain` runs the same simulation as ``tessera simulate`` and, for the named pod, takes
the allocated state as it was when the pod's turn came. Then, per node in cluster order:

* pod-level refusals (node selector/affinity, an allocated claim pinned to another node);
* pool problems visible from the node (incomplete, invalid, obsolete; dra-spec.md 4.2);
* per request (and per ``firstAvailable`` subrequest), per device in pool, slice and device
  order, the **first** check that refuses it, in the allocator's own order (dra-spec.md 4.4):
  node match (perDeviceNodeSelection), in use (dedicated), class selectors, request
  selectors (each top-level ``&&`` conjunct evaluated on its own to name the false one),
  capacity (missing, over the request policy, short by how much), shared counters (the
  exhausted counter named: ``memory slices of gpu-0: 7 of 8 used``), taints, then the claim's
  constraints (attribute missing);
* requests whose devices fit one by one but not together (count, matchAttribute /
  distinctAttribute across the fitting devices, competition between requests);
* for HAMi-style pods, a line in HAMi's words (GPUs, gpumem, gpucores).

Identical reasons are grouped per node. Pure: no I/O; the CLI renders the result.
"""

from __future__ import annotations

import contextlib
import copy
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from fractions import Fraction
from typing import Any

from tessera.allocator import (
    AllocatedState,
    Allocator,
    Device,
    DeviceRecord,
    Node,
    NodeRecord,
    RequestRecord,
)
from tessera.allocator.core import slice_on_node
from tessera.allocator.model import DeviceID
from tessera.allocator.record import (
    CapacityShort,
    CelError,
    CountersShort,
    InUse,
    Refusal,
    SelectorFalse,
)
from tessera.api.errors import TesseraError
from tessera.api.loader import Manifest
from tessera.api.pods import pod_claims
from tessera.cel import CelCompileError, CelRuntimeError, compile_selector
from tessera.cel import reading as celtools
from tessera.scheduler.claims import pod_claim_name
from tessera.scheduler.nodes import node_refusal
from tessera.scheduler.policies import rank_text
from tessera.scheduler.words import (
    amount,
    attribute_value,
    cel_error,
    refusal_key,
    refusal_text,
    selector_false,
)
from tessera.sim.cluster import Cluster
from tessera.sim.reasons import needs_text
from tessera.sim.simulate import (
    EXTENDED_POD_CLAIM,
    Choice,
    PendingCause,
    SimResult,
    Simulation,
)

MIB = 2**20
MAX_NAMES = 4  # device names shown per grouped reason


class ExplainError(TesseraError):
    """The target names no pod or claim of the simulation (or several). One line, with a fix."""


# ---------------------------------------------------------------------------------------------
# Result model


@dataclass
class DeviceVerdict:
    """The first check that refused one device for one request, or ``check == "fits"``.

    ``device``: ``driver/pool/device``. ``check``: ``node``, ``in-use``, ``class-selector``,
    ``selector``, ``cel-error``, ``capacity``, ``capacity-error`` (an amount the scheduler
    refuses to act on: negative, or past its range arithmetic), ``policy``, ``counters`` (a shared counter set,
    KEP-4815, cannot give what the device consumes), ``taint``, ``constraint`` or ``fits``.
    ``reason``: the full text for this device; ``key``: the same text without per-device values
    (identical keys are grouped); ``detail``: the per-device value part.
    """

    device: str
    check: str
    reason: str
    key: str
    detail: str = ""


@dataclass
class ReasonGroup:
    """``count`` devices refused for the same reason (``devices``: their names)."""

    count: int
    devices: list[str]
    check: str
    reason: str


@dataclass
class RequestOnNode:
    """One request (``req`` or ``req/sub``) of one claim on one node."""

    claim: str  # namespace/name
    request: str
    wants: str  # e.g. "1 device × memory 100Gi (class gpu.tessera.dev)"
    considered: int  # devices on the node in complete, valid pools
    fitting: list[str]  # devices that pass every check on their own
    groups: list[ReasonGroup]
    notes: list[str] = field(default_factory=list)
    devices: list[DeviceVerdict] = field(default_factory=list)


@dataclass
class NodeExplanation:
    """One node: ``verdict`` is ``fits``, ``refused`` or ``error``; ``summary`` one line."""

    node: str
    verdict: str
    summary: str
    pools: list[str] = field(default_factory=list)
    requests: list[RequestOnNode] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    hami: list[str] = field(default_factory=list)


@dataclass
class Explanation:
    """What ``tessera explain`` reports about one pod or claim.

    ``target``: ``Pod ns/name`` or ``ResourceClaim ns/name``; ``status``: ``pending``,
    ``scheduled`` or ``unallocated`` (a claim no pod uses); ``reason``: the scheduler's
    message from the simulation; ``node``: where it was scheduled; ``placements``: one line
    per allocated device share; ``nodes``: per node, in cluster order (for a scheduled pod:
    the nodes tried up to the chosen one); ``hami``: HAMi-terms lines for the whole cluster;
    ``notes``: anything else worth knowing.
    """

    target: str
    status: str
    reason: str = ""
    node: str | None = None
    claims: list[str] = field(default_factory=list)
    placements: list[str] = field(default_factory=list)
    nodes: list[NodeExplanation] = field(default_factory=list)
    hami: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    #: ``claim NS/NAME, request REQ`` -> what it asks of each device, over every node
    #: explained (:func:`cluster_wants`).
    wants: dict[str, str] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-able dict (field names as above)."""
        return asdict(self)


# ---------------------------------------------------------------------------------------------
# Formatting helpers


def _names(devs: Sequence[str]) -> list[str]:
    return [d.split("/", 2)[-1] for d in devs]


def _shown(devs: Sequence[str]) -> str:
    n = _names(devs)
    if len(n) <= MAX_NAMES:
        return ", ".join(n)
    return ", ".join(n[:MAX_NAMES]) + f", +{len(n) - MAX_NAMES} more"


def _plural(n: int, word: str) -> str:
    return f"{n} {word}" if n == 1 else f"{n} {word}s"


def wants(rr: RequestRecord, devs: Sequence[DeviceRecord] | None = None) -> str:
    """What a request asks of each device, every capacity it consumes included: the amounts it
    names, and for the ones it does not name the request policy's default (dra-spec.md 2.2),
    e.g. ``1 device with cores 50 and all of the device's memory (...) (class c)``. ``devs``:
    the device records the statement is about (default: this record's matching devices, else
    all of them). The text is :func:`tessera.sim.reasons.needs_text`, the one simulate's
    pending reasons use."""
    if devs is None:
        devs = rr.matching or rr.devices
    return f"{needs_text(rr, devs)} (class {rr.class_name})"


def cluster_wants(
    records: Sequence[tuple[NodeRecord, Sequence[Mapping[str, Any]]]],
) -> dict[str, str]:
    """``claim NS/NAME, request REQ`` -> :func:`wants` over every node's record of it (the
    matching devices of all nodes, else all their devices): one statement for the cluster, as
    ``simulate``'s pending reason makes it. ``records``: (record, the claims it is about)."""
    first: dict[str, RequestRecord] = {}
    matching: dict[str, list[DeviceRecord]] = {}
    every: dict[str, list[DeviceRecord]] = {}
    for rec, claims in records:
        for rr in rec.requests:
            k = f"claim {_claim_ref(claims[rr.claim_index])}, request {rr.name}"
            first.setdefault(k, rr)
            matching.setdefault(k, []).extend(rr.matching)
            every.setdefault(k, []).extend(rr.devices)
    return {k: wants(rr, matching[k] or every[k]) for k, rr in first.items()}


# ---------------------------------------------------------------------------------------------
# Per-device verdicts, from the allocator's record


def _failing_conjunct(expr: str, act: dict[str, Any], *, want_error: bool) -> str | None:
    """The first top-level ``&&`` conjunct that is false (or fails), to name it."""
    parts = celtools.conjuncts(expr)
    if len(parts) < 2:
        return None
    for p in parts:
        try:
            r = compile_selector(p).evaluate(act)
        except CelRuntimeError:
            if want_error:
                return p
            continue
        except CelCompileError:
            continue
        if not r and not want_error:
            return p
    return None


def _values(part: str, d: Device) -> str:
    """``name = value`` for each attribute/capacity the sub-expression reads on ``d``."""
    out: list[str] = []
    for r in celtools.reads(part):
        if r.in_has or r.domain is None or r.name is None:
            continue
        q = f"{r.domain}/{r.name}"
        if r.kind == "attributes":
            v = d.attributes.get(q)
            text = f"{r.name} = {attribute_value(v)}" if v is not None else f"no attribute {q}"
        else:
            name = r.name if r.domain == d.driver else q
            cap = d.capacity.get(name)
            text = (
                f"{r.name} = {attribute_value(cap.value)}"
                if cap is not None
                else f"no capacity {q}"
            )
        if text not in out:
            out.append(text)
    return ", ".join(out)


def verdict(
    dr: DeviceRecord, lists: bool, owners: Mapping[tuple[str, str, str], str]
) -> DeviceVerdict:
    """The record's refusal of one device, in words: selectors name their false (or failing)
    top-level conjunct and the device's values; a dedicated device in use names its claim."""
    d = dr.device
    did = "/".join(d.id)
    r = dr.alone
    if r is None:
        return DeviceVerdict(did, "fits", "fits on its own", "fits on its own")
    if isinstance(r, SelectorFalse):
        part = " ".join(r.expression.split())
        with contextlib.suppress(CelRuntimeError):
            part = _failing_conjunct(r.expression, d.activation(lists), want_error=False) or part
        key = selector_false(r, part)
        detail = _values(part, d)
        return DeviceVerdict(did, r.check, key + (f" ({detail})" if detail else ""), key, detail)
    if isinstance(r, CelError):
        at = ""
        with contextlib.suppress(CelRuntimeError):
            failing = _failing_conjunct(r.expression, d.activation(lists), want_error=True)
            if failing and failing != " ".join(r.expression.split()):
                at = f" in `{failing}`"
        msg = cel_error(r, at)
        return DeviceVerdict(did, r.check, msg, msg)
    if isinstance(r, InUse) and r.by == "allocated":
        owner = owners.get(d.id)
        text = refusal_text(r)
        msg = f"{text} to claim {owner}" if owner else text
        return DeviceVerdict(did, r.check, msg, text, owner or "")
    text, key = refusal_text(r), refusal_key(r)
    if isinstance(r, CountersShort) and key != text and key.startswith("shared counters: "):
        # The set in words is the group; each device adds the counter it cannot have.
        return DeviceVerdict(did, r.check, text, key, f"{r.counter_set}/{r.counter}")
    return DeviceVerdict(did, r.check, text, key, text if text != key else "")


def _group(
    verdicts: Sequence[DeviceVerdict], refusals: Sequence[Refusal | None]
) -> list[ReasonGroup]:
    """Group refusals by reason. Identical texts form one group; a reason whose per-device
    values differ (capacity shortfalls, attribute values) is one group per distinct text while
    there are at most 3 of them, else one group with the values summarised. ``refusals``: the
    record's refusal behind each verdict (same order)."""
    behind = {v.device: r for v, r in zip(verdicts, refusals, strict=True)}
    by_key: dict[str, list[DeviceVerdict]] = {}
    for v in verdicts:
        if v.check != "fits":
            by_key.setdefault(v.key, []).append(v)
    out: list[ReasonGroup] = []
    for key, vs in by_key.items():
        texts: dict[str, list[DeviceVerdict]] = {}
        for v in vs:
            texts.setdefault(v.reason, []).append(v)
        if len(texts) <= 3:
            for text, tv in texts.items():
                out.append(ReasonGroup(len(tv), [v.device for v in tv], tv[0].check, text))
            continue
        details: list[str] = []
        for v in vs:
            if v.detail and v.detail not in details:
                details.append(v.detail)
        if vs[0].check == "capacity":
            text = f"{key}; the least short: {_least_short(vs, behind)}"
        else:
            text = f"{key} ({'; '.join(details[:3])}; ...)"
        out.append(ReasonGroup(len(vs), [v.device for v in vs], vs[0].check, text))
    return out


def _least_short(vs: Sequence[DeviceVerdict], behind: Mapping[str, Refusal | None]) -> str:
    """The device that is least short: by the first capacity its refusal says is short by an
    amount (not one the device can never hold), from the record's amounts."""

    def shortfall(v: DeviceVerdict) -> Fraction:
        r = behind[v.device]
        if isinstance(r, CapacityShort):
            for u in r.short:
                if not u.never:
                    return u.needs - u.free
        return Fraction(0)

    best = min(vs, key=shortfall)
    return f"{best.device.split('/', 2)[-1]}: {best.detail}"


def request_on_node(
    rr: RequestRecord,
    claim: str,
    lists: bool,
    owners: Mapping[tuple[str, str, str], str],
    all_devices: bool,
) -> RequestOnNode:
    """One request's account on one node, read from the allocator's record. ``claim``: the
    claim's ``namespace/name``."""
    verdicts = [verdict(dr, lists, owners) for dr in rr.devices]
    fitting = [v.device for v in verdicts if v.check == "fits"]
    ron = RequestOnNode(
        claim,
        rr.name,
        wants(rr),
        len(verdicts),
        fitting,
        _group(verdicts, [dr.alone for dr in rr.devices]),
    )
    if all_devices:
        ron.devices = verdicts
    if rr.all_mode:
        if rr.count == 0:
            ron.notes.append("allocationMode All needs at least one matching device")
    elif fitting and len(fitting) < rr.count:
        ron.notes.append(f"needs {rr.count} devices, {len(fitting)} fit on their own")
    # Devices that fit on their own but that the search refused beside its other picks.
    together: dict[str, list[str]] = {}
    for dr in rr.devices:
        if dr.alone is None and dr.in_search is not None:
            together.setdefault(refusal_text(dr.in_search), []).append(dr.device.name)
    for text, names in list(together.items())[:3]:
        ron.notes.append(
            f"{', '.join(names)}: fits on its own, refused beside the other picks: {text}"
        )
    return ron


# ---------------------------------------------------------------------------------------------
# Per node


def _claim_ref(c: Mapping[str, Any]) -> str:
    md = c.get("metadata") or {}
    return f"{md.get('namespace') or 'default'}/{md.get('name') or md.get('generateName') or ''}"


def _owners(claims: Sequence[Mapping[str, Any]]) -> dict[tuple[str, str, str], str]:
    owners: dict[tuple[str, str, str], str] = {}
    for c in claims:
        for r in (((c.get("status") or {}).get("allocation") or {}).get("devices") or {}).get(
            "results"
        ) or []:
            if not r.get("shareID") and not r.get("adminAccess"):
                owners[(r["driver"], r["pool"], r["device"])] = _claim_ref(c)
    return owners


def pool_problems(alloc: Allocator, rec: NodeRecord, node: Node) -> list[str]:
    """Pools visible from ``node`` that the allocator skips: incomplete, invalid, obsolete."""
    out: list[str] = []
    pools = alloc.pools(node)
    seen = {p.key for p in pools}
    for name in rec.incomplete_pools:
        driver, _, pool = name.partition("/")
        have, want, gen = alloc.index.pool_publication(driver, pool)
        out.append(
            f"pool {name} is incomplete: {have} of resourceSliceCount {want} slices published "
            f"at generation {gen}; none of its devices is allocated until all are published"
        )
    for name, why in rec.invalid_pools:
        out.append(f"pool {name} is invalid ({why}); none of its devices is allocated")
    for key, sl in alloc.index.by_pool.items():
        if key in seen:
            continue
        visible = [s for s in sl if slice_on_node(s, node)]
        if visible and any(s.generation > max(v.generation for v in visible) for s in sl):
            out.append(
                f"pool {key[0]}/{key[1]} is obsolete on this node: a newer generation is being published"
            )
    return out


def explain_node(
    alloc: Allocator,
    node: Node,
    claims: Sequence[Mapping[str, Any]],
    *,
    owners: Mapping[tuple[str, str, str], str] | None = None,
    all_devices: bool = False,
) -> tuple[NodeExplanation, NodeRecord]:
    """Why ``claims`` can (not) be allocated on ``node``: the allocator's own record
    (:meth:`Allocator.diagnose`) in words, and the record itself. ``owners`` names the claim
    holding each dedicated device (for "in use" lines)."""
    rec = alloc.diagnose(node, claims)
    ne = NodeExplanation(node.name, "refused", "")
    ne.pools = pool_problems(alloc, rec, node)
    lists = alloc.features.list_type_attributes
    for rr in rec.requests:
        ne.requests.append(
            request_on_node(
                rr, _claim_ref(claims[rr.claim_index]), lists, owners or {}, all_devices
            )
        )
    if rec.error is not None:
        ne.verdict = "refused" if rec.node_only else "error"
        ne.summary = rec.error if rec.node_only else f"allocation error: {rec.error}"
        return ne, rec
    if rec.fits:
        ne.verdict = "fits"
        ne.summary = "every claim fits here now"
        return ne, rec
    parts = []
    for r in ne.requests:
        need = "all" if "All" in r.wants or r.wants.startswith("all ") else r.wants.split(" ", 1)[0]
        parts.append(
            f"claim {r.claim}, request {r.request}: {len(r.fitting)} of {_plural(r.considered, 'device')} fit "
            f"(needs {need})"
        )
    ne.summary = (
        "cannot allocate all claims: " + "; ".join(parts) if parts else "cannot allocate all claims"
    )
    if (
        ne.requests
        and all(r.fitting for r in ne.requests)
        and not any(r.notes for r in ne.requests)
    ):
        ne.notes.append(
            "every request has devices that fit on their own, but no combination of them fits together "
            "(the search tried every combination of the devices that fit on their own)"
        )
    return ne, rec


# ---------------------------------------------------------------------------------------------
# HAMi view


def _hami_lines(
    conv_requests: Sequence[Any],
    claims_by_pc: Mapping[str, Mapping[str, Any]],
    per_node: Sequence[tuple[NodeExplanation, NodeRecord | None, Sequence[Mapping[str, Any]]]],
) -> list[str]:
    """Per converted container: the request in HAMi words, and which node comes closest: the
    devices that fit on their own (any subrequest) in the allocator's record of each node.
    ``per_node``: (explanation, record or None where the node was refused before allocation,
    the claims the record is about)."""
    out: list[str] = []
    for hr in conv_requests:
        claim = claims_by_pc.get(hr.claim_name)
        if claim is None:
            continue
        if hr.memory_mib is not None:
            mem = f"gpumem {hr.memory_mib} MiB"
        elif hr.memory_percentage == 100:
            mem = "gpumem all of each GPU's memory"
        else:
            mem = f"gpumem-percentage {hr.memory_percentage}"
        head = f"HAMi request (container {hr.container}): {_plural(hr.gpus, 'GPU')} × {mem}, gpucores {hr.cores}"
        best: tuple[int, str] = (-1, "")
        any_selectable = False
        for ne, rec, claims in per_node:
            if rec is None:
                continue
            ok: set[DeviceID] = set()
            selectable: set[DeviceID] = set()
            for rr in rec.requests:
                if claims[rr.claim_index] is claim:
                    ok |= {dr.id for dr in rr.fitting}
                    selectable |= {dr.id for dr in rr.matching}
            any_selectable = any_selectable or bool(selectable)
            if len(ok) > best[0]:
                best = (len(ok), ne.node)
            if not selectable:
                ne.hami.append(f"{head} — no GPU on {ne.node} matches the pod's device selectors")
            else:
                verb = "has" if len(ok) == 1 else "have"
                ne.hami.append(
                    f"{head} — {_plural(len(ok), 'GPU')} on {ne.node} {verb} {_hami_need(hr)} free"
                )
        if not any_selectable:
            out.append(
                f"{head} — no GPU on any node matches the pod's device selectors (HAMi annotations such as "
                "nvidia.com/use-gputype or nvidia.com/use-gpuuuid)"
            )
        elif best[0] < hr.gpus:
            most = f" (most: {best[0]} on {best[1]})" if best[0] > 0 else ""
            out.append(
                f"{head} — no node has {_plural(hr.gpus, 'GPU')} with {_hami_need(hr)} free{most}"
            )
        else:
            out.append(
                f"{head} — {best[1]} has {_plural(best[0], 'GPU')} with {_hami_need(hr)} free"
            )
    return out


def _hami_need(hr: Any) -> str:
    if hr.memory_mib is not None:
        mem = f"{hr.memory_mib} MiB"
    elif hr.memory_percentage == 100:
        mem = "all memory"
    else:
        mem = f"{hr.memory_percentage}% memory"
    return f"{mem} and {hr.cores}% cores"


# ---------------------------------------------------------------------------------------------
# Entry point


def _split_target(target: str) -> tuple[str | None, str]:
    ns, sep, name = target.partition("/")
    return (ns, name) if sep else (None, target)


def _matches(ref: str, target: str) -> bool:
    ns, name = _split_target(target)
    rns, _, rname = ref.partition("/")
    return rname == name and (ns is None or ns == rns)


def _pod_claims(pod: Mapping[str, Any], sim: Simulation) -> list[tuple[str, dict[str, Any]]]:
    md = pod.get("metadata") or {}
    ns = md.get("namespace") or "default"
    out = []
    for pc in pod_claims(pod):
        name = pod_claim_name(pod, pc, simulated=True)
        c = sim.claims.get((ns, name)) if name is not None else None
        if c is not None:
            out.append((pc.name, c))
    ext = sim.extended_claim_of(pod)  # the claim kube-scheduler synthesises (KEP-5004)
    if ext is not None:
        out.append((EXTENDED_POD_CLAIM, ext))
    return out


def explain(
    cluster: Cluster,
    manifests: Sequence[Manifest],
    target: str,
    *,
    seed: int = 0,
    all_devices: bool = False,
    class_map: Mapping[str, str] | None = None,
    policy: str = "first-fit",
) -> Explanation:
    """Simulate ``manifests`` on ``cluster`` (placement ``policy``, as simulate's
    ``--policy``) and explain ``target``.

    ``target``: a pod (``namespace/name`` or ``name``) or a ResourceClaim (same forms; claims
    made from templates are named ``<pod>-<pod claim name>``). ``all_devices`` keeps the
    per-device verdicts (``RequestOnNode.devices``); ``class_map`` is simulate's
    ``--class-map`` (:func:`tessera.sim.classmap.map_device_classes`). Raises :class:`ExplainError` when the
    target is unknown or ambiguous, and whatever :class:`Simulation` raises for bad input.
    """
    sim, result, snaps = _run(
        cluster, manifests, lambda ref: _matches(ref, target), seed, class_map, policy
    )
    if len(snaps) > 1:
        raise ExplainError(
            f"{target!r} names several pods ({', '.join(sorted(snaps))}): write namespace/name"
        )
    if snaps:
        ref, state = next(iter(snaps.items()))
        return _explain_pod(sim, result, manifests, ref, state, None, all_devices)
    ns, name = _split_target(target)
    keys = [k for k in sim.claims if k[1] == name and (ns is None or k[0] == ns)]
    if not keys:
        pods = [f"{p.namespace}/{p.name}" for p in sim.pods]
        raise ExplainError(
            f"{target!r} is neither a pod nor a ResourceClaim of the simulation "
            f"(pods: {', '.join(pods[:8]) or 'none'}{', ...' if len(pods) > 8 else ''}): check the name"
        )
    if len(keys) > 1:
        raise ExplainError(f"{target!r} names several ResourceClaims: write namespace/name")
    key = keys[0]
    for obj in result.objects:
        if obj.get("kind") != "Pod":
            continue
        if any(c is sim.claims[key] for _, c in _pod_claims(obj, sim)):
            pref = _claim_ref(obj)
            sim2, result2, snaps2 = _run(
                cluster, manifests, lambda ref, pref=pref: ref == pref, seed, class_map, policy
            )
            exp = _explain_pod(
                sim2, result2, manifests, pref, snaps2[pref], f"{key[0]}/{key[1]}", all_devices
            )
            exp.target = f"ResourceClaim {key[0]}/{key[1]} (used by Pod {pref})"
            return exp
    claim = sim.claims[key]
    exp = Explanation(f"ResourceClaim {key[0]}/{key[1]}", "unallocated")
    exp.claims = [f"{key[0]}/{key[1]}"]
    if (claim.get("status") or {}).get("allocation"):
        exp.status = "allocated"
        exp.placements = _placements(sim, [claim], None)
        return exp
    exp.notes.append(
        "no pod uses this claim: the scheduler allocates a claim only when it schedules a pod that uses it"
    )
    ex = _Explainer(sim, sim.state)
    for node in sim.nodes:
        exp.nodes.append(ex.node(node, None, [claim], [], all_devices)[0])
    return exp


def _run(
    cluster: Cluster,
    manifests: Sequence[Manifest],
    want: Any,
    seed: int,
    class_map: Mapping[str, str] | None = None,
    policy: str = "first-fit",
) -> tuple[Simulation, SimResult, dict[str, AllocatedState]]:
    sim = Simulation(cluster, manifests, seed=seed, class_map=class_map, policy=policy)
    sim.record_choices = True
    snaps: dict[str, AllocatedState] = {}

    def on_pod(ref: str) -> None:
        if want(ref) and ref not in snaps:
            snaps[ref] = copy.deepcopy(sim.state)

    result = sim.run(on_pod)
    return sim, result, snaps


def _placements(
    sim: Simulation, claims: Sequence[Mapping[str, Any]], before: AllocatedState | None
) -> list[str]:
    out = []
    devs = {"/".join(d.id): d for d in sim.index.devices()}
    for c in claims:
        for r in (((c.get("status") or {}).get("allocation") or {}).get("devices") or {}).get(
            "results"
        ) or []:
            did = f"{r['driver']}/{r['pool']}/{r['device']}"
            d = devs.get(did)
            parts = []
            cc = r.get("consumedCapacity") or {}
            for k, v in cc.items():
                cap = d.capacity.get(k) if d else None
                if cap is not None and before is not None:
                    free = (
                        cap.value.value - before.aggregated.get(d.id, {}).get(k, Fraction(0))
                        if d
                        else Fraction(0)
                    )
                    parts.append(f"{k} {v} of {amount(free, cap.value.format)} free")
                else:
                    parts.append(f"{k} {v}")
            share = "shared" if r.get("shareID") else "dedicated"
            uuid = d.attributes.get(f"{d.driver}/uuid") if d else None
            model = d.attributes.get(f"{d.driver}/productName") if d else None
            ident = ", ".join(str(x) for x in (uuid, model) if x)
            out.append(
                f"claim {_claim_ref(c)}, request {r['request']}: {did}{f' ({ident})' if ident else ''}, {share}"
                + (f": {', '.join(parts)}" if parts else "")
            )
    return out


def _explain_legacy_pod(sim: Simulation, result: SimResult, ref: str) -> Explanation:
    """A pod of legacy mode's scheduler: per node, what legacy mode's decision
    (:func:`tessera.scheduler.legacy.decide`, the extender's) said at the pod's turn, from the
    simulation's record of it; DRA-mode nodes take no such pod."""
    from tessera.api.modes import MODE_LABEL, MODE_LEGACY
    from tessera.convert import LEGACY_SCHEDULER

    pod = next(o for o in result.objects if o.get("kind") == "Pod" and _claim_ref(o) == ref)
    node_name = (pod.get("spec") or {}).get("nodeName")
    exp = Explanation(f"Pod {ref}", "scheduled" if node_name else "pending", node=node_name)
    exp.reason = next((p.reason for p in result.pending if p.pod == ref), "")
    exp.placements = [
        f"container {p.container}: {p.device} ({', '.join(x for x in (p.uuid, p.model) if x)}): "
        f"memory {p.memory}, cores {p.cores}"
        for p in result.placements
        if p.pod == ref
    ]
    decision = sim.legacy_decisions.get(ref)
    fits = {f.node: f for f in decision.nodes} if decision is not None else {}
    levels = decision.levels() if decision is not None and decision.hami else {}
    unbound = _unbound(pod)
    for node in sim.nodes:
        if sim.node_modes.get(node.name) != MODE_LEGACY:
            exp.nodes.append(
                NodeExplanation(
                    node.name,
                    "refused",
                    f"in DRA mode (label {MODE_LABEL} not {MODE_LEGACY}): the scheduler "
                    f"{LEGACY_SCHEDULER} places pods on legacy-mode nodes only",
                )
            )
            continue
        f = fits.get(node.name)
        if f is None:
            refusal = node_refusal(unbound, node, sim.taints.get(node.name, ()))
            why = refusal.reason if refusal is not None else "not decided"
            exp.nodes.append(NodeExplanation(node.name, "refused", why))
        elif not f.fits:
            exp.nodes.append(NodeExplanation(node.name, "refused", f.reason))
        elif node.name == node_name:
            exp.nodes.append(NodeExplanation(node.name, "fits", "scheduled here"))
        else:
            level = levels.get(node.name)
            exp.nodes.append(
                NodeExplanation(
                    node.name,
                    "fits",
                    "fits, not preferred"
                    + (f" (preference level {level}; 0 is the node chosen)" if level else ""),
                )
            )
    exp.notes.append(
        "placed by legacy mode's decision (what `tessera extender --legacy` decides) over the "
        "legacy-mode nodes and the legacy pods placed before it, recorded on the pod in HAMi's "
        "hami.io/vgpu-devices-allocated; the reasons are those of the pod's turn"
    )
    return exp


def _explain_pod(
    sim: Simulation,
    result: SimResult,
    manifests: Sequence[Manifest],
    ref: str,
    state: AllocatedState,
    only_claim: str | None,
    all_devices: bool,
) -> Explanation:
    from tessera.convert import convert_pod

    if result.modes.get(ref) == "legacy":
        return _explain_legacy_pod(sim, result, ref)
    pod = next(o for o in result.objects if o.get("kind") == "Pod" and _claim_ref(o) == ref)
    pname = ref.split("/", 1)[1]
    claims = _pod_claims(pod, sim)
    if only_claim is not None:
        claims = [(pc, c) for pc, c in claims if _claim_ref(c) == only_claim]
    node_name = (pod.get("spec") or {}).get("nodeName")
    exp = Explanation(f"Pod {ref}", "scheduled" if node_name else "pending", node=node_name)
    exp.claims = [_claim_ref(c) for _, c in claims]
    cause: PendingCause | None = None
    for p in result.pending:
        if p.pod == ref:
            exp.reason, cause = p.reason, p.cause
            # A pending pod stays pending; its reason (above) and the per-device account
            # below both describe the cluster as the simulation left it, after every pod.
            state = sim.state
    before = copy.deepcopy(state)
    own: list[dict[str, Any]] = []
    done: list[dict[str, Any]] = []
    for _, c in claims:
        alloc = (c.get("status") or {}).get("allocation")
        rf = (c.get("status") or {}).get("reservedFor") or []
        if alloc and node_name and rf and rf[0].get("name") == pname:
            own.append(c)
            for r in (alloc.get("devices") or {}).get("results") or []:
                before.remove_result(r)
        elif alloc:
            done.append(c)
    orig = next((m for m in sim.pods if f"{m.namespace}/{m.name}" == ref), None)
    conv_requests: list[Any] = []
    if orig is not None:
        try:
            conv_requests = list(convert_pod(orig.obj, memory_sizes=sim.memory_sizes).requests)
        except ValueError:
            conv_requests = []
    ex = _Explainer(sim, before)
    recs: list[tuple[NodeRecord, Sequence[Mapping[str, Any]]]] = []
    if node_name:
        exp.placements = _placements(sim, own, before) + [
            p + " (allocated earlier, for another pod)" for p in _placements(sim, done, None)
        ]
        choice = sim.choices.get(ref)
        for i in _ranked_order(sim, choice, node_name):
            node = sim.nodes[i]
            if node.name == node_name:
                why = _chosen_text(choice, i)
                if not own:
                    why = (
                        "its claims were already allocated there"
                        if done
                        else "it has no claims to allocate"
                    )
                exp.nodes.append(NodeExplanation(node.name, "fits", f"scheduled here: {why}"))
                continue
            if choice is not None and i in choice.fits:
                exp.nodes.append(
                    NodeExplanation(node.name, "fits", _not_chosen_text(choice, i, node_name))
                )
                continue
            ne, rec = ex.node(node, pod, own, done, all_devices)
            exp.nodes.append(ne)
            if rec is not None:
                recs.append((rec, own))
        exp.wants = cluster_wants(recs)
        if choice is not None and (choice.tiers or choice.policy.nodes != "first-fit"):
            name = choice.policy.gpus if choice.tiers else choice.policy.nodes
            exp.notes.append(
                f"placed by Tessera's {name} planning policy; kube-scheduler itself picks any node where the pod fits "
                "(ties broken at random)"
            )
        else:
            exp.notes.append(
                "kube-scheduler picks any node where the pod fits (ties broken at random); the simulation takes "
                "the first"
            )
        return exp
    todo = [c for _, c in claims if not (c.get("status") or {}).get("allocation")]
    if cause is PendingCause.EVICTED:
        exp.notes.append(
            "the claims fit (below), but the pod would not run: kube-scheduler binds it and the device taint "
            "eviction controller deletes it; a request toleration with effect NoExecute for the taint keeps it "
            "(one without an effect only lets the scheduler allocate the device)"
        )
    if (not claims and exp.reason) or sim.missing_class(todo):
        # Refused before any allocation (kube-scheduler's PreFilter): no per-node account.
        exp.notes.append(exp.reason)
        return exp
    per_node = []
    for node in sim.nodes:
        ne, rec = ex.node(node, pod, todo, done, all_devices)
        exp.nodes.append(ne)
        per_node.append((ne, rec, todo))
        if rec is not None:
            recs.append((rec, todo))
    exp.wants = cluster_wants(recs)
    if cause is PendingCause.ALLOCATION_ERROR:
        exp.notes.append(
            "an allocator error (not 'no room') stops scheduling of the pod on every node: the scheduler retries it "
            "with backoff and it stays pending until the error is fixed (dra-spec.md 3.2)"
        )
    by_pc = {pc: c for pc, c in claims}
    exp.hami = _hami_lines(conv_requests, by_pc, per_node)
    return exp


def _ranked_order(sim: Simulation, choice: Choice | None, node_name: str) -> list[int]:
    """The nodes to report for a scheduled pod, as the simulation's scan met them: those known
    not to fit (skipped, in cluster order), then those it tried, in the policy's order. Without
    a record (the pod's claims were allocated already): cluster order up to its node."""
    if choice is None:
        names = [n.name for n in sim.nodes]
        return list(range(names.index(node_name) + 1 if node_name in names else len(names)))
    return [*range(choice.skipped), *choice.examined]


def _chosen_text(choice: Choice | None, i: int) -> str:
    """Why the chosen node won, in the policy's own ranking (:func:`placement_rank`)."""
    if choice is None:
        return "first node in cluster order where every claim fits"
    rank = choice.fits[i]
    if len(choice.fits) == 1 and choice.policy.nodes == "first-fit" and not choice.tiers:
        return "first node in cluster order where every claim fits"
    name = choice.policy.gpus if choice.tiers else choice.policy.nodes
    return f"ranked first by the {name} policy: {rank_text(choice.policy, rank, choice.tiers)}"


def _not_chosen_text(choice: Choice, i: int, chosen: str) -> str:
    return (
        f"not chosen: {rank_text(choice.policy, choice.fits[i], choice.tiers)} "
        f"(ranked below {chosen})"
    )


def _unbound(pod: Mapping[str, Any]) -> dict[str, Any]:
    """The pod as the scheduler saw it: without the ``spec.nodeName`` the simulation set."""
    p = dict(pod)
    p["spec"] = {k: v for k, v in (pod.get("spec") or {}).items() if k != "nodeName"}
    return p


class _Explainer:
    """The allocator over the simulation's slices and classes, at a given allocated state."""

    def __init__(self, sim: Simulation, state: AllocatedState) -> None:
        self.sim = sim
        self.alloc = Allocator(sim.index, sim.classes, state, sim.allocator.features)
        self.owners = _owners(list(sim.claims.values()))

    def node(
        self,
        node: Node,
        pod: Mapping[str, Any] | None,
        todo: Sequence[dict[str, Any]],
        done: Sequence[Mapping[str, Any]],
        all_devices: bool,
    ) -> tuple[NodeExplanation, NodeRecord | None]:
        """Pod-level refusals first (node affinity, untolerated node taints, claims allocated for
        another node), then the allocator's record for the claims still to allocate."""
        if pod is None:  # a claim on its own: only where its allocated claims are available
            refusal = node_refusal({}, node, (), done)
        else:
            refusal = node_refusal(_unbound(pod), node, self.sim.taints.get(node.name, ()), done)
        if refusal is not None:
            return NodeExplanation(node.name, "refused", refusal.explanation), None
        return explain_node(self.alloc, node, todo, owners=self.owners, all_devices=all_devices)


# ---------------------------------------------------------------------------------------------
# Text rendering


def render_text(exp: Explanation) -> str:
    """The explanation as plain text: a header, then per node a summary line and one row per
    group of devices refused for the same reason; ``--all-devices`` rows when kept."""
    lines: list[str] = []
    head = f"{exp.target}: {exp.status}"
    if exp.node:
        head += f" on {exp.node}"
    lines.append(head)
    if exp.reason:
        lines.append(f"  scheduler: {exp.reason}")
    for p in exp.placements:
        lines.append(f"  placed: {p}")
    for h in exp.hami:
        lines.append(f"  {h}")
    for n in exp.notes:
        lines.append(f"  note: {n}")
    wants: dict[str, str] = dict(exp.wants)
    for ne in exp.nodes:
        for r in ne.requests:
            wants.setdefault(f"claim {r.claim}, request {r.request}", r.wants)
    for k, w in wants.items():
        lines.append(f"  {k} wants {w}")
    for ne in exp.nodes:
        lines.append("")
        lines.append(f"{ne.node}: {ne.verdict} — {ne.summary}")
        for p in ne.pools:
            lines.append(f"  {p}")
        rows: list[tuple[str, str, str]] = []
        for r in ne.requests:
            req = (
                r.request if len({x.claim for x in ne.requests}) == 1 else f"{r.claim}:{r.request}"
            )
            for g in r.groups:
                rows.append((req, f"{_plural(g.count, 'device')} ({_shown(g.devices)})", g.reason))
            if r.fitting:
                rows.append(
                    (
                        req,
                        f"{_plural(len(r.fitting), 'device')} ({_shown(r.fitting)})",
                        "fit on their own",
                    )
                )
            for note in r.notes:
                rows.append((req, "", note))
        if rows:
            w0 = max(len("REQUEST"), *(len(x[0]) for x in rows))
            w1 = max(len("DEVICES"), *(len(x[1]) for x in rows))
            lines.append(f"  {'REQUEST':<{w0}}  {'DEVICES':<{w1}}  REASON")
            for a, b, c in rows:
                lines.append(f"  {a:<{w0}}  {b:<{w1}}  {c}")
        for note in ne.notes:
            lines.append(f"  note: {note}")
        for h in ne.hami:
            lines.append(f"  {h}")
        devs = [(r.request, v) for r in ne.requests for v in r.devices]
        if devs:
            lines.append("  per device:")
            for req, v in devs:
                lines.append(f"    {req}  {v.device.split('/', 2)[-1]}  {v.check}: {v.reason}")
    return "\n".join(lines)
