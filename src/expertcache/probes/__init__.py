"""Workload probe sets (§3.4, §5.6): a diversity-controlled builder and prompt-side diagnostics (B1).

Imports only the standard library and numpy.
"""

from .builder import BuildConfig, ProbeRecord, ProbeSet, build_probe_set, write_probe_set
from .diagnostics import PromptRecord, PromptStats, prompt_diagnostics, read_prompts
from .sources import Payload, discover_sources, example_sources_dir, read_source, read_sources
from .text import jaccard, mean_pairwise_jaccard, ngrams
from .wrappers import Form, Framing, Style, Wrappers, default_wrappers_path, load_wrappers

__all__ = [
    "BuildConfig", "ProbeRecord", "ProbeSet", "build_probe_set", "write_probe_set",
    "PromptRecord", "PromptStats", "prompt_diagnostics", "read_prompts",
    "Payload", "discover_sources", "example_sources_dir", "read_source", "read_sources",
    "jaccard", "mean_pairwise_jaccard", "ngrams",
    "Form", "Framing", "Style", "Wrappers", "default_wrappers_path", "load_wrappers",
]
