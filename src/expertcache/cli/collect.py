"""``expertcache collect``: record a transformers MoE model's routing on a prompt set (issue 4, §3.3)."""

from __future__ import annotations

import click

from .main import _echo_json, _guard, _require_extra


@click.command("collect")
@click.argument("model")
@click.option("--prompts", "prompts", type=click.Path(dir_okay=False), required=True,
              help="Prompts JSONL: {\"id\"?, \"prompt\" | \"messages\", \"category\"?} per line.")
@click.option("--out", "-o", "out", type=click.Path(), required=True,
              help="Trace directory (resumed if it holds this same collection).")
@click.option("--max-new-tokens", type=int, default=384, show_default=True,
              help="Most decode forwards recorded per request (fewer on natural EOS).")
@click.option("--max-prompt-tokens", type=int, default=4096, show_default=True,
              help="Prompt cap; longer prompts keep their last tokens.")
@click.option("--batch-size", type=int, default=8, show_default=True, help="Prompts generated together.")
@click.option("--shard-size", type=int, default=32, show_default=True,
              help="Prompts per shard (the unit of crash-safe resume).")
@click.option("--no-chat-template", is_flag=True, help="Tokenize prompt text raw instead of applying the chat template.")
@click.option("--save-logits", is_flag=True, help="Also store the full router logits (fp16, sharded .npy).")
@click.option("--save-hidden", is_flag=True, help="Also store the hidden state entering each MoE block (fp16).")
@click.option("--dtype", type=click.Choice(["auto", "float32", "bfloat16", "float16"]), default="auto",
              show_default=True, help="Model dtype.")
@click.option("--device", default=None, help="Torch device for the model (cpu, cuda, cuda:1); default cpu.")
@click.option("--device-map", default=None, help="from_pretrained device_map (e.g. auto); exclusive with --device.")
@click.option("--revision", default=None, help="Model revision (branch, tag or commit).")
@click.option("--json", "as_json", is_flag=True, help="Print a JSON object.")
@_guard
def collect(model: str, prompts: str, out: str, max_new_tokens: int, max_prompt_tokens: int, batch_size: int,
            shard_size: int, no_chat_template: bool, save_logits: bool, save_hidden: bool, dtype: str,
            device: str | None, device_map: str | None, revision: str | None, as_json: bool) -> None:
    """Record MODEL's routing (path or Hugging Face id) on PROMPTS into a trace directory.

    Greedy decoding, chat template with reasoning disabled, prefill and decode
    routing recorded separately; sharded, hashed and resumable (docs/collect.md).
    """
    _require_extra("collect", "torch", "transformers", "safetensors")
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from ..collect import CollectConfig, read_prompts

    config = CollectConfig(max_new_tokens=max_new_tokens, max_prompt_tokens=max_prompt_tokens,
                           chat_template=not no_chat_template, batch_size=batch_size, shard_size=shard_size,
                           save_logits=save_logits, save_hidden=save_hidden, dtype=dtype, device=device,
                           device_map=device_map, revision=revision)
    n_prompts = len(read_prompts(prompts))  # bad rows fail before the model loads (and before torch is imported)
    from transformers.utils import logging as hf_logging

    from ..collect.runner import collect as run_collect

    hf_logging.disable_progress_bar()   # transformers' weight-loading bar would interleave with ours and errors
    console = Console(stderr=True)
    bar = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                   TextColumn("{task.fields[rate]}"), TimeElapsedColumn(), console=console, transient=True,
                   disable=not console.is_terminal)
    totals = {"tokens": 0, "seconds": 0.0}
    with bar:
        task = bar.add_task("collecting", total=n_prompts, rate="")

        def progress(ev) -> None:
            totals["tokens"] += ev.tokens
            totals["seconds"] += ev.seconds
            rate = totals["tokens"] / totals["seconds"] if totals["seconds"] > 0 else 0.0
            bar.update(task, completed=ev.prompts_done, rate=f"{rate:,.0f} tok/s")

        result = run_collect(model, prompts, out, config, progress=progress)
    info = result.to_dict()
    info["tokens_per_s"] = totals["tokens"] / totals["seconds"] if totals["seconds"] > 0 else None
    if as_json:
        _echo_json(info)
    elif result.already_complete:
        click.echo(f"{out}: already complete ({result.n_requests} requests, {result.n_tokens} tokens); nothing to do")
    else:
        rate = f", {info['tokens_per_s']:,.0f} routed tokens/s" if info["tokens_per_s"] else ""
        click.echo(f"wrote {out}: {result.n_requests} requests, {result.n_tokens} tokens "
                   f"({result.n_decode_tokens} decode), {result.n_shards} shards "
                   f"({result.n_shards_skipped} resumed){rate}")
