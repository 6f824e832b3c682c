"""Structured allocation with upstream semantics (dra-spec.md sections 2-4)."""

from tessera.allocator.core import (
    AllocationError,
    Allocator,
    CapacityArithmeticError,
    Features,
    NodeAllocationError,
    Pool,
    SelectorError,
    SliceIndex,
    consumed_amount,
    consumption,
    gather_pools,
    violates_policy,
)
from tessera.allocator.model import AllocatedState, Device, Node, Slice, slice_from_dict
from tessera.allocator.record import (
    CapacityShort,
    CapacityUse,
    DeviceRecord,
    NodeRecord,
    Refusal,
    RequestRecord,
)

__all__ = [
    "AllocatedState",
    "AllocationError",
    "Allocator",
    "CapacityArithmeticError",
    "CapacityShort",
    "CapacityUse",
    "Device",
    "DeviceRecord",
    "Features",
    "Node",
    "NodeAllocationError",
    "NodeRecord",
    "Pool",
    "Refusal",
    "RequestRecord",
    "SelectorError",
    "Slice",
    "SliceIndex",
    "consumed_amount",
    "consumption",
    "gather_pools",
    "slice_from_dict",
    "violates_policy",
]
