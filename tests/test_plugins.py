"""Policies registered from Python (docs/policies.md): the docs example, built-ins reproduced exactly,
an independent naive twin (``tests/naive_plugin.py``), sweeps, the CLI, and one-line errors for bad plugins."""

from __future__ import annotations

import re
from pathlib import Path

import naive
import naive_plugin
import numba
import numpy as np
import pytest
from click.testing import CliRunner

from expertcache.cli import main
from expertcache.errors import ValidationError
from expertcache.events import EventStream
from expertcache.replay import (
    POLICIES,
    ReplayConfig,
    register_policy,
    replay,
    replay_curve,
    replay_hits,
    sweep,
    unregister_policy,
)

ROOT = Path(__file__).resolve().parents[1]


@numba.njit
def lfu_key(b, t, last, freq, state):
    return freq[b]


@numba.njit
def lfru_key(b, t, last, freq, state):
    return freq[b] / float(t - last[b] + 1)


@numba.njit
def lru2_update(b, t, hit, last, freq, state):
    state[b, 0] = last[b]


@numba.njit
def lru2_key(b, t, last, freq, state):
    return state[b, 0]


@numba.njit
def hits_update(b, t, hit, last, freq, state):
    # a second state column, and the hit flag: hits are worth 2, misses 1 (a new, made-up policy)
    state[b, 0] += 2.0 if hit else 1.0
    state[b, 1] = t


@numba.njit
def hits_key(b, t, last, freq, state):
    return state[b, 0] - 0.1 * (t - state[b, 1])


PLUGINS = {   # name -> (key, update, state)
    "t-lfu": (lfu_key, None, ()),
    "t-lfru": (lfru_key, None, ()),
    "t-lru2": (lru2_key, lru2_update, (-1.0,)),
    "t-hits": (hits_key, hits_update, (0.0, 0.0)),
}


@pytest.fixture(scope="module")
def registered():
    for name, (key, update, state) in PLUGINS.items():
        register_policy(name, key=key, update=update, state=state)
    yield
    for name in PLUGINS:
        unregister_policy(name)


def random_stream(seed: int) -> EventStream:
    """A small skewed random stream: 1-3 layers, 2-6 experts, gaps in steps and layers."""
    rng = np.random.default_rng(seed)
    L, N = int(rng.integers(1, 4)), int(rng.integers(2, 7))
    k = int(rng.integers(1, N + 1))
    steps, layers, experts, active = [], [], [], []
    for s in range(int(rng.integers(2, 12))):
        for layer in range(L):
            if rng.random() < 0.25:
                continue
            a = int(rng.integers(1, 4))
            size = int(rng.integers(1, min(N, a * k) + 1))
            weights = np.r_[np.full(2, 4.0), np.ones(N - 2)][rng.permutation(N)]
            members = rng.choice(N, size=size, replace=False, p=weights / weights.sum())
            steps.append(s)
            layers.append(layer)
            experts.append(members.tolist())
            active.append(a)
    if not steps:
        steps, layers, experts, active = [0], [0], [[0]], [1]
    return EventStream.from_lists(L, N, k, steps, layers, experts, active)


def configs(stream, rng):
    L, N = stream.n_layers, stream.n_experts
    for scope in ("per-layer", "global"):
        caps = [{"rho": float(rng.random())},
                {"capacity": tuple(int(c) for c in rng.integers(0, N + 2, size=L)) if scope == "per-layer"
                 else int(rng.integers(0, L * N + 2))}]
        for cap in caps:
            for semantics in ("event-atomic", "sequential-ascending", "sequential-random"):
                for tie_break, seed in (("id", 0), ("random", 0), ("random", int(rng.integers(1, 10**6)))):
                    yield dict(scope=scope, semantics=semantics, tie_break=tie_break, seed=seed, **cap)


def per_layer(res):
    return [x.hits for x in res.per_layer], [x.demand_misses for x in res.per_layer]


