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

import copy
import json
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from fractions import Fraction
from typing import Any

from tessera.allocator import AllocatedState, AllocationError, Allocator, Device, Node
from tessera.allocator.core import consumed_amount, tolerates, violates_policy
from tessera.allocator.model import (
    Capacity,
    UnsupportedAttribute,
    device_on_node,
    node_selector_matches,
)
from tessera.api.errors import TesseraError
from tessera.api.loader import Manifest
from tessera.api.quantity import Quantity
from tessera.cel import (
    CelCompileError,
    CelRuntimeError,
    SemverValue,
    compile_selector,
)
from tessera.explain import celtools
from tessera.sim.cluster import Cluster
from tessera.sim.simulate import (
    CounterSetUsage,
    SimResult,
    Simulation,
    _pod_fits_node,
    counter_usage,
    counters_short,
    generated_claim_name,
    untolerated_taint,
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
    ``selector``, ``cel-error``, ``capacity``, ``policy``, ``counters`` (a shared counter set,
    KEP-4815, cannot give what the device consumes), ``taint``, ``constraint`` or ``fits``. ``reason``: the full text for this device; ``key``: the same text without
    per-device values (identical keys are grouped); ``detail``: the per-device value part.
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

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-able dict (field names as above)."""
        return asdict(self)


# ---------------------------------------------------------------------------------------------
# Formatting helpers


def fmt_quantity(v: Fraction, like: Quantity | None = None) -> str:
    """A value in the format of ``like`` (BinarySI for memory), canonical."""
    return Quantity(v, like.format if like is not None else "DecimalSI").canonical()


def fmt_value(v: Any) -> str:
    """An attribute value as CEL would write it."""
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, str):
        return json.dumps(v)
    if isinstance(v, SemverValue):
        return f'semver("{v.text}")'
    if isinstance(v, Quantity):
        return f'quantity("{v.canonical()}")'
    if isinstance(v, list):
        return "[" + ", ".join(fmt_value(x) for x in v) + "]"
    if isinstance(v, UnsupportedAttribute):
        return f"<unsupported: {v.why}>"
    return str(v)


def _names(devs: Sequence[str]) -> list[str]:
    return [d.split("/", 2)[-1] for d in devs]


def _shown(devs: Sequence[str]) -> str:
    n = _names(devs)
    if len(n) <= MAX_NAMES:
        return ", ".join(n)
    return ", ".join(n[:MAX_NAMES]) + f", +{len(n) - MAX_NAMES} more"


def _plural(n: int, word: str) -> str:
    return f"{n} {word}" if n == 1 else f"{n} {word}s"


# ---------------------------------------------------------------------------------------------
# Requests as the allocator sees them


@dataclass
class _Req:
    claim: str
    name: str  # "req" or "req/sub"
    parent: str
    raw: dict[str, Any]
    class_name: str
    class_exprs: list[str]
    exprs: list[str]
    count: int  # 0 for All
    all_mode: bool
    admin: bool
    tolerations: list[dict[str, Any]]
    capacity: dict[str, Quantity]

    def wants(self) -> str:
        n = "all matching devices" if self.all_mode else _plural(self.count, "device")
        caps = ", ".join(f"{k} {v.canonical()}" for k, v in self.capacity.items())
        return f"{n}{' × ' + caps if caps else ''} (class {self.class_name})"


def _claim_ref(c: Mapping[str, Any]) -> str:
    md = c.get("metadata") or {}
    return f"{md.get('namespace') or 'default'}/{md.get('name') or md.get('generateName') or ''}"


def _requests(claim: Mapping[str, Any], classes: Mapping[str, Mapping[str, Any]]) -> list[list[_Req]]:
    out: list[list[_Req]] = []
    ref = _claim_ref(claim)
    for r in ((claim.get("spec") or {}).get("devices") or {}).get("requests") or []:
        alts: list[tuple[str, dict[str, Any]]]
        if r.get("firstAvailable"):
            alts = [(f"{r.get('name', '')}/{s.get('name', '')}", s) for s in r["firstAvailable"]]
        else:
            alts = [(str(r.get("name", "")), r.get("exactly") or {})]
        group: list[_Req] = []
        for name, body in alts:
            cls_name = str(body.get("deviceClassName") or "")
            cls = classes.get(cls_name) or {}
            mode = body.get("allocationMode") or "ExactCount"
            group.append(
                _Req(
                    claim=ref,
                    name=name,
                    parent=str(r.get("name", "")),
                    raw=body,
                    class_name=cls_name,
                    class_exprs=[((s or {}).get("cel") or {}).get("expression") or "" for s in (cls.get("spec") or {}).get("selectors") or []],
                    exprs=[((s or {}).get("cel") or {}).get("expression") or "" for s in body.get("selectors") or []],
                    count=int(body.get("count") or 1) if mode != "All" else 0,
                    all_mode=mode == "All",
                    admin=bool(body.get("adminAccess")) and "/" not in name,
                    tolerations=list(body.get("tolerations") or []),
                    capacity={k: Quantity.parse(v) for k, v in ((body.get("capacity") or {}).get("requests") or {}).items()},
                )
            )
        out.append(group)
    return out


# ---------------------------------------------------------------------------------------------
# Per-device checks


class _Checker:
    """Runs the allocator's per-device checks one by one and says which refused first."""

    def __init__(self, alloc: Allocator, state: AllocatedState, owners: Mapping[tuple[str, str, str], str]) -> None:
        self.alloc = alloc
        self.state = state
        self.owners = owners
        self.lists = alloc.features.list_type_attributes
        self._counters: dict[tuple[str, str, str], CounterSetUsage] | None = None

    def _shared_counters(self, d: Device) -> DeviceVerdict | None:
        """The allocator's counter check (dra-spec.md 4.4 step 3, KEP-4815): the counter sets
        ``d`` consumes must have what it needs left once the allocated devices' consumption is
        subtracted. Named as ``memory slices of gpu-0: 7 of 8 used (slice 3 needed, in use)``."""
        if not d.consumes_counters or not self.alloc.features.partitionable_devices:
            return None
        if self._counters is None:
            self._counters = counter_usage(self.alloc.index, self.state)
        short = counters_short(d, self._counters, self.state)
        if not short:
            return None
        did = "/".join(d.id)
        full = "; ".join(line for _, lines in short for line in lines)
        key = "; ".join(line for u, _ in short for line in u.lines())
        needs = dict(d.consumes_counters)
        detail = ", ".join(
            f"{u.name}/{c}"
            for u, _ in short
            for c, v in sorted(needs.get(u.name, {}).items())
            if max(u.available.get(c, Fraction(0)), Fraction(0)) < v
        )
        return DeviceVerdict(did, "counters", f"shared counters: {full}", f"shared counters: {key}", detail)

    def _selector(self, owner: str, i: int, expr: str, d: Device, act: dict[str, Any]) -> DeviceVerdict | None:
        did = "/".join(d.id)
        where = f"{owner} selector #{i}"
        check = "class-selector" if owner.startswith("class") else "selector"
        try:
            sel = compile_selector(expr)
        except CelCompileError as e:
            msg = f"{where}: CEL compile error: {e}"
            return DeviceVerdict(did, "cel-error", msg, msg)
        try:
            ok = sel.evaluate(act)
        except CelRuntimeError as e:
            part = self._failing_conjunct(expr, act, want_error=True)
            at = f" in `{part}`" if part and part != " ".join(expr.split()) else ""
            hint = " (guard the lookup with has(...))" if "no such key" in str(e) else ""
            msg = f"{where}: CEL runtime error{at}: {e}{hint}; this aborts scheduling of the pod"
            return DeviceVerdict(did, "cel-error", msg, msg)
        if ok:
            return None
        part = self._failing_conjunct(expr, act, want_error=False) or " ".join(expr.split())
        key = f"{where} is false: `{part}`"
        detail = self._values(part, d)
        return DeviceVerdict(did, check, key + (f" ({detail})" if detail else ""), key, detail)

    @staticmethod
    def _failing_conjunct(expr: str, act: dict[str, Any], *, want_error: bool) -> str | None:
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

    @staticmethod
    def _values(part: str, d: Device) -> str:
        """``name = value`` for each attribute/capacity the sub-expression reads on ``d``."""
        out: list[str] = []
        for r in celtools.reads(part):
            if r.in_has or r.domain is None or r.name is None:
                continue
            q = f"{r.domain}/{r.name}"
            if r.kind == "attributes":
                v = d.attributes.get(q)
                text = f"{r.name} = {fmt_value(v)}" if v is not None else f"no attribute {q}"
            else:
                name = r.name if r.domain == d.driver else q
                cap = d.capacity.get(name)
                text = f"{r.name} = {fmt_value(cap.value)}" if cap is not None else f"no capacity {q}"
            if text not in out:
                out.append(text)
        return ", ".join(out)

    def check(self, rq: _Req, d: Device, node: Node, constraints: Sequence[tuple[int, Mapping[str, Any]]]) -> DeviceVerdict:
        did = "/".join(d.id)
        if not device_on_node(d, node):
            msg = "not available on this node (perDeviceNodeSelection)"
            return DeviceVerdict(did, "node", msg, msg)
        multi = d.allow_multiple and self.alloc.features.consumable_capacity
        if not rq.admin and d.id in self.state.dedicated:
            owner = self.owners.get(d.id)
            msg = f"in use: allocated whole (dedicated) to claim {owner}" if owner else "in use: allocated whole (dedicated)"
            return DeviceVerdict(did, "in-use", msg, "in use: allocated whole (dedicated)", owner or "")
        try:
            act = d.activation(self.lists)
        except CelRuntimeError as e:
            msg = f"CEL runtime error: {e}; selectors cannot be evaluated on this device, which aborts scheduling of the pod"
            return DeviceVerdict(did, "cel-error", msg, msg)
        for i, expr in enumerate(rq.class_exprs):
            v = self._selector(f"class {rq.class_name}", i, expr, d, act)
            if v is not None:
                return v
        for i, expr in enumerate(rq.exprs):
            v = self._selector(f"request {rq.name}", i, expr, d, act)
            if v is not None:
                return v
        if self.alloc.features.consumable_capacity:
            v = self._capacity(rq, d, multi)
            if v is not None:
                return v
        v = self._shared_counters(d)
        if v is not None:
            return v
        if self.alloc.features.device_taints:
            for t in d.taints:
                if t.effect in ("NoSchedule", "NoExecute") and not tolerates(rq.tolerations, t.key, t.value, t.effect):
                    taint = f"{t.key}={t.value}:{t.effect}" if t.value else f"{t.key}:{t.effect}"
                    msg = f"taint {taint} not tolerated: add a toleration to request {rq.name}"
                    return DeviceVerdict(did, "taint", msg, msg)
        for i, c in constraints:
            attr = c.get("matchAttribute") or c.get("distinctAttribute") or ""
            kind = "matchAttribute" if c.get("matchAttribute") else "distinctAttribute"
            v = d.attributes.get(attr)
            if v is None or isinstance(v, UnsupportedAttribute) or (isinstance(v, list) and not self.lists):
                msg = f"has no attribute {attr}, which constraint #{i} ({kind}) needs"
                return DeviceVerdict(did, "constraint", msg, msg)
        return DeviceVerdict(did, "fits", "fits on its own", "fits on its own")

    def _capacity(self, rq: _Req, d: Device, multi: bool) -> DeviceVerdict | None:
        did = "/".join(d.id)
        missing = [k for k in rq.capacity if k not in d.capacity]
        if missing:
            have = ", ".join(d.capacity) or "none"
            msg = f"has no capacity {', '.join(missing)} (it publishes: {have})"
            return DeviceVerdict(did, "capacity", msg, msg)
        problems: list[str] = []
        keys: list[str] = []
        existing = self.state.aggregated.get(d.id, {}) if multi else {}
        for k, cap in d.capacity.items():
            req = rq.capacity.get(k)
            amount = consumed_amount(cap, req)
            if violates_policy(cap, amount):
                msg = f"{k}: {_policy_problem(cap, amount)}"
                return DeviceVerdict(did, "policy", msg, msg)
            used = existing.get(k, Fraction(0))
            if amount.value + used > cap.value.value:
                free = cap.value.value - used
                need = fmt_quantity(amount.value, cap.value)
                how = ""
                if req is None:
                    how = " (policy default: the request names no " + k + ")"
                elif req.value != amount.value:
                    how = f" ({req.canonical()} rounded up by the request policy)"
                short = fmt_quantity(amount.value - free, cap.value)
                problems.append(f"{k} short by {short} (needs {need}{how}, {fmt_quantity(free, cap.value)} free of {cap.value.canonical()})")
                keys.append(f"{k} short (needs {need}{how})")
        if problems:
            return DeviceVerdict(did, "capacity", "; ".join(problems), "; ".join(keys), "; ".join(problems))
        return None


def _policy_problem(cap: Capacity, amount: Quantity) -> str:
    pol = cap.policy
    a = fmt_quantity(amount.value, cap.value)
    if pol is not None and pol.range_min is not None:
        if pol.range_max is not None and amount.value > pol.range_max.value:
            return f"{a} is over the request policy's maximum {pol.range_max.canonical()}"
        step = pol.range_step.canonical() if pol.range_step is not None else "?"
        return f"{a} is not {pol.range_min.canonical()} plus a multiple of step {step}"
    if pol is not None and pol.valid_values:
        vals = ", ".join(v.canonical() for v in pol.valid_values)
        return f"{a} is not one of the request policy's validValues ({vals})"
    return f"{a} violates the request policy"


def _group(verdicts: Sequence[DeviceVerdict]) -> list[ReasonGroup]:
    """Group refusals by reason. Identical texts form one group; a reason whose per-device
    values differ (capacity shortfalls, attribute values) is one group per distinct text while
    there are at most 3 of them, else one group with the values summarised."""
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
            text = f"{key}; the least short: {_most_free(vs)}"
        else:
            text = f"{key} ({'; '.join(details[:3])}; ...)"
        out.append(ReasonGroup(len(vs), [v.device for v in vs], vs[0].check, text))
    return out


def _most_free(vs: Sequence[DeviceVerdict]) -> str:
    # details read "<cap> short by X (needs ..., F free of T)"; the least short is the first
    # when sorted by the exact shortfall, which we recover by re-reading the text.
    def shortfall(v: DeviceVerdict) -> Fraction:
        try:
            return Quantity.parse(v.detail.split(" short by ", 1)[1].split(" ", 1)[0]).value
        except (IndexError, ValueError):
            return Fraction(0)

    best = min(vs, key=shortfall)
    return f"{best.device.split('/', 2)[-1]}: {best.detail}"


# ---------------------------------------------------------------------------------------------
# Per node


class _Explainer:
    def __init__(self, sim: Simulation, state: AllocatedState) -> None:
        self.sim = sim
        self.state = state
        self.alloc = Allocator(sim.index, sim.classes, state, sim.allocator.features)
        owners: dict[tuple[str, str, str], str] = {}
        for c in sim.claims.values():
            for r in ((((c.get("status") or {}).get("allocation") or {}).get("devices") or {}).get("results") or []):
                if not r.get("shareID") and not r.get("adminAccess"):
                    owners[(r["driver"], r["pool"], r["device"])] = _claim_ref(c)
        self.checker = _Checker(self.alloc, state, owners)
        self.devices = {"/".join(d.id): d for d in sim.index.devices()}

    def pool_problems(self, node: Node) -> list[str]:
        out: list[str] = []
        pools = self.alloc.pools(node)
        seen = {p.key for p in pools}
        for p in pools:
            if not p.complete:
                sl = self.sim.index.by_pool.get(p.key, [])
                gen = max((s.generation for s in sl), default=0)
                have = len([s for s in sl if s.generation == gen])
                want = sl[0].slice_count if sl else 0
                out.append(
                    f"pool {p.driver}/{p.name} is incomplete: {have} of resourceSliceCount {want} slices published "
                    f"at generation {gen}; none of its devices is allocated until all are published"
                )
            if p.invalid:
                out.append(f"pool {p.driver}/{p.name} is invalid ({p.invalid}); none of its devices is allocated")
        for key, sl in self.sim.index.by_pool.items():
            if key in seen:
                continue
            visible = [s for s in sl if _slice_visible(s, node)]
            if visible and any(s.generation > max(v.generation for v in visible) for s in sl):
                out.append(f"pool {key[0]}/{key[1]} is obsolete on this node: a newer generation is being published")
        return out

    def request(self, rq: _Req, node: Node, claim: Mapping[str, Any], all_devices: bool) -> RequestOnNode:
        cons = _constraints_for(claim, rq)
        verdicts: list[DeviceVerdict] = []
        for p in self.alloc.pools(node):
            if not p.complete or p.invalid:
                continue
            for s in p.slices:
                for d in s.devices:
                    if not d.per_device_node_selection and not device_on_node(d, node):
                        continue
                    verdicts.append(self.checker.check(rq, d, node, cons))
        fitting = [v.device for v in verdicts if v.check == "fits"]
        ron = RequestOnNode(rq.claim, rq.name, rq.wants(), len(verdicts), fitting, _group(verdicts))
        if all_devices:
            ron.devices = verdicts
        need = rq.count
        if rq.all_mode:
            if not fitting:
                ron.notes.append("allocationMode All needs at least one matching device")
            return ron
        if fitting and len(fitting) < need:
            ron.notes.append(f"needs {need} devices, {len(fitting)} fit on their own")
        if len(fitting) >= 1 and need > 1:
            devs = self.devices
            for i, c in cons:
                attr = c.get("matchAttribute") or c.get("distinctAttribute") or ""
                vals: dict[str, list[str]] = {}
                for f in fitting:
                    vals.setdefault(fmt_value(devs[f].attributes.get(attr)), []).append(f)
                if c.get("matchAttribute") and c.get("requests") in (None, [], [rq.parent], [rq.name]):
                    if max(len(v) for v in vals.values()) < need:
                        spread = "; ".join(f"{k}: {_shown(v)}" for k, v in vals.items())
                        ron.notes.append(
                            f"constraint #{i} matchAttribute {attr}: no {need} fitting devices share one value ({spread})"
                        )
                elif c.get("distinctAttribute") and len(vals) < need:
                    ron.notes.append(
                        f"constraint #{i} distinctAttribute {attr}: the fitting devices have {_plural(len(vals), 'distinct value')}, {need} needed"
                    )
        return ron


def _slice_visible(s: Any, node: Node) -> bool:
    if s.node_name:
        return bool(s.node_name == node.name)
    if s.all_nodes:
        return True
    if s.node_selector is not None:
        return node_selector_matches(s.node_selector, node)
    return bool(s.per_device_node_selection and any(device_on_node(d, node) for d in s.devices))


def _constraints_for(claim: Mapping[str, Any], rq: _Req) -> list[tuple[int, Mapping[str, Any]]]:
    out = []
    for i, c in enumerate(((claim.get("spec") or {}).get("devices") or {}).get("constraints") or []):
        reqs = c.get("requests") or []
        if not reqs or rq.parent in reqs or rq.name in reqs:
            out.append((i, c))
    return out


# ---------------------------------------------------------------------------------------------
# HAMi view


def _hami_lines(
    conv_requests: Sequence[Any], claims_by_pc: Mapping[str, Mapping[str, Any]], per_node: Sequence[NodeExplanation],
    sim: Simulation, state: AllocatedState,
) -> list[str]:
    """Per converted container: the request in HAMi words, and which node comes closest."""
    out: list[str] = []
    devs = {"/".join(d.id): d for d in sim.index.devices()}
    usage = counter_usage(sim.index, state)
    for hr in conv_requests:
        claim = claims_by_pc.get(hr.claim_name)
        if claim is None:
            continue
        cref = _claim_ref(claim)
        if hr.memory_mib is not None:
            mem = f"gpumem {hr.memory_mib} MiB"
        elif hr.memory_percentage == 100:
            mem = "gpumem all of each GPU's memory"
        else:
            mem = f"gpumem-percentage {hr.memory_percentage}"
        head = f"HAMi request (container {hr.container}): {_plural(hr.gpus, 'GPU')} × {mem}, gpucores {hr.cores}"
        best: tuple[int, str] = (-1, "")
        any_selectable = False
        for ne in per_node:
            ok: set[str] = set()
            node_selectable = False
            for ron in ne.requests:
                if ron.claim != cref:
                    continue
                # Devices past the selectors, and devices in use (checked before the selectors,
                # so possibly matching): "no GPU matches the selectors" must not be said of them.
                selectable = {
                    g for grp in ron.groups
                    if grp.check in ("in-use", "capacity", "policy", "counters", "taint", "constraint")
                    for g in grp.devices
                }  # fmt: skip
                selectable |= set(ron.fitting)
                any_selectable = any_selectable or bool(selectable)
                node_selectable = node_selectable or bool(selectable)
                for did in selectable:
                    d = devs[did]
                    if _hami_fits(d, hr, state) and not counters_short(d, usage, state):
                        ok.add(did)
            if len(ok) > best[0]:
                best = (len(ok), ne.node)
            if not node_selectable:
                ne.hami.append(f"{head} — no GPU on {ne.node} matches the pod's device selectors")
            else:
                verb = "has" if len(ok) == 1 else "have"
                ne.hami.append(f"{head} — {_plural(len(ok), 'GPU')} on {ne.node} {verb} {_hami_need(hr)} free")
        if not any_selectable:
            out.append(f"{head} — no GPU on any node matches the pod's device selectors (HAMi annotations such as nvidia.com/use-gputype or nvidia.com/use-gpuuuid)")
        elif best[0] < hr.gpus:
            most = f" (most: {best[0]} on {best[1]})" if best[0] > 0 else ""
            out.append(f"{head} — no node has {_plural(hr.gpus, 'GPU')} with {_hami_need(hr)} free{most}")
        else:
            out.append(f"{head} — {best[1]} has {_plural(best[0], 'GPU')} with {_hami_need(hr)} free")
    return out


def _hami_need(hr: Any) -> str:
    if hr.memory_mib is not None:
        mem = f"{hr.memory_mib} MiB"
    elif hr.memory_percentage == 100:
        mem = "all memory"
    else:
        mem = f"{hr.memory_percentage}% memory"
    return f"{mem} and {hr.cores}% cores"


def _hami_fits(d: Device, hr: Any, state: AllocatedState) -> bool:
    if d.id in state.dedicated:
        return False  # allocated whole to another claim: nothing is free on it
    agg = state.aggregated.get(d.id, {})
    mem = d.capacity.get("memory")
    if mem is None:
        return False
    free_mem = mem.value.value - agg.get("memory", Fraction(0))
    if hr.memory_mib is not None:
        need = Fraction(hr.memory_mib * MIB)
    else:
        need = mem.value.value * hr.memory_percentage / 100
    if free_mem < need:
        return False
    cores = d.capacity.get("cores")
    if cores is None:
        # The converted claim names cores: a device without that capacity never takes it, so
        # it must not be counted as a GPU with room (the allocator skips it).
        return False
    return bool(cores.value.value - agg.get("cores", Fraction(0)) >= hr.cores)


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
    for pc in (pod.get("spec") or {}).get("resourceClaims") or []:
        if pc.get("resourceClaimName"):
            key = (ns, pc["resourceClaimName"])
        else:
            generated = generated_claim_name(dict(pod), str(pc.get("name", "")))
            key = (ns, generated or f"{md.get('name') or md.get('generateName')}-{pc.get('name', '')}")
        c = sim.claims.get(key)
        if c is not None:
            out.append((str(pc.get("name", "")), c))
    return out


def explain(
    cluster: Cluster,
    manifests: Sequence[Manifest],
    target: str,
    *,
    seed: int = 0,
    all_devices: bool = False,
) -> Explanation:
    """Simulate ``manifests`` on ``cluster`` and explain ``target``.

    ``target``: a pod (``namespace/name`` or ``name``) or a ResourceClaim (same forms; claims
    made from templates are named ``<pod>-<pod claim name>``). ``all_devices`` keeps the
    per-device verdicts (``RequestOnNode.devices``). Raises :class:`ExplainError` when the
    target is unknown or ambiguous, and whatever :class:`Simulation` raises for bad input.
    """
    sim, result, snaps = _run(cluster, manifests, lambda ref: _matches(ref, target), seed)
    if len(snaps) > 1:
        raise ExplainError(f"{target!r} names several pods ({', '.join(sorted(snaps))}): write namespace/name")
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
            sim2, result2, snaps2 = _run(cluster, manifests, lambda ref, pref=pref: ref == pref, seed)
            exp = _explain_pod(sim2, result2, manifests, pref, snaps2[pref], f"{key[0]}/{key[1]}", all_devices)
            exp.target = f"ResourceClaim {key[0]}/{key[1]} (used by Pod {pref})"
            return exp
    claim = sim.claims[key]
    exp = Explanation(f"ResourceClaim {key[0]}/{key[1]}", "unallocated")
    exp.claims = [f"{key[0]}/{key[1]}"]
    if (claim.get("status") or {}).get("allocation"):
        exp.status = "allocated"
        exp.placements = _placements(sim, [claim], None)
        return exp
    exp.notes.append("no pod uses this claim: the scheduler allocates a claim only when it schedules a pod that uses it")
    ex = _Explainer(sim, sim.state)
    for node in sim.nodes:
        exp.nodes.append(_node(ex, node, None, [claim], [], all_devices))
    return exp


def _run(
    cluster: Cluster, manifests: Sequence[Manifest], want: Any, seed: int
) -> tuple[Simulation, SimResult, dict[str, AllocatedState]]:
    sim = Simulation(cluster, manifests, seed=seed)
    snaps: dict[str, AllocatedState] = {}

    def on_pod(ref: str) -> None:
        if want(ref) and ref not in snaps:
            snaps[ref] = copy.deepcopy(sim.state)

    result = sim.run(on_pod)
    return sim, result, snaps


def _placements(sim: Simulation, claims: Sequence[Mapping[str, Any]], before: AllocatedState | None) -> list[str]:
    out = []
    devs = {"/".join(d.id): d for d in sim.index.devices()}
    for c in claims:
        for r in (((c.get("status") or {}).get("allocation") or {}).get("devices") or {}).get("results") or []:
            did = f"{r['driver']}/{r['pool']}/{r['device']}"
            d = devs.get(did)
            parts = []
            cc = r.get("consumedCapacity") or {}
            for k, v in cc.items():
                cap = d.capacity.get(k) if d else None
                if cap is not None and before is not None:
                    free = cap.value.value - before.aggregated.get(d.id, {}).get(k, Fraction(0)) if d else Fraction(0)
                    parts.append(f"{k} {v} of {fmt_quantity(free, cap.value)} free")
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

    pod = next(o for o in result.objects if o.get("kind") == "Pod" and _claim_ref(o) == ref)
    pname = ref.split("/", 1)[1]
    claims = _pod_claims(pod, sim)
    if only_claim is not None:
        claims = [(pc, c) for pc, c in claims if _claim_ref(c) == only_claim]
    node_name = (pod.get("spec") or {}).get("nodeName")
    exp = Explanation(f"Pod {ref}", "scheduled" if node_name else "pending", node=node_name)
    exp.claims = [_claim_ref(c) for _, c in claims]
    for p in result.pending:
        if p.pod == ref:
            exp.reason = p.reason
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
    if node_name:
        exp.placements = _placements(sim, own, before) + [
            p + " (allocated earlier, for another pod)" for p in _placements(sim, done, None)
        ]
        for node in sim.nodes:
            if node.name == node_name:
                why = "first node in cluster order where every claim fits"
                if not own:
                    why = "its claims were already allocated there" if done else "it has no claims to allocate"
                exp.nodes.append(NodeExplanation(node.name, "fits", f"scheduled here: {why}"))
                break
            todo = own
            exp.nodes.append(_node(ex, node, pod, todo, done, all_devices))
        exp.notes.append("kube-scheduler picks any node where the pod fits (ties broken at random); the simulation takes the first")
        return exp
    todo = [c for _, c in claims if not (c.get("status") or {}).get("allocation")]
    if not claims and exp.reason:
        exp.notes.append(exp.reason)
        return exp
    for node in sim.nodes:
        exp.nodes.append(_node(ex, node, pod, todo, done, all_devices))
    if exp.reason.startswith("allocation error"):
        exp.notes.append(
            "an allocator error (not 'no room') stops scheduling of the pod on every node: the scheduler retries it "
            "with backoff and it stays pending until the error is fixed (dra-spec.md 3.2)"
        )
    by_pc = {pc: c for pc, c in claims}
    exp.hami = _hami_lines(conv_requests, by_pc, exp.nodes, sim, before)
    return exp


def _unbound(pod: Mapping[str, Any]) -> dict[str, Any]:
    """The pod as the scheduler saw it: without the ``spec.nodeName`` the simulation set."""
    p = dict(pod)
    p["spec"] = {k: v for k, v in (pod.get("spec") or {}).items() if k != "nodeName"}
    return p


def _node(
    ex: _Explainer, node: Node, pod: Mapping[str, Any] | None, todo: Sequence[dict[str, Any]],
    done: Sequence[Mapping[str, Any]], all_devices: bool,
) -> NodeExplanation:
    if pod is not None and not _pod_fits_node(_unbound(pod), node):
        return NodeExplanation(node.name, "refused", "didn't match Pod's node affinity/selector")
    taint = untolerated_taint(pod, ex.sim.taints.get(node.name, ())) if pod is not None else None
    if taint is not None:
        return NodeExplanation(node.name, "refused", f"had untolerated taint {{{taint['key']}: {taint.get('value', '')}}}")
    for c in done:
        sel = ((c.get("status") or {}).get("allocation") or {}).get("nodeSelector")
        if sel is not None and not node_selector_matches(sel, node):
            return NodeExplanation(
                node.name, "refused", f"resourceclaim not available on the node: claim {_claim_ref(c)} is allocated for another node"
            )
    ne = NodeExplanation(node.name, "refused", "")
    ne.pools = ex.pool_problems(node)
    error: str | None = None
    try:
        res = ex.alloc.allocate(node, list(todo))
    except AllocationError as e:
        error = str(e)
        res = None
    for c in todo:
        for alts in _requests(c, ex.sim.classes):
            for rq in alts:
                ne.requests.append(ex.request(rq, node, c, all_devices))
    if error is not None:
        ne.verdict = "error"
        ne.summary = f"allocation error: {error}"
        return ne
    if res is not None:
        ne.verdict = "fits"
        ne.summary = "every claim fits here now"
        return ne
    short = [r for r in ne.requests if not r.fitting]
    parts = []
    for r in ne.requests:
        need = "all" if "All" in r.wants else r.wants.split(" ", 1)[0]
        parts.append(f"claim {r.claim}, request {r.request}: {len(r.fitting)} of {_plural(r.considered, 'device')} fit (needs {need})")
    ne.summary = "cannot allocate all claims: " + "; ".join(parts) if parts else "cannot allocate all claims"
    if ne.requests and not short and not any(r.notes for r in ne.requests):
        ne.notes.append(
            "every request has devices that fit on their own, but not together: the requests compete for the same "
            "devices' capacity, or a constraint across requests (matchAttribute/distinctAttribute) cannot be met"
        )
    return ne


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
    wants: dict[str, str] = {}
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
            req = r.request if len({x.claim for x in ne.requests}) == 1 else f"{r.claim}:{r.request}"
            for g in r.groups:
                rows.append((req, f"{_plural(g.count, 'device')} ({_shown(g.devices)})", g.reason))
            if r.fitting:
                rows.append((req, f"{_plural(len(r.fitting), 'device')} ({_shown(r.fitting)})", "fit on their own"))
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
