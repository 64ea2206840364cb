"""Experiment specs: a TOML file expanded into a grid of frozen conditions (§3.5, §7.1, Appendix A.1).

A spec names its **inputs** (routing traces, scheduled under a service
discipline, or ready event streams), its **request selections**, and one or
more **grids** whose axes are crossed into conditions::

    [experiment]
    name = "gap-by-batch"

    [inputs.example]
    trace = "bundled:example_trace"        # or a path (relative to the spec); stream = "DIR" for a stream

    [selections.first32]
    range = [0, 32]                        # also: indices, request_ids, sample + seed (+ from), concat

    [grid]                                 # or [[grid]] blocks, whose conditions are united
    input = "example"
    selection = ["all", "first32"]
    batch = [2, 8]
    rho = [0.2, 0.4]
    policy = ["lru", "lfu", "lfru", "least-stale", "belady"]
    tie_seed = [0, 1, 2]

A **warm-transition** condition (§8.1) names a second selection in the ``warm``
axis: its requests (the first ``warm_requests`` of them) run first and fill the
cache, then the ``selection``'s (the first ``window_requests``), one FCFS
stream; only events from the first step that serves a window request on are
counted (``ReplayConfig.warmup_events``)::

    [grid]
    input = "model"
    warm = ["pool0", "pool1"]              # A; a pair of a selection with itself is left out
    selection = ["pool0", "pool1"]         # B
    warm_requests = 100
    window_requests = [10, 25, 50, 100]
    order_seed = [0, 1, 2]
    batch = 8
    rho = [0.2, 0.3, 0.4]
    policy = ["lru", "lfu", "lfru", "belady"]

Every condition has a stable **ID** (a digest of its parameters, input and
selection names included) and a **hash** of everything that determines its
result: the parameters, the sha256 of each input's ``manifest.json`` (which
holds the sha256 of its data files), the resolved selection definition and the
expertcache version. A changed input, selection or version changes the hash
but not the ID, so a re-run recomputes exactly those conditions.
"""

from __future__ import annotations

import contextlib
import hashlib
import itertools
import json
import os
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

from ..errors import ValidationError

__all__ = ["InputSpec", "SelectionSpec", "Condition", "PlannedCondition", "ExperimentSpec", "load_spec",
           "spec_from_dict", "expand", "canonical_json", "CONDITION_FIELDS", "DISCIPLINES"]

#: Service disciplines of a condition: FCFS continuous batching, deadline rotation, or a given stream.
DISCIPLINES = ("fcfs", "rotation", "stream")
BUNDLED = "bundled:"
#: Bumped when the meaning of a condition's fields changes (part of every condition hash).
#: 2: warm-transition fields; stream inputs honour the warm-up events their manifest records.
SPEC_FORMAT = 2
#: Format of the ID digest: kept at 1 so IDs stay stable (new fields enter an ID only when set).
_ID_FORMAT = 1
#: Fields added after format 1; left out of the ID digest while ``None``.
_LATER_FIELDS = ("warm", "warm_requests", "window_requests")

_SELECTION_KINDS = ("all", "range", "indices", "request_ids", "sample", "concat")
_GRID_AXES = {
    "input": None, "selection": "all", "order_seed": None, "warm": None, "warm_requests": None,
    "window_requests": None, "discipline": "fcfs", "batch": None,
    "admitted": 24, "window": 4, "scheduler": "fcfs_deadline", "offsets": "zero", "offsets_seed": 0,
    "policy": None, "rho": None, "scope": "per-layer", "semantics": "event-atomic", "tie_break": "random",
    "tie_seed": 0, "lfu_in_cache_counters": False,
}


def canonical_json(obj: Any) -> str:
    """Deterministic JSON (sorted keys, no spaces, ASCII): the text every digest is taken over."""
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=True, allow_nan=False)


def _digest(obj: Any) -> str:
    return hashlib.sha256(canonical_json(obj).encode()).hexdigest()


