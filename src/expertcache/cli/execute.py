"""``expertcache execute``: run a MoE model with offloaded experts and check replay predicts it (issue 22)."""

from __future__ import annotations

from typing import Any

import click

from .main import _echo_json, _guard, _require_extra, read_calibration


def _policies(ctx: click.Context, param: click.Parameter, value: str) -> list[str]:
    from ..execute.controller import CONTROLLER_POLICIES

    names = [v.strip() for v in value.split(",") if v.strip()]
    if value.strip() == "all":
        names = [n for n in CONTROLLER_POLICIES if n not in ("static", "predicted-next-use")]
    bad = [n for n in names if n not in CONTROLLER_POLICIES]
    if bad or not names:
        raise click.BadParameter(f"expected a comma list of {', '.join(CONTROLLER_POLICIES)} (or 'all'); "
                                 f"got {value!r}")
    return names


@click.command("execute")
@click.argument("model")
@click.option("--prompts", "prompts", type=click.Path(dir_okay=False), default=None,
              help="Prompts JSONL (as for collect) [default with --example: the bundled example prompts].")
@click.option("--out", "-o", "out", type=click.Path(), required=True, help="Run directory to create.")
@click.option("--policy", "-p", "policies", default="lru", show_default=True, callback=_policies,
              help="Comma list of controller policies, or 'all' (every policy needing no extra input).")
@click.option("--rho", type=float, default=0.4, show_default=True,
              help="Residency fraction: per-layer quota floor(rho*L*N + 0.5) split as in docs/semantics.md.")
@click.option("--scope", type=click.Choice(["per-layer", "global"]), default="per-layer", show_default=True)
@click.option("--contract", type=click.Choice(["fused", "serialized"]), default="fused", show_default=True,
              help="fused: union resident, compute, then retain (event-atomic); serialized: one expert at a "
                   "time in ascending id (sequential-ascending).")
@click.option("--batch", "-B", type=int, default=8, show_default=True, help="Concurrency B (FCFS continuous batching).")
@click.option("--offsets", default="zero", show_default=True, help="Arrival offsets: zero, stagger:D or random:LO:HI.")
@click.option("--offsets-seed", type=int, default=0, show_default=True, help="Seed of random offsets.")
@click.option("--max-new-tokens", type=int, default=64, show_default=True, help="Most decode forwards per request.")
@click.option("--max-prompt-tokens", type=int, default=4096, show_default=True, help="Prompt cap (last tokens kept).")
@click.option("--no-chat-template", is_flag=True, help="Tokenize prompt text raw.")
@click.option("--tie-break", type=click.Choice(["random", "id"]), default="random", show_default=True)
@click.option("--seed", type=int, default=0, show_default=True, help="Seed of the tie ranks.")
@click.option("--lrfu-lambda", type=float, default=0.5, show_default=True)
@click.option("--calibration", type=click.Path(), default=None,
              help="static: a stream directory, or a trace directory (turned into its decode events at -B).")
@click.option("--advice-from", type=click.Path(), default=None,
              help="belady/belady-forced: a trace recorded earlier on the same prompts [default: this run's "
                   "reference recording].")
@click.option("--advice", "advice_path", type=click.Path(dir_okay=False), default=None,
              help="predicted-next-use: an advice .npz aligned to the executed stream.")
@click.option("--device", default="cpu", show_default=True, help="Compute device (cpu, cuda, cuda:1).")
@click.option("--dtype", type=click.Choice(["auto", "float32", "bfloat16", "float16"]), default="auto",
              show_default=True)
@click.option("--host-tier", type=click.Choice(["auto", "mmap", "ram"]), default="auto", show_default=True,
              help="Where expert weights live off the device. mmap: the model is built without its routed "
                   "experts and they are read from the memory-mapped safetensors files, one expert per miss "
                   "(a model larger than RAM runs; add --no-reference, the reference loads it in full); ram: "
                   "full load, experts copied to CPU memory (pinned on CUDA); auto: mmap where the checkpoint "
                   "can be mapped, else ram (the reason is printed).")
@click.option("--experts-implementation", type=click.Choice(["eager", "batched_mm", "grouped_mm", "model"]),
              default="eager", show_default=True,
              help="transformers experts kernel for the run and the reference (model: keep the model's).")
