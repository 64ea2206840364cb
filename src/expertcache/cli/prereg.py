"""``expertcache prereg``: freeze decision criteria before results exist, evaluate them once (§3.5, §8.1)."""

from __future__ import annotations

import click

from .main import _echo_json
from .spec import _console, _guard


@click.group("prereg")
def prereg() -> None:
    """Pre-registration: hashed criteria documents, confirmatory splits read once."""


@prereg.command("freeze")
@click.argument("criteria", type=click.Path(dir_okay=False))
@click.option("-o", "--out", required=True, type=click.Path(dir_okay=False),
              help="Frozen document to create (JSON; a DOC.sha256 sidecar is written next to it).")
@click.option("--results", type=click.Path(), default=None,
              help="Result store to check: freezing is refused if a criterion's results already exist.")
@click.option("--spec", "spec_file", type=click.Path(dir_okay=False), default=None,
              help="Experiment spec: its sha256 is recorded and confirmatory splits are checked disjoint.")
@click.option("--force", is_flag=True, help="Freeze although results exist (recorded in the document).")
@click.option("--json", "as_json", is_flag=True, help="Print {path, sha256} as JSON.")
@_guard
def prereg_freeze(criteria: str, out: str, results: str | None, spec_file: str | None, force: bool,
                  as_json: bool) -> None:
    """Freeze CRITERIA (TOML: [prereg], [splits.NAME], [[criteria]]) into a hashed document."""
    from ..experiment.prereg import freeze, load_criteria

    path, sha = freeze(load_criteria(criteria), out, results=results, spec=spec_file, force=force)
    if as_json:
        _echo_json({"path": str(path), "sha256": sha})
        return
    click.echo(f"froze {path} (sha256 {sha}); publish this hash before reading results")


@prereg.command("evaluate")
@click.argument("document", type=click.Path(dir_okay=False))
@click.option("--results", required=True, type=click.Path(), help="Result store directory or results.parquet.")
@click.option("--force", is_flag=True, help="Read a confirmatory split again (recorded as a forced read).")
@click.option("--json", "as_json", is_flag=True, help="Print the outcome as JSON.")
@_guard
def prereg_evaluate(document: str, results: str, force: bool, as_json: bool) -> None:
    """Check DOCUMENT's hash, evaluate its criteria on RESULTS, write the outcome next to it."""
    from ..experiment.prereg import evaluate

    outcome = evaluate(document, results, force=force)
    if as_json:
        _echo_json(outcome.to_dict())
        return
    from rich.table import Table

    console = _console()
    table = Table(title=f"{document} (sha256 {outcome.document_sha256[:12]}…)")
    for col in ("criterion", "metric", "split", "aggregate", "rule", "n", "value", "verdict"):
        table.add_column(col, no_wrap=True, justify="right" if col in ("n", "value") else "left")
    for c in outcome.criteria:
        value = "n/a" if c.value is None else f"{c.value:.6g}"
        table.add_row(c.id, c.metric, c.split, c.aggregate, f"{c.comparison} {c.threshold:g}",
                      str(c.n) + (f" ({c.n_undefined} undefined)" if c.n_undefined else ""), value,
                      "[green]pass[/]" if c.passed else "[red]fail[/]")
    console.print(table)
    if outcome.forced:
        console.print(f"[yellow]forced re-read of confirmatory split(s) {list(outcome.reread_splits)}; recorded[/]")
    console.print(f"wrote {outcome.path}: {'all criteria passed' if outcome.passed else 'not met'}")


@prereg.command("verify")
@click.argument("document", type=click.Path(dir_okay=False))
@click.option("--json", "as_json", is_flag=True, help="Print the outcome as JSON.")
@_guard
def prereg_verify(document: str, as_json: bool) -> None:
    """Check that DOCUMENT is unchanged since it was frozen (its hash and every recorded read)."""
    from ..experiment.prereg import verify

    _, sha = verify(document)
    if as_json:
        _echo_json({"path": document, "sha256": sha, "unchanged": True})
        return
    click.echo(f"{document}: unchanged since freezing (sha256 {sha})")
