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


def _jobs(jobs: int) -> int:
    """``--jobs`` checked (one line and exit 2 below 0) and resolved: 0 = the local cores."""
    from .._threads import default_jobs

    if jobs < 0:
        _fail(f"--jobs must be >= 0; got {jobs}")
    return jobs or default_jobs()


def _require_new(out: str, overwrite: bool, *, file: bool = False) -> None:
    """Refuse an output before any work: an existing one without ``--overwrite``, and with it anything but
    a directory (or file) this tool may replace (:func:`expertcache.storage.check_output`, docs/safety.md).

    The write itself is atomic and checks again at the instant of replacing.
    """
    from ..errors import OutputExistsError
    from ..storage import check_output

    try:
        check_output(out, overwrite, directory=not file)
    except OutputExistsError as exc:
        _fail(str(exc))


def _echo_json(obj: Any) -> None:
    """Print ``obj`` as one JSON line carrying ``schema_version`` and ``tool_version`` (docs/design.md §5).

    Every ``--json`` output goes through here: one object for a single result, one per line (JSON Lines)
    for per-run records; keys are snake_case (a policy name used as a key is written ``belady_forced``).
    """
    from ..storage import json_text

    click.echo(json_text(obj, snake=True))


#: Optional modules, the extra (pyproject.toml) that installs each, and the commands whose extra it is.
_OPTIONAL = {"torch": None, "transformers": None, "safetensors": None, "tokenizers": None,
             "ray": "ray", "matplotlib": "plot", "sklearn": "nextuse", "libcachesim": "libcachesim"}
_MODEL_EXTRAS = {"collect": "collect", "routers": "routers", "execute": "execute"}


def _absent(module: str) -> bool:
    import importlib.util

    try:
        return importlib.util.find_spec(module) is None
    except (ImportError, ValueError):         # a broken install, or blocked (sys.modules[name] = None)
        return True


def _command_path() -> str:
    ctx = click.get_current_context(silent=True)
    return ctx.command_path if ctx is not None else "expertcache"


def _missing_line(modules: list[str], extra: str) -> str:
    """The one line for missing optional modules (docs/design.md §5)."""
    return (f"`{_command_path()}` needs {', '.join(modules)}, which {'is' if len(modules) == 1 else 'are'} not "
            f"installed: pip install 'expertcache[{extra}]'")


def _require_extra(extra: str, *modules: str) -> None:
    """Fail with one line naming ``pip install 'expertcache[EXTRA]'`` when any of ``modules`` is missing.

    Called first by the commands that need an optional extra (``collect``, ``execute``, ``routers``), before
    any input is read, as ``--plot`` does for matplotlib.
    """
    missing = [m for m in modules if _absent(m)]
    if missing:
        _fail(_missing_line(missing, extra))


def _extra_for(module: str) -> str | None:
    """The extra that installs ``module`` for the running command, or None for a module that is not optional."""
    root = module.split(".")[0]
    if root not in _OPTIONAL:
        return None
    if _OPTIONAL[root] is not None:
        return _OPTIONAL[root]
    words = _command_path().split()
    return _MODEL_EXTRAS.get(words[1] if len(words) > 1 else "", "collect")


