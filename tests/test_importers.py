"""Importers of foreign routing data (issue 4, item 6): small hand-written files, hand-derived expectations."""

from __future__ import annotations

import json

import numpy as np
import pytest

from expertcache.errors import ValidationError
from expertcache.trace import DECODE, PREFILL, read_trace
from expertcache.trace.importers import import_deepseek_csv, import_mixtral_jsonl


def _jsonl(path, rows) -> str:
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return str(path)


def _row(ds, pid, layer, experts, gates=None, pos_key="token_idx", pos=0, **extra):
    r = {"dataset": ds, "problem_id": pid, "layer": layer, "experts": experts, pos_key: pos, **extra}
    if gates is not None:
        r["gating_probs"] = gates
    return r


# ----------------------------------------------------------------------------- Mixtral JSON Lines
MIXTRAL = [
    _row("gsm8k", 0, 0, [7, 0], [0.8, 0.2], pos=0),
    _row("gsm8k", 0, 1, [3, 1], [0.6, 0.4], pos=0),
    _row("gsm8k", 0, 1, [1, 4], [0.7, 0.3], pos=1),  # layers of a token may come in any order
    _row("gsm8k", 0, 0, [2, 5], [0.5, 0.5], pos=1),
    _row("mbpp", 3, 1, [6, 0], [0.9, 0.1], pos_key="token_pos", pos=0),
    _row("mbpp", 3, 0, [0, 1], [0.55, 0.45], pos_key="token_pos", pos=0),
    _row("mbpp", 3, 0, [4, 2], [0.6, 0.4], pos_key="token_pos", pos=2),  # layer 1 missing; token 1 absent
]


def test_mixtral_infers_shape_and_drops_incomplete_step(tmp_path):
    tr, rep = import_mixtral_jsonl(_jsonl(tmp_path / "m.jsonl", MIXTRAL))
    # Hand-derived: layers {0, 1}; max id 7 -> N >= 8; every row lists 2 experts.
    assert (tr.n_layers, tr.n_experts, tr.top_k) == (2, 8, 2)
    assert set(rep.inferred) == {"n_layers", "n_experts", "top_k"}
    assert rep.n_experts_is_lower_bound and rep.layer_ids == (0, 1)
    assert tr.request_ids == ("gsm8k/0", "mbpp/3")
    assert tr.request.tolist() == [0, 0, 1] and tr.position.tolist() == [0, 1, 0]
    assert tr.phase.tolist() == [DECODE] * 3
    assert tr.experts.tolist() == [[[7, 0], [3, 1]], [[2, 5], [1, 4]], [[0, 1], [6, 0]]]
    np.testing.assert_allclose(tr.gates, [[[0.8, 0.2], [0.6, 0.4]], [[0.5, 0.5], [0.7, 0.3]],
                                          [[0.55, 0.45], [0.9, 0.1]]], rtol=1e-6)
    assert tr.token_id.tolist() == [-1, -1, -1]
    assert (rep.n_rows, rep.n_bad_rows, rep.n_steps, rep.n_requests) == (7, 0, 3, 2)
    assert rep.n_incomplete_steps == 1
    assert "mbpp/3" in rep.incomplete_examples[0] and "token 2" in rep.incomplete_examples[0]
    assert "layer(s) 1 missing" in rep.incomplete_examples[0]
    assert rep.n_position_gaps == 1  # mbpp/3 has tokens 0 and 2, not 1
    assert rep.has_gates
    assert any("lower bound" in n for n in rep.notes)


def test_mixtral_given_shape_is_used_and_not_reported_as_inferred(tmp_path):
    tr, rep = import_mixtral_jsonl(_jsonl(tmp_path / "m.jsonl", MIXTRAL), n_layers=2, n_experts=8, top_k=2)
    assert (tr.n_layers, tr.n_experts, tr.top_k) == (2, 8, 2)
    assert rep.inferred == () and not rep.n_experts_is_lower_bound
    tr, rep = import_mixtral_jsonl(_jsonl(tmp_path / "m.jsonl", MIXTRAL), n_experts=64)
    assert tr.n_experts == 64 and rep.inferred == ("top_k", "n_layers")


def test_mixtral_round_trips_through_the_native_format(tmp_path):
    tr, _ = import_mixtral_jsonl(_jsonl(tmp_path / "m.jsonl", MIXTRAL), provenance={"model": "mixtral-8x7b"})
    back = read_trace(tr.save(tmp_path / "trace"))
    assert back.request_ids == tr.request_ids
    assert np.array_equal(back.experts, tr.experts) and np.allclose(back.gates, tr.gates)
    assert back.provenance["model"] == "mixtral-8x7b"
    assert back.provenance["import"]["n_incomplete_steps"] == 1


