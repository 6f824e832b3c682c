"""``tessera lint``: mistakes in DeviceClasses, ResourceClaims, ResourceClaimTemplates and pods
before they are applied (:mod:`tessera.lint.checks` says what is checked). Pure: loaded
manifests and ResourceSlice dicts in, findings out. The webhook lints each new template shape
with the same :class:`LintWorld`.
"""

from .checks import Finding, LintWorld, lint

__all__ = ["Finding", "LintWorld", "lint"]
