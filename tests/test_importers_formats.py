"""warp-jsonl, columnar, multi-file input, categories from the data, gaps, fast = record-by-record, and the
bad-input contract (>= 10 hand-written bad files per format: exit 2, one line naming the file, nothing written)."""

from __future__ import annotations

import json

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner

from expertcache.cli import main
from expertcache.trace import DECODE, PREFILL, read_trace
from expertcache.trace.importers import (
    import_columnar,
    import_mixtral_jsonl,
    import_routes_jsonl,
    import_warp_jsonl,
)


def _lines(path, rows):
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return str(path)


# ----------------------------------------------------------------------------- warp
def test_warp_fields_multi_file_and_categories(tmp_path):
    a = _lines(tmp_path / "a.jsonl", [{"tok": 1, "layers": [[1, 2], [3, 4]]}, {"tok": 2, "layers": [[2, 5], [4, 0]]}])
    b = _lines(tmp_path / "b.jsonl", [{"tok": 1, "layers": [[0, 1], [1, 2]]}])
    tr, rep = import_warp_jsonl([a, b], category_from="file")
    assert tr.request_ids == ("a", "b") and tr.position.tolist() == [1, 2, 1]
    assert tr.experts.tolist() == [[[1, 2], [3, 4]], [[2, 5], [4, 0]], [[0, 1], [1, 2]]]
    assert (tr.n_layers, tr.n_experts, tr.top_k) == (2, 6, 2) and (tr.phase == DECODE).all()
    assert tr.provenance["categories"] == {"a": "a", "b": "b"} and rep.categories_from == "file"
    slow, _ = import_warp_jsonl([a, b], category_from="file", fast=False)
    assert np.array_equal(slow.experts, tr.experts) and slow.request_ids == tr.request_ids


def test_interior_token_missing_a_layer_is_a_gap_not_silently_dropped(tmp_path):
    # tok 2 lists one layer only; tok 3 is complete: tok 2 is an interior gap. tok 4 (trailing) is incomplete.
    path = _lines(tmp_path / "g.jsonl", [{"tok": 1, "layers": [[1, 2], [3, 4]]}, {"tok": 2, "layers": [[2, 5]]},
                                         {"tok": 3, "layers": [[0, 1], [1, 2]]}, {"tok": 4, "layers": [[0, 1]]}])
    tr, rep = import_warp_jsonl(path)
    assert tr.position.tolist() == [1, 3]
    assert rep.n_gap_tokens == 1 and rep.gaps == (("g", 2),) and rep.n_incomplete_steps == 2
    assert rep.n_position_gaps == 1 and "position 2" in rep.gap_examples[0]
    r = CliRunner().invoke(main, ["trace", "import", path, "--format", "warp-jsonl", "-o", str(tmp_path / "t")])
    assert r.exit_code == 0 and "gaps: 1 interior token(s) missing a layer (request, position): ('g', 2)" in r.output


# ----------------------------------------------------------------------------- columnar
def test_columnar_parquet_with_a_map_gates_and_category_column(tmp_path):
    t = pa.table({"req_id": ["x", "x", "y", "y", "x", "x"], "token_idx": [0, 0, 0, 0, 1, 1],
                  "layer": [0, 1, 0, 1, 1, 0], "topk_ids": [[1, 2], [3, 4], [5, 6], [7, 0], [2, 1], [4, 3]],
                  "topk_weights": [[0.6, 0.4], [0.5, 0.5], [0.9, 0.1], [0.7, 0.3], [0.8, 0.2], [0.55, 0.45]],
                  "task": ["math", "math", "code", "code", "math", "math"]})
    pq.write_table(t, tmp_path / "h.parquet")
    tr, rep = import_columnar(tmp_path / "h.parquet", category_from="task",
                              mapping="request=req_id,position=token_idx,experts=topk_ids,gates=topk_weights")
    assert tr.request_ids == ("x", "y") and tr.position.tolist() == [0, 1, 0]
    assert tr.experts.tolist() == [[[1, 2], [3, 4]], [[4, 3], [2, 1]], [[5, 6], [7, 0]]]
    np.testing.assert_allclose(tr.gates[1], [[0.55, 0.45], [0.8, 0.2]], rtol=1e-6)
    assert tr.provenance["categories"] == {"x": "math", "y": "code"}


