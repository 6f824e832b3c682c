"""HAMi-style GPU requests -> DRA ResourceClaimTemplates on ``gpu.tessera.dev``.

Pure code (no I/O), used by the mutating webhook and by ``tessera simulate``::

    from tessera.convert import convert_pod
    conv = convert_pod(pod, memory_sizes=[80 * 2**30])
    conv.pod          # the pod with HAMi resources replaced by resource claims
    conv.templates    # resource.k8s.io/v1 ResourceClaimTemplates to create with it
    conv.warnings     # what was ignored, defaulted or left unconverted
    conv.requests     # per container, the request in HAMi's terms

``convert_object`` does the same for a whole manifest (a Pod, or a Deployment/Job/... whose pod
template it converts in place); ``gpu_memory_sizes`` reads the sizes percentages resolve against
from ResourceSlices, ``compute_unit_sizes`` the compute units of Hygon's cards. HAMi's other
vendors (Ascend, Hygon: ``tessera.api.vendors``) get claims for their own DRA drivers when
``vendors`` names them as installed.

``legacy_pod`` is legacy mode's conversion (no DRA): requests unchanged, the legacy
scheduler named.

See ``docs/convert.md`` for the mapping table and the deliberate divergences from HAMi.
"""

from .convert import ContainerRequest, Conversion, ConversionError, convert_pod, mentions_hami
from .hami import HAMI_RESOURCES
from .legacy import LEGACY_SCHEDULER, legacy_pod
from .manifests import (
    POD_TEMPLATE_PATHS,
    ObjectConversion,
    compute_unit_sizes,
    convert_object,
    gpu_memory_sizes,
)

__all__ = [
    "HAMI_RESOURCES",
    "LEGACY_SCHEDULER",
    "POD_TEMPLATE_PATHS",
    "ContainerRequest",
    "Conversion",
    "ConversionError",
    "ObjectConversion",
    "compute_unit_sizes",
    "convert_object",
    "convert_pod",
    "gpu_memory_sizes",
    "legacy_pod",
    "mentions_hami",
]
