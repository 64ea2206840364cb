"""Every line of the README's walkthrough runs as written on the bundled data (in a fresh directory).

The walkthrough is the fenced ``bash`` block between ``<!-- walkthrough -->`` and ``<!-- /walkthrough -->``.
Its lines are ``expertcache ...`` commands and ``NAME=$(expertcache ...)`` assignments (``$NAME`` is expanded
in later lines); they run in order, in-process through the command line, and each must exit 0. The lines of
the reference block under "Command line" name placeholders in capitals; each must at least name a command
that exists and options that command has.
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import click
import pytest
from click.testing import CliRunner

from expertcache.cli import main

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()


def _block(begin: str, end: str) -> str:
    part = README.split(begin, 1)[1].split(end, 1)[0]
    return part.split("```bash\n", 1)[1].split("```", 1)[0]


def _lines(block: str) -> list[str]:
    """Logical lines (backslash continuations joined), comments and blanks dropped."""
    out, cur = [], ""
    for raw in block.splitlines():
        line = raw.split("  #", 1)[0].rstrip() if not raw.lstrip().startswith("#") else ""
        if line.endswith("\\"):
            cur += line[:-1] + " "
            continue
        cur += line
        if cur.strip():
            out.append(cur.strip())
        cur = ""
    return out


def _expand(line: str, env: dict[str, str]) -> str:
    return re.sub(r"\$\{?([A-Z_][A-Z0-9_]*)\}?", lambda m: env[m.group(1)], line)


def _run(args: list[str]) -> str:
    res = CliRunner().invoke(main, args)
    assert res.exit_code == 0, f"expertcache {shlex.join(args)} exited {res.exit_code}:\n{res.output[-2000:]}"
    return res.stdout


def test_walkthrough_runs_as_written(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    env: dict[str, str] = {}
    lines = _lines(_block("<!-- walkthrough -->", "<!-- /walkthrough -->"))
    assert len(lines) >= 25
    for line in lines:
        m = re.fullmatch(r'([A-Z_][A-Z0-9_]*)="?\$\((expertcache .*)\)"?', line)
        if m:
            env[m.group(1)] = _run(shlex.split(_expand(m.group(2), env))[1:]).strip()
            continue
        words = shlex.split(_expand(line, env))
        assert words[0] == "expertcache", f"a walkthrough line must be an expertcache command: {line}"
        _run(words[1:])


def _command(words: list[str]) -> tuple[click.Command, list[str]]:
    cmd: click.Command = main
    rest = list(words)
    while isinstance(cmd, click.Group) and rest and rest[0] in cmd.commands:
        cmd = cmd.commands[rest.pop(0)]
    if isinstance(cmd, click.Group) and "run" in cmd.commands:        # `expertcache timing STREAM ...`
        cmd = cmd.commands["run"]
    return cmd, rest


def test_reference_lines_name_real_commands_and_options():
    lines = _lines(_block("## Command line", "\n## "))
    assert len(lines) >= 30
    for line in lines:
        words = [w for w in shlex.split(line.replace("[", " ").replace("]", " ").replace("|", " "))]
        assert words[0] == "expertcache", line
        cmd, rest = _command(words[1:])
        assert not isinstance(cmd, click.Group), f"not a command: {line}"
        offered = {o for p in cmd.params for o in [*p.opts, *p.secondary_opts]} | {"-h", "--help"}
        for w in rest:
            if w.startswith("-") and not re.fullmatch(r"-[0-9.]+", w):
                assert w.split("=", 1)[0] in offered, f"{' '.join(words[:3])}: no option {w} ({line})"


@pytest.mark.parametrize("needle", ["--rhos", "--seeds", "--policies", "--batches"])
def test_readme_uses_the_current_spellings(needle):
    assert needle not in README


def _demo(*extra: str) -> dict:
    import json

    return json.loads(_run(["demo", *extra, "--json"]).strip().splitlines()[-1])


def test_the_quoted_demo_output_is_what_the_demo_prints():
    """The README's abridged demo output and the sentences under it hold for ``expertcache demo`` now."""
    d = _demo()
    block = README.split("Output of the command above, abridged:", 1)[1].split("```\n", 1)[1].split("```", 1)[0]
    assert (f"Regime: mean event ratio r = |E|/c_l = {d['mean_event_ratio']:.3f}, "
            f"{100 * d['fraction_events_over_capacity']:.1f}% of events exceed the layer quota") in block
    quoted = {ln.split()[0]: ln.split()[1:] for ln in block.splitlines()[3:] if ln.strip()}
    keys = ("miss_fraction_sequential_ascending", "miss_fraction_sequential_random", "miss_fraction_event_atomic")
    rows = {r["policy"]: r for r in d["rows"]}
    assert set(quoted) == set(rows)
    for name, r in rows.items():
        assert quoted[name] == [f"{100 * r[k]:.2f}%" for k in keys] + [
            f"{100 * r['inflation_sequential_ascending']:+.1f}%", f"{100 * r['inflation_sequential_random']:+.1f}%"]
    # the sentences under it
    infl = {n: r["inflation_sequential_ascending"] for n, r in rows.items()}
    assert min(infl[p] for p in ("lru", "lfru", "least-stale")) > 5 * max(infl[p] for p in ("lfu", "belady"))
    assert infl["static"] == infl["static-same-trace"] == 0
    assert all(r["inflation_sequential_ascending"] > r["inflation_sequential_random"] for n, r in rows.items()
               if n in ("lru", "lfru", "lrfu", "least-stale"))
    same = rows["static-same-trace"]["miss_fraction_sequential_ascending"]
    assert all(same < rows[p]["miss_fraction_sequential_ascending"] for p in ("lru", "lfu", "lfru", "lrfu"))
    bf = rows["belady-forced"]
    assert bf["miss_fraction_event_atomic"] > bf["miss_fraction_sequential_ascending"]
    assert f"sits past the quota boundary (r̄ ≈ {d['mean_event_ratio']:.2f})" in README
    syn = _demo("--example", "synthetic")
    lru = next(r for r in syn["rows"] if r["policy"] == "lru")
    assert (f"(r̄ ≈ {syn['mean_event_ratio']:.2f}; LRU inflation {100 * lru['inflation_sequential_ascending']:+.0f}% / "
            f"{100 * lru['inflation_sequential_random']:+.0f}%)") in README
