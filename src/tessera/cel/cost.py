"""Static checks and the worst-case cost estimate of a device selector, as the API server
computes them.

:func:`check` infers a type for every node of an expression tree (enough of cel-go's checker
for the estimate: struct, map, list, string ... kinds and the device variable's declared
types), reports undeclared references and non-bool results, and :func:`estimate` is a port of
``cel-go/checker/cost.go`` (v0.29.2) with the estimators the API server installs:
Kubernetes' ``library.CostEstimator`` (``apiserver/pkg/cel/library/cost.go``), cel-go's
``ext.Lists`` v3 estimators, and the DRA ``sizeEstimator`` of
``dynamic-resource-allocation/cel/compile.go`` (the maximum sizes of the device's strings,
maps and attribute values). The API server rejects a selector whose estimate's maximum is over
:data:`MAX_COST` (``resource.k8s.io`` ``CELSelectorExpressionMaxCost``) with
``Forbidden: too complex, exceeds cost limit``. Pure: no I/O.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from tessera.cel.syntax import (
    ACCU,
    Call,
    Comprehension,
    Const,
    Expr,
    Ident,
    ListLit,
    MapLit,
    Select,
    UInt,
)

MAX_COST = 1_000_000  # k8s.io/api/resource/v1 CELSelectorExpressionMaxCost (also the runtime limit)
U64 = 2**64 - 1
STRING_FACTOR = 0.1
REGEX_FACTOR = 0.25
LIST_CREATE, MAP_CREATE = 10, 30

# Maximum sizes of the device variable (k8s.io/api/resource/v1 validation constants).
DOMAIN_MAX = 63  # DeviceMaxDomainLength
ID_MAX = 32  # DeviceMaxIDLength
DRIVER_MAX = 63  # DriverNameMaxLength
ATTRS_PER_DEVICE = 32  # ResourceSliceMaxAttributesAndCapacitiesPerDevice
ATTR_VALUE_MAX = (
    64  # max(DeviceAttributeMaxValueLength 64, ResourceSliceMaxAttributeValuesPerDevice 48)
)


# ---------------------------------------------------------------------------------------------
# Types.


@dataclass(frozen=True)
class T:
    """A CEL type: ``kind`` (int, uint, double, bool, string, bytes, null, list, map, dyn, any,
    struct, optional, type), ``params`` (element/key/value types), ``name`` for structs."""

    kind: str
    params: tuple[T, ...] = ()
    name: str = ""

    def __str__(self) -> str:
        if self.kind == "struct":
            return self.name
        if self.kind == "optional":
            return f"optional_type({self.params[0]})"
        if self.params:
            return f"{self.kind}({', '.join(str(p) for p in self.params)})"
        return {"null": "null_type"}.get(self.kind, self.kind)


DYN, ANY = T("dyn"), T("any")
INT, UINT, DOUBLE, BOOL, STRING, BYTES, NULL, TYPE = (
    T(k) for k in ("int", "uint", "double", "bool", "string", "bytes", "null", "type")
)
QUANTITY = T("struct", name="kubernetes.Quantity")
SEMVER = T("struct", name="kubernetes.Semver")
DEVICE = T("struct", name="kubernetes.DRADevice")
ATTRIBUTE = ANY  # attributeTypeV131 (DRAListTypeAttributes is off by default in 1.37)


def list_of(t: T) -> T:
    return T("list", (t,))


def map_of(k: T, v: T) -> T:
    return T("map", (k, v))


def opt_of(t: T) -> T:
    return T("optional", (t,))


DEVICE_FIELDS = {
    "driver": STRING,
    "allowMultipleAllocations": BOOL,
    "attributes": map_of(STRING, map_of(STRING, ATTRIBUTE)),
    "capacity": map_of(STRING, map_of(STRING, QUANTITY)),
}

TYPE_IDENTS = frozenset(
    {"int", "uint", "double", "bool", "string", "bytes", "list", "map", "type", "null_type", "dyn"}
)


@dataclass
class _Decl:
    """apiservercel.DeclType reduced to what the size estimator reads."""

    max_elements: int
    fields: dict[str, _Decl] = field(default_factory=dict)
    key: _Decl | None = None
    elem: _Decl | None = None


_ATTR_DECL = _Decl(ATTR_VALUE_MAX)
_DEVICE_DECL = _Decl(
    0,
    fields={
        "driver": _Decl(DRIVER_MAX),
        "allowMultipleAllocations": _Decl(1),
        "attributes": _Decl(
            ATTRS_PER_DEVICE,
            key=_Decl(DOMAIN_MAX),
            elem=_Decl(ATTRS_PER_DEVICE, key=_Decl(ID_MAX), elem=_ATTR_DECL),
        ),
        "capacity": _Decl(
            ATTRS_PER_DEVICE,
            key=_Decl(DOMAIN_MAX),
            elem=_Decl(ATTRS_PER_DEVICE, key=_Decl(ID_MAX), elem=_Decl(0)),
        ),
    },
)


def _dra_size(path: list[str] | None) -> Size | None:
    """DRA's ``sizeEstimator.EstimateSize``: the declared maximum size at ``path``."""
    if not path or path[0] != "device":
        return None
    node = _DEVICE_DECL
    for name in path[1:]:
        if name in ("@items", "@values"):
            if node.elem is None:
                return None
            node = node.elem
        elif name == "@keys":
            if node.key is None:
                return None
            node = node.key
        elif name in node.fields:
            node = node.fields[name]
        elif node.elem is _ATTR_DECL:
            node = _ATTR_DECL
        else:
            return None
    return Size(0, node.max_elements)