# ----------------------------------------------------------------------------- records
@dataclass(frozen=True)
class InputSpec:
    """One named input.

    Attributes
    ----------
    name
        The name conditions refer to.
    kind
        ``"trace"`` (scheduled per condition) or ``"stream"`` (replayed as stored).
    path
        Resolved directory.
    calibration
        Resolved directory of the calibration trace/stream the ``static`` policy fits on, or ``None``.
        A calibration trace is scheduled with the condition's own discipline, batch and offsets.
    calibration_kind
        ``"trace"`` or ``"stream"`` (``None`` without calibration).
    """

    name: str
    kind: str
    path: str
    calibration: str | None = None
    calibration_kind: str | None = None


@dataclass(frozen=True)
class SelectionSpec:
    """A named request selection (a subset of an input trace's requests, in a given order).

    ``kind`` is one of ``all``, ``range`` (``[start, stop)``), ``indices``, ``request_ids``,
    ``sample`` (``n`` requests drawn without replacement by ``numpy.random.default_rng(seed)``
    from ``from``, default all, kept in their input order) or ``concat`` (named selections one
    after another; ``"name:N"`` keeps the first ``N`` of that part). ``params`` holds the fields.
    """

    name: str
    kind: str
    params: tuple[tuple[str, Any], ...] = ()

    def get(self, key: str, default: Any = None) -> Any:
        return dict(self.params).get(key, default)


@dataclass(frozen=True)
class Condition:
    """Everything that defines one replay of one stream (fields absent from a discipline are ``None``).

    Attributes
    ----------
    input, selection, order_seed
        Input name; selection name; seed permuting the selected requests (within each
        ``concat`` part) or ``None`` for their stored order.
    warm, warm_requests, window_requests
        Warm-transition conditions (§8.1): ``warm`` names the selection whose requests run first
        and only fill the cache (``None``: no warm-up); ``warm_requests`` keeps the first N of
        them and ``window_requests`` the first N of ``selection`` (after ``order_seed``'s
        permutation; ``None``: all). Counting starts at the first step that serves a window request.
    discipline, batch, admitted, window, scheduler
        ``fcfs`` (batch ``B``), ``rotation`` (``admitted``/``batch``/``window``/``scheduler``) or
        ``stream`` (a stored stream: none of these apply).
    offsets, offsets_seed
        Arrival offsets (``zero``, ``stagger:D``, ``random:LO:HI``) and the seed of random ones.
    policy, rho, scope, semantics, tie_break, tie_seed, lfu_in_cache_counters
        The replay configuration (:class:`expertcache.replay.ReplayConfig`).
    """

    input: str
    selection: str | None
    order_seed: int | None
    warm: str | None
    warm_requests: int | None
    window_requests: int | None
    discipline: str
    batch: int | None
    admitted: int | None
    window: int | None
    scheduler: str | None
    offsets: str | None
    offsets_seed: int | None
    policy: str
    rho: float
    scope: str
    semantics: str
    tie_break: str
    tie_seed: int
    lfu_in_cache_counters: bool

    def params(self) -> dict[str, Any]:
        """The fields as a plain dict (every value is a scalar; no deep copy needed)."""
        return {f.name: getattr(self, f.name) for f in fields(self)}

    @property
    def condition_id(self) -> str:
        """Stable ID: ``c`` + 16 hex digits of the digest of the parameters.

        Fields added after the first format enter the digest only when set, so a condition
        without a warm-up keeps the ID it always had.
        """
        params = {k: v for k, v in self.params().items() if not (k in _LATER_FIELDS and v is None)}
        return "c" + _digest({"format": _ID_FORMAT, "params": params})[:16]

    def stream_key(self) -> tuple:
        """Fields that determine the event stream (conditions sharing it share one build)."""
        return (self.input, self.selection, self.order_seed, self.warm, self.warm_requests, self.window_requests,
                self.discipline, self.batch, self.admitted, self.window, self.scheduler, self.offsets,
                self.offsets_seed)

    def curve_key(self) -> tuple:
        """Fields except ``rho``: conditions sharing it form one miss-ratio-curve task."""
        return (*self.stream_key(), self.policy, self.scope, self.semantics, self.tie_break, self.tie_seed,
                self.lfu_in_cache_counters)


