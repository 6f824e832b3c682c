"""CEL source -> parse tree -> expression tree with macros expanded, as cel-go's parser does.

The parse tree comes from Tessera's grammar (``grammar.lark``: cel-python's grammar plus CEL's
optional syntax ``x.?f``, ``x[?k]``, ``[?e]``, ``{?k: v}``). :func:`build` turns it into the
small expression tree of cel-go's ``common/ast``: constants, identifiers, selections (with
``test_only`` for ``has()``), calls (operators named as cel-go names them: ``_&&_``, ``_[_]``,
``_?._`` ...), list and map literals, and comprehensions. Macros are expanded exactly as
``cel-go/parser/macro.go`` (v0.29) and ``cel-go/ext`` expand them (``all``, ``exists``,
``exists_one``/``existsOne``, ``map``, ``filter``, two-variable ``all``/``exists``/
``existsOne``/``transformList``/``transformMap``/``transformMapEntry``, ``cel.bind``,
``optMap``/``optFlatMap``), because both the cost estimate and the runtime cost are defined on
the expanded form. Pure: no I/O.
"""

from __future__ import annotations

import functools
import itertools
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import lark
from celpy.evaluation import celbytes, celstr
from lark.exceptions import LarkError, UnexpectedCharacters, UnexpectedInput, UnexpectedToken

ACCU = "@result"  # cel-go's parser.AccumulatorName


class CelSyntaxError(ValueError):
    """The text is not CEL, or a macro is used wrongly. ``str()`` is one line."""


class UInt(int):
    """A CEL ``uint`` value (Python ``int`` is CEL ``int``)."""

    def __repr__(self) -> str:
        return f"{int(self)}u"


# ---------------------------------------------------------------------------------------------
# The expression tree (cel-go common/ast).

_ids = itertools.count(1)


@dataclass(eq=False)
class Expr:
    id: int = field(default_factory=lambda: next(_ids), init=False)
    pos: int = field(default=0, init=False)


@dataclass(eq=False)
class Const(Expr):
    value: Any


@dataclass(eq=False)
class Ident(Expr):
    name: str


@dataclass(eq=False)
class Select(Expr):
    operand: Expr
    field: str
    test_only: bool = False


@dataclass(eq=False)
class Call(Expr):
    fn: str
    args: list[Expr]
    target: Expr | None = None


@dataclass(eq=False)
class ListLit(Expr):
    elems: list[Expr]
    optional: frozenset[int] = frozenset()


@dataclass(eq=False)
class MapLit(Expr):
    entries: list[tuple[Expr, Expr, bool]]  # key, value, optional entry


@dataclass(eq=False)
class Comprehension(Expr):
    iter_range: Expr
    iter_var: str
    iter_var2: str | None
    accu_var: str
    accu_init: Expr
    loop_cond: Expr
    loop_step: Expr
    result: Expr


# ---------------------------------------------------------------------------------------------
# Parsing.


def _ambiguous_literals(t: lark.Token) -> lark.Token:
    if t.value in ("true", "false"):
        return lark.Token("BOOL_LIT", t.value)
    return t


@functools.cache
def _parser() -> lark.Lark:
    return lark.Lark(
        (Path(__file__).parent / "grammar.lark").read_text(),
        parser="lalr",
        start="expr",
        g_regex_flags=re.M,
        lexer_callbacks={"IDENT": _ambiguous_literals},
        propagate_positions=True,
        maybe_placeholders=False,
        priority="invert",
    )


def parse_tree(text: str) -> lark.Tree:
    """The lark parse tree of ``text``. Raises :class:`CelSyntaxError`."""
    try:
        return _parser().parse(text)
    except UnexpectedInput as e:
        where = f"{e.line}:{e.column}"
        if isinstance(e, UnexpectedToken):
            tok = e.token
            what = "end of input" if tok.type == "$END" else f"{tok.value!r}"
            raise CelSyntaxError(f"<input>:{where}: Syntax error: unexpected {what}") from None
        if isinstance(e, UnexpectedCharacters):
            raise CelSyntaxError(
                f"<input>:{where}: Syntax error: token recognition error at: {e.char!r}"
            ) from None
        raise CelSyntaxError(f"<input>:{where}: Syntax error") from None
    except LarkError as e:
        raise CelSyntaxError(f"Syntax error: {str(e).splitlines()[0]}") from None