def test_columnar_csv_with_bom_string_lists_and_request_from_file(tmp_path):
    (tmp_path / "p1.csv").write_bytes(b"\xef\xbb\xbflayer,experts,phase\n0,[1 2],prefill\n1,\"[3, 4]\",prefill\n"
                                      b"0,5 6,decode\n1,\"7,0\",decode\n")
    (tmp_path / "p2.csv").write_text("layer,experts,phase\n0,[1 3],decode\n1,[2 4],decode\n")
    tr, rep = import_columnar(tmp_path, n_experts=8, category_from="file")
    assert tr.request_ids == ("p1", "p2") and tr.phase.tolist() == [PREFILL, DECODE, DECODE]
    assert tr.position.tolist() == [0, 1, 0]  # ranks within (request, layer): no position column
    assert tr.experts.tolist() == [[[1, 2], [3, 4]], [[5, 6], [7, 0]], [[1, 3], [2, 4]]]
    assert tr.provenance["categories"] == {"p1": "p1", "p2": "p2"}


def test_columnar_per_token_list_of_lists_and_const_request(tmp_path):
    path = _lines(tmp_path / "s.jsonl", [{"step": 0, "ids": [[1, 2], [3, 4]]}, {"step": 1, "ids": [[2, 1], [4, 5]]}])
    tr, _ = import_columnar(path, mapping="request=@const:run7,position=step,experts=ids")
    assert tr.request_ids == ("run7",) and tr.experts.tolist() == [[[1, 2], [3, 4]], [[2, 1], [4, 5]]]


# ----------------------------------------------------------------------------- multi-file, categories, parity
MIX = [{"dataset": "gsm8k", "problem_id": 0, "layer": 0, "experts": [1, 0], "gating_probs": [0.6, 0.4], "token_idx": 0},
       {"dataset": "gsm8k", "problem_id": 0, "layer": 1, "experts": [2, 3], "gating_probs": [0.5, 0.5], "token_idx": 0}]
MIX2 = [{"dataset": "humaneval", "problem_id": 4, "layer": 1, "experts": [5, 6], "token_pos": 0,
         "gating_probs": [0.7, 0.3]},
        {"dataset": "humaneval", "problem_id": 4, "layer": 0, "experts": [7, 4], "token_pos": 0,
         "gating_probs": [0.9, 0.1]}]


def test_mixtral_several_files_categories_from_dataset_and_fast_equals_slow(tmp_path):
    a, b = _lines(tmp_path / "a.jsonl", MIX), _lines(tmp_path / "b.jsonl", MIX2)
    tr, rep = import_mixtral_jsonl([a, b], category_from="dataset")
    assert tr.request_ids == ("gsm8k/0", "humaneval/4") and rep.n_rows == 4
    assert tr.provenance["categories"] == {"gsm8k/0": "gsm8k", "humaneval/4": "humaneval"}
    slow, _ = import_mixtral_jsonl([a, b], category_from="dataset", fast=False)
    d1, d2 = tr.save(tmp_path / "f"), slow.save(tmp_path / "s")
    assert (d1 / "routes.parquet").read_bytes() == (d2 / "routes.parquet").read_bytes()
    r = CliRunner().invoke(main, ["trace", "import", a, b, "--format", "mixtral-jsonl", "--category-from", "dataset",
                                  "-o", str(tmp_path / "t")])
    assert r.exit_code == 0 and "categories (from dataset): gsm8k, humaneval" in r.output
    assert read_trace(tmp_path / "t").n_requests == 2


def test_routes_several_files_and_category_field(tmp_path):
    rows = [{"request_id": "r", "phase": "decode", "position": p, "layer": l, "experts": [l, p + 2],
             "category": "c1"} for p in range(2) for l in range(2)]
    a = _lines(tmp_path / "a.jsonl", rows)
    b = _lines(tmp_path / "b.jsonl", [dict(r, request_id="s", category="c2") for r in rows])
    tr = import_routes_jsonl([a, b], 2, 4, 2, category_from="category")
    assert tr.request_ids == ("r", "s") and tr.provenance["categories"] == {"r": "c1", "s": "c2"}
    assert import_routes_jsonl([a, b], 2, 4, 2, fast=False).request_ids == ("r", "s")