#: Condition fields, in table column order.
CONDITION_FIELDS = tuple(f.name for f in fields(Condition))


@dataclass(frozen=True)
class PlannedCondition:
    """A condition with its stable ID and its hash (of everything that determines its result)."""

    condition: Condition
    condition_id: str
    condition_hash: str


@dataclass(frozen=True)
class ExperimentSpec:
    """A parsed spec: inputs, selections and grids (raw axis tables), plus where it came from."""

    name: str
    description: str
    inputs: dict[str, InputSpec]
    selections: dict[str, SelectionSpec]
    grids: tuple[dict[str, Any], ...]
    source: str = "<dict>"
    base_dir: str = "."
    text_sha256: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)
    #: The ``[timing]`` table (:class:`expertcache.experiment.timing.TimingSpec`), or ``None``: no timing metrics.
    timing: Any = None

    def context(self) -> dict[str, Any]:
        """Picklable description of inputs (with their manifest sha256) and selections, for workers.

        Worker caches are keyed by it, so a changed input is never served from a cache.
        """
        digests: dict[str, str] = {}
        inputs = {}
        for n, i in self.inputs.items():
            inputs[n] = {**asdict(i), "manifest_sha256": _manifest_digest(i.path, digests),
                         "calibration_sha256": _manifest_digest(i.calibration, digests) if i.calibration else None}
        out = {"inputs": inputs,
               "selections": {n: {"name": s.name, "kind": s.kind, "params": list(map(list, s.params))}
                              for n, s in self.selections.items()}}
        if self.timing is not None:
            out["timing"] = self.timing.to_dict()
        return out


# ----------------------------------------------------------------------------- loading
def load_spec(path: str | os.PathLike[str]) -> ExperimentSpec:
    """Read a TOML spec; relative paths inside resolve against the spec's directory."""
    p = Path(path)
    if not p.is_file():
        raise ValidationError("spec file not found; expected a TOML experiment spec", source=str(p))
    from ..jsonl import read_toml

    raw = p.read_bytes()
    data = read_toml(p, "a TOML experiment spec")
    spec = spec_from_dict(data, base_dir=p.resolve().parent, source=str(p))
    return ExperimentSpec(**{**{f.name: getattr(spec, f.name) for f in fields(spec)},
                             "text_sha256": hashlib.sha256(raw).hexdigest()})


def _resolve(value: Any, base_dir: Path, where: str, source: str) -> str:
    if not isinstance(value, str) or not value:
        raise ValidationError(f"expected a directory path (string); got {value!r}", source=source, field=where)
    if value.startswith(BUNDLED):
        from importlib.resources import files

        target = Path(str(files("expertcache") / "data" / value[len(BUNDLED):]))
    else:
        target = Path(value)
        if not target.is_absolute():
            target = base_dir / target
    if not (target / "manifest.json").is_file():
        raise ValidationError(f"{value}: expected a trace or stream directory with a manifest.json",
                              source=source, field=where)
    return str(target.resolve())


