"""Regenerate the bundled matched-arm example (src/expertcache/data/example_matched_trace + its labels).

    python scripts/make_matched_example.py [--model models/example-moe]

A probe set with a fixed-template control arm (``expertcache probe build --per-cell 4 --matched 2``: 4 archetypes
x 2 splits x 4 diverse records, 2 of each cell also rendered with the one fixed template) is collected through
the project's example model (``expertcache collect --max-new-tokens 48``; build the model first with
``python scripts/example_model/make_all.py``). Only the decode rows are kept (the prompts make the routes five
times larger and no matched-pair measurement reads them); the provenance says so. The labels (``request_id,
category, arm, source_id, split``) are written as JSON Lines beside the trace, so that
``expertcache audit``/``expertcache report`` with ``--labels`` measure B8 (matched-pair attribution) on it.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "src" / "expertcache" / "data"
sys.path.insert(0, str(ROOT / "scripts" / "example_model"))

import portable  # noqa: E402  (the recipe's pinned CPU kernels)
import record  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=str(ROOT / "models" / "example-moe"))
    ap.add_argument("--probes", default=None, help="an existing probe-set directory (skips the build)")
    ap.add_argument("--collected", default=None, help="its existing collection (skips the collect)")
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as d:
        probes = Path(a.probes) if a.probes else Path(d) / "probes"
        collected = Path(a.collected) if a.collected else Path(d) / "trace"
        cli = [sys.executable, "-c", "from expertcache.cli import main; main()"]
        if not a.probes:
            subprocess.run([*cli, "probe", "build", "-o", str(probes), "--per-cell", "4", "--matched", "2"],
                           check=True)
        if not a.collected:
            # the example trace's recording settings: the portable CPU kernels and two torch threads
            env = {**os.environ, **portable.PORTABLE_ENV, "OMP_NUM_THREADS": str(record.RECORD_THREADS)}
            subprocess.run([*cli, "collect", a.model, "--prompts", str(probes / "prompts.jsonl"), "-o",
                            str(collected), "--max-new-tokens", "48"], check=True, env=env)
        bundle(collected, probes / "labels.csv")
    return 0


def bundle(collected: Path, labels_csv: Path) -> None:
    """Keep the decode rows of ``collected`` and write the trace and its labels into the package data."""
    from expertcache.trace import DECODE, RoutingTrace, read_trace

    tr = read_trace(collected)
    keep = tr.phase == DECODE
    prov = {k: v for k, v in tr.provenance.items() if k != "shards"}       # the shards are not bundled
    prov.update(model="models/example-moe",               # the repository-relative path; config_sha256 names the build
                example="matched-arm probe set (fixed-template control arm), decode rows only",
                dropped=f"{int((~keep).sum())} prefill rows (not read by the matched-pair attribution)")
    out = RoutingTrace(tr.n_layers, tr.n_experts, tr.top_k, tr.request_ids, tr.request[keep], tr.phase[keep],
                       tr.position[keep], tr.experts[keep], None if tr.gates is None else tr.gates[keep],
                       tr.token_id[keep], prov)
    out.save(DATA / "example_matched_trace", overwrite=True)
    from expertcache.storage import MARKER

    (DATA / "example_matched_trace" / MARKER).unlink(missing_ok=True)   # the package data ships no output marker
    with open(labels_csv, encoding="utf-8", newline="") as fh:
        rows = list(csv.DictReader(fh))
    (DATA / "example_matched_labels.jsonl").write_text("".join(json.dumps(r, sort_keys=True) + "\n" for r in rows))
    n_fixed = int(np.sum([r["arm"] == "fixed" for r in rows]))
    print(f"wrote {DATA / 'example_matched_trace'} ({out.n_requests} requests, {n_fixed} in the fixed arm, "
          f"{out.n_tokens} decode tokens)", file=sys.stderr)


if __name__ == "__main__":
    sys.exit(main())
