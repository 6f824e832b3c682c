"""Structured allocation with upstream semantics (dra-spec.md sections 2-4)."""

from tessera.allocator.core import (
    AllocationError,
    Allocator,
    Features,
    Pool,
    SliceIndex,
    consumed_amount,
    gather_pools,
    violates_policy,
)
from tessera.allocator.model import AllocatedState, Device, Node, Slice, slice_from_dict

__all__ = [
    "AllocatedState",
    "AllocationError",
    "Allocator",
    "Device",
    "Features",
    "Node",
    "Pool",
    "Slice",
    "SliceIndex",
    "consumed_amount",
    "gather_pools",
    "slice_from_dict",
    "violates_policy",
]
