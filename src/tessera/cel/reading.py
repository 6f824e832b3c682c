"""Read device-selector expressions as syntax: top-level ``&&`` conjuncts, attribute and
capacity reads, ordering comparisons. Shared by ``explain`` (which sub-expression was false)
and ``lint`` (what a selector reads and whether that is a mistake).

:func:`device_fields` reads the expression tree a compiled selector holds (macros expanded):
which device fields a selector can see, so the allocator may share one result among devices
that agree on them. The rest works on the lark parse tree of Tessera's CEL grammar
(:func:`tessera.cel.syntax.parse_tree`: cel-python's grammar, ``expr`` > ``conditionalor`` >
``conditionaland`` > ``relation`` > ... > ``member`` > ``primary``, plus the optional syntax
``member_dot_opt``/``member_index_opt``).
Pure: no I/O.
"""

from __future__ import annotations

import ast
import functools
from collections.abc import Iterator
from dataclasses import dataclass

import lark

from tessera.cel.syntax import (
    Call,
    CelSyntaxError,
    Comprehension,
    Const,
    Expr,
    Ident,
    Select,
    children,
    parse_tree,
)

RELATIONS = {
    "relation_lt": "<",
    "relation_le": "<=",
    "relation_gt": ">",
    "relation_ge": ">=",
    "relation_eq": "==",
    "relation_ne": "!=",
    "relation_in": "in",
}


@functools.lru_cache(maxsize=1024)
def parse(expression: str) -> lark.Tree | None:
    """The parse tree of ``expression``, or None where it does not parse."""
    try:
        return parse_tree(expression)
    except CelSyntaxError:
        return None


def text_of(node: lark.Tree, expression: str) -> str:
    """The source text of ``node`` (whitespace collapsed)."""
    meta = node.meta
    if getattr(meta, "empty", True):
        return ""
    return " ".join(expression[meta.start_pos : meta.end_pos].split())


def _unwrap(node: lark.Tree) -> lark.Tree:
    """Descend single-child wrappers (and parentheses) to the node that does something."""
    while True:
        kids = [c for c in node.children if isinstance(c, lark.Tree)]
        if node.data == "paren_expr" and kids:
            node = kids[0]
            continue
        if (
            len(node.children) == 1
            and len(kids) == 1
            and node.data not in ("ident_arg", "member_dot")
        ):
            node = kids[0]
            continue
        return node


def conjuncts(expression: str) -> list[str]:
    """The top-level ``&&`` operands of ``expression`` as source text, in order.

    ``a && (b && c) && d`` gives ``["a", "b", "c", "d"]`` (parenthesised conjunctions are
    flattened, as ``&&`` is associative); anything else is one conjunct: ``[expression]``.
    Returns ``[expression]`` unchanged when it does not parse.
    """
    tree = parse(expression)
    if tree is None:
        return [expression]
    out: list[str] = []

    def walk(node: lark.Tree) -> None:
        node = _unwrap(node)
        if node.data == "conditionaland" and len(node.children) == 2:
            for c in node.children:
                if isinstance(c, lark.Tree):
                    walk(c)
            return
        out.append(text_of(node, expression))

    walk(tree)
    return [c for c in out if c] or [expression]


def string_literal(node: lark.Tree | lark.Token) -> str | None:
    """The value of a string literal expression (``"x"``, ``'x'``), else None."""
    if isinstance(node, lark.Tree):
        node = _unwrap(node)
        if node.data != "literal" or len(node.children) != 1:
            return None
        node = node.children[0]
    text = str(node)
    if not text or (text[0] not in "\"'" and text[:2].lower() not in ("r'", 'r"')):
        return None
    try:
        v = ast.literal_eval(text)
    except (ValueError, SyntaxError):
        return None
    return v if isinstance(v, str) else None