# ----------------------------------------------------------------------------- the bad-input contract
def _routes(**over):
    r = {"request_id": "r", "phase": "decode", "position": 0, "layer": 0, "experts": [1, 2]}
    r.update(over)
    return json.dumps(r)


BAD = {
    "routes-jsonl": [
        ("empty", "", None), ("truncated", _routes()[:-9], None), ("not-object", "[1, 2]", None),
        ("nan-id", _routes(experts=[1, float("nan")]).replace("NaN", "NaN"), "experts"),
        ("huge-id", _routes(experts=[1, 2**63 + 1]), "experts"), ("negative-id", _routes(experts=[-3, 1]), "experts"),
        ("float-id", _routes(experts=[1.5, 2]), "experts"), ("string-position", _routes(position="0"), "position"),
        ("bad-phase", _routes(phase="gen"), "phase"), ("layer-out-of-range", _routes(layer=7), "layer"),
        ("repeated-id", _routes(experts=[2, 2]), "experts"), ("bool-request", _routes(request_id=True), "request_id"),
    ],
    "mixtral-jsonl": [
        ("empty", "", None), ("truncated", json.dumps(MIX[0])[:-7], None), ("not-object", "3", None),
        ("huge-id", json.dumps(dict(MIX[0], experts=[1, 2**63 + 1])), "experts"),
        ("nan-id", json.dumps(dict(MIX[0], experts=[1, float("nan")])), "experts"),
        ("negative-id", json.dumps(dict(MIX[0], experts=[-1, 2])), "experts"),
        ("no-position", json.dumps({k: v for k, v in MIX[0].items() if k != "token_idx"}), "token_pos"),
        ("string-layer", json.dumps(dict(MIX[0], layer="0")), "layer"),
        ("bad-gates", json.dumps(dict(MIX[0], gating_probs=[0.5])), "gating_probs"),
        ("bad-problem", json.dumps(dict(MIX[0], problem_id=[1])), "problem_id"),
        ("bad-phase", json.dumps(dict(MIX[0], phase="both")), "phase"),
    ],
    "warp-jsonl": [
        ("empty", "", None), ("truncated", '{"tok": 1, "layers": [[1, 2], [3', None), ("not-object", "[]", None),
        ("no-tok", json.dumps({"layers": [[1, 2]]}), "tok"), ("string-tok", json.dumps({"tok": "1", "layers": [[1, 2]]}), "tok"),
        ("negative-tok", json.dumps({"tok": -1, "layers": [[1, 2]]}), "tok"),
        ("flat-layers", json.dumps({"tok": 1, "layers": [1, 2]}), "layers"),
        ("huge-id", json.dumps({"tok": 1, "layers": [[1, 2**63 + 1]]}), "layers"),
        ("float-id", json.dumps({"tok": 1, "layers": [[1.5, 2]]}), "layers"),
        ("repeated-id", json.dumps({"tok": 1, "layers": [[3, 3]]}), "layers"),
        ("no-layers", json.dumps({"tok": 1}), "layers"),
    ],
    "deepseek-csv": [
        ("empty", "", None), ("bad-header", "a,b,c,d\n1,0,x,[1 2]\n", None),
        ("short-row", "Layer ID,Batch Number,Token,Activated Expert IDs\n1,0\n", None),
        ("text-layer", "Layer ID,Batch Number,Token,Activated Expert IDs\nx,0,t,[1 2]\n", "Layer ID"),
        ("negative-batch", "Layer ID,Batch Number,Token,Activated Expert IDs\n1,-1,t,[1 2]\n", "Batch Number"),
        ("text-ids", "Layer ID,Batch Number,Token,Activated Expert IDs\n1,0,t,\"[1, x]\"\n", "Activated Expert IDs"),
        ("huge-id", f"Layer ID,Batch Number,Token,Activated Expert IDs\n1,0,t,\"[1, {2**63 + 1}]\"\n",
         "Activated Expert IDs"),
        ("repeated-id", "Layer ID,Batch Number,Token,Activated Expert IDs\n1,0,t,\"[4, 4]\"\n", "Activated Expert IDs"),
        ("empty-ids", "Layer ID,Batch Number,Token,Activated Expert IDs\n1,0,t,\"[]\"\n", "Activated Expert IDs"),
        ("field-over-128k", "Layer ID,Batch Number,Token,Activated Expert IDs\n1,0,\"" + "x" * 140_000 + "\",[1 2]\n",
         None),
        ("header-only", "Layer ID,Batch Number,Token,Activated Expert IDs\n", None),
    ],
    "columnar": [
        ("empty", "", None), ("header-only", "layer,experts\n", None), ("no-experts", "layer,ids\n0,[1 2]\n", None),
        ("text-layer", "layer,experts\nx,[1 2]\n", "layer"), ("text-ids", "layer,experts\n0,\"[1, x]\"\n", "experts"),
        ("negative-id", "layer,experts\n0,[-1 2]\n", "experts"), ("huge-id", "layer,experts\n0,[1 99999]\n", "experts"),
        ("repeated-id", "layer,experts\n0,[3 3]\n", "experts"), ("short-row", "layer,experts\n0\n", None),
        ("field-over-128k", "layer,experts\n0,\"" + "1 " * 70_000 + "\"\n", None),
        ("bad-phase", "layer,experts,phase\n0,[1 2],gen\n", "phase"),
    ],
}
_EXT = {"deepseek-csv": ".csv", "columnar": ".csv"}


