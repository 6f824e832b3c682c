"""Text -> documents: YAML (libyaml's C parser) or a stream of JSON values, read as kubectl
reads them and bounded (:mod:`tessera.api.limits`).

What is done as ``kubectl``/``sigs.k8s.io/yaml`` does it: a ``null`` field is an absent field
(dropped); timestamps stay strings; mapping keys that YAML reads as numbers or booleans become
their text; a whole-number float (``2.0``, ``3e2``) is the integer it denotes (kubectl re-encodes
every manifest through Go's ``encoding/json``, which writes ``float64(2)`` as ``2``, so the API
server receives ``count: 2``; a float with a fraction stays a float and an integer field refuses
it); a mapping key given twice is refused; go-yaml's alias-expansion rule applies (a
document may not be mostly aliases: the "billion laughs" stop early); an alias that contains
itself is refused. Tessera's own bounds: nesting depth (:data:`~tessera.api.limits.MAX_DEPTH`),
integers of at most 20 digits.

Pure: no I/O. Every failure is a :class:`ManifestError` naming the file and, where known, the
line and column.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from sys import intern
from typing import Any

import yaml
from yaml.constructor import ConstructorError, SafeConstructor
from yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode
from yaml.resolver import Resolver

from tessera.api.errors import ManifestError
from tessera.api.limits import MAX_DEPTH, MAX_INT_DIGITS, excessive_aliasing

try:  # libyaml's C parser: ~7x faster than the pure-Python one (PyYAML ships both)
    from yaml.cyaml import CParser as _Parser  # type: ignore[attr-defined]

    WITH_LIBYAML = True
except ImportError:  # pragma: no cover - PyYAML built without libyaml
    from yaml.composer import Composer
    from yaml.parser import Parser
    from yaml.reader import Reader
    from yaml.scanner import Scanner

    class _Parser(Reader, Scanner, Parser, Composer):  # type: ignore[no-redef]
        def __init__(self, stream: str) -> None:
            Reader.__init__(self, stream)
            Scanner.__init__(self)
            Parser.__init__(self)
            Composer.__init__(self)

    WITH_LIBYAML = False

BOM = "\ufeff"


class _Resolver(Resolver):
    """YAML 1.1 implicit types as go-yaml v2 reads them into JSON: no timestamps (they stay
    strings, as in ``kubectl get -o yaml`` output)."""


_Resolver.yaml_implicit_resolvers = {
    first: [(tag, rx) for tag, rx in resolvers if tag != "tag:yaml.org,2002:timestamp"]
    for first, resolvers in Resolver.yaml_implicit_resolvers.items()
}


def _mark(node: Node) -> str:
    m = node.start_mark
    return f"line {m.line + 1}, column {m.column + 1}"


_STR = "tag:yaml.org,2002:str"
_SEQ = "tag:yaml.org,2002:seq"
_MAP = "tag:yaml.org,2002:map"
_MERGE = "tag:yaml.org,2002:merge"
_IN_PROGRESS = object()


class _Builder(SafeConstructor):
    """Builds Python values from libyaml's composed nodes, with kubectl's reading of nulls,
    keys, aliases and tags and Tessera's bounds. Leaner than PyYAML's SafeConstructor (one
    recursive walk, bounded by :data:`MAX_DEPTH`, no generator per collection); scalars are
    converted by SafeConstructor's own methods."""

    def __init__(self) -> None:
        super().__init__()
        self._built: dict[Node, Any] = {}
        self._strings: dict[str, str] = {}
        self._sizes: dict[Node, int] = {}
        self._decoded = 0
        self._aliased = 0
        self.file = ""

    def fail(self, node: Node, message: str) -> ManifestError:
        return ManifestError(f"{_mark(node)}: {message}", file=self.file)

    # -- aliases ----------------------------------------------------------------------------
    def _expanded_size(self, root: Node) -> int:
        """Nodes ``root`` stands for once every alias in it is expanded (memoised)."""
        if root in self._sizes:
            return self._sizes[root]
        stack: list[tuple[Node, bool]] = [(root, False)]
        while stack:
            node, done = stack.pop()
            if done:
                total = 1
                if isinstance(node, MappingNode):
                    for k, v in node.value:
                        total += self._sizes[k] + self._sizes[v]
                elif isinstance(node, SequenceNode):
                    for v in node.value:
                        total += self._sizes[v]
                self._sizes[node] = total
                continue
            if node in self._sizes:
                continue
            stack.append((node, True))
            if isinstance(node, MappingNode):
                for k, v in node.value:
                    stack.append((k, False))
                    stack.append((v, False))
            elif isinstance(node, SequenceNode):
                stack.extend((v, False) for v in node.value)
        return self._sizes[root]

    def _alias(self, node: Node, value: Any) -> Any:
        if value is _IN_PROGRESS:
            raise self.fail(
                node,
                "an alias refers to a node that contains it (a recursive structure): JSON cannot hold it",
            )
        size = self._expanded_size(node)
        self._decoded += size
        self._aliased += size
        if excessive_aliasing(self._decoded, self._aliased):
            raise self.fail(
                node,
                f"excessive aliasing: aliases expand to {self._aliased:,} of {self._decoded:,} "
                'nodes (a "billion laughs" document?); kubectl refuses it too: write the objects out',
            )
        return value

    # -- values -----------------------------------------------------------------------------
    def build(self, node: Node, depth: int = 1) -> Any:
        cls = node.__class__
        if cls is ScalarNode:
            if node.tag == _STR:
                v = node.value
                # One object per distinct short string: a 100 MB manifest repeats the same
                # names and values hundreds of thousands of times.
                return self._strings.setdefault(v, v) if len(v) <= 40 else v
            return self._scalar(node)
        if depth > MAX_DEPTH:
            raise self.fail(
                node, f"nested more than {MAX_DEPTH} levels deep: not a Kubernetes object"
            )
        built = self._built.get(node)
        if built is not None:
            return self._alias(node, built)
        self._decoded += 1
        self._built[node] = _IN_PROGRESS
        if cls is SequenceNode:
            if node.tag != _SEQ:
                self.construct_undefined(node)
            out: Any = [self.build(child, depth + 1) for child in node.value]
        elif cls is MappingNode:
            if node.tag != _MAP:
                self.construct_undefined(node)
            out = self._mapping(node, depth)
        else:  # pragma: no cover - libyaml composes only these three
            raise self.fail(node, f"unexpected YAML node {type(node).__name__}")
        self._built[node] = out
        return out

    def _mapping(self, node: Node, depth: int) -> dict[str, Any]:
        out: dict[str, Any] = {}
        nulls: set[str] = set()
        merges: list[dict[str, Any]] = []
        for key_node, value_node in node.value:
            if key_node.__class__ is ScalarNode and key_node.tag == _STR:
                key = intern(key_node.value)
            elif key_node.tag == _MERGE:
                merges.extend(self._merge(value_node, depth))
                continue
            else:
                key = self._key(key_node, depth)
            if key in out or key in nulls:
                raise self.fail(
                    key_node,
                    f"mapping key {key[:60]!r} is given twice: keep one (kubectl refuses duplicate keys)",
                )
            value = self.build(value_node, depth + 1)
            if value is None:  # null is "not set", as the API server decodes it
                nulls.add(key)
            else:
                out[key] = value
        for merged in merges:  # explicit keys win; among merged maps, the first wins
            for k, v in merged.items():
                if k not in nulls:
                    out.setdefault(k, v)
        return out

    def _merge(self, node: Node, depth: int) -> list[dict[str, Any]]:
        nodes = node.value if isinstance(node, SequenceNode) else [node]
        out = []
        for n in nodes:
            if not isinstance(n, MappingNode):
                raise self.fail(n, "a merge key (<<) takes a mapping or a list of mappings")
            value = self.build(n, depth + 1)
            out.append(value)
        return out

    def _key(self, node: Node, depth: int) -> str:
        if not isinstance(node, ScalarNode):
            raise self.fail(node, "a mapping key is a list or mapping: JSON keys are strings")
        key = self._scalar(node)
        if key is None:
            return "null"
        if isinstance(key, bool):
            return str(key).lower()
        return str(key)

    def _scalar(self, node: Any) -> Any:
        tag = node.tag
        if tag == "tag:yaml.org,2002:null":
            return None
        if tag == "tag:yaml.org,2002:bool":
            return self.construct_yaml_bool(node)
        if tag == "tag:yaml.org,2002:int":
            text = str(node.value).replace("_", "")
            digits = text.lstrip("+-").lstrip("0")
            if len(digits) > MAX_INT_DIGITS + 2:  # 0x/0b prefixes included
                raise self.fail(
                    node,
                    f"integer of {len(digits):,} digits: Kubernetes numbers are 64-bit (quote it if it is a string)",
                )
            return int(self.construct_yaml_int(node))
        if tag == "tag:yaml.org,2002:float":
            if len(str(node.value)) > 400:
                raise self.fail(
                    node, f"number of {len(node.value):,} characters: quote it if it is a string"
                )
            return kubectl_number(float(self.construct_yaml_float(node)))
        if tag == _STR:
            return node.value
        return self.construct_undefined(node)

    def construct_undefined(self, node: Node) -> Any:
        raise self.fail(
            node,
            f"YAML tag {str(node.tag)[:60]!r} has no JSON form: Kubernetes manifests hold only maps, "
            "lists, strings, numbers, booleans and null",
        )

    def document(self, node: Node) -> Any:
        try:
            return self.build(node)
        finally:
            self._built = {}
            self._sizes = {}


