"""The note a terminal user sees once when kernels compile at their first use (and nowhere else)."""

from __future__ import annotations

import importlib
import io

import numba
import pytest

from expertcache import _jit, _notes

cli_main = importlib.import_module("expertcache.cli.main")


def _fresh(module: str):
    """A new jitted function whose module reads ``module`` (so that its first call compiles, never cached)."""
    def f(x):
        return x + 1
    f.__module__ = module
    return numba.njit(cache=False)(f)


@pytest.fixture
def note(monkeypatch):
    monkeypatch.setattr(_jit._FirstCompile, "said", False)
    monkeypatch.setattr(_notes, "compile_note", True)


def test_the_first_expertcache_compile_says_so_once(note, capsys):
    _fresh("elsewhere.mod")(1)                       # not one of ours: nothing
    assert capsys.readouterr().err == ""
    _fresh("expertcache.replay.probe")(1)
    _fresh("expertcache.replay.probe")(2)            # a second compile: no second note
    err = capsys.readouterr().err
    assert err == _jit.COMPILE_NOTE + "\n"


def test_no_note_unless_switched_on(monkeypatch, capsys):
    monkeypatch.setattr(_jit._FirstCompile, "said", False)
    monkeypatch.setattr(_notes, "compile_note", False)
    _fresh("expertcache.replay.probe")(1)
    assert capsys.readouterr().err == ""


@pytest.mark.parametrize(("tty", "quiet", "on"), [(True, False, True), (True, True, False), (False, False, False)])
def test_the_command_line_switches_it_on_for_a_terminal_only(monkeypatch, tty, quiet, on):
    monkeypatch.setattr(_notes, "compile_note", None)
    stderr = io.StringIO()
    stderr.isatty = lambda: tty
    monkeypatch.setattr(cli_main.sys, "stderr", stderr)
    cli_main.configure_logging(0, quiet)
    assert _notes.compile_note is on
    cli_main.configure_logging(0, False)             # (the logger's level back to its default)
