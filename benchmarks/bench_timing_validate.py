"""Does the calibrated timing model predict the executor? Measured against predicted time per step.

    python benchmarks/bench_timing_validate.py --model models/example-moe --threads 1

1. ``calibrate`` (``expertcache timing calibrate``, src/expertcache/execute/calibrate.py) on this machine:
   the executor at ``c = N`` at the calibration batch sizes, the link from timed copies; or ``--profile P``.
2. For every batch size x capacity x policy (default B in {4, 8}, rho in {0.25, 0.5}, lru and static), the
   executor runs the prompts (fused contract, per-layer quota; ``static`` pins what the ``lru`` run of the
   same cell routed most) and its own timings give the **measured** median time per decode step (the
   forward spans of ``timings.parquet``); ``simulate`` of the stream the run recorded (``executed_stream``
   of its trace, the run's capacities, policy and seed) gives the **predicted** median over the same decode
   steps. Also the mean over all forwards, prefill included. The transfers of both sides are checked equal.

Everything runs ``--rounds`` times, the calibration and then every cell in a rotating order, so that on a
machine shared with other work the profile and the measured steps see the same stretch of load: the spans of
all rounds are pooled into one fit, and a cell's measured median is over the decode steps of all its rounds
(greedy decoding repeats the run exactly; checked). ``--clock cpu`` times CPU spans with the thread's CPU time
instead of wall time (calibration and runs alike).

Prints one row per cell with the relative error ``predicted / measured - 1``; ``--json`` writes the rows,
the profile and the settings to a file. Target (issue 20): within 15% in every cell.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default=None, help="model directory [default: the example model]")
    ap.add_argument("--prompts", default=None, help="prompts JSONL [default: the bundled example prompts]")
    ap.add_argument("--batch", default="4,8", help="batch sizes of the validation runs")
    ap.add_argument("--rho", default="0.25,0.5", help="residency fractions of the validation runs")
    ap.add_argument("--policy", default="lru,static")
    ap.add_argument("--calib-batch", default="1,8", help="batch sizes of the calibration runs")
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--calib-max-new-tokens", type=int, default=32)
    ap.add_argument("--threads", type=int, default=1, help="torch CPU threads (calibration and runs)")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--clock", default="wall", choices=["wall", "cpu"],
                    help="CPU span clock of calibration and runs: wall time, or the thread's CPU time")
    ap.add_argument("--profile", default=None, help="use this profile JSON instead of calibrating")
    ap.add_argument("--profile-out", default=None, help="also save the calibrated profile here")
    ap.add_argument("--rounds", type=int, default=3,
                    help="calibration + every cell, repeated; spans and step times pooled over the rounds")
    ap.add_argument("--json", dest="json_out", default=None, help="write rows, profile and settings here")
    args = ap.parse_args(argv)

    import numpy as np
    import torch
    from transformers.utils import logging as hf_logging

    from expertcache.collect import CollectConfig, read_prompts
    from expertcache.collect.runner import encode_prompt, load_tokenizer, load_weights
    from expertcache.execute.calibrate import CalibrateConfig, measure_spans, profile_from_spans
    from expertcache.execute.config import ExecuteConfig
    from expertcache.execute.example import example_model_dir, example_prompts
    from expertcache.execute.runner import Executor, _eos_ids
    from expertcache.execute.stream import executed_stream
    from expertcache.replay import ReplayConfig
    from expertcache.timing import load_profile, save_profile, simulate
    from expertcache.timing.calibrate import CalibrationSpans

    hf_logging.disable_progress_bar()

    model = args.model or str(example_model_dir())
    prompts = args.prompts or str(example_prompts())
    groups = [(int(b), float(r)) for b in args.batch.split(",") for r in args.rho.split(",")]
    policies = args.policy.split(",")
    if "static" in policies and policies[0] == "static":
        raise SystemExit("static pins what the cell's first policy routed: list another policy before it")
    cc = CalibrateConfig(batches=tuple(int(x) for x in args.calib_batch.split(",")),
                         max_new_tokens=args.calib_max_new_tokens, device=args.device, threads=args.threads,
                         clock=args.clock, rounds=args.rounds)
    ccfg = CollectConfig(max_new_tokens=args.max_new_tokens, dtype="auto")
    tok = load_tokenizer(model, ccfg)
    records = read_prompts(prompts)
    encoded = [encode_prompt(tok, r, ccfg)[0] for r in records]
    ids = [r.request_id for r in records]
    t0 = time.perf_counter()
    parts, info = [], {}
    runs: dict[tuple, dict] = {}      # (B, rho, policy) -> stream, calibration, per-round forward times
    for rnd in range(args.rounds):
        if not args.profile:
            spans, info = measure_spans(model, prompts, cc)
            parts.append(spans)
        torch.set_num_threads(args.threads)
        k = rnd % len(groups)
        for B, rho in groups[k:] + groups[:k]:          # the cell order rotates from round to round
            for policy in policies:
                cfg = ExecuteConfig(policy=policy, rho=rho, batch=B, max_new_tokens=args.max_new_tokens,
                                    device=args.device)
                calib = runs[(B, rho, policies[0])]["stream"] if policy == "static" else None
                m = load_weights(model, CollectConfig(dtype="auto"))
                res = Executor(m, cfg, eos_token_ids=_eos_ids(m, tok), calibration=calib,
                               clock=args.clock).run(encoded, ids)
                t = res.timings
                fwd = t["kind"] == "forward"
                order = t["forward"][fwd].argsort()
                cell = runs.setdefault((B, rho, policy), {"cfg": cfg, "calib": calib, "times": [],
                                                          "transferred": res.transferred})
                if "stream" not in cell:
                    ex = executed_stream(res.trace, B, cfg.offsets)
                    cell.update(stream=ex.stream, phase=t["phase"][fwd][order])
                if res.transferred != cell["transferred"]:
                    raise SystemExit(f"B={B} rho={rho} {policy}: round {rnd + 1} transferred {res.transferred}, "
                                     f"round 1 {cell['transferred']} (the runs must repeat)")
                cell["times"].append(t["ns"][fwd][order] / 1e9)
                del m, res
        print(f"round {rnd + 1}/{args.rounds} done [{time.perf_counter() - t0:.0f} s]", file=sys.stderr)
    if args.profile:
        profile = load_profile(args.profile)
    else:
        profile = profile_from_spans(CalibrationSpans.concat(parts), info, cc, model)
        if args.profile_out:
            save_profile(profile, args.profile_out)
    print(f"profile: {profile.source}")
    link = profile.extra.get("fit", {}).get("link", {})
    print(f"link: {profile.bandwidth / 1e9:.2f} GB/s, {profile.latency_s * 1e6:.2f} us per transfer (the executor's "
          f"copy path), standalone intercept {link.get('standalone_latency_s', float('nan')) * 1e6:.2f} us; "
          f"overlap {profile.overlap}")
    print(f"{'B':>2s} {'rho':>5s} {'policy':7s} {'transfers':>9s} {'measured ms':>11s} {'rounds min-max':>15s} "
          f"{'predicted ms':>12s} {'error':>7s} {'mean meas':>9s} {'mean pred':>9s} {'error':>7s}")
    rows = []
    for (B, rho, policy), cell in runs.items():
        cfg, stream = cell["cfg"], cell["stream"]
        caps = cfg.capacities(stream.n_layers, stream.n_experts)
        rcfg = ReplayConfig(policy=policy, scope=cfg.scope, tie_break=cfg.tie_break, seed=cfg.seed,
                            lrfu_lambda=cfg.lrfu_lambda, capacity=tuple(caps))
        sim = simulate(stream, rcfg, profile, calibration=cell["calib"])
        if sim.transferred != cell["transferred"]:
            raise SystemExit(f"B={B} rho={rho} {policy}: simulate transferred {sim.transferred}, the executor "
                             f"{cell['transferred']}")
        tl = sim.timeline
        pred_all = tl.step_end - tl.step_start
        dec = cell["phase"] == 1
        step_dec = dec[tl.step]     # the stream's step is the forward index
        times = np.stack(cell["times"])                       # rounds x forwards
        if times.shape[1] != pred_all.shape[0]:
            raise SystemExit(f"{pred_all.shape[0]} simulated steps, {times.shape[1]} forwards")
        meas = float(np.median(times[:, dec]))
        per_round = [float(np.median(x[dec])) for x in times]
        pred = float(np.median(pred_all[step_dec]))
        row = {"batch": B, "rho": rho, "policy": policy, "capacity_total": sim.capacity_total,
               "transferred": cell["transferred"], "decode_steps": int(dec.sum()), "forwards": int(dec.shape[0]),
               "rounds": len(per_round), "measured_median_s": meas, "measured_round_medians_s": per_round,
               "predicted_median_s": pred, "error": pred / meas - 1,
               "measured_mean_s": float(times.mean()), "predicted_mean_s": float(pred_all.mean()),
               "error_mean": float(pred_all.mean() / times.mean() - 1)}
        rows.append(row)
        print(f"{B:2d} {rho:5.2f} {policy:7s} {cell['transferred']:9d} {meas * 1e3:11.3f} "
              f"{min(per_round) * 1e3:7.3f}-{max(per_round) * 1e3:7.3f} {pred * 1e3:12.3f} {row['error']:+7.1%} "
              f"{row['measured_mean_s'] * 1e3:9.3f} {row['predicted_mean_s'] * 1e3:9.3f} {row['error_mean']:+7.1%}")
    worst = max(abs(r["error"]) for r in rows)
    print(f"worst |error| of the median decode step: {worst:.1%} (target 15%); {time.perf_counter() - t0:.0f} s")
    if args.json_out:
        Path(args.json_out).write_text(json.dumps({"rows": rows, "profile": profile.to_dict(),
                                                   "settings": vars(args)}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
