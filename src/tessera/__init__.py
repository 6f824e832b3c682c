"""Tessera: fractional GPU sharing on Kubernetes through DRA."""

__version__ = "0.1.0"
#: The Kubernetes release Tessera targets: its allocator is checked against this release's
#: (tools/kube/go.mod pins the same version), with resource.k8s.io/v1 and consumable capacity.
KUBERNETES_VERSION = "v1.37.2"
DRIVER_NAME = "gpu.tessera.dev"
DEVICE_CLASS_NAME = "gpu.tessera.dev"
