"""Shared fixtures: tiny hand-written inputs on disk; a repository script loaded as a module or run."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[1]


def load_script(relpath: str, name: str) -> ModuleType:
    """The repository's script ``relpath`` (e.g. ``scripts/docs_tables.py``) imported as module ``name``."""
    spec = importlib.util.spec_from_file_location(name, ROOT / relpath)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def run_benchmark(name: str, *args: str) -> subprocess.CompletedProcess:
    """``benchmarks/NAME`` with ``args`` in a fresh Python process (text output captured)."""
    return subprocess.run([sys.executable, str(ROOT / "benchmarks" / name), *args], capture_output=True, text=True,
                          timeout=600)


#: Arguments the scripts that time rows by shape (``_ab.shape_options``) refuse.
BAD_SHAPE_ARGS = (["--rhos", "2"], ["--shapes", "4x16"], ["--shapes", "4x2000x8"], ["--batches", "0"], ["--pairs", "x"])


def assert_refused(name: str, argsets=BAD_SHAPE_ARGS) -> None:
    """``benchmarks/NAME`` refuses each argument list: exit 2, no traceback, a last line saying what was expected."""
    for args in argsets:
        r = run_benchmark(name, *args)
        assert r.returncode == 2 and "Traceback" not in r.stderr, args
        assert "expected" in r.stderr.strip().splitlines()[-1], (args, r.stderr)


def write_jsonl(path: Path, records: list) -> Path:
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in records))
    return path


def route_records(
    n_requests: int = 3, n_tokens: int = 4, L: int = 2, N: int = 6, k: int = 2
) -> list[dict]:
    """Deterministic routing records: request r, token t, layer l picks experts (r+t+l+j) % N."""
    out = []
    for r in range(n_requests):
        for t in range(n_tokens):
            for layer in range(L):
                experts = [(r + t + layer + j) % N for j in range(k)]
                out.append(
                    {
                        "request_id": f"req{r}",
                        "phase": "decode",
                        "position": 10 + t,
                        "layer": layer,
                        "experts": experts,
                        "gates": [1.0 / k] * k,
                        "token_id": 100 + t,
                    }
                )
    return out


@pytest.fixture
def routes_file(tmp_path: Path) -> Path:
    return write_jsonl(tmp_path / "routes.jsonl", route_records())


def random_events(rng, n_layers: int, n_experts: int, n_events: int, kmax: int):
    """A stream of ``n_events`` events, each on a random layer with 1..``kmax`` random distinct experts."""
    from expertcache.events import EventStream

    steps, layers, exps = [], [], []
    for t in range(n_events):
        steps.append(t)
        layers.append(int(rng.integers(0, n_layers)))
        exps.append(sorted(rng.choice(n_experts, int(rng.integers(1, kmax + 1)), replace=False).tolist()))
    return EventStream.from_lists(n_layers, n_experts, kmax, steps=steps, layers=layers, experts=exps,
                                  active=[1] * n_events)


def spy_calls(monkeypatch, module, name: str) -> list:
    """Replace ``module.name`` by a wrapper that appends to the returned list at each call, then calls it."""
    calls: list = []
    real = getattr(module, name)

    def spy(*args):
        calls.append(True)
        return real(*args)

    monkeypatch.setattr(module, name, spy)
    return calls
