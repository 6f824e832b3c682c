"""Typed errors for bad input. Each names the file, document, object and field it is about."""

from __future__ import annotations


class TesseraError(Exception):
    """Base of every error Tessera reports to a user (the CLI prints it and exits 2)."""


class ManifestError(TesseraError, ValueError):
    """An input manifest is unreadable or invalid.

    ``str(err)`` is one line: ``<file> (document N): <Kind ns/name>: <field>: <problem>``, with
    the parts that are unknown left out. The problem text says how to fix it.
    """

    def __init__(
        self,
        message: str,
        *,
        file: str | None = None,
        doc: int | None = None,
        obj: str | None = None,
        field: str | None = None,
    ) -> None:
        self.message = message
        self.file = file
        self.doc = doc
        self.obj = obj
        self.field = field
        super().__init__(self._render())

    def _render(self) -> str:
        parts = []
        if self.file:
            parts.append(self.file if self.doc is None else f"{self.file} (document {self.doc})")
        if self.obj:
            parts.append(self.obj)
        if self.field:
            parts.append(self.field)
        parts.append(self.message)
        return ": ".join(parts)

    def located(self, *, file: str | None = None, doc: int | None = None) -> ManifestError:
        """A copy with the file/document filled in where still unknown."""
        return ManifestError(
            self.message,
            file=self.file or file,
            doc=self.doc if self.doc is not None else doc,
            obj=self.obj,
            field=self.field,
        )
