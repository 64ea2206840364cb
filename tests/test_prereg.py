"""Pre-registration: frozen documents are hash-checked, confirmatory splits are read once, outcomes are
hand-derived verdicts written next to an unaltered document."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner

from expertcache.cli import main
from expertcache.errors import IntegrityError, OutputExistsError, ValidationError
from expertcache.experiment.prereg import evaluate, freeze, load_criteria, verify
from expertcache.experiment.spec import CONDITION_FIELDS
from expertcache.experiment.store import rows_to_table

# Hand-made miss fractions (selection, tie_seed) -> policy -> m. Gaps by hand:
#   conf seed 0: (0.18 - 0.10) / 0.18 = 0.444444...   conf seed 1: (0.19 - 0.11) / 0.19 = 0.421052...
#   disc seed 0: (0.30 - 0.27) / 0.30 = 0.1
MISS = {("conf", 0): {"lru": 0.20, "lfu": 0.18, "belady": 0.10},
        ("conf", 1): {"lru": 0.22, "lfu": 0.19, "belady": 0.11},
        ("disc", 0): {"lru": 0.30, "lfu": 0.31, "belady": 0.27}}

CRITERIA = """
[prereg]
title = "golden"
statement = "Frozen before any result was generated or read."

[splits.disc]
where = { selection = "disc" }

[splits.conf]
where = { selection = "conf" }
confirmatory = true

[[criteria]]
id = "gap-mean"
metric = "gap"
comparison = ">="
threshold = 0.43
split = "conf"
aggregate = "mean"

[[criteria]]
id = "gap-min"
metric = "gap"
comparison = ">="
threshold = 0.43
split = "conf"
aggregate = "min"

[[criteria]]
id = "lru-all"
metric = "miss_fraction"
comparison = "<="
threshold = 0.2
split = "conf"
where = { policy = "lru" }
aggregate = "all"

