"""``expertcache affinity`` and ``expertcache experiment``: the scoped §8–§9 experiments."""

from __future__ import annotations

import click

from .main import (
    _csv,
    _echo_json,
    _fail,
    _guard,
    _jobs,
    _working,
    main,
    read_calibration,
    read_calibration_input,
)

_TIE = click.option("--tie-break", type=click.Choice(["random", "id"]), default="random", show_default=True,
                    help="Ties between equal policy keys: a seeded random rank per block, or the block id.")
_SEED = click.option("--seed", type=int, default=0, show_default=True, help="Tie seed (--tie-break random).")


def _warn(scope: dict) -> None:
    """Print the scope's warnings after the table (in JSON they are the scope's ``warnings`` list)."""
    for w in scope.get("warnings") or []:
        click.echo(f"WARNING: {w}")


@main.command("affinity")
@click.argument("trace_dir", type=click.Path())
@click.option("--admitted", "-A", type=int, default=24, show_default=True, help="Admitted sessions.")
@click.option("--batch", "-B", type=int, default=8, show_default=True, help="Sessions served per step.")
@click.option("--window", "-W", type=int, default=4, show_default=True, help="Max steps between services.")
@click.option("--rho", type=float, default=0.4, show_default=True)
@click.option("--policy", "policies", default="lfru,static", show_default=True, callback=_csv(str, "policies"),
              help="'static' is frozen (pin list fitted once on the calibration requests, §8.3); "
                   "'static-same-trace' is the diagnostic refitted on each scheduler's trajectory.")
@click.option("--calibration", type=click.Path(), default=None,
              help="Trace or stream the frozen 'static' pin list is fitted on [default: the even requests of "
                   "TRACE_DIR under FCFS at -B; the odd ones are evaluated].")
@click.option("--best-of", "n_draws", type=int, default=300, show_default=True,
              help="Draws for the per-step best-of-N estimate (§8.4), 0 to skip.")
@_TIE
@_SEED
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
@_guard
def affinity_cmd(trace_dir: str, admitted: int, batch: int, window: int, rho: float, policies: list[str],
                 calibration: str | None, n_draws: int, tie_break: str, seed: int, as_json: bool) -> None:
    """Affinity batching under deadline rotation on complete trajectories (Table 18 shape, §8.3-§8.4).

    dp99 is the relative change (causal vs FCFS scheduler) of the p99 of blocks demand-missed per step, per
    policy (the miss-burst tail, in blocks); 'latency dp99' is the schedule's p99 request-latency proxy in
    steps, the same for every policy.
    """
    import numpy as np

    from ..events import build_events
    from ..events.rotation import RotationConfig, best_of_n_estimate
    from ..experiment.scoped import (
        SHARE_MIN_GAIN,
        affinity_experiment,
        scope_block,
        small_trace_warnings,
    )
    from ..replay import ReplayConfig
    from ..trace import read_trace, select_requests

    cfg = RotationConfig(admitted, batch, window)
    for p in policies:
        ReplayConfig(p, rho=rho, tie_break=tie_break, seed=seed)
    full = read_trace(trace_dir)
    calib, trace, fit = None, full, "n/a (no frozen 'static' policy requested)"
    if "static" in policies:
        if calibration:
            calib = read_calibration(calibration, batch)
            fit = f"frozen: pin list fitted once on {calibration}, used on every trajectory"
        else:
            idx = np.arange(full.n_requests)
            trace = select_requests(full, idx[1::2], "odd requests (evaluated)")
            calib = build_events(select_requests(full, idx[0::2], "even requests (calibration)"), batch)
            fit = (f"frozen: pin list fitted once on the {len(idx[0::2])} even requests (FCFS, B = {batch}), "
                   f"used on every trajectory of the {trace.n_requests} odd requests")
    if "static-same-trace" in policies:
        fit += "; static-same-trace: diagnostic, refitted on each scheduler's own trajectory"
    with _working("affinity: replaying every scheduler"):
        rows, stats = affinity_experiment(trace, cfg, rho, tuple(policies), calibration=calib, tie_break=tie_break,
                                          seed=seed)
        bound = best_of_n_estimate(trace, cfg, n_draws) if n_draws > 0 else None
    scope = scope_block(trace, rho, f"B = {batch}", f"rotation, {admitted} admitted, {batch} served",
                        f"W = {window} (max inter-service interval)")
    scope["replay"] = "event-atomic, full trajectories"
    scope["static_protocol"] = fit
    scope["tie_break"] = f"{tie_break} (seed {seed})" if tie_break == "random" else tie_break
    scope["dp99"] = "p99 (nearest rank) of blocks demand-missed per step, causal vs FCFS, per policy"
    scope["share"] = f"causal gain / oracle gain; n/a when |oracle gain| < {SHARE_MIN_GAIN:.1%}"
    scope["warnings"] = small_trace_warnings(trace, batch, admitted)
    if _scoped(scope, as_json, {"rows": [r.to_dict() for r in rows],
                                "stats": {k: v.to_dict() for k, v in stats.items()}, "best_of_n_upper_bound": bound}):
        return
    click.echo(f"{'policy':18s} {'FCFS':>8s} {'causal':>8s} {'oracle':>8s} {'causal gain':>12s} {'oracle gain':>12s}"
               f" {'share':>8s} {'dp99':>8s} {'latency dp99':>13s}")
    for r in rows:
        share = "n/a" if r.share is None else f"{r.share:.1%}"
        dp = "n/a" if r.delta_p99_causal is None else f"{r.delta_p99_causal:+.2%}"
        click.echo(f"{r.policy:18s} {r.fcfs:8.2%} {r.causal:8.2%} {r.oracle:8.2%} {r.causal_gain:12.2%} "
                   f"{r.oracle_gain:12.2%} {share:>8s} {dp:>8s} {r.delta_latency_p99_causal:+13.2%}")
    for name, st in stats.items():
        click.echo(f"  {name:22s} mean batch {st.mean_batch:.2f}, max interval {st.max_interval}, "
                   f"violations {st.deadline_violations}, p99 latency {st.p99_latency_steps:.1f} steps; p99 blocks "
                   "missed per step " + ", ".join(f"{r.policy} {r.p99_blocks[name]:g}" for r in rows))
    if bound is not None:
        click.echo(f"per-step best-of-{n_draws} union reduction: {bound:.2%} -- an UPPER BOUND from single-step "
                   "order statistics (§8.4), not an achievable gain; compare the trajectory gains above")
    _warn(scope)