# ---------------------------------------------------------------------------------------------
# Parse tree -> expression tree.

_REL = {
    "relation_lt": "_<_",
    "relation_le": "_<=_",
    "relation_gt": "_>_",
    "relation_ge": "_>=_",
    "relation_eq": "_==_",
    "relation_ne": "_!=_",
    "relation_in": "@in",
}
_ADD = {"addition_add": "_+_", "addition_sub": "_-_"}
_MUL = {"multiplication_mul": "_*_", "multiplication_div": "_/_", "multiplication_mod": "_%_"}

INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1


def _literal(tok: lark.Token) -> Any:
    t, v = tok.type, tok.value
    if t == "INT_LIT":
        neg = v.startswith("-")
        body = v[1:] if neg else v
        n = int(body, 16) if body.lower().startswith("0x") else int(body)
        n = -n if neg else n
        if not INT64_MIN <= n <= INT64_MAX:
            raise CelSyntaxError(f"invalid int literal {v}")
        return n
    if t == "UINT_LIT":
        body = v[:-1]
        n = int(body, 16) if body.lower().startswith("0x") else int(body)
        if not 0 <= n < 2**64:
            raise CelSyntaxError(f"invalid uint literal {v}")
        return UInt(n)
    if t == "FLOAT_LIT":
        return float(v)
    if t in ("STRING_LIT", "MLSTRING_LIT"):
        return str(celstr(tok))
    if t == "BYTES_LIT":
        return bytes(celbytes(tok))
    if t == "BOOL_LIT":
        return v == "true"
    if t == "NULL_LIT":
        return None
    raise CelSyntaxError(f"unknown literal {v!r}")


def _qualified_name(e: Expr) -> str | None:
    """``a.b.c`` for an identifier or a chain of selections on one, else None."""
    if isinstance(e, Ident):
        return e.name
    if isinstance(e, Select) and not e.test_only:
        base = _qualified_name(e.operand)
        return f"{base}.{e.field}" if base else None
    return None


