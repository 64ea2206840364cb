"""The example model trains on CPU kernels that every x86-64 machine runs alike (issue 18).

torch and MKL choose kernels from the CPU they find; `scripts/example_model/portable.py` pins the
portable ones. Restricting MKL's instruction set (as an older CPU would) must not change a bit of
the trained weights under the pin, and the pin must change the bits relative to the detected
AVX2 path (otherwise it pins nothing). Two training steps of the quick configuration suffice.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("tokenizers")

ROOT = Path(__file__).resolve().parents[1]
SCRIPTS = ROOT / "scripts" / "example_model"

_TRAIN = """
import json, sys
from dataclasses import replace
from pathlib import Path
sys.path.insert(0, {scripts!r})
import train
work, out = Path({work!r}), Path(sys.argv[1])
cfg = replace(train.QUICK, steps=2, log_every=1)
train.train(work / "corpus.jsonl", work / "tokenizer", out, cfg, progress=False)
"""


@pytest.fixture(scope="module")
def work(tmp_path_factory) -> Path:
    """Corpus (its first 400 exchanges: any text shows the kernels) and tokenizer, built in a child interpreter."""
    w = tmp_path_factory.mktemp("example")
    code = (f"import sys; sys.path.insert(0, {str(SCRIPTS)!r}); from pathlib import Path; import corpus, tokenizer; "
            f"w = Path({str(w)!r}); corpus.extract(w); c = w / 'corpus.jsonl'; "
            "c.write_text(''.join(c.read_text().splitlines(True)[:400])); "
            "tokenizer.train_tokenizer(c, w / 'tokenizer')")
    subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, timeout=600)
    return w


def _start(work: Path, out: Path, env: dict[str, str], bypass_check: bool = False) -> subprocess.Popen:
    """Two training steps in a child interpreter under ``env`` (the pinned variables removed first)."""
    base = {k: v for k, v in os.environ.items() if k not in ("ATEN_CPU_CAPABILITY", "MKL_CBWR",
                                                               "MKL_ENABLE_INSTRUCTIONS")}
    code = _TRAIN.format(scripts=str(SCRIPTS), work=str(work))
    if bypass_check:   # the unpinned kernels: portable.check would refuse them
        code = (f"import sys; sys.path.insert(0, {str(SCRIPTS)!r}); import portable; "
                "portable.check = lambda: None" + code)
    return subprocess.Popen([sys.executable, "-c", code, str(out)], env={**base, **env}, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def _finish(proc: subprocess.Popen) -> tuple[int, str]:
    _, err = proc.communicate(timeout=600)
    return proc.returncode, err


@pytest.fixture(scope="module")
def runs(work, tmp_path_factory) -> dict[str, tuple[Path, int, str]]:
    """The four child runs, started together (each mostly imports torch): name -> (out dir, rc, stderr)."""
    env = _portable_env()
    root = tmp_path_factory.mktemp("runs")
    specs = {"unpinned": ({}, False), "pinned": (env, False),
             "pinned-sse42": ({**env, "MKL_ENABLE_INSTRUCTIONS": "SSE4_2"}, False), "free": ({}, True)}
    procs = {name: _start(work, root / name, e, bypass) for name, (e, bypass) in specs.items()}
    return {name: (root / name, *_finish(p)) for name, p in procs.items()}


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _portable_env() -> dict[str, str]:
    sys.path.insert(0, str(SCRIPTS))
    try:
        import portable
    finally:
        sys.path.remove(str(SCRIPTS))
    return dict(portable.PORTABLE_ENV)


def test_training_refuses_without_the_portable_kernels(runs):
    out, rc, err = runs["unpinned"]
    assert rc != 0
    assert "portable CPU kernels" in err and "ATEN_CPU_CAPABILITY=default" in err
    assert not (out / "model.safetensors").exists()


def test_weights_do_not_depend_on_the_cpu_instruction_set(runs):
    (pinned, rc, err), (old_cpu, rc2, err2) = runs["pinned"], runs["pinned-sse42"]
    assert rc == 0, err[-2000:]
    assert rc2 == 0, err2[-2000:]
    assert _sha(pinned / "model.safetensors") == _sha(old_cpu / "model.safetensors")
    assert json.loads((pinned / "training.json").read_text())["kernels"] == _portable_env()


def test_the_pin_changes_the_kernels(runs):
    """Without the pin (a run that bypasses portable.check) the detected vector path sums differently."""
    import torch

    if torch.backends.cpu.get_cpu_capability() == "DEFAULT":
        pytest.skip("this CPU has no vector path above ATen's default: nothing to compare with")
    (pinned, rc, err), (free, rc2, err2) = runs["pinned"], runs["free"]
    assert rc == 0 and rc2 == 0, (err + err2)[-2000:]
    assert _sha(pinned / "model.safetensors") != _sha(free / "model.safetensors")
