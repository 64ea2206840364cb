"""``expertcache nextuse``: fit, evaluate and audit next-use predictors."""

from __future__ import annotations

import click

from .main import (
    _echo_json,
    _fail,
    _guard,
    _require_new,
    _working,
    main,
)


@main.group()
def nextuse() -> None:
    """Next-use prediction (§7.3): fit on one stream, evaluate on a disjoint one."""


@nextuse.command("fit")
@click.argument("stream_dir", type=click.Path())
@click.option("--model", "kind", type=click.Choice(["linear", "gbt"]), default="linear", show_default=True,
              help="linear (the paper's) or gbt (gradient-boosted trees; needs scikit-learn).")
@click.option("-o", "--out", required=True, type=click.Path(dir_okay=False),
              help="Model file: .json for linear, .npz for gbt.")
@click.option("--max-rows", type=int, default=200_000, show_default=True, help="Rows sampled for fitting.")
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--overwrite", is_flag=True, help="Replace an existing model file.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
@_guard
def nextuse_fit(stream_dir: str, kind: str, out: str, max_rows: int, seed: int, overwrite: bool,
                as_json: bool) -> None:
    """Fit a next-use-distance predictor on STREAM_DIR's access features."""
    from ..events import read_events
    from ..nextuse import GradientBoostedNextUse, LinearNextUse, access_features, transfer_r2

    want = ".json" if kind == "linear" else ".npz"
    if not out.endswith(want):
        _fail(f"{out}: a {kind} model is written as {want}")
    _require_new(out, overwrite, file=True)
    with _working(f"fitting a {kind} next-use model"):
        f = access_features(read_events(stream_dir))
        model = (LinearNextUse.fit(f, max_rows, seed) if kind == "linear"
                 else GradientBoostedNextUse.fit(f, max_rows=max_rows, seed=seed))
    model.save(out)
    r2 = transfer_r2(model, f)
    if as_json:
        from ..storage import stream_source

        _echo_json({"out": out, "model": kind, "in_sample_r2": r2, "max_rows": max_rows, "seed": seed,
                    **stream_source(stream_dir)})
        return
    click.echo(f"wrote {out}: {kind} model, in-sample R2 {r2:.3f}")


