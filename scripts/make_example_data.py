"""Regenerate the bundled example trace (src/expertcache/data/example_trace).

    python scripts/make_example_data.py

The example is synthetic (expertcache.trace.synth), shaped like OLMoE-1B-7B
(16 MoE layers, 64 experts, top-8); the demo splits it by request into a
calibration half (even requests) and an evaluation half (odd requests).
"""

from __future__ import annotations

import sys
from pathlib import Path

from expertcache.trace.synth import EXAMPLE_CONFIG, synthesize_trace

out = Path(__file__).resolve().parents[1] / "src" / "expertcache" / "data" / "example_trace"
trace = synthesize_trace(EXAMPLE_CONFIG)
trace.save(out, overwrite=True)
print(f"wrote {out} ({trace.n_requests} requests, {trace.n_tokens} tokens)", file=sys.stderr)