def spec_from_dict(data: Mapping[str, Any], base_dir: str | os.PathLike[str] = ".",
                   source: str = "<dict>") -> ExperimentSpec:
    """Build an :class:`ExperimentSpec` from the TOML structure (a dict)."""
    base = Path(base_dir)
    unknown = set(data) - {"experiment", "inputs", "selections", "grid", "timing"}
    if unknown:
        raise ValidationError(f"unknown top-level table(s) {sorted(unknown)}; expected experiment, inputs, "
                              "selections, grid, timing", source=source)
    exp = data.get("experiment", {})
    if not isinstance(exp, dict) or not isinstance(exp.get("name", ""), str):
        raise ValidationError("[experiment] needs name = \"...\"", source=source, field="experiment")
    inputs: dict[str, InputSpec] = {}
    raw_inputs = data.get("inputs")
    if not isinstance(raw_inputs, dict) or not raw_inputs:
        raise ValidationError("at least one [inputs.NAME] table with trace = \"DIR\" or stream = \"DIR\" is needed",
                              source=source, field="inputs")
    for name, tbl in raw_inputs.items():
        if not isinstance(tbl, dict):
            raise ValidationError("expected a table", source=source, field=f"inputs.{name}")
        bad = set(tbl) - {"trace", "stream", "calibration"}
        if bad or ("trace" in tbl) == ("stream" in tbl):
            raise ValidationError("expected exactly one of trace = \"DIR\" or stream = \"DIR\" "
                                  f"(and optionally calibration = \"DIR\"); got keys {sorted(tbl)}",
                                  source=source, field=f"inputs.{name}")
        kind = "trace" if "trace" in tbl else "stream"
        path = _resolve(tbl[kind], base, f"inputs.{name}.{kind}", source)
        cal = cal_kind = None
        if "calibration" in tbl:
            cal = _resolve(tbl["calibration"], base, f"inputs.{name}.calibration", source)
            cal_kind = _manifest_kind(cal, source)
            if cal_kind not in ("trace", "stream"):
                raise ValidationError(f"{tbl['calibration']} is not a trace or stream directory (manifest kind "
                                      f"{cal_kind!r})", source=source, field=f"inputs.{name}.calibration")
            if kind == "stream" and cal_kind == "trace":
                raise ValidationError("a stream input needs a calibration stream (a trace would need a batch and "
                                      "offsets to schedule, which a stream input does not have): build one with "
                                      "`expertcache events build`", source=source, field=f"inputs.{name}.calibration")
        if _manifest_kind(path, source) != kind:
            raise ValidationError(f"{tbl[kind]} is not a {kind} directory", source=source,
                                  field=f"inputs.{name}.{kind}")
        inputs[name] = InputSpec(name, kind, path, cal, cal_kind)
    selections = {"all": SelectionSpec("all", "all")}
    raw_selections = data.get("selections") or {}
    if not isinstance(raw_selections, dict):
        raise ValidationError("selections must be tables: [selections.NAME] with range, indices, request_ids, "
                              "sample or concat", source=source, field="selections")
    for name, tbl in raw_selections.items():
        selections[name] = _parse_selection(name, tbl, source)
    for sel in selections.values():
        _check_selection_refs(sel, selections, source, ())
    grids_raw = data.get("grid")
    if isinstance(grids_raw, dict):
        grids_raw = [grids_raw]
    if not isinstance(grids_raw, list) or not grids_raw or not all(isinstance(g, dict) for g in grids_raw):
        raise ValidationError("at least one [grid] (or [[grid]]) table is needed", source=source, field="grid")
    for i, g in enumerate(grids_raw):
        bad = set(g) - set(_GRID_AXES)
        if bad:
            raise ValidationError(f"unknown grid axis {sorted(bad)}; expected some of {', '.join(_GRID_AXES)}",
                                  source=source, field=f"grid[{i}]")
        for req in ("input", "policy", "rho"):
            if req not in g:
                raise ValidationError(f"grid needs '{req}'", source=source, field=f"grid[{i}]")
    timing = None
    if "timing" in data:
        from .timing import parse_timing

        timing = parse_timing(data["timing"], base, source, [i.path for i in inputs.values()])
    return ExperimentSpec(exp.get("name", ""), str(exp.get("description", "")), inputs, selections,
                          tuple(grids_raw), source, str(base.resolve()),
                          extra={k: v for k, v in exp.items() if k not in ("name", "description")}, timing=timing)


