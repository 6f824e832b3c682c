"""Text -> documents: YAML (libyaml's C parser) or a stream of JSON values, read as kubectl
reads them and bounded (:mod:`tessera.api.limits`).

What is done as ``kubectl``/``sigs.k8s.io/yaml`` does it: a ``null`` field is an absent field
(dropped); timestamps stay strings; mapping keys that YAML reads as numbers or booleans become
their text; a mapping key given twice is refused; go-yaml's alias-expansion rule applies (a
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
from typing import Any

import yaml
from yaml.constructor import ConstructorError, SafeConstructor
from yaml.nodes import CollectionNode, MappingNode, Node, ScalarNode, SequenceNode
from yaml.resolver import Resolver

from tessera.api.errors import ManifestError
from tessera.api.limits import MAX_DEPTH, MAX_INT_DIGITS, excessive_aliasing

try:  # libyaml's C parser: ~7x faster than the pure-Python one (PyYAML ships both)
    from yaml import CParser as _Parser

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


class _BoundedConstructor(SafeConstructor):
    """SafeConstructor with kubectl's reading of nulls, keys and aliases, and Tessera's bounds."""

    def __init__(self) -> None:
        super().__init__()
        self._depth: dict[Node, int] = {}
        self._sizes: dict[Node, int] = {}
        self._decoded = 0
        self._aliased = 0
        self.file = ""

    def fail(self, node: Node, message: str) -> ManifestError:
        return ManifestError(f"{_mark(node)}: {message}", file=self.file)

    # -- aliases ----------------------------------------------------------------------------
    def _expanded_size(self, root: Node) -> int:
        """Nodes ``root`` stands for once every alias in it is expanded (memoised); refuses an
        alias that contains itself."""
        if root in self._sizes:
            return self._sizes[root]
        on_path: set[Node] = set()
        stack: list[tuple[Node, bool]] = [(root, False)]
        while stack:
            node, done = stack.pop()
            if done:
                on_path.discard(node)
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
            if node in on_path:
                raise self.fail(node, "an alias refers to a node that contains it (a recursive structure): JSON cannot hold it")
            on_path.add(node)
            stack.append((node, True))
            if isinstance(node, MappingNode):
                for k, v in node.value:
                    stack.append((k, False))
                    stack.append((v, False))
            elif isinstance(node, SequenceNode):
                stack.extend((v, False) for v in node.value)
        return self._sizes[root]

    def construct_object(self, node: Node, deep: bool = False) -> Any:
        if node in self.constructed_objects:
            if isinstance(node, CollectionNode):
                size = self._expanded_size(node)
                self._decoded += size
                self._aliased += size
                if excessive_aliasing(self._decoded, self._aliased):
                    raise self.fail(
                        node,
                        f"excessive aliasing: aliases expand to {self._aliased:,} of {self._decoded:,} "
                        "nodes (a \"billion laughs\" document?); kubectl refuses it too: write the "
                        "objects out",
                    )
            return self.constructed_objects[node]
        self._decoded += 1
        return super().construct_object(node, deep)

    def construct_undefined(self, node: Node) -> Any:
        raise self.fail(node, f"YAML tag {node.tag!r} has no JSON form: Kubernetes manifests hold only maps, lists, strings, numbers, booleans and null")

    # -- collections ------------------------------------------------------------------------
    def _child_depth(self, node: Node) -> int:
        depth = self._depth.pop(node, 1) + 1
        if depth > MAX_DEPTH:
            raise self.fail(node, f"nested more than {MAX_DEPTH} levels deep: not a Kubernetes object")
        return depth

    def construct_sequence(self, node: Node, deep: bool = False) -> list[Any]:  # type: ignore[override]
        if not isinstance(node, SequenceNode):
            raise self.fail(node, f"expected a sequence, found {node.id}")
        depth = self._child_depth(node)
        out = []
        for child in node.value:
            if isinstance(child, CollectionNode) and child not in self.constructed_objects:
                self._depth[child] = depth
            out.append(self.construct_object(child, deep=deep))
        return out

    def construct_mapping(self, node: Node, deep: bool = False) -> dict[Any, Any]:  # type: ignore[override]
        if not isinstance(node, MappingNode):
            raise self.fail(node, f"expected a mapping, found {node.id}")
        own: dict[str, Node] = {}
        for key_node, _ in node.value:
            if isinstance(key_node, ScalarNode) and key_node.tag != "tag:yaml.org,2002:merge":
                if key_node.value in own:
                    raise self.fail(
                        key_node,
                        f"mapping key {key_node.value[:60]!r} already defined at {_mark(own[key_node.value])}: "
                        "keep one (kubectl refuses duplicate keys)",
                    )
                own[key_node.value] = key_node
        self.flatten_mapping(node)
        depth = self._child_depth(node)
        out: dict[str, Any] = {}
        for key_node, value_node in node.value:
            key = self.construct_object(key_node, deep=deep)
            if not isinstance(key, str):
                if isinstance(key, (list, dict)):
                    raise self.fail(key_node, "a mapping key is a list or mapping: JSON keys are strings")
                key = "null" if key is None else str(key).lower() if isinstance(key, bool) else str(key)
            if isinstance(value_node, CollectionNode) and value_node not in self.constructed_objects:
                self._depth[value_node] = depth
            value = self.construct_object(value_node, deep=deep)
            if value is not None:  # null is "not set", as the API server decodes it
                out[key] = value
        return out

    def construct_yaml_int(self, node: Node) -> int:  # type: ignore[override]
        text = str(node.value).replace("_", "")
        digits = text.lstrip("+-").lstrip("0")
        if len(digits) > MAX_INT_DIGITS + 2:  # 0x/0b prefixes included
            raise self.fail(
                node,
                f"integer of {len(digits):,} digits: Kubernetes numbers are 64-bit "
                "(quote it if it is a string)",
            )
        return int(super().construct_yaml_int(node))

    def construct_yaml_float(self, node: Node) -> float:  # type: ignore[override]
        text = str(node.value)
        if len(text) > 400:
            raise self.fail(node, f"number of {len(text):,} characters: quote it if it is a string")
        return float(super().construct_yaml_float(node))


for _tag, _fn in (
    ("tag:yaml.org,2002:int", _BoundedConstructor.construct_yaml_int),
    ("tag:yaml.org,2002:float", _BoundedConstructor.construct_yaml_float),
):
    _BoundedConstructor.add_constructor(_tag, _fn)
for _tag in ("tag:yaml.org,2002:timestamp", "tag:yaml.org,2002:binary", "tag:yaml.org,2002:omap",
             "tag:yaml.org,2002:pairs", "tag:yaml.org,2002:set"):
    _BoundedConstructor.add_constructor(_tag, _BoundedConstructor.construct_undefined)
_BoundedConstructor.add_constructor(None, _BoundedConstructor.construct_undefined)


class _Loader(_Parser, _BoundedConstructor, _Resolver):  # type: ignore[misc,valid-type]
    def __init__(self, stream: str, file: str) -> None:
        _Parser.__init__(self, stream)
        _BoundedConstructor.__init__(self)
        _Resolver.__init__(self)
        self.file = file


def _yaml_error(e: yaml.YAMLError, file: str) -> ManifestError:
    mark = getattr(e, "problem_mark", None)
    where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark else ""
    problem = getattr(e, "problem", None) or str(e).splitlines()[0]
    if problem == "exceeded maximum nesting depth":
        problem = f"nested more than libyaml's 1000 levels (Tessera reads at most {MAX_DEPTH})"
    return ManifestError(f"{where}not valid YAML or JSON ({problem}): pass Kubernetes manifests", file=file)


def yaml_documents(text: str, file: str) -> Iterator[Any]:
    """The documents of a YAML stream, bounded (see the module docstring)."""
    loader = _Loader(text, file)
    try:
        while loader.check_node():
            node = loader.get_node()
            loader._depth.clear()
            yield loader.construct_document(node)
            loader._sizes.clear()
    except yaml.YAMLError as e:
        if isinstance(e, ConstructorError) and e.problem_mark is None:
            raise ManifestError(f"not valid YAML ({e.problem})", file=file) from None
        raise _yaml_error(e, file) from None
    except RecursionError:
        raise ManifestError(f"nested too deeply (at most {MAX_DEPTH} levels)", file=file) from None
    finally:
        loader.dispose()


def _json_int(text: str) -> int:
    if len(text.lstrip("-").lstrip("0")) > MAX_INT_DIGITS:
        raise _JsonBound(f"integer of {len(text):,} digits: Kubernetes numbers are 64-bit")
    return int(text)


def _json_float(text: str) -> float:
    if len(text) > 400:
        raise _JsonBound(f"number of {len(text):,} characters")
    return float(text)


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


_DECODER = json.JSONDecoder(object_pairs_hook=_json_object, parse_int=_json_int, parse_float=_json_float)
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
            raise ManifestError(f"{_line_col(text, e.pos)}: not valid JSON ({e.msg})", file=file) from None
        except _JsonBound as e:
            raise ManifestError(f"near {_line_col(text, pos)}: {e}", file=file) from None
        except RecursionError:
            raise ManifestError(f"nested too deeply (at most {MAX_DEPTH} levels)", file=file) from None
        yield value
        pos = _WS.match(text, end).end()  # type: ignore[union-attr]


def check_depth(value: Any, file: str, doc: int) -> None:
    """Refuse a JSON value nested deeper than :data:`MAX_DEPTH` (YAML is bounded while read)."""
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        v, d = stack.pop()
        if d > MAX_DEPTH:
            raise ManifestError(f"nested more than {MAX_DEPTH} levels deep: not a Kubernetes object", file=file, doc=doc)
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
        if stripped in ("", "-", "- -") or re.search(r"(^|\s|-)(:|-)$", stripped) and not re.search(r"[\"']", before):
            return line, m.group(0)
        if _TEMPLATE_WORDS.match(m.group(1)):
            return line, m.group(0)
    return None