def test_docs_example_runs_and_prints_what_the_docs_say(capsys):
    text = (ROOT / "docs" / "policies.md").read_text()
    code = re.findall(r"```python\n(.*?)```", text, flags=re.S)
    assert len(code) == 1
    printed = text.split(code[0], 1)[1].split("```\n\nprints\n\n```\n", 1)[1].split("```", 1)[0]
    try:
        exec(compile(code[0], "docs/policies.md", "exec"), {})
        assert capsys.readouterr().out == printed
        assert printed == "lru-2 3 5\nlru 1 7\n"      # derived by hand in docs/policies.md
    finally:
        if "lru-2" in POLICIES:
            unregister_policy("lru-2")


def test_registered_keys_reproduce_the_builtins_exactly(registered):
    rng = np.random.default_rng(11)
    for seed in range(25):
        stream = random_stream(seed)
        for kw in configs(stream, rng):
            for mine, builtin in (("t-lfu", "lfu"), ("t-lfru", "lfru")):
                got, want = replay(stream, ReplayConfig(mine, **kw)), replay(stream, ReplayConfig(builtin, **kw))
                assert per_layer(got) == per_layer(want), (mine, kw, seed)
                assert (got.hits, got.transferred) == (want.hits, want.transferred)


def test_registered_lfu_equals_the_naive_twin_of_lfu(registered):
    rng = np.random.default_rng(5)
    for seed in range(10):
        stream = random_stream(100 + seed)
        for kw in configs(stream, rng):
            want = naive.naive_replay(stream, "lfu", **kw)
            got = replay(stream, ReplayConfig("t-lfu", **kw))
            assert per_layer(got) == (want["per_layer_hits"], want["per_layer_demand_misses"]), (kw, seed)


@pytest.mark.parametrize("name", ["t-lru2", "t-hits", "t-lfru"])
def test_registered_policies_equal_the_naive_plugin_twin(registered, name):
    key, update, state = PLUGINS[name]
    rng = np.random.default_rng(len(name))
    for seed in range(20):
        stream = random_stream(200 + seed)
        for kw in configs(stream, rng):
            warm = int(rng.integers(0, stream.n_events + 1))
            want = naive_plugin.naive_plugin_replay(stream, key.py_func, update.py_func if update else None, state,
                                                    warmup_events=warm, **kw)
            got = replay(stream, ReplayConfig(name, warmup_events=warm, **kw))
            assert per_layer(got) == (want["per_layer_hits"], want["per_layer_demand_misses"]), (name, kw, warm)


def test_a_new_policy_differs_from_lru(registered):
    """The LRU-2 twin and engine agree above; this checks that the comparison can fail (it is not LRU)."""
    differs = 0
    for seed in range(20):
        s = random_stream(300 + seed)
        kw = dict(rho=0.3, tie_break="id")
        differs += replay(s, ReplayConfig("t-lru2", **kw)).hits != replay(s, ReplayConfig("lru", **kw)).hits
    assert differs > 0


def test_hit_flags_sweeps_and_curves_accept_a_registered_policy(registered):
    s = random_stream(7)
    res, flags = replay_hits(s, ReplayConfig("t-lru2", rho=0.3))
    assert int(flags.sum()) == res.hits
    rhos = [0.1, 0.3, 0.6]
    curve = replay_curve(s, ReplayConfig("t-lru2"), rhos)
    swept = sweep(s, [ReplayConfig("t-lru2", rho=r) for r in rhos] + [ReplayConfig("lru", rho=0.3)])
    one = [replay(s, ReplayConfig("t-lru2", rho=r)) for r in rhos]
    assert [c.hits for c in curve] == [c.hits for c in one] == [c.hits for c in swept[:3]]
    assert swept[3].policy == "lru"


