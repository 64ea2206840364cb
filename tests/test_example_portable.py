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
    """Corpus and tokenizer, built once in a child interpreter (as make_all.py does)."""
    w = tmp_path_factory.mktemp("example")
    code = (f"import sys; sys.path.insert(0, {str(SCRIPTS)!r}); from pathlib import Path; import corpus, tokenizer; "
            f"w = Path({str(w)!r}); corpus.extract(w); tokenizer.train_tokenizer(w / 'corpus.jsonl', w / 'tokenizer')")
    subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, timeout=600)
    return w


def _train(work: Path, out: Path, env: dict[str, str]) -> subprocess.CompletedProcess:
    base = {k: v for k, v in os.environ.items() if k not in ("ATEN_CPU_CAPABILITY", "MKL_CBWR",
                                                               "MKL_ENABLE_INSTRUCTIONS")}
    code = _TRAIN.format(scripts=str(SCRIPTS), work=str(work))
    return subprocess.run([sys.executable, "-c", code, str(out)], env={**base, **env}, capture_output=True,
                          text=True, timeout=600)


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _portable_env() -> dict[str, str]:
    sys.path.insert(0, str(SCRIPTS))
    try:
        import portable
    finally:
        sys.path.remove(str(SCRIPTS))
    return dict(portable.PORTABLE_ENV)


def test_training_refuses_without_the_portable_kernels(work, tmp_path):
    proc = _train(work, tmp_path / "m", {})
    assert proc.returncode != 0
    assert "portable CPU kernels" in proc.stderr and "ATEN_CPU_CAPABILITY=default" in proc.stderr
    assert not (tmp_path / "m" / "model.safetensors").exists()


@pytest.fixture(scope="module")
def pinned(work, tmp_path_factory) -> Path:
    """The weights of two pinned training steps."""
    out = tmp_path_factory.mktemp("pinned")
    proc = _train(work, out, _portable_env())
    assert proc.returncode == 0, proc.stderr[-2000:]
    return out


def test_weights_do_not_depend_on_the_cpu_instruction_set(work, pinned, tmp_path):
    env = _portable_env()
    old_cpu = _train(work, tmp_path / "b", {**env, "MKL_ENABLE_INSTRUCTIONS": "SSE4_2"})
    assert old_cpu.returncode == 0, old_cpu.stderr[-2000:]
    assert _sha(pinned / "model.safetensors") == _sha(tmp_path / "b" / "model.safetensors")
    assert json.loads((pinned / "training.json").read_text())["kernels"] == env


def test_the_pin_changes_the_kernels(work, pinned, tmp_path):
    """Without the pin (a check that bypasses portable.check) the detected vector path sums differently."""
    import torch

    if torch.backends.cpu.get_cpu_capability() == "DEFAULT":
        pytest.skip("this CPU has no vector path above ATen's default: nothing to compare with")
    code = (f"import sys; sys.path.insert(0, {str(SCRIPTS)!r}); import portable; portable.check = lambda: None"
            + _TRAIN.format(scripts=str(SCRIPTS), work=str(work)))
    env = {k: v for k, v in os.environ.items() if k not in _portable_env()}
    free = subprocess.run([sys.executable, "-c", code, str(tmp_path / "f")], capture_output=True, text=True,
                          timeout=600, env=env)
    assert free.returncode == 0, free.stderr[-2000:]
    assert _sha(pinned / "model.safetensors") != _sha(tmp_path / "f" / "model.safetensors")
