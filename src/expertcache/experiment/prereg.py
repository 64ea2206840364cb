"""Pre-registration: decision criteria frozen with their split before results are read (§3.5, §8.1, §8.6).

A criteria file (TOML) names splits of the result table (filters on condition
fields; a split may be marked confirmatory) and criteria (metric, comparison,
threshold, the split it is evaluated on, an aggregate over the split's
conditions)::

    [prereg]
    title = "Gap on held-out requests"
    statement = "Frozen before any result of this experiment was generated or read."

    [splits.discovery]
    where = { selection = "discovery" }

    [splits.heldout]
    where = { selection = "heldout" }
    confirmatory = true

    [[criteria]]
    id = "gap-b8"
    metric = "gap"                 # or a stored metric, e.g. miss_fraction
    comparison = ">="
    threshold = 0.10
    split = "heldout"
    where = { batch = 8, rho = 0.4 }
    aggregate = "mean"             # all | any | mean | min | max | median

:func:`freeze` writes ``DOC.json`` (the document and the sha256 of its canonical
JSON) and ``DOC.json.sha256``; it refuses if results for a criterion already
exist in a given store, unless forced (and then says so in the document).
:func:`evaluate` verifies the hash — an edit after freezing is detected —,
refuses to read a confirmatory split a second time unless forced (the forced
read is recorded), and writes the outcome as a new file next to the document,
which it never alters. Every read is appended to ``DOC.reads.jsonl``.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import math
import os
import statistics
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from ..errors import IntegrityError, OutputExistsError, ValidationError
from ..storage import json_text

__all__ = ["Criterion", "Split", "CriterionOutcome", "Outcome", "load_criteria", "freeze", "verify",
           "evaluate", "COMPARISONS", "AGGREGATES"]

COMPARISONS = (">=", ">", "<=", "<", "==")
AGGREGATES = ("all", "any", "mean", "min", "max", "median")
_KIND = "expertcache_prereg"
_FORMAT = 1


def _canonical(obj: Any) -> str:
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=True, allow_nan=False)


def _sha(obj: Any) -> str:
    return hashlib.sha256(_canonical(obj).encode()).hexdigest()


def _now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


@dataclass(frozen=True)
class Split:
    """A named subset of conditions (``where``: field -> value or list of values)."""

    name: str
    where: dict[str, Any]
    confirmatory: bool = False


@dataclass(frozen=True)
class Criterion:
    """One decision criterion: ``aggregate(metric over split ∩ where) comparison threshold``."""

    id: str
    metric: str
    comparison: str
    threshold: float
    split: str
    where: dict[str, Any]
    aggregate: str = "all"


@dataclass(frozen=True)
class CriterionOutcome:
    """The verdict on one criterion: ``value`` is the aggregate (for all/any: the fraction satisfying)."""

    id: str
    metric: str
    comparison: str
    threshold: float
    split: str
    aggregate: str
    n: int
    n_undefined: int
    n_satisfying: int
    value: float | None
    passed: bool


@dataclass(frozen=True)
class Outcome:
    """One evaluation of a frozen document; written to ``path`` (never over an earlier outcome)."""

    document_sha256: str
    evaluated_at: str
    results: str
    results_sha256: str | None
    forced: bool
    reread_splits: tuple[str, ...]
    criteria: tuple[CriterionOutcome, ...]
    path: str = ""

    @property
    def passed(self) -> bool:
        return all(c.passed for c in self.criteria)

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["passed"] = self.passed
        out["reread_splits"] = list(self.reread_splits)
        return out


# ----------------------------------------------------------------------------- criteria
def _check_where(where: Any, what: str, source: str) -> dict[str, Any]:
    from .spec import CONDITION_FIELDS

    if where is None:
        return {}
    if not isinstance(where, dict):
        raise ValidationError("where must be a table of FIELD = value (or [values])", source=source, field=what)
    for k, v in where.items():
        if k not in CONDITION_FIELDS:
            raise ValidationError(f"unknown condition field {k!r}; choose from {', '.join(CONDITION_FIELDS)}",
                                  source=source, field=what)
        if isinstance(v, list) and not v:
            raise ValidationError(f"where.{k} lists no values", source=source, field=what)
    return dict(where)


def load_criteria(path: str | os.PathLike[str]) -> dict[str, Any]:
    """Read and validate a criteria TOML file; return the document body to freeze."""
    from ..jsonl import read_toml

    src = str(path)
    p = Path(path)
    if not p.is_file():
        raise ValidationError("criteria file not found; expected TOML with [prereg], [splits.*], [[criteria]]",
                              source=src)
    return criteria_document(read_toml(p, "a criteria TOML file"), source=src)


def criteria_document(data: Mapping[str, Any], source: str = "<dict>") -> dict[str, Any]:
    """Validate the TOML structure and return the normalised document body."""
    bad = set(data) - {"prereg", "splits", "criteria"}
    if bad:
        raise ValidationError(f"unknown table(s) {sorted(bad)}; expected prereg, splits, criteria", source=source)
    head = data.get("prereg", {})
    if not isinstance(head, dict) or not isinstance(head.get("title"), str) or not head["title"]:
        raise ValidationError("[prereg] needs title = \"...\"", source=source, field="prereg.title")
    splits: dict[str, dict[str, Any]] = {}
    raw_splits = data.get("splits") or {}
    if not isinstance(raw_splits, dict):
        raise ValidationError("splits must be tables: [splits.NAME]", source=source, field="splits")
    revisions = head.get("revisions", [])
    if not isinstance(revisions, list):
        raise ValidationError("revisions must be a list", source=source, field="prereg.revisions")
    for name, tbl in raw_splits.items():
        if not isinstance(tbl, dict) or set(tbl) - {"where", "confirmatory", "description"}:
            raise ValidationError("a split is where = {...}, confirmatory = true|false, description = \"...\"",
                                  source=source, field=f"splits.{name}")
        if not isinstance(tbl.get("confirmatory", False), bool):
            raise ValidationError("confirmatory must be true or false", source=source, field=f"splits.{name}")
        splits[name] = {"where": _check_where(tbl.get("where"), f"splits.{name}.where", source),
                        "confirmatory": tbl.get("confirmatory", False),
                        "description": str(tbl.get("description", ""))}
    crits = data.get("criteria")
    if not isinstance(crits, list) or not crits:
        raise ValidationError("at least one [[criteria]] entry is needed", source=source, field="criteria")
    out, ids = [], set()
    for i, c in enumerate(crits):
        where = f"criteria[{i}]"
        if not isinstance(c, dict):
            raise ValidationError("expected a table", source=source, field=where)
        unknown = set(c) - {"id", "metric", "comparison", "threshold", "split", "where", "aggregate", "description"}
        if unknown:
            raise ValidationError(f"unknown key(s) {sorted(unknown)}", source=source, field=where)
        cid = c.get("id")
        if not isinstance(cid, str) or not cid or cid in ids:
            raise ValidationError("id must be a unique non-empty string", source=source, field=f"{where}.id")
        ids.add(cid)
        if not isinstance(c.get("metric"), str) or not c["metric"]:
            raise ValidationError("metric must name gap or a stored metric", source=source, field=f"{where}.metric")
        if not isinstance(c.get("comparison"), str) or c.get("comparison") not in COMPARISONS:
            raise ValidationError(f"comparison must be one of {' '.join(COMPARISONS)}; got {c.get('comparison')!r}",
                                  source=source, field=f"{where}.comparison")
        t = c.get("threshold")
        if isinstance(t, bool) or not isinstance(t, (int, float)) or not math.isfinite(t):
            raise ValidationError(f"threshold must be a finite number; got {str(t)[:40]}", source=source,
                                  field=f"{where}.threshold")
        if not isinstance(c.get("split"), str) or c.get("split") not in splits:
            raise ValidationError(f"split must name a [splits.NAME] table; got {c.get('split')!r}", source=source,
                                  field=f"{where}.split")
        agg = c.get("aggregate", "all")
        if not isinstance(agg, str) or agg not in AGGREGATES:
            raise ValidationError(f"aggregate must be one of {', '.join(AGGREGATES)}; got {agg!r}", source=source,
                                  field=f"{where}.aggregate")
        cw = _check_where(c.get("where"), f"{where}.where", source)
        if c["metric"] == "gap" and "policy" in cw:
            raise ValidationError("the gap compares policies; do not filter it by policy", source=source,
                                  field=f"{where}.where")
        out.append({"id": cid, "metric": c["metric"], "comparison": c["comparison"], "threshold": float(t),
                    "split": c["split"], "where": cw, "aggregate": agg,
                    "description": str(c.get("description", ""))})
    return {"title": head["title"], "statement": str(head.get("statement", "")),
            "revisions": list(revisions), "splits": splits, "criteria": out}


# ----------------------------------------------------------------------------- files
def _sidecar(doc: Path) -> Path:
    return doc.with_name(doc.name + ".sha256")


def _ledger(doc: Path) -> Path:
    return doc.with_name(doc.stem + ".reads.jsonl")


def _write_new(path: Path, text: str) -> None:
    """Create ``path`` atomically; never replace an existing file."""
    import secrets

    tmp = str(path.parent / f".{path.name}.{secrets.token_hex(4)}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)     # the umask's mode, unlike mkstemp's 0600
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
            fh.flush()
            os.fsync(fh.fileno())
        os.link(tmp, path)           # fails if path exists: an outcome or document is never overwritten
    except FileExistsError:
        raise OutputExistsError(f"{path}: already exists; frozen documents and outcomes are never "
                                "overwritten") from None
    finally:
        with contextlib.suppress(OSError):
            os.unlink(tmp)


def _rows_in(table, criterion: Mapping[str, Any], split: Mapping[str, Any]):
    from .summary import matches, metric_values

    return [(f, v) for f, v in metric_values(table, criterion["metric"], split["where"])
            if matches(f, criterion["where"])]


def freeze(document: Mapping[str, Any], out: str | os.PathLike[str], results: str | os.PathLike[str] | None = None,
           spec: str | os.PathLike[str] | None = None, force: bool = False) -> tuple[Path, str]:
    """Freeze ``document`` (from :func:`load_criteria`) as ``out``; return ``(path, sha256)``.

    With ``results`` (a store or table), refuses if any criterion already has results in its
    split unless ``force`` (recorded in the document). With ``spec``, records its sha256 and
    checks that confirmatory splits share no condition with any other split.
    """
    out = Path(out)
    for existing in (out, _sidecar(out)):
        if existing.exists():
            raise OutputExistsError(f"{existing}: already exists; a frozen document is never overwritten "
                                    "(record a revision in a new document)")
    body = dict(document)
    body["frozen_at"] = _now()
    from .. import __version__

    body["expertcache"] = __version__
    body["spec"] = None
    if spec is not None:
        body["spec"] = {"path": str(spec), "sha256": hashlib.sha256(Path(spec).read_bytes()).hexdigest()}
        _check_disjoint(body, spec)
    body["results_present_at_freeze"] = []
    if results is not None and Path(results).exists():
        from .store import read_results

        table = read_results(results)
        present = [c["id"] for c in body["criteria"]
                   if table.num_rows and _try_rows(table, c, body["splits"][c["split"]])]
        if present and not force:
            raise ValidationError(f"results already exist for criteria {present} in {results}; a criterion must be "
                                  "frozen before its measurement is read (--force records that it was not)",
                                  field="results")
        body["results_present_at_freeze"] = present
    sha = _sha(body)
    frozen = {"kind": _KIND, "format": _FORMAT, "sha256": sha, "document": body}
    out.parent.mkdir(parents=True, exist_ok=True)
    _write_new(out, json_text(frozen, indent=2) + "\n")
    _write_new(_sidecar(out), f"{sha}  {out.name}\n")
    return out, sha


def _try_rows(table, criterion, split) -> bool:
    try:
        return bool(_rows_in(table, criterion, split))
    except ValidationError:
        return False          # the metric is not in the table yet: nothing was measured


def _check_disjoint(body: Mapping[str, Any], spec: str | os.PathLike[str]) -> None:
    """Splits must match conditions; a confirmatory split may share neither a condition nor a request
    (of a trace input, warm-up included; or a whole stream input) with any other split (§3.5)."""
    from .spec import expand, load_spec
    from .summary import matches
    from .tasks import split_requests

    sp = load_spec(spec)
    planned = [p.condition for p in expand(sp)]
    conds = [c.params() for c in planned]
    members = {name: {i for i, c in enumerate(conds) if matches(c, s["where"])} for name, s in body["splits"].items()}
    requests: dict[str, set] = {}

    def data(name: str) -> set:
        if name not in requests:
            requests[name] = split_requests(sp, [planned[i] for i in sorted(members[name])])
        return requests[name]

    for name, s in body["splits"].items():
        if not members[name]:
            raise ValidationError(f"split {name!r} matches no condition of the spec", field=f"splits.{name}")
        if s["confirmatory"]:
            for other in body["splits"]:
                if other == name:
                    continue
                if members[name] & members[other]:
                    raise ValidationError(f"confirmatory split {name!r} shares conditions with split {other!r}; "
                                          "splits must be disjoint", field=f"splits.{name}")
                shared = data(name) & data(other)
                if shared:
                    path, rid = sorted(shared)[0]
                    what = f"stream input {path}" if rid == "*" else f"request {rid!r} of {path}"
                    raise ValidationError(f"confirmatory split {name!r} reads data of split {other!r} ({len(shared)} "
                                          f"shared, e.g. {what}); confirmatory data must be disjoint from every "
                                          "other split", field=f"splits.{name}")


def verify(path: str | os.PathLike[str]) -> tuple[dict[str, Any], str]:
    """Load a frozen document and check its hash; an edit after freezing raises :class:`IntegrityError`."""
    p = Path(path)
    try:
        frozen = json.loads(p.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ValidationError("frozen document not found (expertcache prereg freeze writes it)", source=str(p)) \
            from None
    except (ValueError, RecursionError) as exc:
        raise IntegrityError(f"not valid JSON ({exc}); the frozen document was damaged", source=str(p)) from None
    if not isinstance(frozen, dict) or frozen.get("kind") != _KIND or not isinstance(frozen.get("document"), dict):
        raise ValidationError("not a frozen pre-registration document", source=str(p))
    actual = _sha(frozen["document"])
    if actual != frozen.get("sha256"):
        raise IntegrityError(f"document hash {actual[:12]}… differs from the frozen {str(frozen.get('sha256'))[:12]}…: "
                             "the document was edited after freezing", source=str(p))
    side = _sidecar(p)
    if not side.is_file():
        raise IntegrityError(f"{side.name} is missing; cannot confirm the frozen hash", source=str(p))
    recorded = side.read_text().split()[0] if side.read_text().split() else ""
    if recorded != actual:
        raise IntegrityError(f"document hash {actual[:12]}… differs from {side.name} ({recorded[:12]}…): "
                             "the document was edited after freezing", source=str(p))
    ledger = _ledger(p)
    for line_no, entry in enumerate(_read_ledger(ledger), start=1):
        if entry.get("document_sha256") != actual:
            raise IntegrityError(f"read {line_no} of {ledger.name} was made under document "
                                 f"{str(entry.get('document_sha256'))[:12]}…; the document changed since",
                                 source=str(p))
    return frozen["document"], actual


def _read_ledger(path: Path) -> list[dict[str, Any]]:
    if not path.is_file():
        return []
    out = []
    for line_no, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        if line.strip():
            try:
                out.append(json.loads(line))
            except (ValueError, RecursionError):
                raise IntegrityError("unreadable read record", source=str(path), record=line_no) from None
    return out


def _compare(value: float, comparison: str, threshold: float) -> bool:
    return {">=": value >= threshold, ">": value > threshold, "<=": value <= threshold, "<": value < threshold,
            "==": value == threshold}[comparison]


def _judge(c: Mapping[str, Any], values: list[float | None]) -> CriterionOutcome:
    defined = [v for v in values if v is not None]
    sat = sum(_compare(v, c["comparison"], c["threshold"]) for v in defined)
    agg = c["aggregate"]
    if agg in ("all", "any"):
        value = sat / len(values) if values else None
        passed = bool(defined) and (sat == len(values) if agg == "all" else sat > 0)
    else:
        fn = {"mean": statistics.fmean, "min": min, "max": max, "median": statistics.median}[agg]
        value = float(fn(defined)) if defined else None
        passed = value is not None and _compare(value, c["comparison"], c["threshold"])
    return CriterionOutcome(c["id"], c["metric"], c["comparison"], c["threshold"], c["split"], agg, len(values),
                            len(values) - len(defined), int(sat), value, bool(passed))


def evaluate(path: str | os.PathLike[str], results: str | os.PathLike[str], force: bool = False) -> Outcome:
    """Evaluate a frozen document against ``results``; write the outcome next to it (never altering it).

    Raises
    ------
    IntegrityError
        The document was edited after freezing.
    ValidationError
        A confirmatory split was already read (without ``force``), or a criterion matches no result.
    """
    from ..storage import sha256_file
    from .store import RESULTS_FILE, read_results

    p = Path(path)
    doc, sha = verify(p)
    ledger = _ledger(p)
    reads = _read_ledger(ledger)
    used = list(dict.fromkeys(c["split"] for c in doc["criteria"]))
    already = [s for s in used if doc["splits"][s]["confirmatory"] and any(r.get("split") == s for r in reads)]
    if already and not force:
        raise ValidationError(f"confirmatory split(s) {already} were already read ({ledger.name}); confirmatory "
                              "data is read once. --force reads again and records it", source=str(p))
    res_path = Path(results)
    if res_path.is_dir():
        from .store import ResultStore

        store = ResultStore.open(res_path)
        if not store.read_meta().get("complete") or store.part_files():
            raise ValidationError("the store holds an unfinished run (chunks not yet consolidated); finish it with "
                                  "`expertcache spec run` before evaluating — confirmatory data is read once, so it "
                                  "is not read half-computed; nothing was read", source=str(results))
    table = read_results(results)
    outcomes = []
    for c in doc["criteria"]:
        rows = _rows_in(table, c, doc["splits"][c["split"]])
        if not rows:
            raise ValidationError(f"criterion {c['id']!r}: no result of metric {c['metric']!r} in split "
                                  f"{c['split']!r} (where {c['where']}); nothing was read", source=str(results))
        outcomes.append(_judge(c, [v for _, v in rows]))
    res_file = res_path / RESULTS_FILE if res_path.is_dir() else res_path
    n_prev = sum(1 for x in p.parent.iterdir() if x.name.startswith(f"{p.stem}.outcome-") and x.suffix == ".json")
    out_path = p.with_name(f"{p.stem}.outcome-{n_prev + 1:03d}.json")
    if out_path.exists():
        raise OutputExistsError(f"{out_path}: already exists; outcomes are never overwritten; nothing was recorded")
    outcome = Outcome(sha, _now(), str(results), sha256_file(res_file) if res_file.is_file() else None,
                      bool(already), tuple(already), tuple(outcomes), str(out_path))
    # the read is recorded before the outcome is written: if writing fails, the split still counts as read
    with open(ledger, "a", encoding="utf-8") as fh:
        for s in used:
            fh.write(_canonical({"split": s, "confirmatory": doc["splits"][s]["confirmatory"], "at": outcome.evaluated_at,
                                 "document_sha256": sha, "forced": s in already, "outcome": out_path.name}) + "\n")
        fh.flush()
        os.fsync(fh.fileno())
    _write_new(out_path, json_text(outcome.to_dict(), indent=2) + "\n")
    return outcome