[[criteria]]
id = "lru-any"
metric = "miss_fraction"
comparison = "<="
threshold = 0.2
split = "conf"
where = { policy = "lru" }
aggregate = "any"
"""

DISCOVERY_ONLY = """
[prereg]
title = "exploratory"
[splits.disc]
where = { selection = "disc" }
[[criteria]]
id = "gap-disc"
metric = "gap"
comparison = ">"
threshold = 0.05
split = "disc"
aggregate = "max"
"""


def _condition(selection: str, seed: int, policy: str) -> dict:
    base = {f: None for f in CONDITION_FIELDS}
    base.update(input="x", selection=selection, discipline="fcfs", batch=8, offsets="zero", policy=policy, rho=0.4,
                scope="per-layer", semantics="event-atomic", tie_break="random", tie_seed=seed,
                lfu_in_cache_counters=False)
    return base


def write_results(path: Path, miss: dict = MISS) -> Path:
    rows = []
    for (sel, seed), per_policy in miss.items():
        for policy, m in per_policy.items():
            cond = _condition(sel, seed, policy)
            cid = hashlib.sha256(json.dumps(cond, sort_keys=True).encode()).hexdigest()[:16]
            rows.append({"condition_id": cid, "condition_hash": cid, **cond, "metric": "miss_fraction", "value": m})
    pq.write_table(rows_to_table(rows), path)
    return path


@pytest.fixture
def setup(tmp_path):
    (tmp_path / "criteria.toml").write_text(CRITERIA)
    doc, sha = freeze(load_criteria(tmp_path / "criteria.toml"), tmp_path / "study.json")
    return tmp_path, doc, sha, write_results(tmp_path / "results.parquet")


def test_freeze_writes_a_hashed_document_and_sidecar(setup):
    root, doc, sha, _ = setup
    frozen = json.loads(doc.read_text())
    canonical = json.dumps(frozen["document"], sort_keys=True, separators=(",", ":"), ensure_ascii=True)
    assert hashlib.sha256(canonical.encode()).hexdigest() == sha == frozen["sha256"]
    assert (root / "study.json.sha256").read_text().split() == [sha, "study.json"]
    assert [c["id"] for c in frozen["document"]["criteria"]] == ["gap-mean", "gap-min", "lru-all", "lru-any"]
    assert verify(doc)[1] == sha


def test_outcomes_match_hand_derived_verdicts(setup):
    root, doc, sha, results = setup
    out = evaluate(doc, results)
    got = {c.id: c for c in out.criteria}
    g0, g1 = (0.18 - 0.10) / 0.18, (0.19 - 0.11) / 0.19
    assert got["gap-mean"].value == pytest.approx((g0 + g1) / 2) and got["gap-mean"].passed
    assert got["gap-mean"].n == 2
    assert got["gap-min"].value == pytest.approx(g1) and not got["gap-min"].passed
    assert got["lru-all"].n == 2 and got["lru-all"].n_satisfying == 1 and not got["lru-all"].passed
    assert got["lru-any"].passed
    assert not out.passed and out.document_sha256 == sha
    written = json.loads(Path(out.path).read_text())
    assert Path(out.path).name == "study.outcome-001.json"
    assert written["passed"] is False and written["criteria"][0]["id"] == "gap-mean"


def test_editing_the_criteria_after_freezing_is_detected(setup):
    root, doc, sha, results = setup
    frozen = json.loads(doc.read_text())
    frozen["document"]["criteria"][1]["threshold"] = 0.40          # make the failing criterion pass
    doc.write_text(json.dumps(frozen, indent=2, sort_keys=True))
    with pytest.raises(IntegrityError, match="edited after freezing"):
        verify(doc)
    with pytest.raises(IntegrityError, match="edited after freezing"):
        evaluate(doc, results)
    # re-computing the embedded hash does not help: the sidecar still holds the frozen one
    canonical = json.dumps(frozen["document"], sort_keys=True, separators=(",", ":"), ensure_ascii=True)
    frozen["sha256"] = hashlib.sha256(canonical.encode()).hexdigest()
    doc.write_text(json.dumps(frozen, indent=2, sort_keys=True))
    with pytest.raises(IntegrityError, match=r"study.json.sha256"):
        evaluate(doc, results)
    assert not list(root.glob("study.outcome-*.json"))             # nothing was evaluated


def test_a_confirmatory_split_is_read_once_unless_forced(setup):
    root, doc, sha, results = setup
    frozen_bytes = doc.read_bytes()
    first = evaluate(doc, results)
    first_bytes = Path(first.path).read_bytes()
    with pytest.raises(ValidationError, match="already read"):
        evaluate(doc, results)
    forced = evaluate(doc, results, force=True)
    assert forced.forced and forced.reread_splits == ("conf",) and not first.forced
    assert Path(forced.path).name == "study.outcome-002.json"
    reads = [json.loads(x) for x in (root / "study.reads.jsonl").read_text().splitlines()]
    assert [(r["split"], r["forced"]) for r in reads] == [("conf", False), ("conf", True)]
    assert doc.read_bytes() == frozen_bytes                        # the frozen document is never altered
    assert Path(first.path).read_bytes() == first_bytes            # nor an earlier outcome


def test_a_discovery_split_may_be_read_again(tmp_path):
    (tmp_path / "c.toml").write_text(DISCOVERY_ONLY)
    doc, _ = freeze(load_criteria(tmp_path / "c.toml"), tmp_path / "d.json")
    results = write_results(tmp_path / "r.parquet")
    a = evaluate(doc, results)
    b = evaluate(doc, results)
    assert a.criteria[0].value == pytest.approx(0.1) and a.passed and b.passed and not b.forced


def test_freeze_refuses_when_results_exist_unless_forced(tmp_path):
    (tmp_path / "c.toml").write_text(CRITERIA)
    results = write_results(tmp_path / "r.parquet")
    with pytest.raises(ValidationError, match="results already exist"):
        freeze(load_criteria(tmp_path / "c.toml"), tmp_path / "d.json", results=results)
    assert not (tmp_path / "d.json").exists()
    doc, _ = freeze(load_criteria(tmp_path / "c.toml"), tmp_path / "d.json", results=results, force=True)
    assert json.loads(doc.read_text())["document"]["results_present_at_freeze"] == \
        ["gap-mean", "gap-min", "lru-all", "lru-any"]
    with pytest.raises(OutputExistsError):
        freeze(load_criteria(tmp_path / "c.toml"), tmp_path / "d.json")


def test_a_criterion_without_results_reads_nothing(setup):
    root, doc, _, _ = setup
    other = write_results(root / "other.parquet", {("disc", 0): MISS[("disc", 0)]})
    with pytest.raises(ValidationError, match="no result"):
        evaluate(doc, other)
    assert not (root / "study.reads.jsonl").exists()
    evaluate(doc, root / "results.parquet")                      # the split is still unread


def test_freeze_checks_splits_against_the_spec(tmp_path):
    from expertcache.trace.synth import SynthConfig, synthesize_trace

    synthesize_trace(SynthConfig(n_layers=2, n_experts=8, top_k=2, n_requests=4, decode_tokens=3,
                                 working_set=4)).save(tmp_path / "t")
    (tmp_path / "spec.toml").write_text('[inputs.x]\ntrace = "t"\n[selections.disc]\nrange = [0, 2]\n'
                                        '[selections.conf]\nrange = [2, 4]\n[grid]\ninput = "x"\n'
                                        'selection = ["disc", "conf"]\nbatch = 2\npolicy = "lru"\nrho = 0.5\n')
    (tmp_path / "c.toml").write_text(CRITERIA)
    doc, _ = freeze(load_criteria(tmp_path / "c.toml"), tmp_path / "ok.json", spec=tmp_path / "spec.toml")
    assert json.loads(doc.read_text())["document"]["spec"]["sha256"] == \
        hashlib.sha256((tmp_path / "spec.toml").read_bytes()).hexdigest()
    (tmp_path / "bad.toml").write_text(CRITERIA.replace('where = { selection = "disc" }', 'where = { batch = 2 }'))
    with pytest.raises(ValidationError, match="shares conditions"):
        freeze(load_criteria(tmp_path / "bad.toml"), tmp_path / "bad.json", spec=tmp_path / "spec.toml")


@pytest.mark.parametrize("text, message", [
    (CRITERIA.replace('comparison = ">="', 'comparison = "=>"', 1), "comparison must be one of"),
    (CRITERIA.replace('split = "conf"', 'split = "nope"', 1), "split must name"),
    (CRITERIA.replace('aggregate = "mean"', 'aggregate = "sum"'), "aggregate must be one of"),
    (CRITERIA.replace('where = { selection = "disc" }', 'where = { colour = "red" }'), "unknown condition field"),
    ('[prereg]\ntitle = "x"\n', "at least one [[criteria]]"),
])
def test_bad_criteria_files(tmp_path, text, message):
    (tmp_path / "c.toml").write_text(text)
    with pytest.raises(ValidationError, match=message.replace("[", r"\[")):
        load_criteria(tmp_path / "c.toml")


def test_cli_freeze_evaluate_verify(tmp_path):
    (tmp_path / "c.toml").write_text(CRITERIA)
    results = write_results(tmp_path / "r.parquet")
    run = CliRunner()
    res = run.invoke(main, ["prereg", "freeze", str(tmp_path / "c.toml"), "-o", str(tmp_path / "d.json"), "--json"])
    assert res.exit_code == 0, res.output
    sha = json.loads(res.output)["sha256"]
    res = run.invoke(main, ["prereg", "verify", str(tmp_path / "d.json")])
    assert res.exit_code == 0 and sha in res.output
    res = run.invoke(main, ["prereg", "evaluate", str(tmp_path / "d.json"), "--results", str(results), "--json"])
    assert res.exit_code == 0, res.output
    assert [c["passed"] for c in json.loads(res.output)["criteria"]] == [True, False, False, True]
    res = run.invoke(main, ["prereg", "evaluate", str(tmp_path / "d.json"), "--results", str(results)])
    assert res.exit_code == 2 and "already read" in res.output and "Traceback" not in res.output
    res = run.invoke(main, ["prereg", "evaluate", str(tmp_path / "d.json"), "--results", str(results), "--force"])
    assert res.exit_code == 0 and "forced" in res.output


def test_evaluate_never_alters_the_frozen_document_or_its_sidecar(setup):
    root, doc, sha, results = setup
    side = root / "study.json.sha256"
    before = [(f.read_bytes(), f.stat().st_mtime_ns) for f in (doc, side)]
    evaluate(doc, results)
    with pytest.raises(ValidationError, match="already read"):
        evaluate(doc, results)
    evaluate(doc, results, force=True)
    assert [(f.read_bytes(), f.stat().st_mtime_ns) for f in (doc, side)] == before
    assert verify(doc)[1] == sha
    assert sorted(x.name for x in root.iterdir()) == ["criteria.toml", "results.parquet", "study.json",
                                                      "study.json.sha256", "study.outcome-001.json",
                                                      "study.outcome-002.json", "study.reads.jsonl"]


def test_a_read_is_recorded_even_if_writing_the_outcome_fails(setup, monkeypatch):
    """Confirmatory data read once: the read log is written before the outcome, so a failed write still counts."""
    import expertcache.experiment.prereg as prereg

    root, doc, _, results = setup

    def full_disk(path, text):
        raise OSError(28, "No space left on device", str(path))

    monkeypatch.setattr(prereg, "_write_new", full_disk)
    with pytest.raises(OSError):
        evaluate(doc, results)
    monkeypatch.undo()
    with pytest.raises(ValidationError, match="already read"):
        evaluate(doc, results)


def test_freeze_refuses_a_leftover_sidecar_and_writes_nothing(tmp_path):
    (tmp_path / "c.toml").write_text(CRITERIA)
    (tmp_path / "d.json.sha256").write_text("0" * 64 + "  d.json\n")
    with pytest.raises(OutputExistsError, match="d.json.sha256"):
        freeze(load_criteria(tmp_path / "c.toml"), tmp_path / "d.json")
    assert not (tmp_path / "d.json").exists()


def test_evaluate_refuses_an_unfinished_store(tmp_path):
    """An interrupted run's store is not read: a confirmatory split would be spent on partial results."""
    from expertcache.experiment import run_spec, spec_from_dict
    from expertcache.trace.synth import SynthConfig, synthesize_trace

    synthesize_trace(SynthConfig(n_layers=2, n_experts=8, top_k=2, n_requests=4, decode_tokens=3,
                                 working_set=4)).save(tmp_path / "t")
    spec = spec_from_dict({"experiment": {"name": "s"}, "inputs": {"x": {"trace": "t"}},
                           "selections": {"conf": {"range": [0, 4]}},
                           "grid": {"input": "x", "selection": "conf", "batch": 2, "policy": ["lru", "belady"],
                                    "rho": [0.25, 0.5]}}, tmp_path)

    def stop(done, total):
        if done >= 2:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        run_spec(spec, tmp_path / "store", progress=stop, flush_seconds=0, task_conditions=2)
    (tmp_path / "c.toml").write_text(
        '[prereg]\ntitle = "t"\n[splits.conf]\nwhere = { selection = "conf" }\nconfirmatory = true\n'
        '[[criteria]]\nid = "m"\nmetric = "miss_fraction"\ncomparison = "<="\nthreshold = 1.0\nsplit = "conf"\n')
    doc, _ = freeze(load_criteria(tmp_path / "c.toml"), tmp_path / "d.json")
    with pytest.raises(ValidationError, match="unfinished run"):
        evaluate(doc, tmp_path / "store")
    assert not (tmp_path / "d.reads.jsonl").exists()
    run_spec(spec, tmp_path / "store")
    out = evaluate(doc, tmp_path / "store")
    assert out.passed and out.criteria[0].n == 4


