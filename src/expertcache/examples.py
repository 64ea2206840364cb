"""The bundled example data: names, paths and loaders.

>>> from expertcache import examples
>>> "example_model_trace" in examples.names()
True
>>> examples.path("example_model_trace").joinpath("manifest.json").is_file()
True
>>> examples.load("example_model_trace")  # doctest: +ELLIPSIS
RoutingTrace(L=4, N=32, k=4, n_requests=56, ...)

Paths point into the installed package: read them, pass them to the CLI
(``expertcache events build "$(python -c '...examples.path(...)')"``), never
write there.
"""

from __future__ import annotations

from contextlib import ExitStack
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

from .errors import ValidationError

__all__ = ["Example", "EXAMPLES", "names", "path", "describe", "load"]


@dataclass(frozen=True)
class Example:
    """One bundled example.

    Attributes
    ----------
    name
        Its name (the file or directory under the package data).
    kind
        ``"trace"`` (a RoutingTrace directory: :func:`expertcache.trace.read_trace`), ``"events-jsonl"``
        (:func:`expertcache.events.import_events_jsonl`), ``"prompts"`` (JSON Lines prompts), ``"labels"``
        (JSON Lines request labels) or ``"warp-jsonl"`` (a foreign format for ``trace import``).
    caption
        What it is, in one line; the captions of the traces are printed with every result made from them.
    relpath
        Path under the package's ``data`` directory.
    """

    name: str
    kind: str
    caption: str
    relpath: str


def _examples() -> dict[str, Example]:
    from .trace.examples import EXAMPLES as TRACES
    from .trace.examples import RAW_EXAMPLES

    captions = {directory: caption for directory, caption in TRACES.values()}
    raw, _fmt, raw_caption = RAW_EXAMPLES["warp-olmoe"]
    rows = [
        Example("example_model_trace", "trace", captions["example_model_trace"], "example_model_trace"),
        Example("example_trace", "trace", captions["example_trace"], "example_trace"),
        Example("example_matched_trace", "trace",
                "routing of the example model on the matched probe set (fixed-template and diverse arms; "
                "docs/probes.md)", "example_matched_trace"),
        Example("example_matched_labels", "labels", "arm, category and split of each request of "
                "example_matched_trace (docs/probes.md)", "example_matched_labels.jsonl"),
        Example("example_prompts", "prompts", "the 56 prompts the example model trace was collected on "
                "(docs/example_model.md)", "example_prompts.jsonl"),
        Example("conformance_events", "events-jsonl", "the hand-derived conformance stream (docs/conformance.md)",
                "conformance_events.jsonl"),
        Example("warp_olmoe", "warp-jsonl", raw_caption, raw),
    ]
    return {e.name: e for e in rows}


#: Every bundled example by name (filled on first use).
EXAMPLES: dict[str, Example] = {}
_FILES = ExitStack()


def _get(name: str) -> Example:
    if not EXAMPLES:
        EXAMPLES.update(_examples())
    if name not in EXAMPLES:
        raise ValidationError(f"unknown example {name!r}; choose from {', '.join(EXAMPLES)}", field="example")
    return EXAMPLES[name]


def names() -> tuple[str, ...]:
    """The names of the bundled examples."""
    _get("example_trace")
    return tuple(EXAMPLES)


def describe(name: str) -> Example:
    """The :class:`Example` record of ``name`` (kind, caption, path under the package data)."""
    return _get(name)


def path(name: str) -> Path:
    """The filesystem path of bundled example ``name`` (a directory for traces, else a file)."""
    ref = resources.files("expertcache") / "data" / _get(name).relpath
    return Path(_FILES.enter_context(resources.as_file(ref)))


def load(name: str) -> Any:
    """Load a trace example as a :class:`~expertcache.trace.RoutingTrace`, or the conformance stream as an
    :class:`~expertcache.events.EventStream`; other kinds are files to read (:func:`path`)."""
    ex = _get(name)
    if ex.kind == "trace":
        from .trace import read_trace

        return read_trace(path(name))
    if ex.kind == "events-jsonl":
        from .events import import_events_jsonl

        return import_events_jsonl(path(name), n_layers=3, n_experts=4, top_k=1)   # docs/conformance.md
    raise ValidationError(f"example {name!r} is a {ex.kind} file, not a trace or stream: open "
                          f"expertcache.examples.path({name!r})", field="example")
