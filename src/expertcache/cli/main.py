"""The ``expertcache`` command line: each command parses, calls the library, prints.

Errors a user can cause print one line (``error: FILE: record N: field 'F': …``)
on stderr and exit with status 2; no output directory is left behind.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

import click

from .. import __version__
from ..errors import ExpertCacheError

EXIT_USER_ERROR = 2


def _fail(message: str) -> None:
    click.echo(f"error: {message}", err=True)
    sys.exit(EXIT_USER_ERROR)


def _require_new(out: str, overwrite: bool) -> None:
    """Refuse an existing output before any work (the write itself is atomic too)."""
    import os

    if os.path.exists(out) and not overwrite:
        _fail(f"{out}: output already exists; choose another path or pass --overwrite")


def _guard(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Turn package errors into a one-line message and exit status 2."""
    import functools

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except ExpertCacheError as exc:
            _fail(str(exc))
        except OSError as exc:  # unreadable input, full disk: the user's environment, not a bug
            _fail(f"{exc.filename or ''}: {exc.strerror or exc}")

    return wrapper


def _csv(kind: type, name: str) -> Callable[[click.Context, click.Parameter, str], list]:
    def parse(ctx: click.Context, param: click.Parameter, value: str | None) -> list | None:
        if value is None:
            return None
        items = [v.strip() for v in str(value).split(",") if v.strip()]
        if not items:
            raise click.BadParameter(f"expected a comma-separated list of {name}")
        try:
            return [kind(v) for v in items]
        except ValueError:
            raise click.BadParameter(f"expected a comma-separated list of {name}; got {value!r}") from None
    return parse


def _console():
    """Rich console for tables: the terminal's width, or 160 columns when piped (no truncated cells)."""
    from rich.console import Console

    probe = Console()
    return probe if probe.is_terminal else Console(width=160)


def _rho_list(ctx: click.Context, param: click.Parameter, value: str) -> list[float]:
    """Parse ``0.4``, ``0.2,0.3,0.4`` or a range ``START:STOP:STEP`` (inclusive), mixed with commas."""
    out: list[float] = []
    for item in (v.strip() for v in str(value).split(",")):
        if not item:
            continue
        try:
            if ":" in item:
                start, stop, step = (float(x) for x in item.split(":"))
                if step <= 0 or stop < start:
                    raise ValueError
                n = int(round((stop - start) / step)) + 1
                out.extend(round(start + i * step, 10) for i in range(n))
            else:
                out.append(float(item))
        except ValueError:
            raise click.BadParameter(f"expected numbers or START:STOP:STEP ranges; got {item!r}") from None
    if not out:
        raise click.BadParameter("expected at least one residency fraction")
    return out


def _progress(total_hint: int | None = None):
    """A Rich progress bar on stderr when it is a terminal; a no-op otherwise."""
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    console = Console(stderr=True)
    return Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                    console=console, transient=True, disable=not console.is_terminal)


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="expertcache")
def main() -> None:
    """Measure Mixture-of-Experts expert caching honestly.

    Pipeline: routing trace -> event stream (FCFS continuous batching) ->
    event-atomic replay -> counts. Start with `expertcache demo`.
    """