@dataclass(frozen=True)
class Read:
    """One read of ``device.attributes`` or ``device.capacity``.

    ``kind``: ``"attributes"`` or ``"capacity"``; ``domain``: the index key (None when not a
    string literal); ``name``: the id read inside the domain (None when only the domain map is
    used, e.g. ``device.attributes["d"]`` alone); ``in_has``: the read is the argument of
    ``has(...)`` or optional (``.?name``, ``[?"name"]``): a test, not a read that can fail;
    ``text``: its source text; ``node``: the tree node of the outermost part (``...["d"].name``).
    """

    kind: str
    domain: str | None
    name: str | None
    in_has: bool
    text: str
    node: lark.Tree


def _device_map(node: lark.Tree) -> str | None:
    """``"attributes"``/``"capacity"`` if ``node`` is ``device.attributes`` / ``device.capacity``."""
    node = _unwrap(node)
    if node.data != "member_dot" or len(node.children) != 2:
        return None
    obj, field = node.children
    if not isinstance(obj, lark.Tree):
        return None
    obj = _unwrap(obj)
    if (
        obj.data == "ident"
        and str(obj.children[0]) == "device"
        and str(field) in ("attributes", "capacity")
    ):
        return str(field)
    return None


def _domain_index(node: lark.Tree) -> tuple[str, str | None] | None:
    """(kind, domain) if ``node`` is ``device.attributes[<lit>]`` (domain None if not a literal)."""
    node = _unwrap(node)
    if node.data not in ("member_index", "member_index_opt") or len(node.children) != 2:
        return None
    obj, key = node.children
    if not isinstance(obj, lark.Tree):
        return None
    kind = _device_map(obj)
    if kind is None:
        return None
    return kind, string_literal(key)


def reads(expression: str) -> list[Read]:
    """Every attribute/capacity read in ``expression``, outermost form, in source order."""
    tree = parse(expression)
    if tree is None:
        return []
    found: list[Read] = []
    claimed: set[int] = set()
    has_args: set[int] = set()
    for node in tree.iter_subtrees_topdown():
        if node.data == "ident_arg" and node.children and str(node.children[0]) == "has":
            for sub in node.iter_subtrees():
                has_args.add(id(sub))
    for node in tree.iter_subtrees_topdown():
        if id(node) in claimed:
            continue
        kind_domain: tuple[str, str | None] | None = None
        name: str | None = None
        optional = node.data in ("member_dot_opt", "member_index_opt")
        if (
            node.data in ("member_dot", "member_dot_opt")
            and len(node.children) == 2
            and isinstance(node.children[0], lark.Tree)
        ):
            kind_domain = _domain_index(node.children[0])
            name = str(node.children[1])
        elif (
            node.data in ("member_index", "member_index_opt")
            and len(node.children) == 2
            and isinstance(node.children[0], lark.Tree)
        ):
            kind_domain = _domain_index(node.children[0])
            if kind_domain is not None:
                name = string_literal(node.children[1])
                if name is None:
                    kind_domain = None
        if kind_domain is None:
            kind_domain = _domain_index(node)
            name = None
        if kind_domain is None:
            continue
        for sub in node.iter_subtrees():
            claimed.add(id(sub))
        found.append(
            Read(
                kind_domain[0],
                kind_domain[1],
                name,
                optional or id(node) in has_args,
                text_of(node, expression),
                node,
            )
        )
    found.sort(key=lambda r: r.node.meta.start_pos if not r.node.meta.empty else 0)
    return found


@dataclass(frozen=True)
class Comparison:
    """An ordering or equality comparison: ``op`` (``<``, ``>=``, ...), operand texts and nodes."""

    op: str
    left: lark.Tree
    right: lark.Tree
    text: str


def comparisons(expression: str) -> Iterator[Comparison]:
    """Every relational comparison in ``expression``."""
    tree = parse(expression)
    if tree is None:
        return
    for node in tree.iter_subtrees_topdown():
        if node.data != "relation" or len(node.children) != 2:
            continue
        first, rhs = node.children
        if (
            not isinstance(first, lark.Tree)
            or first.data not in RELATIONS
            or not isinstance(rhs, lark.Tree)
        ):
            continue
        lhs = (
            first.children[0]
            if first.children and isinstance(first.children[0], lark.Tree)
            else None
        )
        if lhs is None:
            continue
        yield Comparison(RELATIONS[first.data], lhs, rhs, text_of(node, expression))


