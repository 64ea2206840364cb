"""Results and streams as Arrow tables and pandas DataFrames (pandas optional).

Every public record with a ``to_arrow()`` returns a :class:`pyarrow.Table`;
``to_pandas()`` converts that table and needs pandas, which expertcache does
not depend on: without it the call raises one line naming ``pip install pandas``.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Mapping, Sequence
from typing import Any

import pyarrow as pa

from .errors import ExpertCacheError

__all__ = ["rows_to_arrow", "records_to_arrow", "records_to_pandas", "arrow_to_pandas"]


def rows_to_arrow(rows: Sequence[Mapping[str, Any]]) -> pa.Table:
    """A table with one row per mapping (the union of their keys; a missing key is null)."""
    return pa.Table.from_pylist(list(rows))


def records_to_arrow(records: Sequence[Any]) -> pa.Table:
    """One row per record of any kind with a ``to_dict()`` (every result record of expertcache has one:
    ``TimingResult``, ``GapResult``, ``TrafficReading``, ...); nested lists and dicts become Arrow lists and structs."""
    return rows_to_arrow([r.to_dict() for r in records])


def records_to_pandas(records: Sequence[Any]) -> Any:
    """:func:`records_to_arrow` as a pandas DataFrame (needs pandas: ``pip install pandas``)."""
    return arrow_to_pandas(records_to_arrow(records))


def arrow_to_pandas(table: pa.Table) -> Any:
    """``table`` as a :class:`pandas.DataFrame`; without pandas, an :class:`ExpertCacheError` naming the install."""
    if importlib.util.find_spec("pandas") is None:
        raise ExpertCacheError("to_pandas needs pandas, which expertcache does not install: pip install pandas "
                               "(or use to_arrow(), which needs only pyarrow)")
    return table.to_pandas()