@pytest.mark.parametrize("selections, grid_extra, shared", [
    ('[selections.disc]\nrange = [0, 3]\n[selections.conf]\nrange = [2, 4]\n', "", 2),
    # disjoint selections, but the confirmatory units are warmed up by discovery requests
    ('[selections.disc]\nrange = [0, 2]\n[selections.conf]\nrange = [2, 4]\n', 'warm = "disc"\n', 0),
])
def test_freeze_refuses_a_confirmatory_split_that_reads_other_splits_requests(tmp_path, selections, grid_extra,
                                                                              shared):
    from expertcache.trace.synth import SynthConfig, synthesize_trace

    tr = synthesize_trace(SynthConfig(n_layers=2, n_experts=8, top_k=2, n_requests=4, decode_tokens=3, working_set=4))
    ids = list(tr.request_ids)
    tr.save(tmp_path / "t")
    grid = ('[[grid]]\ninput = "x"\nselection = "disc"\nbatch = 2\npolicy = "lru"\nrho = 0.5\n'
            f'[[grid]]\ninput = "x"\nselection = "conf"\n{grid_extra}batch = 2\npolicy = "lru"\nrho = 0.5\n')
    (tmp_path / "spec.toml").write_text('[inputs.x]\ntrace = "t"\n' + selections + grid)
    (tmp_path / "c.toml").write_text(CRITERIA)
    with pytest.raises(ValidationError, match="confirmatory split 'conf' reads data of split 'disc'") as err:
        freeze(load_criteria(tmp_path / "c.toml"), tmp_path / "d.json", spec=tmp_path / "spec.toml")
    assert repr(ids[shared]) in str(err.value)            # the first shared request, by id
    assert not (tmp_path / "d.json").exists()
