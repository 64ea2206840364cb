"""Traces and streams survive a save/load round trip exactly; writes are atomic."""

from __future__ import annotations

import numpy as np
import pytest

from expertcache.errors import OutputExistsError
from expertcache.events import build_events, dump_events_jsonl, import_events_jsonl, read_events
from expertcache.storage import atomic_directory
from expertcache.trace import import_routes_jsonl, read_trace, select_requests
from expertcache.trace.examples import example_trace


def test_trace_roundtrip(tmp_path):
    tr = select_requests(example_trace(), [5, 2, 9])
    tr.save(tmp_path / "t")
    back = read_trace(tmp_path / "t")
    assert back.request_ids == tr.request_ids
    for name in ("request", "phase", "position", "experts", "gates", "token_id"):
        assert np.array_equal(getattr(back, name), getattr(tr, name)), name
    assert back.provenance == tr.provenance


def test_jsonl_import_matches_records(routes_file):
    tr = import_routes_jsonl(routes_file, 2, 6, 2)
    assert tr.request_ids == ("req0", "req1", "req2")
    # request 1, token 2 (position 12), layer 1 routed to (1+2+1+j) % 6
    row = 1 * 4 + 2
    assert tr.position[row] == 12 and tr.experts[row, 1].tolist() == [4, 5]
    assert tr.token_id[row] == 102


def test_stream_roundtrip_and_jsonl_inverse(tmp_path):
    s = build_events(select_requests(example_trace(), range(6)), 3)
    s.save(tmp_path / "s")
    back = read_events(tmp_path / "s")
    for name in ("step", "layer", "active", "logical_per_event", "offsets", "expert", "multiplicity", "gate_mass"):
        assert np.array_equal(getattr(back, name), getattr(s, name)), name
    (tmp_path / "s.jsonl").write_text(dump_events_jsonl(s))
    again = import_events_jsonl(tmp_path / "s.jsonl", s.n_layers, s.n_experts, s.top_k)
    for name in ("step", "layer", "active", "offsets", "expert", "multiplicity"):
        assert np.array_equal(getattr(again, name), getattr(s, name)), name
    assert np.allclose(again.gate_mass, s.gate_mass, atol=1e-5)


def test_atomic_directory_leaves_nothing_on_failure(tmp_path):
    out = tmp_path / "out"
    with pytest.raises(RuntimeError):
        with atomic_directory(out) as tmp:
            (tmp / "partial").write_text("x")
            raise RuntimeError("boom")
    assert list(tmp_path.iterdir()) == []
    out.mkdir()
    with pytest.raises(OutputExistsError):
        with atomic_directory(out):
            pass


def test_atomic_file_keeps_the_old_content_on_failure(tmp_path):
    from expertcache.storage import atomic_file, atomic_write_bytes

    target = tmp_path / "out.json"
    atomic_write_bytes(target, b"old")
    with pytest.raises(RuntimeError), atomic_file(target) as tmp:
        with open(tmp, "wb") as fh:
            fh.write(b"half")
        raise RuntimeError("killed mid-write")
    assert target.read_bytes() == b"old"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.json"]
    atomic_write_bytes(target, b"new")
    assert target.read_bytes() == b"new"


def test_atomic_file_names_a_missing_folder(tmp_path):
    from expertcache.errors import ValidationError
    from expertcache.storage import atomic_write_bytes

    with pytest.raises(ValidationError, match="the folder .*missing does not exist"):
        atomic_write_bytes(tmp_path / "missing" / "a.npz", b"x")
    with pytest.raises(ValidationError, match="is a directory"):
        atomic_write_bytes(tmp_path, b"x")


def test_event_sums_are_exact_in_int64_and_take_no_widened_copy(monkeypatch):
    """``read_events``' per-event multiplicity sums: the naive sums (past int32 too), across chunk boundaries,
    without a whole int64 copy of the members (``np.add.reduceat`` alone widens its input first)."""
    import tracemalloc

    from expertcache.events import stream as S

    rng = np.random.default_rng(4)
    sizes = rng.integers(1, 9, 5_000)
    offsets = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
    for dtype in (np.int16, np.int32, np.int64):
        vals = rng.integers(1, min(np.iinfo(dtype).max // 2, 2 ** 40), offsets[-1]).astype(dtype)
        want = np.array([int(vals[a:b].astype(object).sum()) for a, b in zip(offsets[:-1], offsets[1:], strict=True)])
        monkeypatch.setattr(S, "_SUM_MEMBERS", 37)            # many chunks of whole events, one event at least
        assert (S._event_sums(vals, offsets) == want).all(), dtype
        monkeypatch.undo()
        assert (S._event_sums(vals, offsets) == want).all(), dtype
    vals = np.ones(2_000_000, dtype=np.int32)
    offsets = np.arange(0, vals.shape[0] + 1, 40, dtype=np.int64)
    tracemalloc.start()
    sums = S._event_sums(vals, offsets)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert (sums == 40).all()
    assert peak < sums.nbytes + 4 * 2 ** 20 < 8 * vals.shape[0]           # the output and a few MB, not 16 MB
    big = np.ones(3 * 2 ** 18, dtype=np.int32)                            # one event past the chunk size
    assert S._event_sums(big, np.array([0, 5, big.shape[0] - 1, big.shape[0]])).tolist() == [5, big.shape[0] - 6, 1]