@click.option("--no-reference", is_flag=True, help="Skip the unmodified-model run (no token/logit check).")
@click.option("--overwrite", is_flag=True, help="Replace OUT if it is a run directory of this command.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
@_guard
def execute(model: str, prompts: str | None, out: str, policies: list[str], rho: float, scope: str, contract: str,
            batch: int, offsets: str, offsets_seed: int, max_new_tokens: int, max_prompt_tokens: int,
            no_chat_template: bool, tie_break: str, seed: int, lrfu_lambda: float, calibration: str | None,
            advice_from: str | None, advice_path: str | None, device: str, dtype: str, host_tier: str,
            experts_implementation: str, no_reference: bool, overwrite: bool, as_json: bool) -> None:
    """Execute MODEL (a local directory, or 'example' for the example model in models/example-moe, rebuilt by
    scripts/example_model/make_all.py) with its routed experts offloaded: at most c per layer on the device, the rest in a host tier, every transfer counted and timed.

    Writes OUT (docs/execute.md): per policy the executed routing (trace/), the stream its cache saw
    (events/, for `expertcache replay`), counts.json and timings.parquet; and checks that replay of the
    recorded trace predicts the executor's transfers layer by layer.
    """
    _require_extra("execute", "torch", "transformers", "safetensors")
    from ..errors import ValidationError
    from ..events import ArrivalOffsets
    from ..execute.config import ExecuteConfig

    if model == "example":
        from ..execute.example import example_model_dir, example_prompts

        model = str(example_model_dir())
        prompts = prompts or str(example_prompts())
    if prompts is None:
        raise ValidationError("--prompts is required (except with MODEL 'example')", field="prompts")
    offs = ArrivalOffsets.parse(offsets, seed=offsets_seed)
    impl = None if experts_implementation == "model" else experts_implementation
    configs = [ExecuteConfig(policy=p, rho=rho, scope=scope, contract=contract, batch=batch, offsets=offs,
                             max_new_tokens=max_new_tokens, max_prompt_tokens=max_prompt_tokens,
                             chat_template=not no_chat_template, tie_break=tie_break, seed=seed,
                             lrfu_lambda=lrfu_lambda, device=device, dtype=dtype, host_tier=host_tier,
                             experts_implementation=impl) for p in policies]
    from ..collect import CollectConfig, read_prompts
    from ..collect.runner import check_placement

    n_prompts = len(read_prompts(prompts))          # bad rows fail before the model loads
    check_placement(CollectConfig(device=None if device == "cpu" else device))
    calib = None
    if "static" in policies:
        if calibration is None:
            raise ValidationError("policy static needs --calibration (a stream or trace directory)",
                                  field="calibration")
        calib = read_calibration(calibration, batch, offs)
    adv = None
    if "predicted-next-use" in policies:
        if advice_path is None:
            raise ValidationError("policy predicted-next-use needs --advice FILE", field="advice")
        from ..nextuse import load_advice

        adv = load_advice(advice_path)
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
    from transformers.utils import logging as hf_logging

    from ..execute.run import execute as run_execute

    hf_logging.disable_progress_bar()
    console = Console(stderr=True)
    bar = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                   console=console, transient=True, disable=not console.is_terminal)
    tasks: dict[str, Any] = {}
    with bar:
        def progress(name: str, done: int, total: int) -> None:
            if name not in tasks:
                tasks[name] = bar.add_task(name, total=total or n_prompts)
            bar.update(tasks[name], completed=done)

        result = run_execute(model, prompts, out, configs, calibration=calib, advice_from=advice_from, advice=adv,
                             reference=not no_reference, overwrite=overwrite, progress=progress)
    if as_json:
        _echo_json(result.to_dict())
        return
    _print(result)


def _print(result: Any) -> None:
    from rich.console import Console

    console = Console()
    runs = result.summaries
    if runs:
        r = runs[0]
        console.print(f"{result.out}: B={r['batch']}, contract {r['contract']} (= replay {r['replay_semantics']}), "
                      f"scope {r['scope']}, capacity {r['capacity_total']} blocks; device tier "
                      f"{r.get('memory_device_expert_bytes', 0):,} B = {r.get('memory_slots_total')} expert slots "
                      f"of {r.get('memory_block_bytes')} B (capacity + workspace; at most "
                      f"{r.get('memory_slots_high_water_total')} in use at once), host tier "
                      f"{r.get('memory_host_tier')} {r.get('memory_host_expert_bytes', 0):,} B"
                      + (f" (mmap not possible: {r['memory_host_tier_fallback']})"
                         if r.get("memory_host_tier_fallback") else "")
                      + (f"; process peak RSS {r['memory_process_peak_rss_bytes']:,} B, anonymous "
                         f"{r['memory_process_rss_anon_bytes']:,} B" if r.get("memory_process_peak_rss_bytes")
                         else ""), soft_wrap=True)
    for r in runs:
        logits = ("logits bit-exact" if r.get("logits_bit_exact") else
                  (f"logits max|diff| {r['logits_max_abs_diff']:.2g}" if r.get("logits_max_abs_diff") is not None
                   else "logits not compared"))
        tokens = {True: "tokens = reference", False: "tokens DIFFER from the reference",
                  None: "no reference run"}[r.get("tokens_equal_reference")]
        step = f"{r['decode_step_ms_median']:.2f} ms/step (median)" if r["decode_step_ms_median"] else "- ms/step"
        rate = f"{r['decode_tokens_per_s']:,.0f} tok/s" if r["decode_tokens_per_s"] else "- tok/s"
        agree = "equal in every layer" if r["replay_equal_per_layer"] else "DIFFERENT in some layer"
        console.print(f"{r['run']}: transferred {r['transferred']} (replay {r['replay_transferred']}, {agree}), "
                      f"hits {r['hits']}; misses prefill {r['prefill_misses']} / decode {r['decode_misses']}"
                      + (f", initial load {r['initial_load']}" if r["initial_load"] else "")
                      + f"; {step}, {rate}; {tokens}, {logits}", soft_wrap=True)