def test_cli_plugin_file(tmp_path, registered):
    s = random_stream(9)
    s.save(tmp_path / "s")
    plugin = tmp_path / "my_policies.py"
    plugin.write_text("import numba\nfrom expertcache.replay import register_policy\n\n"
                      "@numba.njit\ndef key(b, t, last, freq, state):\n    return freq[b]\n\n"
                      "register_policy('cli-lfu', key=key)\n")
    try:
        args = ["replay", str(tmp_path / "s"), "--plugin", str(plugin), "--policy", "cli-lfu,lfu", "--json"]
        res = CliRunner().invoke(main, args)
        assert res.exit_code == 0, res.output
        rows = [__import__("json").loads(x) for x in res.output.splitlines()]
        assert [r["policy"] for r in rows] == ["cli-lfu", "lfu"] and rows[0]["hits"] == rows[1]["hits"]
        res = CliRunner().invoke(main, args)           # the same file again in one process: not re-run
        assert res.exit_code == 0, res.output
    finally:
        if "cli-lfu" in POLICIES:
            unregister_policy("cli-lfu")
    bad = tmp_path / "bad.py"
    bad.write_text("raise RuntimeError('boom')\n")
    res = CliRunner().invoke(main, ["replay", str(tmp_path / "s"), "--plugin", str(bad), "--policy", "lru"])
    assert res.exit_code == 2 and res.output.count("\n") == 1 and "boom" in res.output, res.output
    wrong = tmp_path / "wrong.py"
    wrong.write_text("from expertcache.replay import register_policy\nregister_policy('w', key=lambda b, t: 0.0)\n")
    res = CliRunner().invoke(main, ["replay", str(tmp_path / "s"), "--plugin", str(wrong), "--policy", "w"])
    assert res.exit_code == 2 and res.output.count("\n") == 1, res.output
    assert str(wrong) in res.output and "must take exactly key(b, t, last, freq, state)" in res.output
    res = CliRunner().invoke(main, ["replay", str(tmp_path / "s"), "--plugin", str(tmp_path / "none.py")])
    assert res.exit_code == 2 and res.output.count("\n") == 1 and "no such plugin file" in res.output
    res = CliRunner().invoke(main, ["replay", str(tmp_path / "s"), "--policy", "not-registered"])
    assert res.exit_code == 2 and "unknown policy" in res.output


def _one_line(excinfo) -> str:
    msg = str(excinfo.value)
    assert "\n" not in msg, msg
    return msg


def test_bad_plugins_raise_one_line():
    def two_args(b, t):
        return 0.0

    with pytest.raises(ValidationError, match=r"must take exactly key\(b, t, last, freq, state\)") as e:
        register_policy("bad-1", key=two_args)
    _one_line(e)

    @numba.njit
    def untypable(b, t, last, freq, state):
        return {"a": object()}[b]

    with pytest.raises(ValidationError, match="does not compile with numba") as e:
        register_policy("bad-2", key=untypable)
    _one_line(e)

    def opens_a_file(b, t, last, freq, state):   # plain Python functions are jitted at registration
        return len(open("x").read())

    with pytest.raises(ValidationError, match="does not compile with numba") as e:
        register_policy("bad-3", key=opens_a_file)
    _one_line(e)

    @numba.njit
    def tuple_key(b, t, last, freq, state):
        return (freq[b], last[b])

    with pytest.raises(ValidationError, match="must return a real number") as e:
        register_policy("bad-4", key=tuple_key)
    _one_line(e)

    @numba.njit
    def bad_update(b, t, last, freq, state):
        state[b, 0] = 1.0

    with pytest.raises(ValidationError, match=r"update must take exactly update\(b, t, hit") as e:
        register_policy("bad-5", key=lfu_key, update=bad_update, state=(0.0,))
    _one_line(e)
    for kwargs, pattern in (({"key": 3}, "must be a function"), ({}, "needs key="),
                            ({"key": lfu_key, "state": "ab"}, "state must be a sequence of numbers")):
        with pytest.raises(ValidationError, match=pattern) as e:
            register_policy("bad-6", **kwargs)
        _one_line(e)
    with pytest.raises(ValidationError, match="already registered"):
        register_policy("lru", key=lfu_key)
    with pytest.raises(ValidationError, match="a policy name must be"):
        register_policy("has space", key=lfu_key)
    with pytest.raises(ValidationError, match="built in"):
        unregister_policy("lru")
    assert not [n for n in POLICIES if n.startswith("bad-")]