def test_mixtral_phase_option_and_per_row_phase(tmp_path):
    rows = [_row("d", 0, 0, [1, 0], pos=0, phase="prefill"), _row("d", 0, 0, [1, 2], pos=1)]
    tr, rep = import_mixtral_jsonl(_jsonl(tmp_path / "m.jsonl", rows), phase="decode")
    assert tr.phase.tolist() == [PREFILL, DECODE]
    assert not rep.has_gates and tr.gates is None
    assert any("1 row(s) without a 'phase' field imported as decode" in n for n in rep.notes)
    tr, _ = import_mixtral_jsonl(_jsonl(tmp_path / "m.jsonl", rows[1:]), phase="prefill")
    assert tr.phase.tolist() == [PREFILL]
    with pytest.raises(ValidationError, match="phase must be"):
        import_mixtral_jsonl(_jsonl(tmp_path / "m.jsonl", rows), phase="both")


BAD = [
    _row("g", 0, 0, [1, 0], pos=0),
    _row("g", 0, 1, [2, 3], pos=0),
    _row("g", 0, 0, [1, 1], pos=1),          # line 3: repeated expert id
    _row("g", 0, 1, [2, 0], pos=1),
    '{"dataset": "g", "problem_id": 0, "lay',  # line 5: truncated JSON
    _row("g", 0, 0, [4, 5], pos=2),
    _row("g", 0, 1, [4, 5], pos=2),
    _row("g", 0, 1, [4, 6], pos=2),          # line 8: duplicate (token 2, layer 1)
    _row("g", 0, 0, [4, 5, 6], pos=3),       # line 9: three experts where k = 2
    _row("g", 0, 1, [4, 5], pos=3),
]


def test_bad_rows_raise_with_line_and_field_by_default(tmp_path):
    path = _jsonl(tmp_path / "bad.jsonl", BAD)
    with pytest.raises(ValidationError) as info:
        import_mixtral_jsonl(path)
    assert info.value.record == 3 and info.value.field == "experts"
    assert "distinct" in str(info.value) and "--skip-bad-rows" in str(info.value)


def test_bad_rows_skipped_counted_and_their_steps_dropped(tmp_path):
    tr, rep = import_mixtral_jsonl(_jsonl(tmp_path / "bad.jsonl", BAD), skip_bad_rows=True)
    # Bad: line 3 (repeated id), 5 (JSON), 8 (duplicate), 9 (length 3). Token 1 and 3 lose layer 0 -> incomplete.
    assert rep.n_rows == 10 and rep.n_bad_rows == 4
    assert [e.split(": ")[1] for e in rep.bad_row_examples] == ["record 3", "record 5", "record 8", "record 9"]
    assert rep.n_incomplete_steps == 2 and rep.top_k == 2
    assert tr.position.tolist() == [0, 2]
    assert tr.experts.tolist() == [[[1, 0], [2, 3]], [[4, 5], [4, 5]]]


def test_too_small_expert_count_and_layer_count_are_rejected(tmp_path):
    path = _jsonl(tmp_path / "m.jsonl", MIXTRAL)
    with pytest.raises(ValidationError, match=r"\[0, 7\)") as info:
        import_mixtral_jsonl(path, n_experts=7)
    assert info.value.record == 1
    with pytest.raises(ValidationError, match="no complete step"):
        import_mixtral_jsonl(path, n_layers=3)  # layer 2 never appears: nothing is padded
    with pytest.raises(ValidationError, match="--top-k must be"):
        import_mixtral_jsonl(path, n_experts=2, top_k=4)


def test_empty_and_non_json_files(tmp_path):
    (tmp_path / "e.jsonl").write_text("\n")
    with pytest.raises(ValidationError, match="no readable routing rows"):
        import_mixtral_jsonl(tmp_path / "e.jsonl")
    (tmp_path / "x.jsonl").write_text("[1, 2]\n")
    with pytest.raises(ValidationError, match="expected a JSON object"):
        import_mixtral_jsonl(tmp_path / "x.jsonl")


# ----------------------------------------------------------------------------- DeepSeek CSV
HEADER = "Layer ID,Batch Number,Token,Activated Expert IDs\n"


def _csv(path, body: str) -> str:
    path.write_text(HEADER + body)
    return str(path)