def _manifest_kind(directory: str, source: str) -> str:
    try:
        kind = json.loads((Path(directory) / "manifest.json").read_text()).get("kind")
    except (OSError, ValueError, RecursionError, AttributeError):
        raise ValidationError("manifest.json is not readable JSON", source=directory) from None
    return {"routing_trace": "trace", "event_stream": "stream"}.get(kind, str(kind))


def _parse_selection(name: str, tbl: Any, source: str) -> SelectionSpec:
    where = f"selections.{name}"
    if name == "all":
        raise ValidationError("'all' is reserved (every request in stored order)", source=source, field=where)
    if not isinstance(tbl, dict):
        raise ValidationError("expected a table", source=source, field=where)
    kinds = [k for k in ("range", "indices", "request_ids", "sample", "concat") if k in tbl]
    if len(kinds) != 1:
        raise ValidationError("expected exactly one of range, indices, request_ids, sample, concat; "
                              f"got {sorted(tbl)}", source=source, field=where)
    kind = kinds[0]
    allowed = {kind} | ({"seed", "from"} if kind == "sample" else set())
    if set(tbl) - allowed:
        raise ValidationError(f"unexpected key(s) {sorted(set(tbl) - allowed)} for a {kind} selection",
                              source=source, field=where)
    v = tbl[kind]

    def ints(x: Any, n: int | None = None) -> bool:
        return (isinstance(x, list) and all(isinstance(i, int) and not isinstance(i, bool) and i >= 0 for i in x)
                and (n is None or len(x) == n))

    if kind == "range" and not (ints(v, 2) and v[0] < v[1]):
        raise ValidationError(f"range must be [start, stop) with 0 <= start < stop; got {v!r}", source=source,
                              field=where)
    if kind == "indices" and not (ints(v) and v and len(set(v)) == len(v)):
        raise ValidationError("indices must be a non-empty list of distinct non-negative integers",
                              source=source, field=where)
    if kind == "request_ids" and not (isinstance(v, list) and v and all(isinstance(x, str) for x in v)
                                      and len(set(v)) == len(v)):
        raise ValidationError("request_ids must be a non-empty list of distinct strings", source=source,
                              field=where)
    if kind == "sample":
        seed = tbl.get("seed", 0)
        if isinstance(v, bool) or not isinstance(v, int) or v < 1 or isinstance(seed, bool) \
                or not isinstance(seed, int) or seed < 0:
            raise ValidationError("sample = N (>= 1) with seed = S (>= 0)", source=source, field=where)
        if not isinstance(tbl.get("from", "all"), str):
            raise ValidationError("from must name another selection", source=source, field=where)
    if kind == "concat":
        if not (isinstance(v, list) and v and all(isinstance(x, str) for x in v)):
            raise ValidationError("concat must list selection names (\"name\" or \"name:N\" for the first N)",
                                  source=source, field=where)
        for part in v:
            _split_part(part, source, where)
    params = tuple(sorted((k, tuple(x) if isinstance(x, list) else x) for k, x in tbl.items()))
    return SelectionSpec(name, kind, params)


def _split_part(part: str, source: str = "", where: str = "") -> tuple[str, int | None]:
    name, _, head = part.partition(":")
    if not head:
        return name, None
    if not head.isdigit() or int(head) < 1:
        raise ValidationError(f"concat part must be \"name\" or \"name:N\" (N >= 1); got {part!r}", source=source,
                              field=where)
    return name, int(head)


def _check_selection_refs(sel: SelectionSpec, selections: dict[str, SelectionSpec], source: str,
                          stack: tuple[str, ...]) -> None:
    if sel.name in stack:
        raise ValidationError(f"selection {sel.name!r} refers to itself ({' -> '.join((*stack, sel.name))})",
                              source=source, field=f"selections.{sel.name}")
    refs = [sel.get("from", "all")] if sel.kind == "sample" else (
        [_split_part(p)[0] for p in sel.get("concat")] if sel.kind == "concat" else [])
    for r in refs:
        if r not in selections:
            raise ValidationError(f"unknown selection {r!r}; define [selections.{r}]", source=source,
                                  field=f"selections.{sel.name}")
        _check_selection_refs(selections[r], selections, source, (*stack, sel.name))