def _scoped(scope: dict, as_json: bool, payload: dict) -> bool:
    """Print ``{"scope": ..., **payload}`` as JSON (True: done) or the D4 scope line before a table (False)."""
    if as_json:
        _echo_json({"scope": scope, **payload})
        return True
    click.echo("scope: " + "; ".join(f"{k} {v}" for k, v in scope.items()))
    return False


@main.group()
def experiment() -> None:
    """Scoped experiments (§9): each prints its scope block (model, rho, concurrency, discipline, fairness)."""


def _split_trace(trace_dir: str, calibration: str | None):
    """The evaluated trace and its calibration: a separate trace, or the even/odd requests of one."""
    import numpy as np

    from ..trace import read_trace, select_requests

    trace = read_trace(trace_dir)
    if calibration:
        cal = read_calibration_input(calibration)
        from ..events import EventStream

        what = ("calibration stream (its own B, at every B) " if isinstance(cal, EventStream)
                else "calibration trace ")
        return trace, cal, what + calibration
    idx = np.arange(trace.n_requests)
    return (select_requests(trace, idx[1::2], "odd requests"), select_requests(trace, idx[0::2], "even requests"),
            "even requests of the same trace (disjoint from the evaluated odd ones)")


@experiment.command("static-vs-dynamic")
@click.argument("trace_dir", type=click.Path())
@click.option("--calibration", type=click.Path(), default=None,
              help="Calibration trace or stream for the pin list (default: even requests; odd ones are evaluated).")
@click.option("--batch", "-B", "batches", default="2,4,8,16", show_default=True, callback=_csv(int, "integers"),
              help="Comma list of concurrencies B.")