class _Loader(_Parser, _Builder, _Resolver):
    def __init__(self, stream: str, file: str) -> None:
        _Parser.__init__(self, stream)
        _Builder.__init__(self)
        _Resolver.__init__(self)
        self.file = file
        self._resolved: dict[str, str] = {}

    def descend_resolver(self, current_node: Any, current_index: Any) -> None:
        """No path resolvers are registered: nothing to track per node."""

    def ascend_resolver(self) -> None:
        """See :meth:`descend_resolver`."""

    def resolve(self, kind: Any, value: Any, implicit: Any) -> Any:
        """Resolver.resolve, remembered per plain scalar text (keys and values repeat a lot)."""
        if kind is ScalarNode and implicit[0]:
            tag = self._resolved.get(value)
            if tag is None:
                tag = _Resolver.resolve(self, kind, value, implicit)
                if len(value) <= 64 and len(self._resolved) < 100_000:
                    self._resolved[value] = tag
            return tag
        return _Resolver.resolve(self, kind, value, implicit)


def _yaml_error(e: yaml.YAMLError, file: str) -> ManifestError:
    mark = getattr(e, "problem_mark", None)
    where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark else ""
    problem = getattr(e, "problem", None) or str(e).splitlines()[0]
    if problem == "exceeded maximum nesting depth":
        problem = f"nested more than libyaml's 1000 levels (Tessera reads at most {MAX_DEPTH})"
    return ManifestError(
        f"{where}not valid YAML or JSON ({problem}): pass Kubernetes manifests", file=file
    )


