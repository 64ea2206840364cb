"""Importers for routing data that other tools publish, into :class:`~expertcache.trace.RoutingTrace`.

One module per format (docs/importers.md says, for each, the producing tool, what one record
means, what is inferred and what replaying it means):

``routes-jsonl``
    This project's JSON Lines interchange format (docs/design.md §3); the shape is given.
``mixtral-jsonl``
    JSON Lines, one row per (request, token, layer), as a vLLM routing profiler published for
    Mixtral-8x7B::

        {"dataset": "gsm8k", "problem_id": 0, "layer": 0, "experts": [7, 0],
         "gating_probs": [0.80, 0.20], "token_idx": 0}

    ``token_pos`` is accepted instead of ``token_idx``; the request id is
    ``"{dataset}/{problem_id}"``; ``gating_probs`` become the trace's gates.
``deepseek-csv``
    One CSV file per text with the header ``Layer ID,Batch Number,Token,Activated Expert IDs``,
    as published (MoE-Beyond) for DeepSeek-V2-Lite: one teacher-forced forward pass per file,
    imported as decode positions (``Batch Number`` is the row of that forward's batch).
``warp-jsonl``
    ``{"tok": n, "layers": [[k ids] x L]}`` per decode step, batch 1, sorted ids, no gates (the
    warp project's ``tools/trace_hf.py``; a real OLMoE file ships as an example).
``columnar``
    Parquet, CSV or JSON Lines with a column mapping: one row per (token, layer), or one row per
    token with a list-of-lists layer column.

What the data do not say is inferred and reported in an :class:`ImportReport`:

* ``L``: the distinct layer ids seen, mapped in ascending order to MoE layers
  ``0..L-1`` (dense layers never appear in such files; a gap in the ids is
  reported, because a layer absent from the whole file cannot be told apart
  from a dense one). Pass ``n_layers`` to use the ids as they are.
* ``N``: ``max expert id + 1``. This is only a **lower bound**: an expert that
  was never selected is invisible. Pass ``n_experts`` for the real value.
* ``k``: the number of experts per row (the most common length; rows of another
  length are bad rows).

A token whose layers are not all present is dropped, never padded: a trailing one is an
*incomplete step*, an interior one (later positions of the request are complete) a *gap*
``(request, position)``; both are counted with examples. Rows that cannot be read raise
:class:`~expertcache.errors.ValidationError` (file, record, field), or with
``skip_bad_rows=True`` are counted and skipped. Every reader parses whole columns through
pyarrow where it can and falls back to a record-by-record read that names the first fault.
"""

from ._common import ImportReport
from .columnar import import_columnar, parse_map
from .deepseek_csv import import_deepseek_csv
from .mixtral_jsonl import import_mixtral_jsonl
from .routes_jsonl import import_routes_jsonl
from .warp_jsonl import import_warp_jsonl

__all__ = ["ImportReport", "import_mixtral_jsonl", "import_deepseek_csv", "import_routes_jsonl",
           "import_warp_jsonl", "import_columnar", "parse_map", "FORMATS"]

#: Foreign formats this package reads (names used by ``expertcache trace import --format``).
FORMATS = ("mixtral-jsonl", "deepseek-csv", "warp-jsonl", "columnar")
