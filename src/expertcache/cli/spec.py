"""``expertcache spec``: expand, run and summarise declarative experiment specs (docs/experiments.md)."""

from __future__ import annotations

import json
import os
import signal
import sys

import click

from .main import _console, _echo_json, _fail, _guard, _jobs

#: A path fragment of numba's own modules (not imported here: the command line starts without numba).
_NUMBA_DIR = os.sep + "numba" + os.sep


def _may_raise(frame) -> bool:
    """Whether a signal handler may raise in ``frame``: not where it or a caller is a finalizer (``__del__``) or
    numba's own Python code (see ``spec_run``'s SIGTERM handler)."""
    while frame is not None:
        if frame.f_code.co_name == "__del__" or _NUMBA_DIR in frame.f_code.co_filename:
            return False
        frame = frame.f_back
    return True


@click.group("spec")
def spec() -> None:
    """Experiment specs (TOML): frozen conditions with IDs and hashes, resumable runs, pivots."""


def _progress_eta():
    """A Rich progress bar with ETA on stderr when it is a terminal; a no-op otherwise."""
    from rich.console import Console
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeElapsedColumn,
        TimeRemainingColumn,
    )

    console = Console(stderr=True)
    return Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                    TextColumn("ETA"), TimeRemainingColumn(), console=console, transient=True,
                    disable=not console.is_terminal)


@spec.command("expand")
@click.argument("spec_file", type=click.Path(dir_okay=False))
@click.option("--json", "as_json", is_flag=True, help="One JSON object per condition (JSON Lines).")
@click.option("--limit", type=int, default=20, show_default=True, help="Conditions shown in the table (0 = all).")
@_guard
def spec_expand(spec_file: str, as_json: bool, limit: int) -> None:
    """Expand SPEC_FILE into its conditions: stable ID, hash, fields."""
    from ..experiment.spec import conditions_table_rows, expand, load_spec

    sp = load_spec(spec_file)
    rows = conditions_table_rows(expand(sp))
    if as_json:
        for row in rows:
            _echo_json(row)
        return
    from rich.table import Table

    varying = [k for k in rows[0] if k not in ("condition_id", "condition_hash")
               and len({json.dumps(r[k]) for r in rows}) > 1]
    console = _console()
    console.print(f"{sp.name or spec_file}: {len(rows)} conditions over {len(sp.inputs)} input(s); "
                  f"varying: {', '.join(varying) or 'nothing'}")
    table = Table()
    for col in ("condition_id", "hash", *varying):
        table.add_column(col, no_wrap=True)
    shown = rows if limit <= 0 else rows[:limit]
    for r in shown:
        table.add_row(r["condition_id"], r["condition_hash"][:12], *(str(r[k]) for k in varying))
    console.print(table)
    if len(shown) < len(rows):
        console.print(f"... {len(rows) - len(shown)} more (--limit 0 shows all, --json lists every field)")


@spec.command("run")
@click.argument("spec_file", type=click.Path(dir_okay=False))
@click.option("--store", "-s", required=True, type=click.Path(file_okay=False),
              help="Result store directory (created; a re-run skips stored conditions with the same hash).")
@click.option("--executor", type=click.Choice(["local", "ray"]), default="local", show_default=True,
              help="local: worker processes; ray: Ray tasks (pip install 'expertcache[ray]').")
@click.option("--jobs", "-j", type=int, default=1, show_default=True,
              help="Local worker processes, or CPUs of a local Ray instance (0 = all local cores); on a Ray "
                   "cluster its CPUs are used.")
@click.option("--address", default=None,
              help="Ray cluster to use: auto (the one `ray start --head` started here), HOST:6379 or "
                   "ray://HOST:10001; default: $RAY_ADDRESS, else a local instance. Ray executor only.")
@click.option("--chunk-seconds", type=float, default=2.0, show_default=True,
              help="Write finished conditions to the store at least this often (a kill loses at most this much).")
