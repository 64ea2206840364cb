"""The §2.5 conformance trace: hand-derived counts (docs/conformance.md), checked layer by layer."""

from __future__ import annotations

from dataclasses import replace

from expertcache.conformance import CONFORMANCE_CONFIG, EXPECTED, conformance_stream
from expertcache.replay import capacities_for_rho, replay


def test_shape_of_the_conformance_trace():
    s = conformance_stream()
    assert (s.n_layers, s.n_experts, s.n_events) == (3, 4, 15)
    assert s.union == 30
    assert sorted(set(s.step.tolist())) == [0, 1, 2, 3, 4]
    assert capacities_for_rho(0.5, 3, 4).tolist() == [2, 2, 2]


def test_event_atomic_counts_match_the_pencil_derivation():
    r = replay(conformance_stream(), CONFORMANCE_CONFIG)
    assert (r.hits, r.demand_misses, r.transferred) == (12, 18, 18)
    # docs/conformance.md: 4 hits and 6 misses in every layer
    assert [(x.hits, x.demand_misses) for x in r.per_layer] == [(4, 6), (4, 6), (4, 6)]
    assert EXPECTED["event-atomic"] == (12, 18)


def test_sequential_ascending_counts_differ_and_match_the_derivation():
    r = replay(conformance_stream(), replace(CONFORMANCE_CONFIG, semantics="sequential-ascending"))
    assert (r.hits, r.demand_misses) == (6, 24)
    assert [(x.hits, x.demand_misses) for x in r.per_layer] == [(2, 8), (2, 8), (2, 8)]
    assert EXPECTED["sequential-ascending"] == (6, 24)


def test_conformance_command(run_cli=None):
    from click.testing import CliRunner

    from expertcache.cli import main

    res = CliRunner().invoke(main, ["conformance", "--json"])
    assert res.exit_code == 0, res.output
    assert '"ok": true' in res.output
