"""Tessera: fractional GPU sharing on Kubernetes through DRA."""

__version__ = "0.1.0"
#: The Kubernetes release Tessera targets: its allocator is checked against this release's
#: (tools/kube/go.mod pins the same version), with resource.k8s.io/v1 and consumable capacity.
KUBERNETES_VERSION = "v1.37.2"
DRIVER_NAME = "gpu.tessera.dev"
DEVICE_CLASS_NAME = "gpu.tessera.dev"
#: Tessera's opaque device configuration (``spec.devices.config[].opaque.parameters`` of a
#: ResourceClaim or DeviceClass, KEP-4381, driver :data:`DRIVER_NAME`): the compute policy.
CONFIG_API_VERSION = "gpu.tessera.dev/v1alpha1"
CONFIG_KIND = "ComputeConfig"
#: What ``cores`` promises: ``strict`` (a cap, the default) or ``work-conserving`` (a
#: guarantee; idle GPU time is shared in proportion to the shares). docs/enforcement.md §5.
COMPUTE_POLICIES = ("strict", "work-conserving")
