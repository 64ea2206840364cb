"""Step 4: record the example model's routing on the bundled prompt set with ``expertcache collect``.

The exact command (run from the repository root)::

    expertcache collect models/example-moe \\
        --prompts src/expertcache/data/example_prompts.jsonl \\
        -o src/expertcache/data/example_model_trace --max-new-tokens 64

with ``OMP_NUM_THREADS=2`` (torch's CPU thread count: it changes floating-point sums, hence the gate
and probability bits, though not the routes; the shipped trace was recorded with 2, the default on
the 2-core machine that made it, so the recipe pins it for every machine).
Greedy decoding, chat template applied, at most 64 decode tokens per prompt so
the shipped trace stays small. The per-shard copies under ``shards/`` (the
unit of resume) are then removed: they repeat ``routes.parquet``. Afterwards the routing's skew and temporal
locality (:func:`expertcache.analysis.locality.routing_locality`) are printed
as JSON; docs/example_model.md quotes them.

Run alone: ``python scripts/example_model/record.py [--overwrite]``.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import portable  # sibling module: the CPU kernels every x86-64 machine runs alike

ROOT = Path(__file__).resolve().parents[2]
PROMPTS = ROOT / "src" / "expertcache" / "data" / "example_prompts.jsonl"
TRACE_DIR = ROOT / "src" / "expertcache" / "data" / "example_model_trace"
MAX_NEW_TOKENS = 64
#: torch CPU threads of the recording (OMP_NUM_THREADS); the shipped trace's bits depend on it.
RECORD_THREADS = 2


def command(model_dir: Path, out: Path, max_new_tokens: int = MAX_NEW_TOKENS) -> list[str]:
    """The ``expertcache collect`` argument list that records the trace."""
    exe = Path(sys.executable).with_name("expertcache")  # the console script of this environment
    head = [str(exe)] if exe.exists() else [sys.executable, "-c", "from expertcache.cli import main; main()"]
    return [*head, "collect", _rel(model_dir), "--prompts", _rel(PROMPTS), "-o", _rel(out),
            "--max-new-tokens", str(max_new_tokens)]


def _rel(path: Path) -> str:
    """``path`` relative to the repository root when inside it (the manifest then names no local paths)."""
    try:
        return str(Path(path).resolve().relative_to(ROOT))
    except ValueError:
        return str(path)


def locality(trace_dir: Path) -> dict:
    """Skew and temporal locality of the recorded decode routing, as a dict."""
    from expertcache.analysis.locality import routing_locality
    from expertcache.trace import read_trace

    return routing_locality(read_trace(trace_dir), n_shuffles=20, seed=0).to_dict()


def record(model_dir: Path, out: Path, max_new_tokens: int = MAX_NEW_TOKENS, overwrite: bool = False,
           prune_shards: bool = True) -> int:
    """Run the collection and print the locality figures; return the exit status.

    ``overwrite`` removes an existing ``out`` first (collect itself refuses to mix collections);
    ``prune_shards`` then deletes ``out/shards/`` (per-shard copies of the same rows, needed only to resume).
    """
    if overwrite and out.exists():
        shutil.rmtree(out)
    cmd = command(model_dir, out, max_new_tokens)
    env = {**portable.PORTABLE_ENV, "OMP_NUM_THREADS": str(RECORD_THREADS)}
    print("+", " ".join(f"{k}={v}" for k, v in env.items()), " ".join(cmd), flush=True)
    rc = subprocess.call(cmd, cwd=ROOT, env={**os.environ, **env})
    if rc == 0:
        if prune_shards and (out / "shards").is_dir():
            # The per-shard copies (the unit of crash-safe resume) duplicate routes.parquet; not shipped.
            shutil.rmtree(out / "shards")
        print(json.dumps(locality(out)), flush=True)
    return rc


if __name__ == "__main__":
    sys.exit(record(ROOT / "models" / "example-moe", TRACE_DIR, overwrite="--overwrite" in sys.argv))