def selection_definition(name: str, selections: Mapping[str, SelectionSpec]) -> dict[str, Any]:
    """The resolved definition of a selection (referenced selections inlined): part of condition hashes."""
    sel = selections[name]
    out: dict[str, Any] = {"kind": sel.kind, **{k: list(v) if isinstance(v, tuple) else v for k, v in sel.params}}
    if sel.kind == "sample":
        out["from"] = selection_definition(sel.get("from", "all"), selections)
    if sel.kind == "concat":
        out["concat"] = [{"head": _split_part(p)[1], "part": selection_definition(_split_part(p)[0], selections)}
                         for p in sel.get("concat")]
    return out


# ----------------------------------------------------------------------------- expansion
def _axis(grid: Mapping[str, Any], name: str, i: int, source: str) -> list[Any]:
    value = grid.get(name, _GRID_AXES[name])
    values = value if isinstance(value, list) else [value]
    if not values:
        raise ValidationError(f"axis '{name}' is empty", source=source, field=f"grid[{i}].{name}")
    return values


def _manifest_digest(directory: str, cache: dict[str, str]) -> str:
    if directory not in cache:
        cache[directory] = hashlib.sha256((Path(directory) / "manifest.json").read_bytes()).hexdigest()
    return cache[directory]


def expand(spec: ExperimentSpec) -> tuple[PlannedCondition, ...]:
    """Cross every grid's axes into conditions (validated); return them with IDs and hashes, in grid order.

    A condition listed by two grids appears once (first occurrence). Axes that do not apply
    to a condition's discipline are set to ``None`` (a stream input ignores selection,
    warm-up, discipline, batch and offsets), so they never split one condition into several
    IDs. A combination whose ``warm`` selection is its ``selection`` is not a transition and
    is left out of the cross product.
    """
    from .. import __version__
    from ..events import ArrivalOffsets
    from ..events.rotation import RotationConfig
    from ..replay import ReplayConfig, get_policy

    digests: dict[str, str] = {}
    sizes: dict[tuple[str, str], int] = {}
    seen: dict[str, PlannedCondition] = {}
    sel_defs: dict[str, dict] = {}

    def size(inp: InputSpec, name: str) -> int:
        if (inp.name, name) not in sizes:
            sizes[inp.name, name] = _selection_size(name, spec.selections, _n_requests(inp.path),
                                                    f"{spec.source}: input {inp.name!r}")
        return sizes[inp.name, name]

    for i, grid in enumerate(spec.grids):
        names = list(_GRID_AXES)
        for combo in itertools.product(*(_axis(grid, n, i, spec.source) for n in names)):
            raw = dict(zip(names, combo, strict=True))
            where = f"grid[{i}]"
            inp = spec.inputs.get(raw["input"])
            if inp is None:
                raise ValidationError(f"unknown input {raw['input']!r}; define [inputs.{raw['input']}]",
                                      source=spec.source, field=f"{where}.input")
            if inp.kind == "stream":
                raw.update(selection=None, order_seed=None, warm=None, warm_requests=None, window_requests=None,
                           discipline="stream", batch=None, admitted=None, window=None, scheduler=None,
                           offsets=None, offsets_seed=None)
            else:
                for axis in ("selection", "warm"):
                    if raw[axis] is not None and raw[axis] not in spec.selections:
                        raise ValidationError(f"unknown selection {raw[axis]!r}; define [selections.{raw[axis]}]",
                                              source=spec.source, field=f"{where}.{axis}")
                if raw["selection"] is None:
                    raise ValidationError("selection must name a selection (\"all\" for every request)",
                                          source=spec.source, field=f"{where}.selection")
                if raw["discipline"] not in ("fcfs", "rotation"):
                    raise ValidationError(f"discipline must be fcfs or rotation for a trace input; got "
                                          f"{raw['discipline']!r}", source=spec.source, field=f"{where}.discipline")
                b = raw["batch"]
                if isinstance(b, bool) or not isinstance(b, int) or b < 1:
                    raise ValidationError(f"batch must be a positive integer; got {b!r}", source=spec.source,
                                          field=f"{where}.batch")
                with _at(spec.source, where):
                    if raw["discipline"] == "rotation":
                        RotationConfig(_int(raw["admitted"], "admitted", where, spec.source), b,
                                       _int(raw["window"], "window", where, spec.source), raw["scheduler"])
                    else:
                        raw.update(admitted=None, window=None, scheduler=None)
                    offs = ArrivalOffsets.parse(str(raw["offsets"]),
                                                seed=_int(raw["offsets_seed"], "offsets_seed", where, spec.source))
                raw["offsets"] = offs.describe()
                if not offs.seeded:
                    raw["offsets_seed"] = None
                if raw["order_seed"] is not None:
                    _int(raw["order_seed"], "order_seed", where, spec.source)
                if raw["warm"] is not None:
                    if raw["warm"] == raw["selection"]:
                        continue                      # A -> A is not a transition
                    if raw["discipline"] != "fcfs":
                        raise ValidationError("a warm-up selection needs the fcfs discipline (the window starts "
                                              "at the first FCFS step that serves one of its requests)",
                                              source=spec.source, field=f"{where}.warm")
                elif raw["warm_requests"] is not None:
                    raise ValidationError("warm_requests needs warm = \"SELECTION\"", source=spec.source,
                                          field=f"{where}.warm_requests")
                for axis, sel in (("warm_requests", raw["warm"]), ("window_requests", raw["selection"])):
                    n = raw[axis]
                    if n is None:
                        continue
                    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
                        raise ValidationError(f"{axis} must be a positive integer; got {n!r}", source=spec.source,
                                              field=f"{where}.{axis}")
                    if n > size(inp, sel):
                        raise ValidationError(f"{axis} = {n} exceeds the {size(inp, sel)} requests of selection "
                                              f"{sel!r} in input {inp.name!r}", source=spec.source,
                                              field=f"{where}.{axis}")
                size(inp, raw["selection"])
                if raw["warm"] is not None:
                    size(inp, raw["warm"])
            rho = raw["rho"]
            if isinstance(rho, bool) or not isinstance(rho, (int, float)):
                raise ValidationError(f"rho must be a number in [0, 1]; got {rho!r}", source=spec.source,
                                      field=f"{where}.rho")
            raw["rho"] = float(rho)
            _int(raw["tie_seed"], "tie_seed", where, spec.source)
            if not isinstance(raw["lfu_in_cache_counters"], bool):
                raise ValidationError("lfu_in_cache_counters must be true or false", source=spec.source,
                                      field=f"{where}.lfu_in_cache_counters")
            with _at(spec.source, where):
                ReplayConfig(raw["policy"], rho=raw["rho"], scope=raw["scope"], semantics=raw["semantics"],
                             tie_break=raw["tie_break"], seed=raw["tie_seed"],
                             lfu_in_cache_counters=raw["lfu_in_cache_counters"])
                pol = get_policy(raw["policy"])
            if pol.needs_advice:
                raise ValidationError(f"policy {raw['policy']!r} reads predictor advice, which specs do not "
                                      "carry; replay it with `expertcache replay --advice`", source=spec.source,
                                      field=f"{where}.policy")
            if pol.needs_calibration and inp.calibration is None:
                raise ValidationError(f"policy 'static' needs calibration = \"DIR\" in [inputs.{inp.name}]",
                                      source=spec.source, field=f"{where}.policy")
            if spec.timing is not None:
                from .timing import check_semantics

                check_semantics(raw["semantics"], spec.source, where)
            cond = Condition(**raw)
            cid = cond.condition_id
            if cid in seen:
                continue
            for sel in (cond.selection, cond.warm):
                if sel is not None and sel not in sel_defs:
                    sel_defs[sel] = selection_definition(sel, spec.selections)
            basis = {
                "format": SPEC_FORMAT, "expertcache": __version__, "params": cond.params(),
                "input": {"kind": inp.kind, "manifest_sha256": _manifest_digest(inp.path, digests)},
                "calibration": (None if not pol.needs_calibration else
                                {"kind": inp.calibration_kind,
                                 "manifest_sha256": _manifest_digest(inp.calibration, digests)}),
                "selection": sel_defs.get(cond.selection) if cond.selection else None,
                "warm": sel_defs.get(cond.warm) if cond.warm else None,
            }
            if spec.timing is not None:       # only then: hashes of specs without timing are unchanged
                basis["timing"] = spec.timing.to_dict()
            seen[cid] = PlannedCondition(cond, cid, _digest(basis))
    if not seen:
        raise ValidationError("the grid has no conditions: every combination pairs a warm selection with itself "
                              "(warm and selection must differ)", source=spec.source, field="grid")
    return tuple(seen.values())


