"""Make the example MoE model and its routing trace, from nothing but this Python installation.

    python scripts/example_model/make_all.py            # the example model (72 min on one thread of a loaded 2-core machine)
    python scripts/example_model/make_all.py --quick    # a toy run of the whole pipeline (~1 min)

Steps (each in its own module beside this one):

1. ``corpus.py``    docstrings of a fixed list of standard-library modules -> chat exchanges (PSF licence)
2. ``tokenizer.py`` byte-level BPE, 4,096 tokens, ChatML chat template
3. ``train.py``     transformers ``Qwen3MoeForCausalLM`` trained with the load-balancing loss, seeded
4. ``record.py``    ``expertcache collect`` on the bundled prompt set -> the shipped trace

Outputs: ``models/example-moe/`` (weights, git-ignored; ``--quick``: ``models/example-moe-quick/``), the
intermediate files in ``models/work/``, and (not with ``--quick``) the trace
``src/expertcache/data/example_model_trace/``. See docs/example_model.md.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import replace
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path.insert(0, str(HERE))

import portable  # noqa: E402

portable.apply()  # before anything imports torch: the CPU kernels every x86-64 machine runs alike

import corpus  # noqa: E402
import record  # noqa: E402
import tokenizer  # noqa: E402
import train  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="tiny model, 30 steps, trace to models/ (a smoke test)")
    ap.add_argument("--models", type=Path, default=ROOT / "models", help="where model and work files go")
    ap.add_argument("--threads", type=int, default=1, help="torch CPU threads (changes bits, not statistics)")
    ap.add_argument("--steps", type=int, default=None, help="override the number of training steps")
    ap.add_argument("--skip-train", action="store_true", help="reuse an existing trained model")
    ap.add_argument("--skip-record", action="store_true", help="stop after training")
    ap.add_argument("--trace-out", type=Path, default=None,
                    help="trace directory (default: the package data dir; with --quick: models/example-trace-quick)")
    args = ap.parse_args(argv)

    work = args.models / ("work-quick" if args.quick else "work")
    model_dir = args.models / ("example-moe-quick" if args.quick else "example-moe")
    trace_out = args.trace_out or (args.models / "example-trace-quick" if args.quick else record.TRACE_DIR)
    cfg = train.QUICK if args.quick else train.TrainConfig()
    cfg = replace(cfg, threads=args.threads, **({"steps": args.steps} if args.steps else {}))

    if not args.skip_train:
        man = corpus.extract(work)
        print(f"[1/4] corpus: {man['n_exchanges']} exchanges, {man['n_chars']} chars, sha256 {man['sha256'][:12]}")
        if man["deviations"]:
            print(f"      differs from the documented corpus ({str(man['documented_sha256'])[:12]}) in "
                  f"{len(man['deviations'])} module(s): {', '.join(man['deviations'])}")
        tokenizer.train_tokenizer(work / "corpus.jsonl", work / "tokenizer")
        print(f"[2/4] tokenizer: {work / 'tokenizer'}")
        summary = train.train(work / "corpus.jsonl", work / "tokenizer", model_dir, cfg,
                              corpus_sha256=man["sha256"])
        print("[3/4] model:", json.dumps({k: summary[k] for k in ("n_parameters", "first_logged_loss",
              "last_logged_loss", "heldout_loss_before", "heldout_loss_after", "train_seconds")}))
    if args.skip_record:
        return 0
    max_new = 16 if args.quick else record.MAX_NEW_TOKENS
    rc = record.record(model_dir, trace_out, max_new_tokens=max_new, overwrite=True)
    print(f"[4/4] trace: {trace_out}" if rc == 0 else f"[4/4] recording failed (exit {rc})")
    return rc


if __name__ == "__main__":
    sys.exit(main())