@click.option("--rho", type=float, default=0.4, show_default=True)
@_TIE
@_SEED
@click.option("--json", "as_json", is_flag=True)
@_guard
def experiment_static(trace_dir: str, calibration: str | None, batches: list[int], rho: float,
                      tie_break: str, seed: int, as_json: bool) -> None:
    """Static pinned (calibration-frozen) vs LFRU and Belady across concurrency (Table 19 shape)."""
    from ..experiment.scoped import static_vs_dynamic
    from ..replay import ReplayConfig

    ReplayConfig(rho=rho)
    trace, calib, fit = _split_trace(trace_dir, calibration)
    with _working("static vs dynamic"):
        rows, scope = static_vs_dynamic(trace, calib, batches, rho, tie_break, seed)
    scope["static_fit_source"] = fit
    if _scoped(scope, as_json, {"rows": [r.to_dict() for r in rows]}):
        return
    click.echo(f"{'B':>4s} {'static':>9s} {'LFRU':>9s} {'Belady':>9s} {'static vs LFRU':>15s}")
    for r in rows:
        click.echo(f"{r.batch:4d} {r.static:9.2%} {r.lfru:9.2%} {r.belady:9.2%} {r.static_vs_lfru:+15.1%}")
    _warn(scope)


@experiment.command("disciplines")
@click.argument("trace_dir", type=click.Path())
@click.option("--calibration", type=click.Path(), default=None,
              help="Calibration trace or stream for the pin list (default: even requests; odd ones are evaluated).")
@click.option("--batch", "-B", type=int, default=8, show_default=True)
@click.option("--admitted", "-A", type=int, default=24, show_default=True)
@click.option("--window", "-W", type=int, default=4, show_default=True)
@click.option("--rho", type=float, default=0.4, show_default=True)
@_TIE
@_SEED
@click.option("--json", "as_json", is_flag=True)
@_guard
def experiment_disciplines(trace_dir: str, calibration: str | None, batch: int, admitted: int, window: int,
                           rho: float, tie_break: str, seed: int, as_json: bool) -> None:
    """The same requests under continuous batching and deadline rotation (Table 20 shape, §9.3)."""
    from ..experiment.scoped import service_disciplines
    from ..replay import ReplayConfig

    ReplayConfig(rho=rho)
    trace, calib, fit = _split_trace(trace_dir, calibration)
    with _working("service disciplines"):
        rows, scope = service_disciplines(trace, calib, batch, admitted, window, rho, tie_break, seed)
    scope["static_fit_source"] = fit
    if _scoped(scope, as_json, {"rows": [r.to_dict() for r in rows]}):
        return
    click.echo(f"{'service discipline':32s} {'mean batch':>10s} {'static':>9s} {'LFRU':>9s} {'static vs LFRU':>15s}")
    for r in rows:
        click.echo(f"{r.discipline:32s} {r.mean_batch:10.2f} {r.static:9.2%} {r.lfru:9.2%} {r.static_vs_lfru:+15.1%}")
    _warn(scope)


@experiment.command("prefill-order")
@click.argument("trace_dir", type=click.Path())
@click.option("--chunk", type=int, default=16, show_default=True, help="Prefill chunk size in tokens.")
@click.option("--rho", type=float, default=0.4, show_default=True)
@click.option("--policy", "policies", default="lru,belady", show_default=True, callback=_csv(str, "policies"))
@click.option("--json", "as_json", is_flag=True)
@_guard
def experiment_prefill(trace_dir: str, chunk: int, rho: float, policies: list[str], as_json: bool) -> None:
    """Layer-major vs chunk-major prefill: total expert traffic on the same trace and cache (§8.5)."""
    import numpy as np

    from ..events.prefill import ORDERS, prefill_events, uniform_prefill_estimate
    from ..experiment.scoped import scope_block
    from ..replay import ReplayConfig, replay
    from ..trace import PREFILL, read_trace

    for p in policies:
        ReplayConfig(p, rho=rho)
    trace = read_trace(trace_dir)
    with _working("prefill orders"):
        streams = {o: prefill_events(trace, chunk, o) for o in ORDERS}
        rows = [{"order": o, "scope": sc, "policy": p, "transferred": replay(s, ReplayConfig(p, rho=rho, scope=sc)).transferred,
                 "logical": s.logical}
                for o, s in streams.items() for sc in ("per-layer", "global") for p in policies]
    lengths = np.bincount(trace.request[trace.phase == PREFILL], minlength=trace.n_requests)
    est = uniform_prefill_estimate(trace.n_layers, trace.n_experts, trace.top_k, int(lengths[lengths > 0].mean()),
                                   chunk, rho)
    scope = scope_block(trace, rho, "one request at a time", f"sequential prefill, chunks of {chunk} tokens",
                        "n/a")
    if _scoped(scope, as_json, {"rows": rows, "uniform_estimate_per_prompt": est}):
        return
    click.echo(f"{'order':12s} {'scope':10s} {'policy':8s} {'transferred':>12s} {'logical':>10s}")
    for r in rows:
        click.echo(f"{r['order']:12s} {r['scope']:10s} {r['policy']:8s} {r['transferred']:12d} {r['logical']:10d}")
    click.echo(f"uniform-routing estimate per prompt (analytical, global pool): layer-major "
               f"{est['layer_major']:.0f}, chunk-major {est['chunk_major']:.0f} blocks "
               f"(x{est['ratio_chunk_over_layer']:.1f})")