# ---------------------------------------------------------------------------------------------
# Checking: types, undeclared references, the result type.


class CheckError(ValueError):
    """The expression does not pass the checker; ``str()`` is cel-go's wording."""


@dataclass
class Checked:
    """Types of every node (by ``Expr.id``) of a checked expression."""

    root: Expr
    types: dict[int, T]

    def type_of(self, e: Expr) -> T:
        return self.types.get(e.id, DYN)


def _const_type(v: object) -> T:
    if isinstance(v, bool):
        return BOOL
    if isinstance(v, UInt):
        return UINT
    if isinstance(v, int):
        return INT
    if isinstance(v, float):
        return DOUBLE
    if isinstance(v, str):
        return STRING
    if isinstance(v, bytes):
        return BYTES
    return NULL


def _join(ts: list[T]) -> T:
    if not ts:
        return DYN
    first = ts[0]
    return first if all(t == first for t in ts) else DYN


_RESULT: dict[str, T] = {
    "size": INT,
    "contains": BOOL,
    "startsWith": BOOL,
    "endsWith": BOOL,
    "matches": BOOL,
    "int": INT,
    "uint": UINT,
    "double": DOUBLE,
    "string": STRING,
    "bytes": BYTES,
    "bool": BOOL,
    "type": TYPE,
    "charAt": STRING,
    "indexOf": INT,
    "lastIndexOf": INT,
    "lowerAscii": STRING,
    "upperAscii": STRING,
    "replace": STRING,
    "split": list_of(STRING),
    "substring": STRING,
    "trim": STRING,
    "join": STRING,
    "strings.quote": STRING,
    "format": STRING,
    "lists.range": list_of(INT),
    "isSorted": BOOL,
    "includes": BOOL,
    "sets.contains": BOOL,
    "sets.equivalent": BOOL,
    "sets.intersects": BOOL,
    "find": STRING,
    "findAll": list_of(STRING),
    "quantity": QUANTITY,
    "isQuantity": BOOL,
    "compareTo": INT,
    "isGreaterThan": BOOL,
    "isLessThan": BOOL,
    "add": QUANTITY,
    "sub": QUANTITY,
    "sign": INT,
    "isInteger": BOOL,
    "asInteger": INT,
    "asApproximateFloat": DOUBLE,
    "semver": SEMVER,
    "isSemver": BOOL,
    "major": INT,
    "minor": INT,
    "patch": INT,
    "hasValue": BOOL,
    "_==_": BOOL,
    "_!=_": BOOL,
    "_<_": BOOL,
    "_<=_": BOOL,
    "_>_": BOOL,
    "_>=_": BOOL,
    "@in": BOOL,
    "_&&_": BOOL,
    "_||_": BOOL,
    "!_": BOOL,
    "@not_strictly_false": BOOL,
    "optional.none": opt_of(DYN),
}


