"""Typed errors of :mod:`tessera.inventory`.

Every error is an :class:`InventoryError` (a :class:`ValueError`). ``str(err)`` is one line:
``<source>[:<line>[:<column>]]: <field>: <problem>``, where ``<source>`` is the file (or the
``source`` name given to a parser), ``<field>`` the input field or format element concerned, and
``<problem>`` says what is wrong and what to do instead.
"""

from __future__ import annotations

from tessera.api.errors import TesseraError


class InventoryError(TesseraError, ValueError):
    """An inventory, topology or generated ResourceSlice is unusable.

    Attributes: ``source`` (file or name), ``field`` (the field concerned), ``line`` and ``column``
    (1-based, when known), ``problem`` (the message without the location).
    """

    def __init__(
        self,
        problem: str,
        *,
        source: str,
        field: str,
        line: int | None = None,
        column: int | None = None,
    ) -> None:
        self.problem = " ".join(problem.split())  # always one line
        self.source = source
        self.field = field
        self.line = line
        self.column = column
        where = source
        if line is not None:
            where += f":{line}"
            if column is not None:
                where += f":{column}"
        super().__init__(f"{where}: {field}: {self.problem}")


class UnsupportedFormatError(InventoryError):
    """The text is not a format this package reads, or one that lacks what a GPU needs
    (for example the plain ``nvidia-smi`` table, which carries no UUIDs)."""


class MalformedInputError(InventoryError):
    """The text is in a known format but broken: truncated XML, a cut ``-q`` block, a bad row."""


class MissingFieldError(InventoryError):
    """An essential field (uuid, product name, memory) is absent or unreadable."""


class SliceBuildError(InventoryError):
    """GPUs and topology cannot be turned into valid ResourceSlices (bad node name, duplicate
    UUIDs, a topology of another size...)."""