@experiment.command("prefill-gap")
@click.argument("trace_dir", type=click.Path())
@click.option("--chunk", type=int, default=128, show_default=True, help="Prefill block size in tokens.")
@click.option("--rho", "rhos", default="0.2,0.3,0.4", show_default=True, callback=_csv(float, "numbers"))
@click.option("--seed", "seeds", default="0,1,2,3,4", show_default=True, callback=_csv(int, "integers"))
@click.option("--order", type=click.Choice(["chunk-major", "layer-major"]), default="chunk-major", show_default=True)
@click.option("--json", "as_json", is_flag=True)
@_guard
def experiment_prefill_gap(trace_dir: str, chunk: int, rhos: list[float], seeds: list[int], order: str,
                           as_json: bool) -> None:
    """Steady-state prefill eviction/admission gap (§4.4 Table 3, §8.1): best causal vs Belady on prefill events."""
    from ..analysis import gap_decomposition
    from ..events.prefill import prefill_events
    from ..experiment.scoped import scope_block
    from ..replay import ReplayConfig
    from ..trace import read_trace

    for r in rhos:
        ReplayConfig(rho=r)
    trace = read_trace(trace_dir)
    with _working("prefill gap"):
        stream = prefill_events(trace, chunk, order)
        rows = [gap_decomposition(stream, r, seeds=tuple(seeds)).to_dict() for r in rhos]
    scope = scope_block(trace, rhos, "one request at a time", f"prefill, {chunk}-token blocks, {order}", "n/a")
    if _scoped(scope, as_json, {"rows": rows}):
        return
    click.echo(f"{'rho':>5s} {'best causal':>12s} {'miss':>8s} {'belady':>8s} {'gap':>8s} {'tie-seed spread':>16s}")
    for r in rows:
        gap = "n/a" if r["gap"] is None else f"{r['gap']:.3%}"
        spread = "n/a" if r["gap_spread"] is None else f"{r['gap_spread']:.2e}"
        click.echo(f"{r['rho']:5.2f} {r['best_causal']:>12s} {r['miss_fraction'][r['best_causal']]:8.2%} "
                   f"{r['miss_fraction']['belady']:8.2%} {gap:>8s} {spread:>16s}")


@experiment.command("transition")
@click.argument("trace_dir", type=click.Path())
@click.option("--labels", type=click.Path(dir_okay=False), default=None,
              help="Request categories: CSV 'request_id,category' or JSON Lines [default: the trace's own].")
@click.option("--windows", default=None, callback=_csv(int, "integers"),
              help="Post-transition windows N (requests of the target category) [default: the paper's "
                   "10,25,50,100 that the smallest category can fill].")
@click.option("--warm", type=int, default=None, help="Requests of the source category that warm the cache "
              "[default: the largest window].")
@click.option("--rho", "rhos", default="0.2,0.3,0.4", show_default=True, callback=_csv(float, "numbers"))
@click.option("--seed", "seeds", default="0,1,2", show_default=True, callback=_csv(int, "integers"),
              help="Request-order seeds.")
@click.option("--batch", "-B", type=int, default=8, show_default=True)
@click.option("--threshold", type=float, default=0.10, show_default=True, help="Criterion: gap >= threshold.")
@click.option("--jobs", "-j", type=int, default=1, show_default=True,
              help="Units replayed side by side in this many threads (0 = all local cores); the units are the same.")