class _Checker:
    def __init__(self, known_function: object) -> None:
        self.types: dict[int, T] = {}
        self.scopes: list[dict[str, T]] = [{"device": DEVICE}]
        self.known = known_function

    def lookup(self, name: str) -> T | None:
        for s in reversed(self.scopes):
            if name in s:
                return s[name]
        return None

    def check(self, e: Expr) -> T:
        t = self._check(e)
        self.types[e.id] = t
        return t

    def _check(self, e: Expr) -> T:
        if isinstance(e, Const):
            return _const_type(e.value)
        if isinstance(e, Ident):
            t = self.lookup(e.name)
            if t is not None:
                return t
            if e.name in TYPE_IDENTS:
                return TYPE
            raise CheckError(f"undeclared reference to '{e.name}' (in container '')")
        if isinstance(e, Select):
            ot = self.check(e.operand)
            if e.test_only:
                return BOOL
            if ot.kind == "struct" and ot == DEVICE:
                if e.field not in DEVICE_FIELDS:
                    raise CheckError(f"undefined field '{e.field}'")
                return DEVICE_FIELDS[e.field]
            if ot.kind == "map":
                return ot.params[1]
            if ot.kind == "optional":
                inner = ot.params[0]
                return opt_of(inner.params[1] if inner.kind == "map" else DYN)
            return DYN
        if isinstance(e, ListLit):
            return list_of(_join([self._elem(x, i in e.optional) for i, x in enumerate(e.elems)]))
        if isinstance(e, MapLit):
            ks = [self.check(k) for k, _, _ in e.entries]
            vs = [self._elem(v, o) for _, v, o in e.entries]
            return map_of(_join(ks), _join(vs))
        if isinstance(e, Comprehension):
            return self._comprehension(e)
        assert isinstance(e, Call)
        return self._call(e)

    def _elem(self, x: Expr, optional: bool) -> T:
        t = self.check(x)
        if optional and t.kind == "optional":
            return t.params[0]
        return t

    def _comprehension(self, e: Comprehension) -> T:
        rt = self.check(e.iter_range)
        it = self.check(e.accu_init)
        scope: dict[str, T] = {}
        if rt.kind == "list":
            k, v = INT, rt.params[0]
        elif rt.kind == "map":
            k, v = rt.params[0], rt.params[1]
        else:
            k = v = DYN
        if e.iter_var2 is None:
            scope[e.iter_var] = v if rt.kind == "list" else k
        else:
            scope[e.iter_var], scope[e.iter_var2] = k, v
        empty_init = (isinstance(e.accu_init, ListLit) and not e.accu_init.elems) or (
            isinstance(e.accu_init, MapLit) and not e.accu_init.entries
        )
        self.scopes.append({e.accu_var: it})
        self.scopes.append(scope)
        self.check(e.loop_cond)
        st = self.check(e.loop_step)
        if empty_init and st.kind == it.kind:
            self.scopes[-2][e.accu_var] = st
            self.check(e.loop_step)
        self.scopes.pop()
        t = self.check(e.result)
        self.scopes.pop()
        return t

    def _call(self, e: Call) -> T:
        tt = self.check(e.target) if e.target is not None else None
        ats = [self.check(a) for a in e.args]
        fn = e.fn
        if fn in ("_?_:_",):
            return ats[1] if ats[1] == ats[2] else DYN
        if fn in ("_[_]", "_?._", "_[?_]"):
            ct = ats[0]
            if ct.kind == "optional":
                ct = ct.params[0]
            if ct.kind == "list" and fn != "_?._":
                r = ct.params[0]
            elif ct.kind == "map":
                r = ct.params[1]
            else:
                r = DYN
            return r if fn == "_[_]" and ats[0].kind != "optional" else opt_of(r)
        if fn in ("_<_", "_<=_", "_>_", "_>=_"):
            ordered = ("int", "uint", "double", "string", "bytes", "bool", "dyn", "any")
            a, b = ats
            numeric = ("int", "uint", "double")
            if (
                a.kind not in ordered
                or b.kind not in ordered
                or (
                    a.kind not in ("dyn", "any")
                    and b.kind not in ("dyn", "any")
                    and a.kind != b.kind
                    and not (a.kind in numeric and b.kind in numeric)
                )
            ):
                raise CheckError(f"found no matching overload for '{fn}' applied to '({a}, {b})'")
            return BOOL
        if fn in ("_+_", "_-_", "_*_", "_/_", "_%_"):
            return ats[0] if ats[0] == ats[1] else DYN
        if fn == "-_":
            return ats[0]
        if fn == "dyn":
            return DYN
        if fn == "cel.@mapInsert":
            return ats[0]
        if fn in ("optional.of", "optional.ofNonZeroValue"):
            return opt_of(ats[0])
        if fn in ("value", "orValue"):
            return tt.params[0] if tt is not None and tt.kind == "optional" else DYN
        if fn == "or":
            return tt or DYN
        if fn in ("slice", "reverse", "sort", "distinct", "@sortByAssociatedKeys"):
            return tt if tt is not None and tt.kind == "list" else list_of(DYN)
        if fn == "flatten":
            return list_of(DYN)
        if fn in ("sum", "min", "max"):
            return tt.params[0] if tt is not None and tt.kind == "list" else DYN
        if fn in ("indexOf", "lastIndexOf"):
            return INT
        if not self.known(fn, e.target is not None):  # type: ignore[operator]
            if fn in _RESULT or fn.startswith(("_", "@", "!")):
                return _RESULT.get(fn, DYN)
            if e.target is not None:
                raise CheckError(f"undeclared reference to '{fn}' (in container '')")
            raise CheckError(f"undeclared reference to '{fn}' (in container '')")
        return _RESULT.get(fn, DYN)