@nextuse.command("eval")
@click.argument("model_path", type=click.Path(dir_okay=False))
@click.argument("stream_dir", type=click.Path())
@click.option("--rho", type=float, default=0.4, show_default=True)
@click.option("--scope", type=click.Choice(["per-layer", "global"]), default="per-layer", show_default=True)
@click.option("--seed", type=int, default=0, show_default=True, help="Tie seed.")
@click.option("--advice-out", type=click.Path(dir_okay=False), default=None, help="Also write the advice .npz.")
@click.option("--overwrite", is_flag=True, help="Replace an existing --advice-out file.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
@_guard
def nextuse_eval(model_path: str, stream_dir: str, rho: float, scope: str, seed: int, advice_out: str | None,
                 overwrite: bool, as_json: bool) -> None:
    """Transfer R2 on STREAM_DIR and the predicted-next-use policy against the baselines (Table 15 shape)."""
    from ..analysis.gap import CAUSAL_POLICIES
    from ..events import read_events
    from ..nextuse import (
        access_features,
        advice_from_predictions,
        load_predictor,
        save_advice,
        transfer_r2,
    )
    from ..replay import ReplayConfig, replay

    if advice_out:
        _require_new(advice_out, overwrite, file=True)
    model = load_predictor(model_path)
    stream = read_events(stream_dir)
    with _working("predicting next use and replaying"):
        f = access_features(stream)
        advice = advice_from_predictions(f, model.predict(f.X), {"model": model_path})
        miss = {p: replay(stream, ReplayConfig(p, rho=rho, scope=scope, seed=seed)).miss_fraction
                for p in (*CAUSAL_POLICIES, "belady")}
        miss["predicted-next-use"] = replay(stream, ReplayConfig("predicted-next-use", rho=rho, scope=scope,
                                                                 seed=seed), advice=advice).miss_fraction
    best = min(CAUSAL_POLICIES, key=lambda p: (miss[p], p))
    gap = miss[best] - miss["belady"]
    out = {"transfer_r2": transfer_r2(model, f), "miss_fraction": miss, "best_causal": best,
           "fraction_of_gap_recovered": (miss[best] - miss["predicted-next-use"]) / gap if gap > 0 else None}
    if advice_out:
        from ..storage import atomic_file

        with atomic_file(advice_out) as tmp:
            save_advice(advice, tmp)
    if as_json:
        _echo_json(out)
        return
    click.echo(f"transfer R2 on log next-use distance: {out['transfer_r2']:.3f}")
    for p, m in miss.items():
        click.echo(f"  {p:20s} {m:.2%}" + ("  (best causal)" if p == best else ""))
    rec = out["fraction_of_gap_recovered"]
    click.echo(f"fraction of the gap recovered: {'n/a' if rec is None else f'{rec:+.2%}'}")


@nextuse.command("victims")
@click.argument("model_path", type=click.Path(dir_okay=False))
@click.argument("stream_dir", type=click.Path())
@click.option("--rho", type=float, default=0.4, show_default=True)
@click.option("--scope", type=click.Choice(["per-layer", "global"]), default="per-layer", show_default=True)
@click.option("--seed", type=int, default=0, show_default=True, help="Tie and bootstrap seed.")
@click.option("--every", type=int, default=37, show_default=True, help="Sample every n-th eviction decision.")
@click.option("--bootstrap", "n_boot", type=int, default=1000, show_default=True, help="Bootstrap resamples.")
@click.option("--candidates", type=click.Choice(["residents", "residents+misses"]), default="residents",
              show_default=True, help="residents: the blocks resident when the event begins (at most the capacity; "
              "bypass decisions not sampled); residents+misses: also the event's not-yet-decided misses.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
@_guard
def nextuse_victims(model_path: str, stream_dir: str, rho: float, scope: str, seed: int, every: int, n_boot: int,
                    candidates: str, as_json: bool) -> None:
    """Victim-ranking quality at sampled eviction decisions, tie-aware (Table 16 shape)."""
    from ..events import read_events
    from ..nextuse import access_features, advice_from_predictions, load_predictor
    from ..nextuse.victims import record_decisions, score_decisions
    from ..replay import ReplayConfig

    ReplayConfig(rho=rho)
    if every < 1 or n_boot < 1:
        _fail("--every and --bootstrap must be >= 1")
    model = load_predictor(model_path)
    stream = read_events(stream_dir)
    with _working("ranking victims"):
        f = access_features(stream)
        advice = advice_from_predictions(f, model.predict(f.X), {"model": model_path})
        rep = score_decisions(record_decisions(stream, advice, rho, scope, seed, every, candidates=candidates),
                              n_boot, seed)
    if as_json:
        _echo_json(rep.to_dict())
        return
    click.echo(f"{rep.n_decisions} sampled decisions (every {every}th); candidate set: {rep.candidates}; "
               f"mean candidate set {rep.mean_candidates:.1f}, "
               f"mean optimal-victim set {rep.mean_optimal_set:.2f}; 95% CIs by cluster bootstrap over steps")
    click.echo(f"{'victim chosen by':22s} {'in optimal set':>28s} {'distance regret':>16s}")
    for k, (m, lo, hi) in rep.in_optimal_set.items():
        click.echo(f"{k:22s} {m:9.2%} [{lo:7.2%}, {hi:7.2%}] {rep.distance_regret[k][0]:16.5f}")
    for label, (m, lo, hi) in (("all candidates", rep.spearman_all),
                               ("excluding never-again", rep.spearman_excluding_never)):
        click.echo(f"Spearman predicted vs true next use, {label}: {m:+.3f} [{lo:+.3f}, {hi:+.3f}]")


# -------------------------------------------------------------------------- rotation