P0 = (
    '1,0,Hello,"[3, 17, 42]"\n'
    '1,0,world,"[1, 2, 3]"\n'
    '1,0,!,"[7, 8, 9]"\n'
    '2,0,Hello,"[0, 5, 6]"\n'
    '2,0,world,"[4, 5, 6]"\n'   # layer 2 lists one token fewer: token 2 lacks layer 2 (trailing -> incomplete)
)


def test_deepseek_one_forward_is_one_teacher_forced_decode_request(tmp_path):
    tr, rep = import_deepseek_csv(_csv(tmp_path / "p0.csv", P0))
    # Layer ids 1, 2 (layer 0 of DeepSeek-V2-Lite is dense) -> MoE layers 0, 1; max id 42 -> N >= 43; k = 3.
    assert (tr.n_layers, tr.n_experts, tr.top_k) == (2, 43, 3)
    assert rep.layer_ids == (1, 2) and rep.n_experts_is_lower_bound
    assert any("mapped to MoE layers 0..1" in n for n in rep.notes)
    assert tr.request_ids == ("p0",)
    # Token i of the batch row is the i-th row of every layer; all are decode positions of one request.
    assert tr.position.tolist() == [0, 1] and tr.phase.tolist() == [DECODE, DECODE]
    assert tr.experts.tolist() == [[[3, 17, 42], [0, 5, 6]], [[1, 2, 3], [4, 5, 6]]]
    assert tr.gates is None and tr.token_id.tolist() == [-1, -1]
    assert rep.n_rows == 5 and rep.n_steps == 2 and rep.n_incomplete_steps == 1 and rep.n_gap_tokens == 0
    assert "token 2" in rep.incomplete_examples[0] and "layer(s) 2 missing" in rep.incomplete_examples[0]
    assert "teacher-forced over the prompt; no generation" in rep.reading
    assert "teacher-forced over the prompt; no generation" in tr.provenance["reading"]
    tr, rep = import_deepseek_csv(_csv(tmp_path / "p0.csv", P0), phase="prefill")
    assert tr.phase.tolist() == [PREFILL, PREFILL] and "prefill" in rep.reading


def test_deepseek_batch_rows_become_separate_requests(tmp_path):
    body = ('1,0,a,"[1, 2]"\n1,0,b,"[2, 3]"\n1,1,x,"[4, 5]"\n'
            '2,0,a,"[0, 1]"\n2,0,b,"[1, 0]"\n2,1,x,"[5, 6]"\n')
    tr, rep = import_deepseek_csv(_csv(tmp_path / "t.csv", body), n_experts=8)
    # batch row 0 is request "t" (tokens a, b), batch row 1 is request "t/1" (token x): never stitched together
    assert tr.request_ids == ("t", "t/1") and tr.request.tolist() == [0, 0, 1]
    assert tr.position.tolist() == [0, 1, 0]
    assert tr.experts.tolist() == [[[1, 2], [0, 1]], [[2, 3], [1, 0]], [[4, 5], [5, 6]]]
    assert any("batch row b > 0 is its own request" in n for n in rep.notes)


def test_deepseek_directory_reads_files_in_name_order(tmp_path):
    d = tmp_path / "csv"
    d.mkdir()
    _csv(d / "b.csv", P0)
    _csv(d / "a.csv", '2,0,x,"[40, 41, 0]"\n1,0,x,"[9, 8, 7]"\n')
    tr, rep = import_deepseek_csv(d)
    assert tr.request_ids == ("a", "b") and [s.rsplit("/", 1)[1] for s in rep.sources] == ["a.csv", "b.csv"]
    assert tr.request.tolist() == [0, 1, 1]
    assert tr.experts[0].tolist() == [[9, 8, 7], [40, 41, 0]]
    assert rep.n_requests == 2 and rep.n_steps == 3 and rep.n_incomplete_steps == 1
    with pytest.raises(ValidationError, match="same request id"):
        import_deepseek_csv([d / "a.csv", d / "a.csv"])