def check(root: Expr, known_function: object) -> Checked:
    """Type the tree; raise :class:`CheckError` for undeclared references and a result that is
    neither bool nor of unknown type (upstream: ``must evaluate to bool or the unknown type``)."""
    c = _Checker(known_function)
    t = c.check(root)
    if t.kind not in ("bool", "dyn", "any"):
        raise CheckError(f"must evaluate to bool or the unknown type, not {t}")
    return Checked(root, c.types)


# ---------------------------------------------------------------------------------------------
# Cost estimation (cel-go checker/cost.go).


@dataclass(frozen=True)
class Size:
    min: int
    max: int

    def add(self, o: Size) -> Size:
        return Size(_addu(self.min, o.min), _addu(self.max, o.max))

    def mul(self, o: Size) -> Size:
        return Size(_mulu(self.min, o.min), _mulu(self.max, o.max))

    def factor(self, f: float) -> Cost:
        return Cost(_mulf(self.min, f), _mulf(self.max, f))

    def times(self, c: Cost) -> Cost:
        return Cost(_mulu(self.min, c.min), _mulu(self.max, c.max))

    def union(self, o: Size) -> Size:
        return Size(min(self.min, o.min), max(self.max, o.max))


@dataclass(frozen=True)
class Cost:
    """A cost estimate: ``min`` and ``max`` in CEL cost units (saturating at 2**64-1)."""

    min: int
    max: int

    def add(self, o: Cost) -> Cost:
        return Cost(_addu(self.min, o.min), _addu(self.max, o.max))

    def mul(self, o: Cost) -> Cost:
        return Cost(_mulu(self.min, o.min), _mulu(self.max, o.max))

    def factor(self, f: float) -> Cost:
        return Cost(_mulf(self.min, f), _mulf(self.max, f))

    def union(self, o: Cost) -> Cost:
        return Cost(min(self.min, o.min), max(self.max, o.max))


def _addu(x: int, y: int) -> int:
    return min(x + y, U64)


def _mulu(x: int, y: int) -> int:
    return min(x * y, U64)


def _mulf(x: int, f: float) -> int:
    xf = float(x)
    if xf > 0 and f > 0 and xf > U64 / f:
        return U64
    c = math.ceil(xf * f)
    return U64 if c >= 2.0**64 else int(c)


UNKNOWN_SIZE = Size(0, U64)
ZERO = Cost(0, 0)
ONE = Cost(1, 1)


def _fixed(n: int) -> Cost:
    return Cost(n, n)


@dataclass
class _Entry:
    kind: str  # "list" | "map"
    key: Size
    val: Size


@dataclass
class _Local:
    path: list[str] | None
    size: Size | None
    entry: _Entry | None


def _is_scalar(t: T) -> bool:
    if t.kind in ("bool", "double", "int", "uint"):
        return True
    if t.kind == "optional":
        return _is_scalar(t.params[0])
    return False


