"""expertcache: honest measurement of Mixture-of-Experts expert caching.

The pipeline reads left to right::

    RoutingTrace --schedule--> EventStream --replay(policy, cache)--> ReplayResult

Importing the package does no work: submodules are loaded on first use.
"""

from __future__ import annotations

__version__ = "0.1.0"

__all__ = ["__version__"]
