"""Deterministic Kubernetes object names (DNS labels and subdomains) with hashed suffixes."""

from __future__ import annotations

import hashlib
import re

DNS_LABEL_MAX = 63
DNS_SUBDOMAIN_MAX = 253

_LABEL_RE = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_BAD_CHARS = re.compile(r"[^a-z0-9-]+")


def is_dns_label(name: str) -> bool:
    """RFC 1123 label: lower-case alphanumerics and '-', alphanumeric at both ends, <=63."""
    return len(name) <= DNS_LABEL_MAX and bool(_LABEL_RE.match(name))


def is_dns_subdomain(name: str) -> bool:
    """RFC 1123 subdomain: dot-separated labels, <=253 characters in all."""
    return 0 < len(name) <= DNS_SUBDOMAIN_MAX and all(
        bool(_LABEL_RE.match(part)) for part in name.split(".")
    )


def short_hash(text: str, n: int = 8) -> str:
    """First ``n`` hex digits of sha256(text)."""
    return hashlib.sha256(text.encode()).hexdigest()[:n]


def _clean_label(part: str) -> str:
    return _BAD_CHARS.sub("-", part.lower()).strip("-")


def _fit(name: str, limit: int, original: str, dots: bool) -> str:
    """Shorten ``name`` to ``limit`` with ``-<hash of original>`` when it is too long."""
    if len(name) <= limit:
        return name
    suffix = "-" + short_hash(original)
    head = name[: limit - len(suffix)].rstrip("-.")
    if dots:
        # a label may not end in '-' after the cut; rstrip above handles both separators
        head = ".".join(p.strip("-") for p in head.split(".") if p.strip("-"))
    return head + suffix


def dns_subdomain(text: str) -> str:
    """``text`` as a valid DNS subdomain (<=253).

    A valid name is kept as is; an invalid or too-long one is cleaned (lower-cased, other
    characters replaced by '-') and, when it changed or was cut, given ``-<8 hex of sha256>`` of
    the original so that distinct inputs keep distinct names.
    """
    if is_dns_subdomain(text):
        return text
    parts = [_clean_label(p) for p in text.split(".")]
    cleaned = ".".join(p for p in parts if p) or "x"
    if cleaned != text and len(cleaned) + 9 <= DNS_SUBDOMAIN_MAX:
        return f"{cleaned}-{short_hash(text)}"
    return _fit(cleaned, DNS_SUBDOMAIN_MAX, text, dots=True)


def dns_label(text: str) -> str:
    """``text`` as a valid DNS label (<=63), same rules as :func:`dns_subdomain`."""
    if is_dns_label(text):
        return text
    cleaned = _clean_label(text.replace(".", "-")) or "x"
    if cleaned != text and len(cleaned) + 9 <= DNS_LABEL_MAX:
        return f"{cleaned}-{short_hash(text)}"
    return _fit(cleaned, DNS_LABEL_MAX, text, dots=False)