@contextlib.contextmanager
def _at(source: str, where: str) -> Iterator[None]:
    """Re-raise a configuration's own ValidationError with the spec file and grid named."""
    try:
        yield
    except ValidationError as exc:
        raise ValidationError(exc.detail, source=source,
                              field=f"{where}.{exc.field}" if exc.field else where) from None


def _n_requests(trace_dir: str) -> int:
    from ..storage import read_manifest

    n = read_manifest(trace_dir, "routing_trace").get("n_requests")
    if not isinstance(n, int) or n < 1:
        raise ValidationError("manifest.json lacks a positive n_requests", source=trace_dir)
    return n


def _selection_size(name: str, selections: Mapping[str, SelectionSpec], n: int, source: str) -> int:
    """Requests a selection holds in a trace of ``n`` requests; out-of-range selections raise before any work."""
    sel = selections[name]
    where = f"selections.{name}"
    if sel.kind == "all":
        return n
    if sel.kind == "range":
        a, b = sel.get("range")
        if b > n:
            raise ValidationError(f"range [{a}, {b}) exceeds the trace's {n} requests", source=source, field=where)
        return b - a
    if sel.kind == "indices":
        if max(sel.get("indices")) >= n:
            raise ValidationError(f"index {max(sel.get('indices'))} >= the trace's {n} requests", source=source,
                                  field=where)
        return len(sel.get("indices"))
    if sel.kind == "request_ids":
        return len(sel.get("request_ids"))        # checked against the ids when the trace is read
    if sel.kind == "sample":
        pool = _selection_size(sel.get("from", "all"), selections, n, source)
        if sel.get("sample") > pool:
            raise ValidationError(f"samples {sel.get('sample')} of {pool} requests", source=source, field=where)
        return sel.get("sample")
    total = 0
    for part in sel.get("concat"):
        pname, head = _split_part(part)
        size = _selection_size(pname, selections, n, source)
        if head is not None and head > size:
            raise ValidationError(f"asks for the first {head} requests of {pname!r}, which holds {size}",
                                  source=source, field=where)
        total += size if head is None else head
    return total


def _int(value: Any, name: str, where: str, source: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValidationError(f"{name} must be a non-negative integer; got {value!r}", source=source,
                              field=f"{where}.{name}")
    return value


def conditions_table_rows(planned: Iterable[PlannedCondition]) -> list[dict[str, Any]]:
    """One dict per condition: ID, hash and fields (for ``spec expand --json``)."""
    return [{"condition_id": p.condition_id, "condition_hash": p.condition_hash, **p.condition.params()}
            for p in planned]
