"""Where a prepared claim's files live: the contract between the node driver (which writes
them), the enforcement library in the container (which reads the limits file and updates the
usage region) and the monitor (which reads both). Every component imports its names and
defaults from here; nothing else spells them.

On the host (``tessera driver --state-dir``, default :data:`DEFAULT_STATE_DIR`)::

    <state-dir>/claims/<claim-uid>/limits      the claim's limits file (0444; limits.py)
    <state-dir>/claims/<claim-uid>/region      the claim's usage region (region.py)
    <state-dir>/claims/<claim-uid>/claim.json  optional metadata (monitor/regions.py)
    <state-dir>/claims/<claim-uid>/driver/usage  what the claim holds beyond its charges, per
                                               GPU, by NVML's per-process figures (reconcile.py)
    <state-dir>/ld.so.preload                  one line naming the library's container path
    <state-dir>/shares/<GPU UUID>              the GPU's guaranteed cores (0444; shares.py)

``<state-dir>/claims`` is the monitor's ``--region-dir`` (default :data:`DEFAULT_CLAIMS_DIR`:
the driver's default state dir's, so the two defaults meet). In the container (CDI mounts)
the limits file is :data:`CONTAINER_LIMITS`, the region :data:`CONTAINER_REGION`, the shares
directory (read-only) :data:`CONTAINER_SHARES` and the library lives in
:data:`CONTAINER_LIBRARY_DIR`.
"""

from __future__ import annotations

from pathlib import Path

from tessera.enforcement.limits import LIMITS_PATH

#: The node driver's default ``--state-dir`` (checkpoint, GPU registry, claim directories).
DEFAULT_STATE_DIR = "/var/lib/tessera/driver"
#: The directory under the state dir with one directory per prepared claim (by claim UID).
CLAIMS_SUBDIR = "claims"
#: The monitor's default ``--region-dir``: the claim directories of the driver's default.
DEFAULT_CLAIMS_DIR = f"{DEFAULT_STATE_DIR}/{CLAIMS_SUBDIR}"
#: A claim directory's usage region (``tessera_region.h``).
REGION_FILE = "region"
#: A claim directory's limits file (``tessera_limits.h``).
LIMITS_FILE = "limits"
#: A claim directory's optional metadata for the monitor.
META_FILE = "claim.json"
#: A claim directory's subdirectory that only the node driver writes (mounted read-only next to
#: the region, so that a file replaced in it is seen in the container), and its file.
DRIVER_DIR = "driver"
DRIVER_USAGE_FILE = "usage"
#: The host file mounted as the container's ``/etc/ld.so.preload``.
PRELOAD_FILE = "ld.so.preload"

#: The directory under the state dir with the node's per-GPU shares files.
SHARES_SUBDIR = "shares"

#: Container paths the CDI spec mounts the claim's files at.
CONTAINER_LIMITS = LIMITS_PATH
CONTAINER_REGION = "/run/tessera/region"
#: The claim's driver directory in the container: next to the region, where the library looks.
CONTAINER_DRIVER_DIR = "/run/tessera/driver"
CONTAINER_LIBRARY_DIR = "/usr/lib/tessera"
CONTAINER_SHARES = "/run/tessera/shares"
LD_SO_PRELOAD = "/etc/ld.so.preload"


def claims_dir(state_dir: str | Path) -> Path:
    """``<state_dir>/claims``: what the monitor reads as its ``--region-dir``."""
    return Path(state_dir) / CLAIMS_SUBDIR


def claim_dir(state_dir: str | Path, uid: str) -> Path:
    """``<state_dir>/claims/<uid>``: one prepared claim's limits file, region and metadata."""
    return claims_dir(state_dir) / uid