def _guard(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Turn package errors into a one-line message and exit status 2.

    A closed stdout (``expertcache trace info T | head -1``) is not an error: the BrokenPipeError goes on
    to click, which exits quietly. Other ``OSError`` (unreadable input, a full disk) print the file
    they concern and what happened.
    """
    import functools

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except ExpertCacheError as exc:
            _fail(str(exc))
        except ModuleNotFoundError as exc:   # an optional dependency imported deep inside: the extra to install
            extra = _extra_for(exc.name or "")
            if extra is None:
                raise
            _fail(_missing_line([(exc.name or "").split(".")[0]], extra))
        except BrokenPipeError:
            raise
        except OSError as exc:  # unreadable input, full disk: the user's environment, not a bug
            _fail(_os_error_line(exc))

    return wrapper


def _os_error_line(exc: OSError) -> str:
    """One line for an ``OSError``: the file it concerns, what happened, and for a full disk what to do."""
    import errno

    what = exc.strerror or str(exc) or type(exc).__name__
    where = f"{exc.filename}: " if exc.filename else ""
    hint = ""
    if exc.errno in (errno.ENOSPC, getattr(errno, "EDQUOT", -1)) or "no space left" in what.lower():
        hint = "; free some space or write elsewhere (no partial output was kept)"
    return f"{where}{what}{hint}"


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


#: The most residency fractions one ``--rho`` option may list (a range is expanded, so it is bounded first).
MAX_RHO_VALUES = 10_000


def _rho_list(ctx: click.Context, param: click.Parameter, value: str) -> list[float]:
    """Parse ``0.4``, ``0.2,0.3,0.4`` or a range ``START:STOP:STEP`` (inclusive), mixed with commas.

    Every value must be a number in [0, 1], and all together at most :data:`MAX_RHO_VALUES` (checked
    before a range is expanded).
    """
    import math

    out: list[float] = []
    for item in (v.strip() for v in str(value).split(",")):
        if not item:
            continue
        try:
            if ":" in item:
                start, stop, step = (float(x) for x in item.split(":"))
                if not all(math.isfinite(x) for x in (start, stop, step)) or step <= 0 or stop < start:
                    raise ValueError
                count = math.floor((stop - start) / step + 0.5) + 1
                if count + len(out) > MAX_RHO_VALUES:
                    raise click.BadParameter(f"{item!r} expands to {count} values; at most {MAX_RHO_VALUES} "
                                             "residency fractions per run (use a larger STEP)")
                values = [round(start + i * step, 10) for i in range(count)]
            else:
                values = [float(item)]
        except ValueError:
            raise click.BadParameter(f"expected numbers or START:STOP:STEP ranges; got {item!r}") from None
        bad = [v for v in values if not (math.isfinite(v) and 0.0 <= v <= 1.0)]
        if bad:
            raise click.BadParameter(f"rho must be a number in [0, 1]; got {bad[0]!r}")
        out.extend(values)
        if len(out) > MAX_RHO_VALUES:
            raise click.BadParameter(f"at most {MAX_RHO_VALUES} residency fractions per run; got more")
    if not out:
        raise click.BadParameter("expected at least one residency fraction")
    return out


def _progress(total_hint: int | None = None):
    """A Rich progress bar on stderr when it is a terminal; a no-op otherwise."""
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    console = Console(stderr=True)
    return Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                    console=console, transient=True, disable=_QUIET or not console.is_terminal)


class _working:
    """An indeterminate progress bar with elapsed time for one long call (``with _working("building events"):``)."""

    def __init__(self, description: str) -> None:
        self.description = description

    def __enter__(self) -> Any:
        import logging

        logging.getLogger("expertcache.cli").info("%s ...", self.description)
        self._bar = _progress()
        self._bar.__enter__()
        self._bar.add_task(self.description, total=None)
        return self._bar

    def __exit__(self, *exc: Any) -> None:
        self._bar.__exit__(*exc)


def read_calibration(path: str, batch: int | None = None, offsets: Any = None, *, what: str = "--calibration") -> Any:
    """A calibration input as an event stream: a stream directory as it is, a trace as its FCFS decode events.

    A trace is built at ``batch`` (and ``offsets``); without ``batch`` at the concurrency of the stream it
    calibrates is unknown, so the caller passes the evaluated stream's own B.
    """
    from ..events import EventStream, build_events

    cal = read_calibration_input(path, what=what)
    return cal if isinstance(cal, EventStream) else build_events(cal, batch or 1, offsets)


def _stream_batch(stream: Any) -> int:
    """The concurrency B a stream was built at (its provenance), for a calibration trace built alike; else 1."""
    b = stream.provenance.get("batch")
    return int(b) if isinstance(b, int) and not isinstance(b, bool) and b >= 1 else 1


def read_calibration_input(path: str, *, what: str = "--calibration") -> Any:
    """A calibration input as it is: a :class:`~expertcache.trace.RoutingTrace` or an event stream."""
    import json
    from pathlib import Path

    from ..errors import ValidationError
    from ..events import read_events
    from ..trace import read_trace

    try:
        kind = json.loads((Path(path) / "manifest.json").read_text()).get("kind")
    except (OSError, ValueError, AttributeError):
        raise ValidationError(f"{what}: expected a stream or trace directory with a manifest.json",
                              source=path, field="calibration") from None
    return read_events(path) if kind == "event_stream" else read_trace(path)


#: Option spellings renamed for one convention (docs/cli.md): a quantity's option takes one value or a comma
#: list (``--rho``, ``--policy``, ``--seed``), a sweep beside a single value is ``--sweep-X``, a cache capacity
#: is ``--capacity/-C``. The old spellings still work for a while, with a note on stderr.
RENAMED: dict[tuple[str, ...], dict[str, str]] = {
    ("report",): {"--seeds": "--seed", "--rhos": "--sweep-rho", "--batches": "--sweep-batch"},
    ("align",): {"--batches": "--sweep-batch"},
    ("affinity",): {"--policies": "--policy"},
    ("experiment", "static-vs-dynamic"): {"--batches": "--batch"},
    ("experiment", "prefill-order"): {"--policies": "--policy"},
    ("experiment", "prefill-gap"): {"--rhos": "--rho", "--seeds": "--seed"},
    ("experiment", "transition"): {"--rhos": "--rho", "--seeds": "--seed"},
    ("prefetch", "compare"): {"--policies": "--policy", "-B": "-C"},
    ("prefetch", "replay"): {"-B": "-C"},
    ("routers", "eval"): {"--budgets": "--sweep-budget", "--capacities": "--sweep-capacity"},
}


def _renamed(args: list[str]) -> list[str]:
    """``args`` with the old spellings of :data:`RENAMED` replaced (a note on stderr for each)."""
    words: list[str] = []
    for a in args:                      # the command path: the leading words (root options such as -v skipped)
        if a.startswith("-"):
            if words:
                break
            continue
        words.append(a)
        if len(words) == 2:
            break
    path = tuple(words)
    root = args[:args.index(words[0])] if words else []
    quiet = "-q" in root or "--quiet" in root
    key = path if path in RENAMED else path[:1]
    table = RENAMED.get(key, {})
    if not table:
        return args
    out = []
    for a in args:
        name, eq, value = a.partition("=")
        if len(name) > 2 and not name.startswith("--") and name[:2] in table:   # -B8
            name, eq, value = name[:2], "", a[2:]
        new = table.get(name) if a.startswith("-") else None
        if new is not None:
            if not quiet:
                click.echo(f"note: {name} is now spelled {new} ('expertcache {' '.join(key)} -h')", err=True)
            a = new + eq + value
        out.append(a)
    return out


_NO_ARGS_IS_HELP = getattr(click.exceptions, "NoArgsIsHelpError", ())


class _Main(click.Group):
    """The top-level group: a usage error (bad option value, unknown option) is one line, exit status 2,
    like every other error a user can cause (``error: ...; see 'expertcache CMD -h'``)."""

    def main(self, args=None, prog_name=None, complete_var=None, standalone_mode=True, **extra):  # type: ignore[override]
        args = _renamed(list(sys.argv[1:] if args is None else args))
        if not standalone_mode:
            return super().main(args, prog_name, complete_var, standalone_mode=False, **extra)
        try:
            rv = super().main(args, prog_name, complete_var, standalone_mode=False, **extra)
        except _NO_ARGS_IS_HELP as exc:     # a bare group (click >= 8.2): its help, as click prints it
            exc.show()
            sys.exit(exc.exit_code)
        except click.UsageError as exc:
            where = exc.ctx.command_path if exc.ctx is not None else "expertcache"
            message = " ".join(exc.format_message().split())
            _fail(f"{message}; see '{where} -h'")
        except click.ClickException as exc:
            exc.show()
            sys.exit(exc.exit_code)
        except click.Abort:
            click.echo("Aborted!", err=True)
            sys.exit(1)
        sys.exit(rv if isinstance(rv, int) and not isinstance(rv, bool) else 0)


def _set_verbosity(ctx: click.Context, param: click.Parameter, value: Any) -> Any:
    """``-v``/``-q`` on the root: the ``expertcache`` logger's level (stderr), and ``-q`` hides progress bars."""
    ctx.meta[f"expertcache.{param.name}"] = value
    configure_logging(ctx.meta.get("expertcache.verbose", 0), ctx.meta.get("expertcache.quiet", False))
    return value


def configure_logging(verbose: int = 0, quiet: bool = False) -> None:
    """Log records of ``expertcache.*`` to stderr: warnings by default, ``-v`` info, ``-vv`` debug, ``-q`` errors."""
    import logging

    global _QUIET
    _QUIET = bool(quiet)
    from .. import _notes

    _notes.compile_note = not _QUIET and sys.stderr.isatty()   # kernels compiling at first use: said once
    level = logging.ERROR if quiet else (logging.WARNING, logging.INFO)[min(verbose, 1)] if verbose < 2 \
        else logging.DEBUG
    logger = logging.getLogger("expertcache")
    logger.setLevel(level)
    if not any(getattr(h, "_expertcache", False) for h in logger.handlers):
        handler = logging.StreamHandler()        # sys.stderr at emit time (works under test runners too)
        handler.setFormatter(logging.Formatter("%(levelname)s %(name)s: %(message)s"))
        handler._expertcache = True              # type: ignore[attr-defined]
        logger.addHandler(handler)
        logger.propagate = False


_QUIET = False


@click.group(cls=_Main, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="expertcache")
@click.option("-v", "--verbose", count=True, expose_value=False, is_eager=True, callback=_set_verbosity,
              help="Log what the command does to stderr (-v info, -vv debug).")
@click.option("-q", "--quiet", is_flag=True, expose_value=False, is_eager=True, callback=_set_verbosity,
              help="Only errors on stderr: no progress bars, no notes.")
def main() -> None:
    """Measure Mixture-of-Experts expert caching honestly.

    Pipeline: routing trace -> event stream (FCFS continuous batching) ->
    event-atomic replay -> counts. Start with `expertcache demo`.
    """
