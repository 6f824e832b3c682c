"""Tessera: fractional GPU sharing on Kubernetes through DRA."""

__version__ = "0.1.0"
DRIVER_NAME = "gpu.tessera.dev"
DEVICE_CLASS_NAME = "gpu.tessera.dev"
