"""The example model's corpus rebuilds byte for byte, whatever else is installed or imported (issue 18).

The documented sha256 (docs/example_model.md) is the independent reference: it was computed by the
build that trained the shipped weights, before this extraction was isolated. The corpus depends on
the Python build's docstrings, so the hash is checked only on the build that recorded it.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPTS = ROOT / "scripts" / "example_model"
RECIPE = json.loads((SCRIPTS / "corpus_sha256.json").read_text())
DOCUMENTED = "6481b891ec6c729fc45ec1e96f73624de71ba64a364bc546fef3672179197ef5"

same_build = pytest.mark.skipif(
    sys.version != RECIPE["python"],
    reason=f"the documented corpus was extracted with Python {RECIPE['python']!r}; this is {sys.version!r} "
           "(another build may have other docstrings)")


def _corpus():
    sys.path.insert(0, str(SCRIPTS))
    try:
        import corpus
    finally:
        sys.path.remove(str(SCRIPTS))
    return corpus


def test_recipe_and_docs_name_the_same_hash():
    assert RECIPE["sha256"] == DOCUMENTED
    assert DOCUMENTED in (ROOT / "docs" / "example_model.md").read_text()
    assert sorted(RECIPE["modules"]) == sorted(_corpus().MODULES)


@same_build
def test_corpus_hash_with_torch_and_transformers_imported_first(tmp_path):
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    import torch  # noqa: F401  (patches inspect.getfile)
    import transformers.utils.logging  # noqa: F401  (adds methods to logging.Logger)

    m = _corpus().extract(tmp_path)
    got = hashlib.sha256((tmp_path / "corpus.jsonl").read_bytes()).hexdigest()
    assert got == m["sha256"] == DOCUMENTED
    assert m["deviations"] == []
    assert m["n_exchanges"] == RECIPE["n_exchanges"]


@same_build
def test_corpus_hash_from_another_interpreter_path_without_site(tmp_path):
    # the same build reached through another path, outside any venv, with -S: the interpreter path
    # (platform.architecture's default) and site's builtins used to change the text
    exe = tmp_path / "bin" / "python3"
    exe.parent.mkdir()
    os.symlink(os.path.realpath(sys.executable), exe)
    code = (f"import sys; sys.path.insert(0, {str(SCRIPTS)!r}); import corpus, pathlib, json; "
            f"print(json.dumps(corpus.extract(pathlib.Path({str(tmp_path / 'out')!r}))))")
    p = subprocess.run([str(exe), "-S", "-c", code], capture_output=True, text=True, check=True)
    m = json.loads(p.stdout)
    assert m["sha256"] == DOCUMENTED and m["deviations"] == []


def test_deviations_name_the_module():
    corpus = _corpus()
    recipe = {"modules": {"abc": "1", "json": "2", "os": "3"}}
    assert corpus.deviations({"abc": "1", "json": "x", "os": "3"}, recipe) == ["json"]
    assert corpus.deviations({"abc": "1", "json": "2"}, recipe) == ["os"]
    assert corpus.deviations(dict(recipe["modules"]), recipe) == []
