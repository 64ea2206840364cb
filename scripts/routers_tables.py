"""Measure the "Result on the project's example model" tables of docs/routers.md (CLR on the example model).

Runs the worked example of docs/routers.md end to end with today's code and protocol: split the bundled prompts
by id parity into 28 training and 28 held-out prompts, collect both with hidden states and router logits, train
one auxiliary-only Temporal Router per capacity ``B`` in 6, 8, 12, 16 (offline, from the training trace, logging
the held-out Hit), evaluate each with ``routers eval --reference`` for tie seeds 0-4, and train and evaluate the
full mode (``aux-full``, ``B = 8``) over pre-access budgets ``R`` 0-8. Every command runs in-process through the
command line, with ``--json``.

The raw results go to ``docs/data/routers_example.json`` with what they were measured on (the model's weights
sha256, versions, the commands); ``python scripts/docs_tables.py`` renders the tables from that file (the tables
``routers-temporal`` and ``routers-budget``), and ``tests/test_docs_tables.py`` checks the document against it.

Usage::

    python scripts/routers_tables.py [--model models/example-moe] [--work /tmp/clr_tables]

It needs the example model (``python scripts/example_model/make_all.py``) and the ``collect`` and ``routers``
extras; about 5-10 minutes on one CPU core.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts" / "example_model"))

import portable  # noqa: E402  (the example model's pinned CPU kernels, set before torch is imported)

portable.apply()

OUT = ROOT / "docs" / "data" / "routers_example.json"
PROMPTS = ROOT / "src" / "expertcache" / "data" / "example_prompts.jsonl"
CAPACITIES = (6, 8, 12, 16)
SEEDS = (0, 1, 2, 3, 4)
BUDGETS = (0, 2, 4, 6, 8)
TRAIN = ["--mode", "aux-temporal", "--tau", "0.03", "--lr", "3e-3", "--batch-size", "256", "--grad-accum", "1",
         "--epochs", "20"]


def _cli(args: list[str]) -> dict:
    from click.testing import CliRunner

    from expertcache.cli import main

    t0 = time.perf_counter()
    res = CliRunner().invoke(main, args)
    if res.exit_code != 0:
        raise SystemExit(f"expertcache {' '.join(args)} failed:\n{res.output}")
    print(f"  expertcache {' '.join(args)}  ({time.perf_counter() - t0:.0f} s)", file=sys.stderr)
    return json.loads(res.output.strip().splitlines()[-1])


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def split_prompts(work: Path) -> dict[str, Path]:
    """The training (even id) and held-out (odd id) halves of the bundled prompts."""
    recs = [json.loads(line) for line in PROMPTS.read_text().splitlines() if line.strip()]
    out = {}
    for name, parity in (("train", 0), ("heldout", 1)):
        p = work / f"clr_{name}.jsonl"
        p.write_text("".join(json.dumps(r) + "\n" for r in recs if int(r["id"].rsplit("-", 1)[1]) % 2 == parity))
        out[name] = p
    return out


def measure(model: Path, work: Path) -> dict:
    """Run the pipeline; return the raw results and their provenance."""
    import torch
    import transformers

    import expertcache

    portable.check()
    work.mkdir(parents=True, exist_ok=True)
    prompts = split_prompts(work)
    tr, ho = work / "clr_tr", work / "clr_ho"
    for p, out in ((prompts["train"], tr), (prompts["heldout"], ho)):
        _cli(["collect", str(model), "--prompts", str(p), "-o", str(out), "--max-new-tokens", "128",
              "--save-hidden", "--save-logits", "--json"])
    temporal = {}
    for b in CAPACITIES:
        ck = work / f"clr_ck{b}"
        train = _cli(["routers", "train", "--trace", str(tr), "--model", str(model), "--capacity", str(b), *TRAIN,
                      "--eval-trace", str(ho), "-o", str(ck), "--overwrite", "--json"])
        evals = [_cli(["routers", "eval", str(ck), "--trace", str(ho), "--capacity", str(b), "--reference",
                       "--seed", str(s), "--json"]) for s in SEEDS]
        temporal[str(b)] = {"train": train, "evals": evals}
    ckf = work / "clr_ckf8"
    train_full = _cli(["routers", "train", "--trace", str(tr), "--model", str(model), "--capacity", "8",
                       *[("aux-full" if a == "aux-temporal" else a) for a in TRAIN], "-o", str(ckf), "--overwrite",
                       "--json"])
    full = _cli(["routers", "eval", str(ckf), "--trace", str(ho), "--capacity", "8", "--budget", "6",
                 "--sweep-budget", ",".join(map(str, BUDGETS)), "--seed", "0", "--json"])
    return {
        "measured_with": "python scripts/routers_tables.py",
        "model_weights_sha256": _sha256(model / "model.safetensors"),
        "python": platform.python_version(), "torch": torch.__version__,
        "transformers": transformers.__version__, "expertcache": expertcache.__version__,
        "threads": torch.get_num_threads(), "kernels": dict(portable.PORTABLE_ENV),
        "train_options": TRAIN, "capacities": list(CAPACITIES), "seeds": list(SEEDS), "budgets": list(BUDGETS),
        "temporal": temporal, "full": {"train": train_full, "eval": full},
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", type=Path, default=ROOT / "models" / "example-moe")
    ap.add_argument("--work", type=Path, default=Path("/tmp/clr_tables"))
    ap.add_argument("-o", "--out", type=Path, default=OUT)
    a = ap.parse_args(argv)
    if not (a.model / "model.safetensors").is_file():
        print(f"{a.model}: no model.safetensors; build the example model first: "
              "python scripts/example_model/make_all.py", file=sys.stderr)
        return 2
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    res = measure(a.model, a.work)
    a.out.parent.mkdir(parents=True, exist_ok=True)
    tmp = a.out.with_suffix(".tmp")
    tmp.write_text(json.dumps(res, indent=1, sort_keys=True) + "\n")
    tmp.replace(a.out)
    print(f"wrote {a.out}; now run: python scripts/docs_tables.py", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
