"""One JSON convention (docs/design.md §5): every result-printing command has ``--json``; each line it prints
parses, carries ``schema_version`` and ``tool_version``, and has no hyphenated keys.

Every command is run here on bundled data except the torch-bound ones (``collect``, ``execute``,
``routers train|export|eval``), which need a model; their ``--json`` goes through the same printer
(``expertcache.cli.main._echo_json``), and :func:`test_every_command_has_json` checks they offer it.
"""

from __future__ import annotations

import json
from importlib import resources
from pathlib import Path

import click
import pytest
from click.testing import CliRunner

from expertcache import __version__
from expertcache.cli import main
from expertcache.storage import SCHEMA_VERSION, VERBATIM_KEYS

DATA = resources.files("expertcache") / "data"
#: Commands printing one record per run or row (JSON Lines); every other command prints one object.
PER_RUN = {"replay", "prefetch replay", "timing run", "spec expand", "align", "probe audit", "trace examples"}
#: Commands that need torch and a model (see the module docstring).
TORCH_BOUND = {"collect", "execute", "routers train", "routers export", "routers eval", "timing calibrate"}


def _leaves(cmd: click.Command, path: tuple[str, ...] = ()):
    if isinstance(cmd, click.Group):
        for name, sub in sorted(cmd.commands.items()):
            yield from _leaves(sub, (*path, name))
    else:
        yield " ".join(path), cmd


def test_every_command_has_json():
    lacking = [name for name, cmd in _leaves(main)
               if "--json" not in {o for p in cmd.params for o in getattr(p, "opts", [])}]
    assert lacking == []


def _hyphenated(obj, where="") -> list[str]:
    out: list[str] = []
    if isinstance(obj, dict):
        for k, v in obj.items():
            if "-" in str(k):
                out.append(f"{where}.{k}")
            if str(k) not in VERBATIM_KEYS:
                out += _hyphenated(v, f"{where}.{k}")
    elif isinstance(obj, list):
        for i, v in enumerate(obj):
            out += _hyphenated(v, f"{where}[{i}]")
    return out


@pytest.fixture(scope="module")
def work(tmp_path_factory) -> dict[str, Path]:
    """A trace (the bundled example model's first 16 requests), its stream, a model, a spec store, a prereg."""
    from expertcache.trace import read_trace, select_requests

    root = tmp_path_factory.mktemp("json")
    with resources.as_file(DATA / "example_model_trace") as src:
        trace = read_trace(src)
    # 6 code, 6 explain and 4 list requests each (the bundled trace holds 14 of each of 4 categories)
    pick = [*range(0, 6), *range(14, 20), *range(28, 32)]
    select_requests(trace, pick, "16 of 3 categories").save(root / "trace")
    select_requests(trace, [i + 6 if i < 28 else i + 4 for i in pick], "16 others").save(root / "calib")
    run = CliRunner().invoke
    for args in (["events", "build", root / "trace", "--batch", "4", "-o", root / "stream"],
                 ["events", "build", root / "calib", "--batch", "4", "-o", root / "cstream"],
                 ["nextuse", "fit", root / "cstream", "-o", root / "model.json"],
                 ["nextuse", "eval", root / "model.json", root / "stream", "--advice-out", root / "advice.npz"],
                 ["probe", "build", "-o", root / "probes", "--per-cell", "2", "--matched", "1"]):
        res = run(main, [str(a) for a in args])
        assert res.exit_code == 0, (args, res.output)
    (root / "spec.toml").write_text(f'[experiment]\nname = "j"\n[inputs.a]\ntrace = "{root / "trace"}"\n'
                                    '[grid]\ninput = "a"\nbatch = [1, 2]\npolicy = ["lru", "belady"]\n'
                                    'rho = [0.25, 0.5]\n')
    (root / "crit.toml").write_text('[prereg]\ntitle = "t"\nstatement = "s"\n'
                                    '[splits.all]\nwhere = {}\nconfirmatory = false\n'
                                    '[[criteria]]\nid = "c1"\nmetric = "gap"\nsplit = "all"\n'
                                    'aggregate = "mean"\ncomparison = ">="\nthreshold = -1\n')
    (root / "events.jsonl").write_text('{"step": 0, "layer": 0, "experts": [0, 1], "active": 1}\n'
                                       '{"step": 1, "layer": 0, "experts": [1, 2], "active": 1}\n')
    return {"root": root}