@click.option("--json", "as_json", is_flag=True, help="Print the run report as a JSON object.")
@_guard
def spec_run(spec_file: str, store: str, executor: str, jobs: int, address: str | None, chunk_seconds: float,
             as_json: bool) -> None:
    """Run every condition of SPEC_FILE that STORE lacks; interrupting loses no stored result."""
    from ..experiment.runner import run_spec
    from ..experiment.spec import load_spec

    jobs = _jobs(jobs)
    if chunk_seconds < 0:
        _fail(f"--chunk-seconds must be >= 0; got {chunk_seconds}")
    sp = load_spec(spec_file)

    state = {"done": 0, "terminated": False}

    def on_term(signum, frame):  # SIGTERM behaves like Ctrl-C: received results are written first
        # The flag makes the next progress call raise from ordinary code. Inside a finalizer (__del__) nothing is
        # raised: Python would swallow the exception there and print its traceback to stderr. Nor inside numba's
        # own Python code, which compiled code calls back (a kernel's result unpickled): the exception would leave
        # it as a SystemError, a traceback and exit 1 (seen in tests/test_spec.py's SIGTERM test).
        state["terminated"] = True
        if _may_raise(frame):
            raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, on_term)
    try:
        with _progress_eta() as bar:
            task = bar.add_task(f"{sp.name or 'spec'}", total=None)

            def progress(done: int, total: int) -> None:
                state["done"] = done
                bar.update(task, completed=done, total=total)
                if state["terminated"]:
                    raise KeyboardInterrupt

            report = run_spec(sp, store, executor=executor, jobs=jobs, address=address, progress=progress,
                              flush_seconds=chunk_seconds)
        if state["terminated"]:
            raise KeyboardInterrupt
    except KeyboardInterrupt:
        click.echo(f"interrupted: {state['done']} new conditions stored in {store}; run the same command "
                   "again to resume", err=True)
        sys.exit(130)
    finally:
        signal.signal(signal.SIGTERM, previous)
    if as_json:
        _echo_json(report.to_dict())
        return
    click.echo(f"{report.n_conditions} conditions: ran {len(report.ran)}, skipped {report.n_skipped} "
               f"(stored, same hash) in {report.seconds:.1f} s ({report.conditions_per_minute:,.0f} conditions/min, "
               f"{executor}, {report.jobs} jobs); results: {os.path.join(store, 'results.parquet')}")


def _where(ctx: click.Context, param: click.Parameter, values: tuple[str, ...]) -> dict:
    out: dict = {}
    for item in values:
        name, eq, value = item.partition("=")
        if not eq or not name.strip():
            raise click.BadParameter(f"expected FIELD=VALUE[,VALUE...]; got {item!r}")
        out[name.strip()] = [v.strip() for v in value.split(",")]
    return out


def _names(ctx: click.Context, param: click.Parameter, value: str) -> list[str]:
    return [v.strip() for v in value.split(",") if v.strip()]


@spec.command("summary")
@click.argument("results", type=click.Path())
@click.option("--metric", "-m", default="gap", show_default=True,
              help="gap (best causal vs Belady, per tie seed) or a stored metric, e.g. miss_fraction.")
@click.option("--rows", default="batch", show_default=True, callback=_names, help="Comma list of fields.")
@click.option("--cols", default="rho", show_default=True, callback=_names, help="Comma list of fields.")
@click.option("--where", "where", multiple=True, callback=_where,
              help="Keep conditions with FIELD=VALUE[,VALUE...] (repeatable), e.g. --where selection=heldout.")
@click.option("--json", "as_json", is_flag=True, help="Print the pivot as a JSON object.")
@_guard
def spec_summary(results: str, metric: str, rows: list[str], cols: list[str], where: dict, as_json: bool) -> None:
    """Pivot RESULTS (a store directory or results.parquet): METRIC by ROWS x COLS (mean [min, max] of n)."""
    from ..experiment.store import read_results
    from ..experiment.summary import summarize

    summ = summarize(read_results(results), metric, rows, cols, where)
    if as_json:
        _echo_json(summ.to_dict())
        return
    from rich.markup import escape
    from rich.table import Table

    row_keys = list(dict.fromkeys(tuple(c.key[r] for r in rows) for c in summ.cells))
    col_keys = list(dict.fromkeys(tuple(c.key[k] for k in cols) for c in summ.cells))
    cell = {(tuple(c.key[r] for r in rows), tuple(c.key[k] for k in cols)): c for c in summ.cells}
    pct = metric in ("gap", "miss_fraction", "steady_miss_fraction", "union_over_logical")
    console = _console()
    console.print(escape(f"{metric} by {' x '.join(rows)} (rows) x {' x '.join(cols)} (cols)"
                         + (f", where {where}" if where else "") + ": mean [min, max] over n conditions"))
    table = Table()
    for r in rows:
        table.add_column(r, no_wrap=True)
    for ck in col_keys:
        table.add_column(" ".join(f"{k}={v}" for k, v in zip(cols, ck, strict=True)), justify="right")

    def fmt(x: float | None) -> str:
        if x is None:
            return "n/a"
        return f"{100 * x:.2f}%" if pct else f"{x:,.6g}"

    for rk in row_keys:
        out = [str(v) for v in rk]
        for ck in col_keys:
            c = cell.get((rk, ck))
            if c is None:
                out.append("")
            elif c.n <= 1:
                out.append(fmt(c.mean) + ("" if not c.n_undefined else " (undefined)"))
            else:
                out.append(escape(f"{fmt(c.mean)} [{fmt(c.min)}, {fmt(c.max)}] n={c.n}"))
        table.add_row(*out)
    console.print(table)
