"""The package's exception hierarchy.

Every error a user can cause derives from :class:`ExpertCacheError`; the CLI
prints its one-line message and exits with status 2, without a traceback.
"""

from __future__ import annotations


class ExpertCacheError(Exception):
    """Base class of every user-facing error of expertcache."""


class ValidationError(ExpertCacheError, ValueError):
    """Input data or a configuration violates the documented contract.

    Parameters
    ----------
    message
        What was expected, what came, and how to fix it.
    source
        The file (or other origin) of the offending data, if any.
    record
        The 1-based record (line or row) number, if known.
    field
        The offending field name, if known.
    """

    def __init__(
        self,
        message: str,
        *,
        source: str | None = None,
        record: int | None = None,
        field: str | None = None,
    ) -> None:
        self.source = source
        self.record = record
        self.field = field
        self.detail = message
        super().__init__(self._format())

    def _format(self) -> str:
        where = []
        if self.source is not None:
            where.append(str(self.source))
        if self.record is not None:
            where.append(f"record {self.record}")
        if self.field is not None:
            where.append(f"field '{self.field}'")
        prefix = ": ".join(where)
        return f"{prefix}: {self.detail}" if prefix else self.detail


class IntegrityError(ValidationError):
    """A stored file is missing, truncated, or does not match its manifest hash."""


class OutputExistsError(ExpertCacheError):
    """The requested output path exists and overwriting was not requested."""
