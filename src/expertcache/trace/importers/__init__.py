"""Importers for routing data that other tools publish, into :class:`~expertcache.trace.RoutingTrace`.

One module per format; two foreign layouts are read:

``mixtral-jsonl``
    JSON Lines, one row per (request, token, layer), as published for
    Mixtral-8x7B::

        {"dataset": "gsm8k", "problem_id": 0, "layer": 0, "experts": [7, 0],
         "gating_probs": [0.80, 0.20], "token_idx": 0}

    ``token_pos`` is accepted instead of ``token_idx``; the request id is
    ``"{dataset}/{problem_id}"``; ``gating_probs`` become the trace's gates.
``deepseek-csv``
    One CSV file per prompt with the header
    ``Layer ID,Batch Number,Token,Activated Expert IDs``, as published for
    DeepSeek-V2-Lite. The expert list is a string, ``"[3, 17, 42]"`` or
    ``"3 17 42"``. ``Batch Number`` is read as the forward pass of the
    generation (the first ``prefill_batches`` passes are the prompt, every later
    one a decode step); inside a (batch, layer) group the rows come in token
    order, so the i-th row of every layer of a batch is the same token.

What the data do not say is inferred and reported in an :class:`ImportReport`:

* ``L``: the distinct layer ids seen, mapped in ascending order to MoE layers
  ``0..L-1`` (dense layers never appear in such files; a gap in the ids is
  reported, because a layer absent from the whole file cannot be told apart
  from a dense one). Pass ``n_layers`` to use the ids as they are.
* ``N``: ``max expert id + 1``. This is only a **lower bound**: an expert that
  was never selected is invisible. Pass ``n_experts`` for the real value.
* ``k``: the number of experts per row (the most common length; rows of another
  length are bad rows).

A token whose layers are not all present is an *incomplete step*: it is
counted, a few examples are kept, and it is dropped, never padded. Rows that
cannot be read raise :class:`~expertcache.errors.ValidationError` (file, line,
field), or with ``skip_bad_rows=True`` are counted and skipped.
"""

from ._common import ImportReport
from .deepseek_csv import import_deepseek_csv
from .mixtral_jsonl import import_mixtral_jsonl
from .routes_jsonl import import_routes_jsonl

__all__ = ["ImportReport", "import_mixtral_jsonl", "import_deepseek_csv", "import_routes_jsonl", "FORMATS"]

#: Foreign formats this package reads (names used by ``expertcache trace import --format``).
FORMATS = ("mixtral-jsonl", "deepseek-csv")
