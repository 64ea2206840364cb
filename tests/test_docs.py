"""Docs that run: the README's Python example and the CLI reference stay true."""

from __future__ import annotations

import re
from pathlib import Path

from click.testing import CliRunner

from expertcache.cli import main

ROOT = Path(__file__).resolve().parents[1]


def test_readme_python_example_runs(capsys):
    text = (ROOT / "README.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", text, flags=re.S)
    assert blocks
    for block in blocks:
        exec(compile(block, "README.md", "exec"), {})
    out = capsys.readouterr().out
    assert out.split()[:2] == ["2", "4"]


def test_readme_lists_every_registered_policy():
    from expertcache.replay import policy_names

    text = (ROOT / "README.md").read_text()
    for name in policy_names():
        assert name in text, name


def test_every_documented_command_exists():
    text = (ROOT / "README.md").read_text()
    commands = set(re.findall(r"^expertcache ([a-z]+(?: [a-z][a-z-]*)?)", text, flags=re.M))
    assert {"trace import", "events build", "events import", "demo"} <= {c for c in commands}
    for cmd in commands:
        res = CliRunner().invoke(main, [*cmd.split(), "--help"])
        assert res.exit_code == 0, (cmd, res.output)


def test_readme_public_surface_names_exist():
    """Every name the README's public-surface table lists under a face is exported by that face."""
    import importlib

    text = (ROOT / "README.md").read_text()
    rows = re.findall(r"^\| `(expertcache[\w.]*)` \| (.*) \|$", text, flags=re.M)
    assert len(rows) >= 3
    for module, names in rows:
        face = importlib.import_module(module)
        for name in re.findall(r"`([A-Za-z_]\w*)`", names):
            assert name in face.__all__, (module, name)
        for sub in re.findall(r"`(expertcache\.[\w.]+)`", names):
            importlib.import_module(sub)


def test_ci_runs_exactly_the_readme_test_command():
    text = (ROOT / "README.md").read_text()
    ci = (ROOT / ".ci" / "run").read_text()
    command = next(line for line in ci.splitlines() if "pytest" in line)
    assert command in text


def test_python_dash_m_and_one_version_source():
    import subprocess
    import sys
    from importlib.metadata import version

    import expertcache

    out = subprocess.run([sys.executable, "-m", "expertcache", "--version"], capture_output=True, text=True)
    assert out.returncode == 0 and out.stdout.strip().endswith(expertcache.__version__)
    assert version("expertcache") == expertcache.__version__
    assert 'dynamic = ["version"]' in (ROOT / "pyproject.toml").read_text()
