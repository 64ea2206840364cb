"""A missing optional dependency is one line naming the ``pip install 'expertcache[EXTRA]'`` to run.

The imports are made to fail by blocking the modules (``sys.modules[name] = None``, which makes both
``import name`` and ``importlib.util.find_spec(name)`` report the module missing), so the tests run on a
machine that has every extra installed.
"""

from __future__ import annotations

import sys

import pytest
from click.testing import CliRunner

from expertcache.cli import main


def _block(monkeypatch, *names: str) -> None:
    for name in names:
        monkeypatch.setitem(sys.modules, name, None)


def _one_line(res) -> str:
    assert res.exit_code == 2, res.output
    text = res.output.strip()
    assert "\n" not in text and "Traceback" not in text, text
    return text


@pytest.mark.parametrize("args, extra, missing", [
    (["collect", "some/model", "--prompts", "p.jsonl", "-o", "out"], "collect", "torch, transformers, safetensors"),
    (["execute", "example", "-o", "out"], "execute", "torch, transformers, safetensors"),
    (["routers", "train", "--trace", "t", "--mode", "aux-temporal", "--capacity", "8", "-o", "new"], "routers",
     "torch, safetensors"),
    (["routers", "export", "ck", "--trace", "t", "-o", "a.npz"], "routers", "safetensors"),
    (["routers", "eval", "ck", "--trace", "t", "--capacity", "8"], "routers", "safetensors"),
])
def test_model_commands_without_torch_say_which_extra(monkeypatch, tmp_path, args, extra, missing):
    _block(monkeypatch, "torch", "transformers", "safetensors")
    monkeypatch.chdir(tmp_path)
    (tmp_path / "t").mkdir()        # option values click checks exist (the command never reads them)
    (tmp_path / "ck").mkdir()
    line = _one_line(CliRunner().invoke(main, args))
    command = " ".join(args[:2] if args[0] == "routers" else args[:1])
    verb = "are" if "," in missing else "is"
    assert line == (f"error: `main {command}` needs {missing}, which {verb} not installed: "
                    f"pip install 'expertcache[{extra}]'")
    assert not (tmp_path / "out").exists() and not (tmp_path / "new").exists()


def test_an_optional_import_deep_inside_a_command_names_the_extra(monkeypatch, tmp_path):
    """A module that fails to import inside the library (after the command started) still gives the one
    line, with the extra that installs it."""
    import expertcache.cli.replay as cli_replay
    from expertcache.events import build_events
    from expertcache.trace.synth import SynthConfig, synthesize_trace

    build_events(synthesize_trace(SynthConfig(n_layers=2, n_experts=8, top_k=2, n_requests=4, decode_tokens=3,
                                              working_set=4, seed=1)), 2).save(tmp_path / "s")

    def deep(*args, **kwargs):
        raise ModuleNotFoundError("No module named 'matplotlib'", name="matplotlib")

    monkeypatch.setattr(cli_replay, "_print_results", deep)
    line = _one_line(CliRunner().invoke(main, ["replay", str(tmp_path / "s")]))
    assert line == "error: `main replay` needs matplotlib, which is not installed: pip install 'expertcache[plot]'"
    from expertcache.cli.main import _extra_for

    assert _extra_for("sklearn.ensemble") == "nextuse" and _extra_for("numpy") is None


def test_a_non_optional_missing_module_is_not_disguised(monkeypatch):
    from expertcache.cli.main import _guard

    @_guard
    def broken():
        raise ModuleNotFoundError("No module named 'numpyy'", name="numpyy")

    with pytest.raises(ModuleNotFoundError):
        broken()


def test_the_ray_executor_without_ray(monkeypatch, tmp_path):
    _block(monkeypatch, "ray")
    (tmp_path / "s.toml").write_text('[inputs.a]\ntrace = "a"\n[grid]\ninput = "a"\nbatch = 2\npolicy = "lru"\n'
                                     'rho = 0.5\n')
    from expertcache.trace.synth import SynthConfig, synthesize_trace

    synthesize_trace(SynthConfig(n_layers=2, n_experts=8, top_k=2, n_requests=4, decode_tokens=3, working_set=4,
                                 seed=1)).save(tmp_path / "a")
    line = _one_line(CliRunner().invoke(main, ["spec", "run", str(tmp_path / "s.toml"), "--store",
                                               str(tmp_path / "st"), "--executor", "ray"]))
    assert line == "error: field 'executor': the ray executor needs Ray: pip install 'expertcache[ray]'"
    assert not (tmp_path / "st").exists()


def test_a_deep_torch_import_in_routers_names_the_routers_extra(monkeypatch):
    import click

    from expertcache.cli.main import _guard

    @click.command("eval")
    @_guard
    def fake():
        raise ModuleNotFoundError("No module named 'torch'", name="torch")

    group = click.Group("main", commands={"routers": click.Group("routers", commands={"eval": fake})})
    res = CliRunner().invoke(group, ["routers", "eval"])
    assert _one_line(res) == ("error: `main routers eval` needs torch, which is not installed: "
                              "pip install 'expertcache[routers]'")
