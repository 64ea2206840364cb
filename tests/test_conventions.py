"""One spelling per option (docs/cli.md): quantities take one value or a comma list, sweeps are --sweep-X,
capacities are --capacity/-C; the old spellings are rewritten with a note, and no command offers two."""

from __future__ import annotations

import json

import click
import pytest
from click.testing import CliRunner

from expertcache.cli import main
from expertcache.cli.main import RENAMED, _renamed

PLURALS = ("--rhos", "--seeds", "--policies", "--batches", "--budgets", "--capacities")


def _commands(group: click.Group, path: tuple[str, ...] = ()):
    for name, cmd in group.commands.items():
        if isinstance(cmd, click.Group):
            yield from _commands(cmd, (*path, name))
        else:
            yield (*path, name), cmd


def test_no_command_spells_a_plural_option_or_capacity_as_B():
    for path, cmd in _commands(main):
        for p in cmd.params:
            names = [*p.opts, *p.secondary_opts]
            assert not set(names) & set(PLURALS), (path, names)
            if "--capacity" in names:
                assert "-B" not in names and "-C" in names, (path, names)


def test_renamed_options_exist_where_they_point():
    by_path = dict(_commands(main))
    for path, table in RENAMED.items():
        cmd = by_path[path]
        offered = {o for p in cmd.params for o in [*p.opts, *p.secondary_opts]}
        for old, new in table.items():
            assert new in offered and old not in offered, (path, old, new)


def test_old_spellings_are_rewritten_with_a_note(capsys):
    assert _renamed(["report", "--example", "--seeds", "0,1", "--rhos=0.4", "--batch", "8"]) == \
        ["report", "--example", "--seed", "0,1", "--sweep-rho=0.4", "--batch", "8"]
    assert _renamed(["prefetch", "compare", "x", "-B8", "--policies", "lru"]) == \
        ["prefetch", "compare", "x", "-C8", "--policy", "lru"]
    assert _renamed(["events", "build", "x", "-B", "8"]) == ["events", "build", "x", "-B", "8"]   # batch there
    err = capsys.readouterr().err
    assert "--seeds is now spelled --seed" in err and "-B is now spelled -C" in err


@pytest.mark.parametrize("old,new", [(["-B", "8"], ["-C", "8"]), (["--policies", "lru,lfu"], ["--policy", "lru,lfu"])])
def test_prefetch_compare_old_and_new_spellings_agree(old, new):
    run = CliRunner().invoke
    base = ["prefetch", "compare", "example", "--json"]
    a, b = run(main, base + old), run(main, base + new)
    assert a.exit_code == 0 and b.exit_code == 0, (a.output, b.output)
    assert json.loads(a.stdout.strip().splitlines()[-1]) == json.loads(b.stdout.strip().splitlines()[-1])


def test_verbose_logs_through_the_logging_module_and_quiet_silences_notes(tmp_path):
    import subprocess
    import sys

    trace = "src/expertcache/data/example_model_trace"
    base = [sys.executable, "-m", "expertcache"]
    v = subprocess.run([*base, "-v", "events", "build", trace, "-B", "4", "-o", str(tmp_path / "s")],
                       capture_output=True, text=True, cwd=_root())
    assert v.returncode == 0, v.stderr
    assert "INFO expertcache.trace.model: reading trace" in v.stderr
    assert "INFO expertcache.events.fcfs: FCFS events:" in v.stderr and v.stdout.startswith("wrote ")
    plain = subprocess.run([*base, "events", "build", trace, "-B", "4", "-o", str(tmp_path / "s2")],
                           capture_output=True, text=True, cwd=_root())
    assert plain.returncode == 0 and "INFO" not in plain.stderr
    q = subprocess.run([*base, "-q", "prefetch", "replay", str(tmp_path / "s"), "-B", "3"],
                       capture_output=True, text=True, cwd=_root())
    loud = subprocess.run([*base, "prefetch", "replay", str(tmp_path / "s"), "-B", "3"],
                          capture_output=True, text=True, cwd=_root())
    assert q.returncode == loud.returncode == 0, (q.stderr, loud.stderr)
    assert "is now spelled -C" in loud.stderr and q.stderr == "" and q.stdout == loud.stdout


def _root():
    from pathlib import Path

    return str(Path(__file__).resolve().parents[1])
