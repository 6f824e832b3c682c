"""``nvidia-smi -q`` text (the "NVSMI LOG"), as an indentation tree."""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from ._records import RawGPU, RawMig, mig_problem, parse_mib
from .errors import MalformedInputError, UnsupportedFormatError
from .model import small_int

_KV = re.compile(r"^(?P<ind> *)(?P<key>[^:]*?\S)\s+:(?: ?(?P<val>.*))?$")
_GPU_HEAD = re.compile(r"^GPU (?P<bus>[0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}\.[0-7])\s*$")


@dataclass
class Node:
    key: str
    value: str | None
    line: int
    children: list[Node] = field(default_factory=list)

    def get(self, *path: str) -> Node | None:
        node: Node | None = self
        for key in path:
            if node is None:
                return None
            node = next((c for c in node.children if c.key == key), None)
        return node

    def value_of(self, *path: str) -> str | None:
        node = self.get(*path)
        return node.value if node is not None else None

    def all(self, key: str) -> list[Node]:
        return [c for c in self.children if c.key == key]


def parse_tree(text: str, line_offset: int = 0) -> Node:
    """The ``-q`` text as a tree: each ``Key : value`` or section line is a node, children are
    the lines indented below it. ``line`` is 1-based (plus ``line_offset``)."""
    root = Node("", None, 0)
    stack: list[tuple[int, Node]] = [(-1, root)]
    for n, raw in enumerate(text.splitlines(), start=1 + line_offset):
        line = raw.rstrip()
        if not line.strip() or line.startswith("====="):
            continue
        indent = len(line) - len(line.lstrip(" "))
        m = _KV.match(line)
        node = (
            Node(m.group("key").strip(), (m.group("val") or "").strip(), n)
            if m
            else Node(line.strip(), None, n)
        )
        while stack[-1][0] >= indent:
            stack.pop()
        stack[-1][1].children.append(node)
        stack.append((indent, node))
    return root


def raw_gpus_from_smi_text(text: str, source: str, line_offset: int = 0) -> list[RawGPU]:
    """Raw GPU records from ``nvidia-smi -q`` text.

    Reads "Driver Version", "CUDA Version", and per ``GPU <bus id>`` block: "Product Name",
    "Product Architecture", "GPU UUID", "PCI/Bus Id", "FB Memory Usage/Total", "MIG Mode/Current"
    and each "MIG Device" ("Index", "GPU Instance ID", "Compute Instance ID",
    "Device Attributes/Shared/Multiprocessor count", "[Shared] FB Memory Usage/Total").
    Raises :class:`MalformedInputError` when "Attached GPUs" disagrees with the GPU blocks found
    (a cut file) or a MIG block lacks its ids.
    """
    tree = parse_tree(text, line_offset)
    driver = tree.value_of("Driver Version")
    cuda = tree.value_of("CUDA Version") or tree.value_of("CUDA Driver Version")
    blocks = [c for c in tree.children if _GPU_HEAD.match(c.key)]
    if not blocks:
        raise UnsupportedFormatError(
            "no `GPU <bus id>` block in this nvidia-smi -q text",
            source=source,
            field="GPU",
        )
    attached = tree.get("Attached GPUs")
    if (
        attached is not None
        and attached.value
        and small_int(attached.value) is not None
        and small_int(attached.value) != len(blocks)
    ):
        raise MalformedInputError(
            f"Attached GPUs says {attached.value} but {len(blocks)} `GPU <bus id>` blocks "
            "follow; the text is cut - capture all of `nvidia-smi -q` again",
            source=source,
            field="Attached GPUs",
            line=attached.line,
        )
    raws: list[RawGPU] = []
    for index, block in enumerate(blocks):
        head = _GPU_HEAD.match(block.key)
        assert head is not None
        migs: list[RawMig] = []
        for k, mig in enumerate(block.all("MIG Device")):
            mem = mig.value_of("FB Memory Usage", "Total") or mig.value_of(
                "Shared FB Memory Usage", "Total"
            )
            gi, ci, mib = (
                mig.value_of("GPU Instance ID"),
                mig.value_of("Compute Instance ID"),
                parse_mib(mem),
            )
            if small_int(gi) is None or small_int(ci) is None or mib is None:
                raise MalformedInputError(
                    mig_problem(
                        index,
                        k,
                        {
                            "GPU Instance ID": gi,
                            "Compute Instance ID": ci,
                            "FB Memory Usage/Total": mem,
                        },
                    ),
                    source=source,
                    field="MIG Device",
                    line=mig.line,
                )
            idx = mig.value_of("Index")
            sm = mig.value_of("Device Attributes", "Shared", "Multiprocessor count")
            migs.append(
                RawMig(
                    index=small_int(idx, k),  # type: ignore[arg-type]
                    gpu_instance_id=small_int(gi),  # type: ignore[arg-type]
                    compute_instance_id=small_int(ci),  # type: ignore[arg-type]
                    memory_mib=mib,
                    sm_count=small_int(sm),
                )
            )
        raws.append(
            RawGPU(
                index=index,
                uuid=block.value_of("GPU UUID"),
                product_name=block.value_of("Product Name"),
                memory=block.value_of("FB Memory Usage", "Total"),
                memory_reserved=block.value_of("FB Memory Usage", "Reserved"),
                architecture=block.value_of("Product Architecture"),
                driver_version=driver,
                cuda_version=cuda,
                bus_id=block.value_of("PCI", "Bus Id") or head.group("bus"),
                mig_enabled=(block.value_of("MIG Mode", "Current") or "").lower() == "enabled",
                migs=migs,
                line=block.line,
            )
        )
    return raws