@pytest.mark.parametrize("fmt,name,body,field", [(f, *case) for f, cases in BAD.items() for case in cases],
                         ids=[f"{f}-{c[0]}" for f, cases in BAD.items() for c in cases])
def test_bad_file_one_line_exit_2_nothing_written(tmp_path, fmt, name, body, field):
    src = tmp_path / f"{name}{_EXT.get(fmt, '.jsonl')}"
    src.write_text(body + ("\n" if body and not body.endswith("\n") else ""))
    before = src.read_bytes()
    out = tmp_path / "out"
    shape = ["-L", "2", "-N", "8", "-k", "2"] if fmt == "routes-jsonl" else []
    r = CliRunner().invoke(main, ["trace", "import", str(src), "--format", fmt, *shape, "-o", str(out)])
    assert r.exit_code == 2, r.output
    lines = r.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and str(src) in lines[0], r.output
    if field is not None:
        assert f"field '{field}'" in lines[0] and "record " in lines[0], lines[0]
    assert "Traceback" not in r.output and not out.exists() and src.read_bytes() == before
    assert not list(tmp_path.glob(".out*"))


def test_declared_shapes_far_beyond_the_data_allocate_nothing(tmp_path):
    src = _lines(tmp_path / "r.jsonl", [_routes()])
    r = CliRunner().invoke(main, ["trace", "import", src, "-L", "1000000000", "-N", "8", "-k", "2",
                                  "-o", str(tmp_path / "o")])
    assert r.exit_code == 2 and "--layers must be at most 32767" in r.output
    r = CliRunner().invoke(main, ["trace", "import", src, "-L", "30000", "-N", "8", "-k", "2", "-o", str(tmp_path / "o")])
    assert r.exit_code == 2 and "layer 1 has no record" in r.output  # one record, no (30000, k) block per token
    r = CliRunner().invoke(main, ["trace", "import", src, "-L", "2", "-N", "100000", "-k", "2", "-o", str(tmp_path / "o")])
    assert r.exit_code == 2 and "--experts must be at most 32768" in r.output


def test_mixtral_never_writes_an_enormous_n(tmp_path):
    """An id past the stored int16 range is refused with the bound; one past 64 bits by the shared JSON guard."""
    for big, said in ((40000, "32768"), (2**63, "64-bit")):
        src = _lines(tmp_path / "m.jsonl", [dict(MIX[0], experts=[1, big])])
        r = CliRunner().invoke(main, ["trace", "import", src, "--format", "mixtral-jsonl", "-o", str(tmp_path / "o")])
        assert r.exit_code == 2 and said in r.output and "'experts'" in r.output and not (tmp_path / "o").exists()