def test_deepseek_misaligned_layer_is_dropped_not_shifted(tmp_path):
    # Layer 1 lists tokens 11, 13 where layer 0 lists 11, 12, 13: which token it lacks is unknowable.
    path = _csv(tmp_path / "a.csv", "0,0,11,[1 2]\n0,0,12,[2 3]\n0,0,13,[3 4]\n1,0,11,[5 6]\n1,0,13,[6 7]\n")
    tr_err = None
    with pytest.raises(ValidationError, match="no complete step"):
        import_deepseek_csv(path, n_experts=64)
    # A layer listing fewer tokens (a prefix) is alignable: only its trailing tokens are incomplete.
    path = _csv(tmp_path / "b.csv", "0,0,11,[1 2]\n0,0,12,[2 3]\n0,0,13,[3 4]\n1,0,11,[5 6]\n1,0,12,[6 7]\n")
    tr, rep = import_deepseek_csv(path, n_experts=64)
    assert tr.position.tolist() == [0, 1] and tr.token_id.tolist() == [11, 12]
    assert tr.experts.tolist() == [[[1, 2], [5, 6]], [[2, 3], [6, 7]]]
    assert rep.n_incomplete_steps == 1 and rep.inferred == ("top_k", "n_layers") and tr_err is None


def test_deepseek_bad_rows_and_header(tmp_path):
    path = _csv(tmp_path / "p.csv", '0,0,a,"[1, 2]"\n0,0,b,"[1, x]"\n0,0,c,"[3, 3]"\n0,0,d,"[4, 5]"\n')
    with pytest.raises(ValidationError) as info:
        import_deepseek_csv(path)
    assert info.value.record == 3 and info.value.field == "Activated Expert IDs"
    tr, rep = import_deepseek_csv(path, skip_bad_rows=True)
    assert rep.n_bad_rows == 2 and tr.position.tolist() == [0, 1]  # the rows of a and d, renumbered
    (tmp_path / "h.csv").write_text("layer,batch,token,experts\n0,0,a,[1 2]\n")
    with pytest.raises(ValidationError, match="expected the header"):
        import_deepseek_csv(tmp_path / "h.csv")
    with pytest.raises(ValidationError, match="no such file"):
        import_deepseek_csv(tmp_path / "missing.csv")


def test_docs_example_runs_and_prints_what_its_comments_say(capsys):
    import re
    from pathlib import Path

    text = (Path(__file__).resolve().parents[1] / "docs" / "importers.md").read_text()
    (block,) = re.findall(r"```python\n(.*?)```", text, flags=re.S)
    exec(compile(block, "docs/importers.md", "exec"), {})
    printed = capsys.readouterr().out.splitlines()
    promised = [line.split("# ")[1] for line in block.splitlines() if line.lstrip().startswith("print(")]
    assert printed == promised


def test_cli_trace_import_foreign_formats(tmp_path):
    from click.testing import CliRunner

    from expertcache.cli import main

    src = _jsonl(tmp_path / "m.jsonl", MIXTRAL)
    r = CliRunner().invoke(main, ["trace", "import", str(src), "--format", "mixtral-jsonl", "-o", str(tmp_path / "t")])
    assert r.exit_code == 0, r.output
    assert "L=2 N=8 k=2" in r.output and "lower bound" in r.output and "1 incomplete steps" in r.output
    assert read_trace(tmp_path / "t").request_ids == ("gsm8k/0", "mbpp/3")
    r = CliRunner().invoke(main, ["trace", "import", str(_csv(tmp_path / "p0.csv", P0)), "--format", "deepseek-csv",
                                  "-o", str(tmp_path / "d"), "--json"])
    assert r.exit_code == 0, r.output
    assert json.loads(r.output)["report"]["format"] == "deepseek-csv"
    # the old --prefill-batches reading is refused with the reason, nothing written
    r = CliRunner().invoke(main, ["trace", "import", str(tmp_path / "p0.csv"), "--format", "deepseek-csv",
                                  "--prefill-batches", "1", "-o", str(tmp_path / "d2")])
    assert r.exit_code == 2 and "not a generation step" in r.output and not (tmp_path / "d2").exists()
    # --phase prefill leaves nothing to schedule; events build names the option that gives decode tokens
    r = CliRunner().invoke(main, ["trace", "import", str(tmp_path / "p0.csv"), "--format", "deepseek-csv",
                                  "--phase", "prefill", "-o", str(tmp_path / "d3")])
    assert r.exit_code == 0, r.output
    r = CliRunner().invoke(main, ["events", "build", str(tmp_path / "d3"), "--batch", "1", "-o", str(tmp_path / "e3")])
    assert r.exit_code == 2 and "--phase decode" in r.output and not (tmp_path / "e3").exists()
    # routes-jsonl needs the shape: a one-line error, nothing written
    r = CliRunner().invoke(main, ["trace", "import", str(src), "-o", str(tmp_path / "x")])
    assert r.exit_code == 2 and "needs --layers, --experts and --top-k" in r.output
    assert not (tmp_path / "x").exists()