class _Coster:
    def __init__(self, checked: Checked) -> None:
        self.checked = checked
        self.paths: dict[int, list[str]] = {}
        self.sizes: dict[int, Size] = {}
        self.entries: dict[int, _Entry] = {}
        self.locals: dict[str, list[_Local]] = {}

    def t(self, e: Expr) -> T:
        return self.checked.type_of(e)

    # --- locals, paths, sizes ---
    def peek(self, name: str) -> _Local | None:
        st = self.locals.get(name)
        return st[-1] if st else None

    def push(self, name: str, local: _Local) -> None:
        self.locals.setdefault(name, []).append(local)

    def pop(self, name: str) -> None:
        self.locals[name].pop()

    def path(self, e: Expr) -> list[str] | None:
        if isinstance(e, Ident):
            v = self.peek(e.name)
            if v is not None:
                return list(v.path) if v.path is not None else None
        p = self.paths.get(e.id)
        return list(p) if p is not None else None

    def node_path(self, e: Expr) -> list[str] | None:
        p = self.path(e)
        if p and p[0] in (ACCU, "__result__"):
            return None
        return p

    def size(self, e: Expr) -> Size | None:
        if e.id in self.sizes:
            return self.sizes[e.id]
        s = _expr_size(e)
        if s is not None:
            return s
        s = _dra_size(self.path(e))
        if s is not None:
            self.sizes[e.id] = s
            return s
        if _is_scalar(self.t(e)):
            return Size(1, 1)
        if isinstance(e, Ident):
            v = self.peek(e.name)
            if v is not None and v.size is not None:
                return v.size
        return None

    def node_size(self, e: Expr) -> Size:
        """``sizeOrUnknown`` of an AstNode (computed size, then the estimator)."""
        s = self.size(e)
        if s is not None:
            return s
        s = _dra_size(self.node_path(e))
        return s if s is not None else UNKNOWN_SIZE

    def entry(self, e: Expr) -> _Entry | None:
        if e.id in self.entries:
            return self.entries[e.id]
        if isinstance(e, Ident):
            v = self.peek(e.name)
            if v is not None and v.entry is not None:
                return v.entry
        return None

    # --- cost ---
    def cost(self, e: Expr) -> Cost:
        if isinstance(e, Const):
            return ZERO
        if isinstance(e, Ident):
            v = self.peek(e.name)
            self.paths[e.id] = list(v.path) if v is not None and v.path is not None else [e.name]
            return ONE
        if isinstance(e, Select):
            if e.test_only:
                return ZERO.add(self.cost(e.operand))  # PresenceTestHasCost(false)
            s = self.cost(e.operand)
            if self.t(e.operand).kind in ("map", "struct"):
                s = s.add(ONE)
            p = self.path(e.operand)
            self.paths[e.id] = (p or []) + [e.field]
            return s
        if isinstance(e, ListLit):
            s = ZERO
            item = Size(U64 if e.elems else 0, 0)
            for x in e.elems:
                s = s.add(self.cost(x))
                item = item.union(self.size(x) or UNKNOWN_SIZE)
            self.entries[e.id] = _Entry("list", Size(1, 1), item)
            return s.add(_fixed(LIST_CREATE))
        if isinstance(e, MapLit):
            s = ZERO
            ks = Size(U64 if e.entries else 0, 0)
            vs = Size(U64 if e.entries else 0, 0)
            for ke, ve, _ in e.entries:
                s = s.add(self.cost(ke)).add(self.cost(ve))
                ks = ks.union(self.size(ke) or UNKNOWN_SIZE)
                vs = vs.union(self.size(ve) or UNKNOWN_SIZE)
            self.entries[e.id] = _Entry("map", ks, vs)
            return s.add(_fixed(MAP_CREATE))
        if isinstance(e, Comprehension):
            if self._is_bind(e):
                return self._bind(e)
            return self._comprehension(e)
        assert isinstance(e, Call)
        return self._call(e)

    def _is_bind(self, e: Comprehension) -> bool:
        return (
            isinstance(e.iter_range, ListLit)
            and not e.iter_range.elems
            and isinstance(e.loop_cond, Const)
            and e.loop_cond.value is False
            and e.accu_var != ACCU
        )

    def _push_local(self, name: str, e: Expr) -> None:
        self.push(name, _Local(self.path(e), self.size(e), self.entry(e)))

    def _bind(self, e: Comprehension) -> Cost:
        s = self.cost(e.iter_range).add(self.cost(e.accu_init))
        self._push_local(e.accu_var, e.accu_init)
        s = s.add(self.cost(e.result))
        self.pop(e.accu_var)
        sz = self.size(e.result)
        if sz is not None:
            self.sizes[e.id] = sz
        en = self.entry(e.result)
        if en is not None:
            self.entries[e.id] = en
        return s

    def _iter(self, name: str, rng: Expr, part: str) -> None:
        en = self.entry(rng)
        kind = en.kind if en is not None else self.t(rng).kind
        path = self.path(rng) or []
        if part == "single":
            size = en.key if en is not None else None
            sub = "@keys"
            if kind == "list":
                size = en.val if en is not None else None
                sub = "@items"
        elif part == "key":
            size = en.key if en is not None else None
            sub = "@indices" if kind == "list" else "@keys"
        else:
            size = en.val if en is not None else None
            sub = "@items" if kind == "list" else "@values"
        self.push(name, _Local([*path, sub], size, None))

    def _comprehension(self, e: Comprehension) -> Cost:
        s = self.cost(e.iter_range).add(self.cost(e.accu_init))
        self._push_local(e.accu_var, e.accu_init)
        if e.iter_var2 is not None:
            self._iter(e.iter_var, e.iter_range, "key")
            self._iter(e.iter_var2, e.iter_range, "value")
        else:
            self._iter(e.iter_var, e.iter_range, "single")
        loop = self.cost(e.loop_cond)
        step = self.cost(e.loop_step)
        self.pop(e.iter_var)
        if e.iter_var2 is not None:
            self.pop(e.iter_var2)
        s = s.add(self.cost(e.result))
        self.pop(e.accu_var)
        n = self.size(e.iter_range) or UNKNOWN_SIZE
        s = s.add(n.times(step.add(loop)))
        if isinstance(e.accu_init, Const):
            sz = self.size(e.accu_init)
            if sz is not None:
                self.sizes[e.id] = sz
        elif isinstance(e.accu_init, ListLit | MapLit):
            self.sizes[e.id] = n
            en = self.entry(e.loop_step)
            if en is not None:
                self.entries[e.id] = en
        return s

    def _call(self, e: Call) -> Cost:
        fn = e.fn
        if fn == "dyn" and e.args:
            c = ONE.add(self.cost(e.args[0]))
            sz = self.size(e.args[0])
            if sz is not None:
                self.sizes[e.id] = sz
            en = self.entry(e.args[0])
            if en is not None:
                self.entries[e.id] = en
            return c
        arg_costs = [self.cost(a) for a in e.args]
        s = ZERO
        if e.target is not None:
            s = s.add(self.cost(e.target))
        fc, result = self._function_cost(e, arg_costs)
        if fn in ("_[_]",):
            ct = self.t(e.args[0])
            if ct.kind in ("list", "map", "dyn", "any"):
                en = self.entry(e.args[0])
                result = en.val if en is not None else None
                sub = "@items" if ct.kind == "list" else "@values"
                self.paths[e.id] = (self.path(e.args[0]) or []) + [sub]
        if result is None:
            result = self.size(e)
        if result is not None:
            self.sizes[e.id] = result
        return s.add(fc)

    def _function_cost(self, e: Call, arg_costs: list[Cost]) -> tuple[Cost, Size | None]:
        fn, args, target = e.fn, e.args, e.target
        argsum = ZERO
        for c in arg_costs:
            argsum = argsum.add(c)

        # cel-go ext.Lists v3 overload estimators.
        if (
            target is not None and fn in ("slice", "reverse", "flatten", "distinct", "sort")
        ) or fn in ("lists.range", "@sortByAssociatedKeys"):
            est = self._lists_estimate(e)
            if est is not None:
                return est[0].add(argsum), est[1]
        # Kubernetes library.CostEstimator.EstimateCallCost.
        kest = self._k8s_estimate(e)
        if kest is not None:
            return kest[0].add(argsum), kest[1]
        # cel-go's own overloads.
        tt = self.t(target) if target is not None else None
        if fn == "format" and target is not None:
            return self.node_size(target).factor(STRING_FACTOR).add(argsum), None
        if fn == "bytes" and len(args) == 1 and self.t(args[0]).kind == "string":
            sz = self.node_size(args[0])
            return sz.factor(STRING_FACTOR).add(argsum), Size(sz.min, _mulu(sz.max, 4))
        if fn == "string" and len(args) == 1 and self.t(args[0]).kind == "bytes":
            sz = self.node_size(args[0])
            return sz.factor(STRING_FACTOR).add(argsum), Size(sz.min // 4, sz.max)
        if fn == "strings.quote" and len(args) == 1:
            sz = self.node_size(args[0])
            return sz.factor(STRING_FACTOR).add(argsum), Size(
                sz.min + 2, _addu(_mulu(sz.max, 2), 2)
            )
        if fn in ("startsWith", "endsWith") and len(args) == 1:
            return self.node_size(args[0]).factor(STRING_FACTOR).add(argsum), None
        if fn == "@in" and len(args) == 2:
            rt = self.t(args[1]).kind
            in_list = self.node_size(args[1]).factor(1).add(argsum)
            if rt == "list":
                return in_list, None
            if rt in ("dyn", "any"):
                return in_list.union(ONE.add(argsum)), None
        if fn == "matches":
            if target is not None and len(args) == 1:
                strn, rx = target, args[0]
            elif target is None and len(args) == 2:
                strn, rx = args[0], args[1]
            else:
                strn = rx = None  # type: ignore[assignment]
            if strn is not None and rx is not None:
                sc = self.node_size(strn).add(Size(1, 1)).factor(STRING_FACTOR)
                rc = self.node_size(rx).factor(REGEX_FACTOR)
                return sc.mul(rc).add(argsum), None
        if (
            fn == "contains"
            and target is not None
            and len(args) == 1
            and tt is not None
            and tt.kind in ("string", "dyn", "any")
        ):
            sc = self.node_size(target).factor(STRING_FACTOR)
            subc = self.node_size(args[0]).factor(STRING_FACTOR)
            return sc.mul(subc).add(argsum), None
        if fn in ("_||_", "_&&_"):
            lhs, rhs = arg_costs
            return Cost(lhs.min, lhs.add(rhs).max), None
        if fn == "_?_:_":
            csize = self.node_size(args[1]).union(self.node_size(args[2]))
            a, b = self.entry(args[1]), self.entry(args[2])
            if a is not None and b is not None:
                self.entries[e.id] = _Entry(a.kind, a.key.union(b.key), a.val.union(b.val))
            return arg_costs[0].add(arg_costs[1].union(arg_costs[2])), csize
        if fn == "_+_" and len(args) == 2:
            k0, k1 = self.t(args[0]).kind, self.t(args[1]).kind
            ls, rs = self.node_size(args[0]), self.node_size(args[1])
            result = ls.add(rs)
            a, b = self.entry(args[0]), self.entry(args[1])
            if a is not None and b is not None:
                self.entries[e.id] = _Entry(a.kind, a.key.union(b.key), a.val.union(b.val))
            if k0 == "list" or k1 == "list":
                return ONE.add(argsum), result
            if k0 in ("string", "bytes") or k1 in ("string", "bytes"):
                return result.factor(STRING_FACTOR).add(argsum), result
            if k0 in ("dyn", "any") and k1 in ("dyn", "any"):
                return result.factor(STRING_FACTOR).add(argsum).union(ONE.add(argsum)), result
        if fn in ("_==_", "_!=_") or (
            fn in ("_<_", "_<=_", "_>_", "_>=_") and self._stringish(args)
        ):
            lsz, rsz = self.node_size(args[0]), self.node_size(args[1])
            smallest = min(lsz.max, rsz.max)
            cmp_cost = Size(1 if smallest > 0 else 0, smallest).factor(STRING_FACTOR).add(argsum)
            if fn not in ("_==_", "_!=_") and not all(
                self.t(a).kind in ("string", "bytes") for a in args
            ):
                cmp_cost = cmp_cost.union(ONE.add(argsum))
            return cmp_cost, None
        return ONE.add(argsum), None

    def _stringish(self, args: list[Expr]) -> bool:
        return any(self.t(a).kind in ("string", "bytes", "dyn", "any") for a in args) and not any(
            self.t(a).kind in ("int", "uint", "double", "bool") for a in args
        )

    def _list_elem(self, target: Expr) -> tuple[T, list[str] | None] | None:
        t = self.t(target)
        if t.kind == "list" or t.kind == "map":
            p = self.node_path(target)
            return t.params[0], ([*p, "@items"] if p is not None else None)
        return None

    def _lists_estimate(self, e: Call) -> tuple[Cost, Size] | None:
        fn, args, target = e.fn, e.args, e.target

        def call(factor: float, size: Size) -> tuple[Cost, Size]:
            return size.factor(factor).add(ONE).add(_fixed(LIST_CREATE)), size

        def uint_lit(x: Expr, default: int) -> int:
            if isinstance(x, Const) and type(x.value) is int:
                return max(0, x.value)
            return default

        if fn == "lists.range" and target is None and len(args) == 1:
            return call(1, Size(uint_lit(args[0], U64), uint_lit(args[0], U64)))
        if target is None:
            return None
        if fn == "slice" and len(args) == 2:
            sz = self.node_size(target)
            n = max(0, uint_lit(args[1], sz.max) - uint_lit(args[0], 0))
            return call(1, Size(n, n))
        if fn == "reverse" and not args and self.t(target).kind in ("list", "dyn", "any"):
            return call(1, self.node_size(target))
        if fn == "flatten" and len(args) <= 1:
            depth = uint_lit(args[0], U64) if args else 1
            return call(float(depth), self.node_size(target))
        if fn == "distinct" and not args:
            sz = self.node_size(target)
            return call(2.0, sz.mul(sz))
        if fn == "sort" and not args:
            return self._sort_cost(target)
        if fn == "@sortByAssociatedKeys" and len(args) == 1:
            return self._sort_cost(args[0])
        return None

    def _sort_cost(self, node: Expr) -> tuple[Cost, Size]:
        sz = self.node_size(node)
        t = self.t(node)
        f = 2.0
        if t.kind == "list" and t.params[0].kind in ("string", "bytes"):
            f += STRING_FACTOR
        size = sz.mul(sz)
        return size.factor(f).add(ONE).add(_fixed(LIST_CREATE)), size

    def _k8s_estimate(self, e: Call) -> tuple[Cost, Size | None] | None:
        fn, args, target = e.fn, e.args, e.target
        if (
            fn in ("isSorted", "sum", "max", "min", "indexOf", "lastIndexOf", "includes")
            and target is not None
        ):
            el = self._list_elem(target)
            if el is not None:
                elt, elpath = el
                el_cost = ONE
                if elt.kind in ("string", "bytes"):
                    es = _dra_size(elpath) or UNKNOWN_SIZE
                    el_cost = el_cost.add(es.factor(STRING_FACTOR))
                return self.node_size(target).times(el_cost), None
            if fn == "includes":
                return self.node_size(target).times(ONE), None
            return self.node_size(target).factor(STRING_FACTOR), None
        if fn in ("lowerAscii", "upperAscii", "substring", "trim") and target is not None:
            sz = self.node_size(target)
            return sz.factor(STRING_FACTOR), sz
        if fn == "replace" and target is not None and len(args) >= 2:
            sz = self.node_size(target)
            to_rep, rep_with = self.node_size(args[0]), self.node_size(args[1])
            cnt_min = cnt_max = ret_min = ret_max = 0
            if to_rep.min == 0:
                cnt_max = sz.max + 1 if sz.max < U64 else sz.max
                ret_max = sz.max
            elif rep_with.max <= to_rep.min:
                cnt_max, ret_max = 0, sz.max
            else:
                cnt_max = math.ceil(sz.max / to_rep.min)
            if to_rep.max == 0:
                cnt_min = sz.min + 1 if sz.min < U64 else sz.min
                ret_min = sz.min
            elif to_rep.max <= rep_with.min:
                cnt_min, ret_min = 0, sz.min
            else:
                cnt_min = math.ceil(sz.min / to_rep.max)
            size = Size(cnt_min, cnt_max).mul(rep_with).add(Size(ret_min, ret_max))
            return sz.factor(2 * STRING_FACTOR), size
        if fn == "split" and target is not None:
            sz = self.node_size(target)
            mx = sz.max
            if len(args) > 1 and isinstance(args[1], Const) and type(args[1].value) is int:
                mx = args[1].value % 2**64
            return sz.factor(2 * STRING_FACTOR), Size(0, mx)
        if fn == "join" and target is not None:
            sz = Size(0, 0)
            ls = self.node_size(target)
            el = self._list_elem(target)
            if el is not None:
                es = _dra_size(el[1]) or UNKNOWN_SIZE
                sz = ls.mul(es)
            if args:
                sep = self.node_size(args[0])
                sz = sz.add(sep.mul(Size(max(ls.min - 1, 0), max(ls.max - 1, 0))))
            return sz.factor(STRING_FACTOR), sz
        if fn in ("find", "findAll") and target is not None and args:
            sz = self.node_size(target)
            sc = sz.add(Size(1, 1)).factor(STRING_FACTOR)
            rc = self.node_size(args[0]).factor(REGEX_FACTOR)
            return sc.mul(rc), Size(0, sz.max)
        if fn in ("quantity", "isQuantity", "semver", "isSemver") and args:
            return self.node_size(args[0]).factor(STRING_FACTOR), None
        if fn in (
            "sign",
            "asInteger",
            "isInteger",
            "asApproximateFloat",
            "isGreaterThan",
            "isLessThan",
            "compareTo",
            "add",
            "sub",
            "major",
            "minor",
            "patch",
        ):
            return ONE, None
        if fn == "_==_" and len(args) == 2:
            lt, rt = self.t(args[0]), self.t(args[1])
            if lt == rt and lt in (QUANTITY, SEMVER):
                return ONE, None
        return None


def _expr_size(e: Expr) -> Size | None:
    if isinstance(e, Const):
        v = e.value
        if isinstance(v, str):
            return Size(len(v), len(v))
        if isinstance(v, bytes):
            return Size(len(v), len(v))
        return Size(1, 1)
    if isinstance(e, ListLit):
        return Size(len(e.elems), len(e.elems))
    if isinstance(e, MapLit):
        return Size(len(e.entries), len(e.entries))
    return None


def estimate(checked: Checked) -> Cost:
    """The worst-case cost estimate of a checked device selector (cel-go ``EstimateCost``)."""
    return _Coster(checked).cost(checked.root)
