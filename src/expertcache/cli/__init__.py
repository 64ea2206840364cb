"""The command line: the ``main`` group and shared options in main.py, one module per command group."""

from . import (  # noqa: F401  (their decorators register them on main)
    audit,
    collect,
    events,
    execute,
    experiment,
    nextuse,
    prefetch,
    prereg,
    probe,
    replay,
    report,
    routers,
    spec,
    timing,
    trace,
)
from .main import main

# These modules each define one click command or group named like the module; they import their heavy
# dependencies (torch, transformers, ray) lazily, inside the commands.
for _module in (collect, routers, prefetch, spec, prereg, probe, audit, execute):
    main.add_command(getattr(_module, _module.__name__.rsplit(".", 1)[1]))

__all__ = ["main"]