class _Builder:
    def __init__(self) -> None:
        self.accu = ACCU

    def build(self, node: lark.Tree | lark.Token) -> Expr:
        if isinstance(node, lark.Token):
            raise CelSyntaxError(f"unexpected token {node.value!r}")
        e = getattr(self, "_" + node.data)(node)
        if not getattr(node.meta, "empty", True) and e.pos == 0:
            e.pos = node.meta.start_pos
        return e

    def _kids(self, node: lark.Tree) -> list[Any]:
        return list(node.children)

    # --- operators ---------------------------------------------------------------------------
    def _expr(self, n: lark.Tree) -> Expr:
        k = self._kids(n)
        if len(k) == 1:
            return self.build(k[0])
        return Call("_?_:_", [self.build(k[0]), self.build(k[1]), self.build(k[2])])

    def _binary(self, n: lark.Tree, fn: str) -> Expr:
        k = self._kids(n)
        if len(k) == 1:
            return self.build(k[0])
        return Call(fn, [self.build(k[0]), self.build(k[1])])

    def _conditionalor(self, n: lark.Tree) -> Expr:
        return self._binary(n, "_||_")

    def _conditionaland(self, n: lark.Tree) -> Expr:
        return self._binary(n, "_&&_")

    def _op_chain(self, n: lark.Tree, table: dict[str, str]) -> Expr:
        k = self._kids(n)
        if len(k) == 1:
            return self.build(k[0])
        op, rhs = k
        return Call(table[op.data], [self.build(op.children[0]), self.build(rhs)])

    def _relation(self, n: lark.Tree) -> Expr:
        return self._op_chain(n, _REL)

    def _addition(self, n: lark.Tree) -> Expr:
        return self._op_chain(n, _ADD)

    def _multiplication(self, n: lark.Tree) -> Expr:
        return self._op_chain(n, _MUL)

    def _unary(self, n: lark.Tree) -> Expr:
        k = self._kids(n)
        if len(k) == 1:
            return self.build(k[0])
        op, operand = k
        inner = self.build(operand)
        if op.data == "unary_not":
            return Call("!_", [inner])
        if (
            isinstance(inner, Const)
            and type(inner.value) in (int, float)
            and not isinstance(inner.value, bool)
        ):
            # cel-go folds -<number literal> into the literal (so -9223372036854775808 is valid).
            v = -inner.value
            if isinstance(v, int) and not INT64_MIN <= v <= INT64_MAX:
                raise CelSyntaxError("invalid int literal")
            return Const(v)
        return Call("-_", [inner])

    # --- members -----------------------------------------------------------------------------
    def _member(self, n: lark.Tree) -> Expr:
        return self.build(n.children[0])

    def _primary(self, n: lark.Tree) -> Expr:
        return self.build(n.children[0])

    def _paren_expr(self, n: lark.Tree) -> Expr:
        return self.build(n.children[0])

    def _member_dot(self, n: lark.Tree) -> Expr:
        obj, name = n.children
        return Select(self.build(obj), str(name))

    def _member_dot_opt(self, n: lark.Tree) -> Expr:
        obj, name = n.children
        return Call("_?._", [self.build(obj), Const(str(name))])

    def _member_index(self, n: lark.Tree) -> Expr:
        obj, key = n.children
        return Call("_[_]", [self.build(obj), self.build(key)])

    def _member_index_opt(self, n: lark.Tree) -> Expr:
        obj, key = n.children
        return Call("_[?_]", [self.build(obj), self.build(key)])

    def _member_object(self, n: lark.Tree) -> Expr:
        raise CelSyntaxError(
            "message construction (Type{field: ...}) is not available: device selectors have no message types"
        )

    def _args(self, exprlist: Any) -> list[lark.Tree]:
        if exprlist is None:
            return []
        return [c for c in exprlist.children if isinstance(c, lark.Tree)]

    def _member_dot_arg(self, n: lark.Tree) -> Expr:
        kids = n.children
        obj, name = kids[0], str(kids[1])
        raw_args = self._args(kids[2]) if len(kids) > 2 else []
        target = self.build(obj)
        macro = self._member_macro(target, name, raw_args)
        if macro is not None:
            return macro
        return Call(name, [self.build(a) for a in raw_args], target)

    def _ident_arg(self, n: lark.Tree) -> Expr:
        name = str(n.children[0])
        raw_args = self._args(n.children[1]) if len(n.children) > 1 else []
        if name == "has":
            if len(raw_args) != 1:
                raise CelSyntaxError("has() takes exactly one argument")
            arg = self.build(raw_args[0])
            if not isinstance(arg, Select) or arg.test_only:
                raise CelSyntaxError("invalid argument to has() macro")
            return Select(arg.operand, arg.field, test_only=True)
        return Call(name, [self.build(a) for a in raw_args])

    def _dot_ident_arg(self, n: lark.Tree) -> Expr:
        name = str(n.children[0])
        raw_args = self._args(n.children[1]) if len(n.children) > 1 else []
        return Call(name, [self.build(a) for a in raw_args])

    def _dot_ident(self, n: lark.Tree) -> Expr:
        return Ident(str(n.children[0]))

    def _ident(self, n: lark.Tree) -> Expr:
        return Ident(str(n.children[0]))

    def _literal(self, n: lark.Tree) -> Expr:
        tok = n.children[0]
        assert isinstance(tok, lark.Token)
        return Const(_literal(tok))

    def _list_lit(self, n: lark.Tree) -> Expr:
        elems: list[Expr] = []
        opt: set[int] = set()
        if n.children:
            for le in n.children[0].children:
                if not isinstance(le, lark.Tree):
                    continue
                inner = le.children[0]
                if isinstance(inner, lark.Tree) and inner.data == "list_opt_elem":
                    opt.add(len(elems))
                    elems.append(self.build(inner.children[0]))
                else:
                    elems.append(self.build(inner))
        return ListLit(elems, frozenset(opt))

    def _map_lit(self, n: lark.Tree) -> Expr:
        entries: list[tuple[Expr, Expr, bool]] = []
        if n.children:
            for mi in n.children[0].children:
                if not isinstance(mi, lark.Tree):
                    continue
                kids = [c for c in mi.children if isinstance(c, lark.Tree)]
                if len(kids) == 1 and kids[0].data == "map_opt_entry":
                    k, v = kids[0].children
                    entries.append((self.build(k), self.build(v), True))
                else:
                    entries.append((self.build(kids[0]), self.build(kids[1]), False))
        return MapLit(entries)

    # --- macros ------------------------------------------------------------------------------
    def _var(self, raw: lark.Tree, what: str = "argument must be a simple name") -> str:
        e = self.build(raw)
        if not isinstance(e, Ident):
            raise CelSyntaxError(what)
        if e.name in (self.accu, ACCU):
            raise CelSyntaxError("iteration variable overwrites accumulator variable")
        return e.name

    def _accu(self) -> Ident:
        return Ident(self.accu)

    def _member_macro(self, target: Expr, name: str, raw: list[lark.Tree]) -> Expr | None:
        n = len(raw)
        if name == "bind" and n == 3 and _qualified_name(target) == "cel":
            var = self._var(raw[0], "cel.bind() variable names must be simple identifiers")
            return Comprehension(
                ListLit([]),
                "#unused",
                None,
                var,
                self.build(raw[1]),
                Const(False),
                Ident(var),
                self.build(raw[2]),
            )
        if name in ("all", "exists", "exists_one", "existsOne") and n == 2:
            return self._quantifier(name, target, self._var(raw[0]), None, raw[1])
        if name in ("all", "exists", "existsOne") and n == 3:
            v1, v2 = self._var(raw[0]), self._var(raw[1])
            if v1 == v2:
                raise CelSyntaxError("duplicate variable name")
            return self._quantifier(name, target, v1, v2, raw[2])
        if name == "map" and n in (2, 3):
            v = self._var(raw[0], "argument is not an identifier")
            fn = self.build(raw[-1])
            step: Expr = Call("_+_", [self._accu(), ListLit([fn])])
            if n == 3:
                step = Call("_?_:_", [self.build(raw[1]), step, self._accu()])
            return Comprehension(
                target, v, None, self.accu, ListLit([]), Const(True), step, self._accu()
            )
        if name == "filter" and n == 2:
            v = self._var(raw[0], "argument is not an identifier")
            step = Call(
                "_?_:_",
                [
                    self.build(raw[1]),
                    Call("_+_", [self._accu(), ListLit([Ident(v)])]),
                    self._accu(),
                ],
            )
            return Comprehension(
                target, v, None, self.accu, ListLit([]), Const(True), step, self._accu()
            )
        if name == "transformList" and n in (3, 4):
            v1, v2 = self._var(raw[0]), self._var(raw[1])
            fn = self.build(raw[-1])
            step = Call("_+_", [self._accu(), ListLit([fn])])
            if n == 4:
                step = Call("_?_:_", [self.build(raw[2]), step, self._accu()])
            return Comprehension(
                target, v1, v2, self.accu, ListLit([]), Const(True), step, self._accu()
            )
        if name in ("transformMap", "transformMapEntry") and n in (3, 4):
            v1, v2 = self._var(raw[0]), self._var(raw[1])
            fn = self.build(raw[-1])
            if name == "transformMap":
                step = Call("cel.@mapInsert", [self._accu(), Ident(v1), fn])
            else:
                step = Call("cel.@mapInsert", [self._accu(), fn])
            if n == 4:
                step = Call("_?_:_", [self.build(raw[2]), step, self._accu()])
            return Comprehension(
                target, v1, v2, self.accu, MapLit([]), Const(True), step, self._accu()
            )
        if name in ("optMap", "optFlatMap") and n == 2:
            v = self._var(raw[0], "optMap() variable name must be a simple identifier")
            fn = self.build(raw[1])
            inner: Expr = Call("optional.of", [fn]) if name == "optMap" else fn
            body = Call(
                "_?_:_",
                [
                    Call("hasValue", [], target),
                    Comprehension(
                        ListLit([]),
                        "#unused",
                        None,
                        v,
                        Call("value", [], target),
                        Const(False),
                        Ident(v),
                        inner,
                    ),
                    Call("optional.none", []),
                ],
            )
            return body
        if name == "sortBy" and n == 2:
            # ext.Lists v2: list.sortBy(e, key) -> @sortByAssociatedKeys(list, list.map(e, key))
            v = self._var(raw[0])
            keys = Comprehension(
                Ident("@__sortBy_input__"),
                v,
                None,
                self.accu,
                ListLit([]),
                Const(True),
                Call("_+_", [self._accu(), ListLit([self.build(raw[1])])]),
                self._accu(),
            )
            return Comprehension(
                ListLit([]),
                "#unused",
                None,
                "@__sortBy_input__",
                target,
                Const(False),
                Ident("@__sortBy_input__"),
                Call("@sortByAssociatedKeys", [keys], Ident("@__sortBy_input__")),
            )
        if _qualified_name(target) == "optional" and name in ("of", "none", "ofNonZeroValue"):
            return Call(f"optional.{name}", [self.build(a) for a in raw])
        qual = _qualified_name(target)
        if qual in ("sets", "lists", "strings", "math", "base64"):
            return Call(f"{qual}.{name}", [self.build(a) for a in raw])
        return None

    def _quantifier(
        self, name: str, target: Expr, v1: str, v2: str | None, raw_pred: lark.Tree
    ) -> Expr:
        pred = self.build(raw_pred)
        accu = self._accu
        if name == "all":
            return Comprehension(
                target,
                v1,
                v2,
                self.accu,
                Const(True),
                Call("@not_strictly_false", [accu()]),
                Call("_&&_", [accu(), pred]),
                accu(),
            )
        if name == "exists":
            return Comprehension(
                target,
                v1,
                v2,
                self.accu,
                Const(False),
                Call("@not_strictly_false", [Call("!_", [accu()])]),
                Call("_||_", [accu(), pred]),
                accu(),
            )
        return Comprehension(
            target,
            v1,
            v2,
            self.accu,
            Const(0),
            Const(True),
            Call("_?_:_", [pred, Call("_+_", [accu(), Const(1)]), accu()]),
            Call("_==_", [accu(), Const(1)]),
        )


def build(tree: lark.Tree) -> Expr:
    """The expression tree of a parse tree from :func:`parse_tree`."""
    return _Builder().build(tree)


def parse(text: str) -> Expr:
    """Parse and expand macros. Raises :class:`CelSyntaxError`."""
    return build(parse_tree(text))


def children(e: Expr) -> list[Expr]:
    """The direct sub-expressions of ``e``, in evaluation order."""
    if isinstance(e, Select):
        return [e.operand]
    if isinstance(e, Call):
        return ([e.target] if e.target is not None else []) + list(e.args)
    if isinstance(e, ListLit):
        return list(e.elems)
    if isinstance(e, MapLit):
        return [x for k, v, _ in e.entries for x in (k, v)]
    if isinstance(e, Comprehension):
        return [e.iter_range, e.accu_init, e.loop_cond, e.loop_step, e.result]
    return []