def call_name(node: lark.Tree) -> str | None:
    """``f`` if ``node`` is a global call ``f(...)``, ``.f`` for a member call ``x.f(...)``."""
    node = _unwrap(node)
    if node.data == "ident_arg" and node.children:
        return str(node.children[0])
    if node.data == "member_dot_arg" and len(node.children) >= 2:
        return "." + str(node.children[1])
    return None


def read_of(node: lark.Tree, expression: str) -> Read | None:
    """The attribute/capacity read that ``node`` is exactly (not a call on it), else None."""
    node = _unwrap(node)
    for r in reads(expression):
        if r.node is node:
            return r
    return None


#: ``device`` fields besides the attribute and capacity maps (the DRA CEL environment's device:
#: ``driver``, ``attributes``, ``capacity``, ``allowMultipleAllocations``; dra-spec.md 3.1).
PLAIN_DEVICE_FIELDS = frozenset({"driver", "allowMultipleAllocations"})
_INDEX = ("_[_]", "_[?_]")


def _string_const(e: Expr) -> str | None:
    return e.value if isinstance(e, Const) and isinstance(e.value, str) else None


def _domain_of(e: Expr) -> tuple[str, str] | None:
    """(``"attributes"``/``"capacity"``, domain) if ``e`` is ``device.<map>["<domain>"]``."""
    if not (isinstance(e, Call) and e.fn in _INDEX and e.target is None and len(e.args) == 2):
        return None
    m, key = e.args
    domain = _string_const(key)
    if (
        domain is None
        or not isinstance(m, Select)
        or m.test_only
        or m.field not in ("attributes", "capacity")
        or not (isinstance(m.operand, Ident) and m.operand.name == "device")
    ):
        return None
    return m.field, domain


def _field_read(e: Expr) -> tuple[str, str, str] | None:
    """(kind, domain, name) if ``e`` reads one named field: ``device.attributes["d"].name``,
    ``has(...)`` of it, ``.?name``, or ``["name"]``/``[?"name"]`` with a string literal."""
    if isinstance(e, Select):
        found = _domain_of(e.operand)
        return (*found, e.field) if found is not None else None
    if not (isinstance(e, Call) and e.target is None and e.fn in (*_INDEX, "_?._")):
        return None
    if len(e.args) != 2:
        return None
    found = _domain_of(e.args[0])
    name = _string_const(e.args[1])
    return (*found, name) if found is not None and name is not None else None


def device_fields(tree: Expr) -> frozenset[tuple[str, str]] | None:
    """The device fields a selector's expression tree can read, as ``(kind, "domain/name")``
    pairs (``kind``: ``"attributes"`` or ``"capacity"``), or None when it may read fields it
    does not name.

    None when ``device`` is used other than as ``device.driver``,
    ``device.allowMultipleAllocations`` or one literal-named field
    (``device.attributes["gpu.tessera.dev"].model``, ``[?"model"]``, ``has(...)`` of one): a
    domain map used whole (enumerated by a macro, ``size``, ``in``, bound with ``cel.bind``),
    an index that is not a string literal, ``device`` itself passed or bound, or a
    comprehension variable named ``device``. Two devices with the same driver, the same
    ``allowMultipleAllocations`` and the same values (or absence) of every field named here
    give the same result. ``tree``: :attr:`tessera.cel.CompiledSelector.tree`.
    """
    found: set[tuple[str, str]] = set()
    todo = [tree]
    while todo:
        e = todo.pop()
        read = _field_read(e)
        if read is not None:
            found.add((read[0], f"{read[1]}/{read[2]}"))
            continue
        if isinstance(e, Select) and isinstance(e.operand, Ident) and e.operand.name == "device":
            if e.field in PLAIN_DEVICE_FIELDS:
                continue
            return None
        if isinstance(e, Ident) and e.name == "device":
            return None
        if isinstance(e, Comprehension) and "device" in (e.iter_var, e.iter_var2, e.accu_var):
            return None
        todo.extend(children(e))
    return frozenset(found)