def yaml_documents(text: str, file: str) -> Iterator[Any]:
    """The documents of a YAML stream, bounded (see the module docstring)."""
    loader = None
    try:
        loader = _Loader(text, file)
        while loader.check_node():
            node = loader.get_node()
            if node is not None:
                yield loader.document(node)
    except yaml.YAMLError as e:
        if isinstance(e, ConstructorError) and e.problem_mark is None:
            raise ManifestError(f"not valid YAML ({e.problem})", file=file) from None
        raise _yaml_error(e, file) from None
    except RecursionError:
        raise ManifestError(f"nested too deeply (at most {MAX_DEPTH} levels)", file=file) from None
    finally:
        if loader is not None:
            loader.dispose()


def _json_int(text: str) -> int:
    if len(text.lstrip("-").lstrip("0")) > MAX_INT_DIGITS:
        raise _JsonBound(f"integer of {len(text):,} digits: Kubernetes numbers are 64-bit")
    return int(text)


def _json_float(text: str) -> int | float:
    if len(text) > 400:
        raise _JsonBound(f"number of {len(text):,} characters")
    return kubectl_number(float(text))


def kubectl_number(value: float) -> int | float:
    """A decoded float as kubectl sends it to the API server: Go's ``encoding/json`` writes a
    whole ``float64`` below 1e21 without a fraction or exponent (``2.0`` -> ``2``), which the
    API server then decodes as an integer; anything else (``2.5``, ``1e21``, ``.inf``) stays a
    float."""
    if value.is_integer() and abs(value) < 1e21:
        return int(value)
    return value


