"""resource.k8s.io/v1 and Pod views: exact Quantity, manifest loading, validation."""

from tessera.api.errors import ManifestError, TesseraError
from tessera.api.loader import (
    Manifest,
    Source,
    expand_workloads,
    load_file,
    load_files,
    parse_documents,
)
from tessera.api.quantity import Quantity, QuantityError, parse_quantity

__all__ = [
    "Manifest",
    "ManifestError",
    "Quantity",
    "QuantityError",
    "Source",
    "TesseraError",
    "expand_workloads",
    "load_file",
    "load_files",
    "parse_documents",
    "parse_quantity",
]