def test_the_compiled_scanner_in_parallel_chunks_equals_the_record_by_record_reader(tmp_path, monkeypatch):
    """Large routes files are scanned by the numba kernel in newline-aligned chunks on threads; the trace must
    equal the record-by-record reader's, and a fault found after the scan must name its line in the file."""
    import json as _json

    import expertcache.trace.importers._routes_scan as scan
    import expertcache.trace.importers.routes_jsonl as rj
    from expertcache.errors import ValidationError
    from expertcache.trace.importers import import_routes_jsonl

    lines = []
    for r in range(5):
        for pos in range(8):
            for layer in range(2):
                lines.append(_json.dumps({"request_id": f"q{r}", "phase": "decode", "position": pos,
                                          "layer": layer, "experts": [(r + pos + layer) % 6, 6 + layer],
                                          "gates": [0.625, 0.375], "token_id": 100 + pos}))
    (tmp_path / "a.jsonl").write_text("\n".join(lines) + "\n")
    monkeypatch.setattr(rj, "_SCAN_MIN_BYTES", 0)
    monkeypatch.setattr(scan, "_PARALLEL_MIN_BYTES", 1)
    monkeypatch.setattr("os.cpu_count", lambda: 4)
    fast = import_routes_jsonl(tmp_path / "a.jsonl", 2, 8, 2)
    slow = import_routes_jsonl(tmp_path / "a.jsonl", 2, 8, 2, fast=False)
    for name in ("request", "phase", "position", "experts", "gates", "token_id"):
        assert np.array_equal(getattr(fast, name), getattr(slow, name)), name
    assert fast.request_ids == slow.request_ids
    bad = lines.copy()
    bad[61] = bad[61].replace('"layer": 1', '"layer": 5')          # line 62, in the last of four chunks
    (tmp_path / "b.jsonl").write_text("\n".join(bad) + "\n")
    with pytest.raises(ValidationError) as err:
        import_routes_jsonl(tmp_path / "b.jsonl", 2, 8, 2)
    assert "record 62" in str(err.value) and "layer" in str(err.value)


def test_the_sorted_shortcut_agrees_with_lexsort():
    """Files already in (request, position, layer) order skip the sort; the check must be exactly 'lexsort would
    return the rows in place' (ties in row order)."""
    from expertcache.trace.importers._common import _lex_sorted

    rng = np.random.default_rng(0)
    for _ in range(3000):
        n = int(rng.integers(0, 9))
        r, p, layer = (rng.integers(0, 3, n) for _ in range(3))
        if rng.random() < 0.3:  # make sorted cases common
            o = np.lexsort((layer, p, r))
            r, p, layer = r[o], p[o], layer[o]
        in_place = bool(np.array_equal(np.lexsort((np.arange(n), layer, p, r)), np.arange(n)))
        assert _lex_sorted(r, p, layer) == in_place


def test_assembly_in_blocks_of_records_gives_the_same_trace_and_report(tmp_path, monkeypatch):
    """``assemble`` sorts and copies the records' ids and gates a block of records at a time (``_BLOCK_ROWS``):
    blocks of 1 and 3 records give the default's trace and report, bit for bit, on rows out of order, a row with a
    repeated id, one with an id out of range and one with too few ids (skipped with ``skip_bad_rows``; the first
    of them named without it)."""
    import expertcache.trace.importers._common as C
    from expertcache.errors import ValidationError

    rng = np.random.default_rng(5)
    rows = [{"request_id": f"q{r}", "phase": "decode", "position": pos, "layer": layer,
             "experts": rng.choice(8, 3, replace=False).tolist(), "gates": rng.random(3).tolist()}
            for r in range(4) for pos in range(6) for layer in range(3)]
    order = rng.permutation(len(rows))
    rows = [rows[i] for i in order]                   # out of order: the assembly sorts them
    rows[5]["experts"] = [1, 1, 2]
    rows[9]["experts"] = [1, 9, 2]
    rows[17]["experts"] = [4, 5]
    rows[17]["gates"] = [0.5, 0.5]
    path = _lines(tmp_path / "r.jsonl", rows)

    def run():
        tr, rep = import_columnar(path, n_layers=3, n_experts=8, top_k=3, skip_bad_rows=True)
        with pytest.raises(ValidationError) as err:
            import_columnar(path, n_layers=3, n_experts=8, top_k=3)
        return tr, rep, str(err.value)

    want = run()
    assert want[1].n_bad_rows == 3 and "record 6" in want[2] and "distinct" in want[2]
    for block in (1, 3):
        monkeypatch.setattr(C, "_BLOCK_ROWS", block)
        got = run()
        for name in ("request", "phase", "position", "experts", "gates", "token_id"):
            a, b = getattr(got[0], name), getattr(want[0], name)
            assert a.dtype == b.dtype and np.array_equal(a.view(np.uint8), b.view(np.uint8)), (block, name)
        assert got[0].request_ids == want[0].request_ids and got[1:] == want[1:], block
