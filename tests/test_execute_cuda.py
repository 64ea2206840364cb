"""expertcache execute on CUDA: the same equality of counts with real host->device copies (skipped without a GPU).

Not run in the session that wrote it (no GPU there); see docs/execute.md, "Not done here".
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


@pytest.mark.parametrize("contract", ["fused", "serialized"])
@pytest.mark.parametrize("policy", ["lru", "lfu", "demand"])
def test_cuda_counts_equal_replay_and_logits_equal_reference(contract, policy):
    from expertcache.execute import ExecuteConfig
    from expertcache.execute.run import replay_prediction
    from expertcache.execute.runner import Executor
    from expertcache.execute.tiny import make_model, prompt_ids

    ids = [f"r{i}" for i in range(len(prompt_ids()))]
    base = dict(batch=4, max_new_tokens=6, device="cuda")
    ref = Executor(make_model("qwen3_moe"), ExecuteConfig(**base), eos_token_ids=[1], offload=False,
                   keep_logits=True).run(prompt_ids(), ids)
    res = Executor(make_model("qwen3_moe"), ExecuteConfig(policy=policy, rho=0.25, contract=contract, **base),
                   eos_token_ids=[1], keep_logits=True).run(prompt_ids(), ids)
    pred, _ = replay_prediction(res)
    assert [(x.hits, x.misses) for x in res.per_layer] == [(p.hits, p.demand_misses) for p in pred.per_layer]
    assert res.transfers_copied == res.transferred
    assert res.generated == ref.generated
    assert all(torch.equal(a, b) for a, b in zip(res.logits, ref.logits, strict=True))
    s = res.summary()
    assert s["copy_gb_per_s"] is None or s["copy_gb_per_s"] > 0
    print(f"cuda {contract} {policy}: host->device {s['copy_gb_per_s']} GB/s over {res.transfers_copied} copies")