def _commands(r: Path) -> list[tuple[str, list]]:
    t, s, c, cs = r / "trace", r / "stream", r / "calib", r / "cstream"
    return [
        ("affinity", ["affinity", t, "-A", "4", "-B", "2", "-W", "2", "--policy", "lfru"]),
        ("align", ["align", f"a={t}", f"b={c}", "--sweep-batch", "1,2", "--batch", "2"]),
        ("audit", ["audit", t]),
        ("conformance", ["conformance"]),
        ("demo", ["demo", "--example", "synthetic", "--batch", "2"]),
        ("events build", ["events", "build", t, "--batch", "2", "-o", r / "out-build"]),
        ("events import", ["events", "import", r / "events.jsonl", "-L", "1", "-N", "4", "-k", "2",
                           "-o", r / "out-import"]),
        ("events info", ["events", "info", s]),
        ("events export", ["events", "export", s, "-o", r / "out-export"]),
        ("experiment disciplines", ["experiment", "disciplines", t, "--calibration", c, "-B", "2", "-A", "4",
                                    "-W", "2"]),
        ("experiment partition", ["experiment", "partition", t, "--groups", "code;*", "--slots", "4"]),
        ("experiment prefill-gap", ["experiment", "prefill-gap", t, "--chunk", "16", "--rho", "0.4"]),
        ("experiment prefill-order", ["experiment", "prefill-order", t, "--chunk", "16"]),
        ("experiment static-vs-dynamic", ["experiment", "static-vs-dynamic", t, "--calibration", c,
                                          "--batch", "2"]),
        ("experiment transition", ["experiment", "transition", t, "--windows", "2", "--warm", "2", "--rho", "0.4"]),
        ("nextuse fit", ["nextuse", "fit", cs, "-o", r / "out-model.json"]),
        ("nextuse eval", ["nextuse", "eval", r / "model.json", s]),
        ("nextuse victims", ["nextuse", "victims", r / "model.json", s, "--every", "97"]),
        ("prefetch compare", ["prefetch", "compare", t, "-C", "2", "-R", "2"]),
        ("prefetch advice", ["prefetch", "advice", s, "-o", r / "out-advice.npz"]),
        ("prefetch replay", ["prefetch", "replay", s, "--advice", r / "advice.npz", "--priority", "lru,lfu",
                             "-R", "0"]),
        ("spec expand", ["spec", "expand", r / "spec.toml"]),
        ("spec run", ["spec", "run", r / "spec.toml", "--store", r / "store"]),
        ("spec summary", ["spec", "summary", r / "store", "--metric", "gap", "--rows", "batch", "--cols", "rho"]),
        ("prereg freeze", ["prereg", "freeze", r / "crit.toml", "-o", r / "crit.json"]),
        ("prereg verify", ["prereg", "verify", r / "crit.json"]),
        ("prereg evaluate", ["prereg", "evaluate", r / "crit.json", "--results", r / "store"]),
        ("probe build", ["probe", "build", "-o", r / "out-probes", "--per-cell", "2", "--matched", "1"]),
        ("probe audit", ["probe", "audit", r / "probes"]),
        ("replay", ["replay", s, "--policy", "lru,belady", "--rho", "0.25,0.5"]),
        ("report", ["report", s, "-o", r / "out-report", "--no-figures", "--seed", "0", "--sweep-batch", "1,2",
                    "--sweep-rho", "0.4", "--permutations", "1"]),
        ("timing run", ["timing", "run", s, "--policy", "lru"]),
        ("trace examples", ["trace", "examples"]),
        ("trace import", ["trace", "import", str(DATA / "warp_olmoe" / "trace_olmoe_299.jsonl"), "--format", "warp-jsonl",
                          "--experts", "64", "-o", r / "out-trace"]),
        ("trace info", ["trace", "info", t]),
    ]


def test_the_command_list_covers_every_command_but_the_torch_bound(tmp_path):
    names = {n for n, _ in _leaves(main)}
    assert {n for n, _ in _commands(tmp_path)} | TORCH_BOUND == names


@pytest.mark.parametrize("name", [n for n, _ in _commands(Path("."))])
def test_json_lines_carry_versions_and_no_hyphenated_keys(work, name):
    args = dict(_commands(work["root"]))[name]
    res = CliRunner().invoke(main, [str(a) for a in args] + ["--json"])
    assert res.exit_code == 0, (name, res.output[-2000:])
    lines = [x for x in res.output.splitlines() if x.strip()]
    assert lines, name
    if name not in PER_RUN:
        assert len(lines) == 1, (name, len(lines))
    for line in lines:
        rec = json.loads(line)
        assert isinstance(rec, dict), (name, line[:200])
        assert rec["schema_version"] == SCHEMA_VERSION and rec["tool_version"] == __version__, name
        assert _hyphenated(rec) == [], name
