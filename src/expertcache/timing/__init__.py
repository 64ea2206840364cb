"""The timing stage: a replay put on a device timeline (compute and the host-to-device link) under a profile.

Importing this package loads numpy only; numba loads with the first :func:`simulate`.
"""

from __future__ import annotations

from typing import Any

from .profile import PROFILES, HardwareProfile, load_profile, profile_names, save_profile

__all__ = ["HardwareProfile", "PROFILES", "load_profile", "save_profile", "profile_names", "simulate",
           "TimingResult", "Timeline", "CONTRACTS", "simulate_prefetch"]


def __getattr__(name: str) -> Any:
    if name in ("simulate", "TimingResult", "Timeline", "CONTRACTS"):
        from . import model

        return getattr(model, name)
    if name == "simulate_prefetch":
        from . import prefetch

        return prefetch.simulate_prefetch
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
