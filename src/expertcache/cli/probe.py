"""``expertcache probe``: build diversity-controlled probe sets and audit prompts (§3.4, §5.6, B1)."""

from __future__ import annotations

import click

from .main import _console, _echo_json, _guard, _require_new


@click.group("probe")
def probe() -> None:
    """Workload probe sets: build a diversity-controlled set, audit a set's prompts."""


def _parse_sources(items: tuple[str, ...]) -> dict[str, str]:
    out: dict[str, str] = {}
    for item in items:
        name, sep, path = item.partition("=")
        if not sep or not name or not path:
            raise click.BadParameter(f"expected NAME=FILE; got {item!r}", param_hint="--source")
        if name in out:
            raise click.BadParameter(f"archetype {name!r} given twice", param_hint="--source")
        out[name] = path
    return out


@probe.command("build")
@click.option("--sources", "sources_dir", type=click.Path(), default=None,
              help="Directory of ARCHETYPE.jsonl|csv payload files (default: the bundled stdlib examples).")
@click.option("--source", "source_items", multiple=True, metavar="NAME=FILE",
              help="One archetype's payload file (repeatable; instead of --sources).")
@click.option("--wrappers", type=click.Path(dir_okay=False), default=None,
              help="Forms/framings/styles/languages file (default: the bundled wrappers.json).")
@click.option("--per-cell", type=int, default=12, show_default=True,
              help="Diverse records per (archetype, split) cell; at most forms x languages.")
@click.option("--matched", "n_matched", type=int, default=4, show_default=True,
              help="Records per cell also rendered with the fixed template (0: no control arm).")
@click.option("--threshold", type=float, default=0.30, show_default=True,
              help="Maximum 5-gram Jaccard between selected payloads.")
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("-o", "--out", required=True, type=click.Path(file_okay=False), help="Probe-set directory to create.")
@click.option("--overwrite", is_flag=True, help="Replace an existing output directory.")
@click.option("--json", "as_json", is_flag=True, help="Print the manifest as one JSON object.")
@_guard
def build(sources_dir: str | None, source_items: tuple[str, ...], wrappers: str | None, per_cell: int,
          n_matched: int, threshold: float, seed: int, out: str, overwrite: bool, as_json: bool) -> None:
    """Build a probe set: probes.jsonl (every field), prompts.jsonl (for `expertcache collect --prompts`),
    labels.csv (for `expertcache audit --labels`) and manifest.json."""
    from ..probes import BuildConfig, build_probe_set, write_probe_set

    if sources_dir and source_items:
        raise click.UsageError("give either --sources DIR or --source NAME=FILE, not both")
    _require_new(out, overwrite)
    config = BuildConfig(per_cell=per_cell, n_matched=n_matched, threshold=threshold, seed=seed)
    sources = _parse_sources(source_items) if source_items else sources_dir
    ps = build_probe_set(sources, wrappers, config)
    write_probe_set(ps, out, overwrite=overwrite)
    if as_json:
        _echo_json({"out": out, **ps.manifest})
        return
    cells = ps.manifest["cells"]
    click.echo(f"wrote {out}: {ps.manifest['n_records']} records ({ps.manifest['n_fixed']} in the fixed arm), "
               f"{len(cells)} archetypes x {len(next(iter(cells.values())))} splits x {per_cell} per cell")


@probe.command("audit")
@click.argument("prompts", type=click.Path())
@click.option("--by-split", is_flag=True, help="One row per (category, split, arm) cell.")
@click.option("--json", "as_json", is_flag=True, help="One JSON object per row.")
@_guard
def audit_prompts(prompts: str, by_split: bool, as_json: bool) -> None:
    """Prompt-side diagnostics (B1) of PROMPTS: a probe-set directory or a JSON Lines prompts file."""
    from ..probes import prompt_diagnostics, read_prompts

    rows = prompt_diagnostics(read_prompts(prompts), by_split=by_split)
    if as_json:
        for r in rows:
            _echo_json(r.to_dict())
        return
    print_prompt_table(rows)


def print_prompt_table(rows) -> None:
    """Rich table of :class:`expertcache.probes.PromptStats` rows."""
    from rich.table import Table

    table = Table(title="prompt-side diagnostics (B1, §5.6)")
    splits = any(r.split for r in rows)
    for col in ("category", *(("split",) if splits else ()), "arm", "records", "templates",
                "distinct heads (70 ch)", "distinct finals", "mean 5-gram Jaccard"):
        table.add_column(col, justify="left" if col in ("category", "split", "arm") else "right")
    for r in rows:
        table.add_row(r.category, *((r.split or "-",) if splits else ()), r.arm or "-", str(r.n_records), "-" if r.n_templates is None else str(r.n_templates),
                      str(r.n_heads), str(r.n_finals), "-" if r.mean_jaccard is None else f"{r.mean_jaccard:.4f}")
    _console().print(table)
