"""Replay predicts execution: the equality matrix of docs/execute.md (needs torch).

For every model, batch ``B``, capacity, contract and policy, the executor runs the prompts with its
experts offloaded, and :func:`expertcache.replay.replay` replays the stream rebuilt from the trace the
executor recorded (:func:`~expertcache.execute.stream.executed_stream`), under the matching semantics
(fused -> event-atomic, serialized -> sequential-ascending). A case passes when hits, misses and initial
load agree in **every layer**.

Inputs per (model, B): the unmodified model's run of the same prompts is the "earlier recording" that
belady / belady-forced take their next uses from; a second, disjoint prompt set run the same way is the
static policy's calibration stream; the predicted-next-use advice is the recording's true next use
perturbed by a seeded integer noise (so it is a wrong predictor, and replay must still agree).

Regenerate the table of docs/execute.md::

    python -m expertcache.execute.equality --markdown            # tiny models + the example model
    python -m expertcache.execute.equality --quick               # the fast subset the test suite runs
    python -m expertcache.execute.equality --exactness           # logits vs the unmodified model, per kernel
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from ..storage import json_text
from .config import ExecuteConfig
from .controller import NEVER

__all__ = ["EqualityRow", "MatrixSpec", "run_matrix", "noisy_advice", "markdown_table", "exactness", "TINY_SPEC", "QUICK_SPEC",
           "EXAMPLE_SPEC", "ALL_POLICIES"]

ALL_POLICIES = ("lru", "least-stale", "lfu", "lfru", "lrfu", "demand", "static", "belady", "belady-forced",
                "predicted-next-use")


@dataclass(frozen=True)
class EqualityRow:
    """One case: executor vs replay, per layer."""

    model: str
    batch: int
    rho: float
    contract: str
    policy: str
    capacity: tuple[int, ...]
    max_event: int                 # largest event |E(s,l)| of the run: > capacity means events exceed the quota
    executed: tuple[int, ...]      # transferred per layer (misses + initial load)
    replayed: tuple[int, ...]
    executed_hits: tuple[int, ...]
    replayed_hits: tuple[int, ...]
    prefill_misses: int
    decode_misses: int
    copies: int                    # copies the device tier performed
    tokens_equal_reference: bool

    @property
    def equal(self) -> bool:
        """Hits and transfers equal in every layer, and every counted transfer was a real copy."""
        return (self.executed == self.replayed and self.executed_hits == self.replayed_hits
                and self.copies == sum(self.executed))

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "equal": self.equal}


@dataclass(frozen=True)
class MatrixSpec:
    """Which cases to run."""

    models: tuple[str, ...]
    batches: tuple[int, ...] = (1, 4, 8)
    rhos: tuple[float, ...] = (0.25, 0.5, 0.75)
    contracts: tuple[str, ...] = ("fused", "serialized")
    policies: tuple[str, ...] = ALL_POLICIES
    max_new_tokens: int = 6
    example_prompts: int = 8       # the example model runs the first this many bundled prompts


TINY = ("qwen3_moe", "olmoe", "mixtral", "qwen2_moe", "granitemoe", "deepseek_v3", "gpt_oss")
TINY_SPEC = MatrixSpec(models=TINY)
EXAMPLE_SPEC = MatrixSpec(models=("example",), rhos=(0.125, 0.25, 0.5), max_new_tokens=16)
#: The subset the default test suite runs (the full matrix is in the slow set and the docs table).
QUICK_SPEC = MatrixSpec(models=("qwen3_moe", "olmoe", "mixtral"), batches=(4,), rhos=(0.25,))


def noisy_advice(stream: Any, seed: int = 0, spread: int = 3) -> Any:
    """Advice whose next use is the true one plus uniform integer noise in ``[-spread, spread]``.

    Kept strictly after the access's own event; "never again" stays ``NEVER``. A deliberately
    imperfect predictor for predicted-next-use.
    """
    from ..nextuse import Advice

    units = [(int(stream.layer[i]), stream.members(i).tolist()) for i in range(stream.n_events)]
    nxt = np.empty(stream.union, dtype=np.int64)
    seen: dict[int, int] = {}
    a = stream.union
    for i in range(stream.n_events - 1, -1, -1):
        layer, members = units[i]
        for e in reversed(members):
            a -= 1
            b = layer * stream.n_experts + e
            nxt[a] = seen.get(b, NEVER)
            seen[b] = i
    ev = stream.event_of_access
    rng = np.random.default_rng(seed)
    noise = rng.integers(-spread, spread + 1, size=nxt.shape[0])
    out = np.where(nxt == NEVER, NEVER, np.maximum(ev + 1, nxt + noise))
    return Advice(next_use=out.astype(np.int32), provenance={"predictor": f"true next use + U[-{spread},{spread}]",
                                                             "seed": seed})


def _model_factory(name: str, n_example_prompts: int) -> tuple[Callable[[], Any], list[list[int]], list[list[int]],
                                                                list[int]]:
    """``(make_model, prompts, calibration prompts, eos ids)`` of a matrix model."""
    if name == "example":
        from ..collect import CollectConfig, read_prompts
        from ..collect.runner import encode_prompt, load_tokenizer, load_weights
        from .example import example_model_dir, example_prompts

        mdir = str(example_model_dir())
        ccfg = CollectConfig()
        tok = load_tokenizer(mdir, ccfg)
        recs = read_prompts(example_prompts())
        enc = [encode_prompt(tok, r, ccfg)[0] for r in recs]
        eos = [int(tok.eos_token_id)]
        return (lambda: load_weights(mdir, ccfg)), enc[:n_example_prompts], \
            enc[n_example_prompts:2 * n_example_prompts], eos
    from .tiny import make_model, prompt_ids

    return (lambda: make_model(name)), prompt_ids(), prompt_ids([6, 2, 11, 4, 8, 3])[::-1], [1]


def run_matrix(spec: MatrixSpec, progress: Callable[[str], None] | None = None) -> list[EqualityRow]:
    """Run every case of ``spec``; one :class:`EqualityRow` each."""
    from .run import replay_prediction
    from .runner import Executor
    from .stream import executed_stream

    rows: list[EqualityRow] = []
    for name in spec.models:
        make, prompts, calib_prompts, eos = _model_factory(name, spec.example_prompts)
        ids = [f"r{i}" for i in range(len(prompts))]
        model = make()
        for B in spec.batches:
            base = ExecuteConfig(batch=B, max_new_tokens=spec.max_new_tokens)
            ref = Executor(model, base, eos_token_ids=eos, offload=False).run(prompts, ids)
            calib_trace = Executor(model, base, eos_token_ids=eos, offload=False).run(
                calib_prompts, [f"c{i}" for i in range(len(calib_prompts))]).trace
            calibration = executed_stream(calib_trace, B).stream
            advice_stream = executed_stream(ref.trace, B).stream
            advice = noisy_advice(advice_stream, seed=B)
            for rho in spec.rhos:
                for contract in spec.contracts:
                    for policy in spec.policies:
                        if policy == "predicted-next-use" and contract != "fused":
                            continue
                        cfg = ExecuteConfig(policy=policy, rho=rho, contract=contract, batch=B,
                                            max_new_tokens=spec.max_new_tokens)
                        t0 = time.perf_counter()
                        ex = Executor(model, cfg, eos_token_ids=eos, calibration=calibration,
                                      advice_stream=advice_stream, advice=advice)
                        try:
                            res = ex.run(prompts, ids)
                        finally:
                            ex.restore()
                        pred, exs = replay_prediction(res, calibration, advice if policy == "predicted-next-use"
                                                      else None)
                        max_event = int(np.diff(exs.stream.offsets).max())
                        row = EqualityRow(
                            name, B, rho, contract, policy, tuple(x.capacity for x in res.per_layer), max_event,
                            tuple(x.transferred for x in res.per_layer),
                            tuple(p.demand_misses + p.initial_load for p in pred.per_layer),
                            tuple(x.hits for x in res.per_layer), tuple(p.hits for p in pred.per_layer),
                            sum(x.prefill_misses for x in res.per_layer), sum(x.decode_misses for x in res.per_layer),
                            res.transfers_copied, res.generated == ref.generated)
                        rows.append(row)
                        if progress:
                            progress(f"{name} B={B} rho={rho} {contract} {policy}: {sum(row.executed)} vs "
                                     f"{sum(row.replayed)} {'equal' if row.equal else 'DIFFERENT'} "
                                     f"({time.perf_counter() - t0:.1f}s)")
        del model
    return rows


def markdown_table(rows: Sequence[EqualityRow]) -> str:
    """The docs table: per (model, contract, policy), executed transfers at every (B, rho); ``x≠y`` marks a mismatch."""
    cells = sorted({(r.batch, r.rho) for r in rows})
    head = "| model | contract | policy | " + " | ".join(f"B={b} ρ={rho:g}" for b, rho in cells) + " |"
    sep = "|" + "---|" * (3 + len(cells))
    lines = [head, sep]
    keys: list[tuple[str, str, str]] = []
    for r in rows:
        k = (r.model, r.contract, r.policy)
        if k not in keys:
            keys.append(k)
    by = {(r.model, r.contract, r.policy, r.batch, r.rho): r for r in rows}
    for m, c, p in keys:
        vals = []
        for b, rho in cells:
            r = by.get((m, c, p, b, rho))
            if r is None:
                vals.append("")
            else:
                e, x = sum(r.executed), sum(r.replayed)
                vals.append(str(e) if r.equal else f"{e}≠{x}")
        lines.append(f"| {m} | {c} | {p} | " + " | ".join(vals) + " |")
    n_eq = sum(r.equal for r in rows)
    exceed = sum(r.max_event > min(r.capacity) for r in rows)
    lines.append("")
    lines.append(f"{len(rows)} cases, {n_eq} equal layer by layer (hits and transfers), "
                 f"{sum(r.tokens_equal_reference for r in rows)} with tokens equal to the unmodified model's; "
                 f"{exceed} with an event larger than the smallest per-layer quota.")
    return "\n".join(lines)


def exactness(models: Sequence[str] = ("qwen3_moe", "olmoe", "mixtral", "example"), batch: int = 4,
              rho: float = 0.25, max_new_tokens: int = 6) -> list[dict[str, Any]]:
    """Largest |logit difference| executor vs unmodified model, per experts kernel and contract (fp32, CPU).

    ``example`` runs the example model on its first 8 bundled prompts (skipped when its weights are absent).
    """
    from .runner import Executor

    out = []
    for name in models:
        try:
            make, prompts, _, eos = _model_factory(name, 8)
        except Exception:   # the example model's weights are not installed
            continue
        ids = [f"r{i}" for i in range(len(prompts))]
        for impl in ("eager", "batched_mm", "grouped_mm"):
            base = ExecuteConfig(batch=batch, max_new_tokens=max_new_tokens, experts_implementation=impl)
            ref = Executor(make(), base, eos_token_ids=eos, offload=False, keep_logits=True).run(prompts, ids)
            for contract in ("fused", "serialized"):
                cfg = ExecuteConfig(rho=rho, batch=batch, max_new_tokens=max_new_tokens, contract=contract,
                                    experts_implementation=impl)
                res = Executor(make(), cfg, eos_token_ids=eos, keep_logits=True).run(prompts, ids)
                diff = max(float((a - b).abs().max()) for a, b in zip(res.logits, ref.logits, strict=True))
                out.append({"model": name, "kernel": impl, "contract": contract, "max_abs_diff": diff,
                            "tokens_equal": res.generated == ref.generated})
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="the fast subset of the test suite")
    ap.add_argument("--models", default=None, help="comma list (tiny architectures and/or 'example')")
    ap.add_argument("--markdown", action="store_true", help="print the docs table")
    ap.add_argument("--json", dest="json_out", default=None, help="also write every row as JSON Lines")
    ap.add_argument("--exactness", action="store_true", help="print max |logit diff| per kernel and contract")
    args = ap.parse_args(argv)
    import torch

    torch.set_num_threads(1)
    if args.exactness:
        print("| model | kernel | fused | serialized |\n|---|---|---|---|")
        rows = exactness()
        for i in range(0, len(rows), 2):
            a, b = rows[i], rows[i + 1]
            fmt = lambda r: "bit-exact" if r["max_abs_diff"] == 0 else f"{r['max_abs_diff']:.2g}"  # noqa: E731
            print(f"| {a['model']} | {a['kernel']} | {fmt(a)} | {fmt(b)} |")
        return 0
    specs = [QUICK_SPEC] if args.quick else [TINY_SPEC, EXAMPLE_SPEC]
    if args.models:
        wanted = args.models.split(",")
        specs = [MatrixSpec(**{**asdict(s), "models": tuple(m for m in s.models if m in wanted)}) for s in specs]
    rows: list[EqualityRow] = []
    tables = []
    for s in specs:
        if s.models:
            part = run_matrix(s, progress=lambda msg: print(msg, file=sys.stderr, flush=True))
            rows += part
            tables.append(markdown_table(part))
    if args.json_out:
        with open(args.json_out, "w") as fh:
            for r in rows:
                fh.write(json_text(r.to_dict()) + "\n")
    if args.markdown:
        print("\n\n".join(tables))
    return 0 if all(r.equal for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