def _json_object(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in pairs:
        if k in out:
            raise _JsonBound(f"key {k[:60]!r} given twice in one object: keep one")
        if v is not None:
            out[k] = v
    return out


class _JsonBound(ValueError):
    pass


_DECODER = json.JSONDecoder(
    object_pairs_hook=_json_object, parse_int=_json_int, parse_float=_json_float
)
_WS = re.compile(r"[ \t\r\n]*")


def _line_col(text: str, pos: int) -> str:
    line = text.count("\n", 0, pos) + 1
    return f"line {line}, column {pos - (text.rfind(chr(10), 0, pos) + 1) + 1}"


def json_documents(text: str, file: str) -> Iterator[Any] | None:
    """The values of a stream of JSON documents (``{...}{...}``, one per line, or one), or
    None when the text does not start as JSON (then it is YAML)."""
    pos = _WS.match(text).end()  # type: ignore[union-attr]
    if pos >= len(text) or text[pos] not in "{[":
        return None
    try:
        first, end = _DECODER.raw_decode(text, pos)
    except json.JSONDecodeError:
        return None  # flow-style YAML, or JSON with comments: the YAML parser decides
    except _JsonBound as e:
        raise ManifestError(f"{e}", file=file) from None
    except RecursionError:
        raise ManifestError(f"nested too deeply (at most {MAX_DEPTH} levels)", file=file) from None
    return _json_rest(text, file, first, end)


def _json_rest(text: str, file: str, first: Any, end: int) -> Iterator[Any]:
    yield first
    pos = _WS.match(text, end).end()  # type: ignore[union-attr]
    while pos < len(text):
        try:
            value, end = _DECODER.raw_decode(text, pos)
        except json.JSONDecodeError as e:
            raise ManifestError(
                f"{_line_col(text, e.pos)}: not valid JSON ({e.msg})", file=file
            ) from None
        except _JsonBound as e:
            raise ManifestError(f"near {_line_col(text, pos)}: {e}", file=file) from None
        except RecursionError:
            raise ManifestError(
                f"nested too deeply (at most {MAX_DEPTH} levels)", file=file
            ) from None
        yield value
        pos = _WS.match(text, end).end()  # type: ignore[union-attr]


def without_nulls(value: Any, file: str = "", doc: int = 0, depth: int = 1) -> Any:
    """``value`` with every ``null`` mapping value dropped (unset, as the API server decodes
    it), for objects that did not come through :func:`documents` (read from an API server).
    Refuses nesting deeper than :data:`MAX_DEPTH`."""
    if depth > MAX_DEPTH:
        raise ManifestError(
            f"nested more than {MAX_DEPTH} levels deep: not a Kubernetes object", file=file, doc=doc
        )
    if isinstance(value, dict):
        return {
            k: without_nulls(v, file, doc, depth + 1) for k, v in value.items() if v is not None
        }
    if isinstance(value, list):
        return [without_nulls(v, file, doc, depth + 1) for v in value]
    return value


def check_depth(value: Any, file: str, doc: int) -> None:
    """Refuse a JSON value nested deeper than :data:`MAX_DEPTH` (YAML is bounded while read)."""
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        v, d = stack.pop()
        if d > MAX_DEPTH:
            raise ManifestError(
                f"nested more than {MAX_DEPTH} levels deep: not a Kubernetes object",
                file=file,
                doc=doc,
            )
        if isinstance(v, dict):
            stack.extend((c, d + 1) for c in v.values() if isinstance(c, (dict, list)))
        elif isinstance(v, list):
            stack.extend((c, d + 1) for c in v if isinstance(c, (dict, list)))


def documents(text: str, file: str) -> Iterator[Any]:
    """Every document of ``text`` (JSON stream or YAML), a UTF-8 BOM ignored."""
    if text.startswith(BOM):
        text = text[1:]
    js = json_documents(text, file)
    if js is not None:
        for i, v in enumerate(js, start=1):
            check_depth(v, file, i)
            yield v
        return
    yield from yaml_documents(text, file)


# A Go/Helm template action: ``{{ ... }}`` (with optional ``-`` trim markers).
_ACTION = re.compile(r"\{\{-?\s*(.*?)\s*-?\}\}", re.S)
# Template data (.Values, .Release, .Index...) or template keywords and Helm functions.
_TEMPLATE_WORDS = re.compile(
    r"^(?:\.|\$\w*\s*:?=|(?:if|else|end|range|with|define|block|template|include|tpl|toYaml|"
    r"required|default|quote|nindent|indent|printf\s+\"%s)\b)"
)


def template_action(text: str) -> tuple[int, str] | None:
    """``(line, action)`` of the first Go/Helm template action in ``text``, or None.

    An action is a template where it starts a line or an unquoted value (then the text is not
    YAML), or where it reads template data (``.Values``, ``.Release``, ``.Index``) or uses a
    template keyword or Helm function. ``{{ $labels.gpu }}`` in a Prometheus rule's string, and
    anything in a ``#`` comment, is text, not a template.
    """
    if "{{" not in text:
        return None
    for m in _ACTION.finditer(text):
        start = m.start()
        line_start = text.rfind("\n", 0, start) + 1
        before = text[line_start:start]
        if re.search(r"(^|\s)#", before):
            continue  # in a comment
        line = text.count("\n", 0, start) + 1
        stripped = before.strip()
        if stripped in ("", "-", "- -") or (
            re.search(r"(^|\s|-)(:|-)$", stripped) and not re.search(r"[\"']", before)
        ):
            return line, m.group(0)
        if _TEMPLATE_WORDS.match(m.group(1)):
            return line, m.group(0)
    return None