@click.option("--json", "as_json", is_flag=True)
@_guard
def experiment_transition(trace_dir: str, labels: str | None, windows: list[int], warm: int | None,
                          rhos: list[float], seeds: list[int], batch: int, threshold: float, jobs: int,
                          as_json: bool) -> None:
    """Warm-cache workload transition A -> B over windows of N requests (§8.1): gap after a warm start."""
    from ..experiment.scoped import warm_transition
    from ..replay import ReplayConfig
    from ..trace import read_trace

    for r in rhos:
        ReplayConfig(rho=r)
    if batch < 1:
        _fail(f"--batch must be a positive integer; got {batch}")
    jobs = _jobs(jobs)
    trace = read_trace(trace_dir)
    with _working("warm transitions"):
        units, scope = warm_transition(trace, labels, windows, rhos, seeds, batch, warm, threshold=threshold,
                                       jobs=jobs)
    if _scoped(scope, as_json, {"units": [u.to_dict() for u in units]}):
        return
    click.echo(f"{'A -> B':28s} {'N':>4s} {'rho':>5s} {'seed':>4s} {'best causal':>12s} {'m':>8s} {'belady':>8s} "
               f"{'gap':>8s} {'cold m':>8s}")
    for u in units:
        click.echo(f"{(u.source + ' -> ' + u.target)[:28]:28s} {u.window:4d} {u.rho:5.2f} {u.seed:4d} "
                   f"{u.best_causal:>12s} {u.miss_fraction[u.best_causal]:8.2%} {u.miss_fraction['belady']:8.2%} "
                   f"{u.gap:8.2%} {u.cold:8.2%}")
    click.echo(f"{scope['units_meeting']}/{len(units)} units meet {scope['criterion']}")


@experiment.command("partition")
@click.argument("trace_dir", type=click.Path())
@click.option("--labels", type=click.Path(dir_okay=False), default=None,
              help="Request categories: CSV 'request_id,category' or JSON Lines [default: the trace's own].")
@click.option("--groups", default=None,
              help="Partitions separated by ';', categories by ',', e.g. 'math;code;*' ('*' = every other) "
                   "[default: one partition per category].")
@click.option("--slots", default=None, callback=_csv(int, "integers"),
              help="Per-layer slots of every partition but the last, which takes the rest of the quota "
                   "[default: an even split].")
@click.option("--rho", type=float, default=0.4, show_default=True)
@click.option("--batch", "-B", type=int, default=8, show_default=True)
@click.option("--policy", default="lfru", show_default=True)
@click.option("--seed", type=int, default=0, show_default=True, help="Tie seed.")
@click.option("--json", "as_json", is_flag=True)
@_guard
def experiment_partition(trace_dir: str, labels: str | None, groups: str | None, slots: list[int] | None,
                         rho: float, batch: int,
                         policy: str, seed: int, as_json: bool) -> None:
    """Semantic category partitioning at equal total capacity vs one shared cache (§8.2), with the D5 guard."""
    from ..experiment.scoped import category_partition
    from ..replay import ReplayConfig
    from ..trace import read_trace

    ReplayConfig(policy=policy, rho=rho)
    if batch < 1:
        _fail(f"--batch must be a positive integer; got {batch}")
    parts = [[c.strip() for c in g.split(",") if c.strip()] for g in groups.split(";")] if groups else None
    if parts is not None and any(not p for p in parts):
        _fail(f"--groups has an empty partition: {groups!r}; expected e.g. 'math;code;*'")
    with _working("category partition"):
        res, scope = category_partition(read_trace(trace_dir), labels, parts, slots, rho, batch, policy, seed)
    if _scoped(scope, as_json, {"result": res.to_dict()}):
        return
    for g, sl, sh, u in zip(res.partitions, res.slots, res.logical_share, res.per_step_union, strict=True):
        click.echo(f"  partition {','.join(g)[:40]:40s} slots/layer {sl:4d}  logical share {sh:6.1%}  "
                   f"mean per-step union {u:6.1f}")
    click.echo(f"shared cache m {res.shared:.2%}; partitioned m {res.measured:.2%} "
               f"(transfer change {res.transfer_change:+.1%}); fragmentation-only prediction {res.predicted:.2%}")
    if res.fragmentation_share is not None:
        click.echo(f"capacity fragmentation explains {res.fragmentation_share:.0%} of the degradation")
    for w in res.warnings:
        click.echo(f"WARNING: {w}")


# ----------------------------------------------------------------------- conformance
