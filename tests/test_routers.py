"""Cache-Learning Routers: surrogate, initialisation, hooks, losses, frozen backbone, checkpoints, advice.

Models are tiny random-init Hugging Face MoEs built from configs (2 MoE layers,
hidden 32, 8 experts); expected values come from naive re-implementations
written here, never from the code under test.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
pytest.importorskip("safetensors")

from expertcache.errors import ValidationError  # noqa: E402
from expertcache.routers.config import TrainConfig  # noqa: E402

L, N, D = 2, 8, 32


def tiny_qwen3(seed: int = 0):
    from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM

    cfg = Qwen3MoeConfig(vocab_size=96, hidden_size=D, num_hidden_layers=L, num_attention_heads=2,
                         num_key_value_heads=1, head_dim=16, intermediate_size=64, moe_intermediate_size=16,
                         num_experts=N, num_experts_per_tok=2, max_position_embeddings=128)
    torch.manual_seed(seed)
    model = Qwen3MoeForCausalLM(cfg)
    with torch.no_grad():   # larger router weights so routing is not near-uniform
        for layer in model.model.layers:
            layer.mlp.gate.weight.normal_(0.0, 0.5)
    return model


def sequences(n: int = 6, length: int = 12, seed: int = 1) -> list[list[int]]:
    rng = np.random.default_rng(seed)
    return [list(rng.integers(1, 96, size=int(rng.integers(length // 2, length + 1)))) for _ in range(n)]


# ------------------------------------------------------------------ soft top-B surrogate


def naive_topb(row: list[float], b: int) -> set[int]:
    return set(sorted(range(len(row)), key=lambda e: -row[e])[:b])


def test_soft_topb_approaches_hard_membership_as_tau_shrinks():
    from expertcache.routers.losses import soft_topb_membership

    rng = np.random.default_rng(0)
    s = rng.random((64, N))
    for b in (1, 3, 7):
        hard = np.array([[1.0 if e in naive_topb(list(r), b) else 0.0 for e in range(N)] for r in s])
        errs = []
        for tau in (1.0, 1e-1, 1e-2, 1e-3, 1e-5):
            m = soft_topb_membership(torch.tensor(s, dtype=torch.float64), b, tau).numpy()
            errs.append(np.abs(m - hard).max())
        assert all(x >= y for x, y in zip(errs, errs[1:], strict=False)), errs
        assert errs[0] > 0.1 and errs[-1] < 1e-6, errs
        # every row: exactly b memberships above one half
        m = soft_topb_membership(torch.tensor(s), b, 0.01).numpy()
        assert ((m > 0.5).sum(1) == b).all()


def test_soft_topb_formula_and_gradient():
    from expertcache.routers.losses import coverage_loss, soft_topb_membership

    s = [0.10, 0.55, 0.65, 0.15, 0.40, 0.15]      # s^T of CLR's worked example (N = 6)
    b, tau = 2, 0.03
    theta = (0.55 + 0.40) / 2                       # between the 2nd and 3rd largest
    want = [1 / (1 + math.exp(-(x - theta) / tau)) for x in s]
    st = torch.tensor(s, dtype=torch.float64, requires_grad=True)
    got = soft_topb_membership(st, b, tau)
    assert np.allclose(got.detach().numpy(), want, atol=1e-12)
    q = torch.tensor([0.05, 0.60, 0.05, 0.10, 0.10, 0.10], dtype=torch.float64)
    loss = coverage_loss(st[None], q[None], b, tau)
    assert math.isclose(float(loss.detach()), sum(qe * (1 - me) for qe, me in zip(q.tolist(), want, strict=True)), rel_tol=1e-12)
    loss.backward()
    assert st.grad is not None and float(st.grad.abs().sum()) > 0
    assert torch.equal(soft_topb_membership(st, 6, tau), torch.ones(6, dtype=torch.float64))
    with pytest.raises(ValueError):
        soft_topb_membership(st, 2, 0.0)


# ------------------------------------------------------------------ initialisation and hooks


def test_initialisation_copies_native_routers_with_wraparound():
    from expertcache.routers.modules import CacheRouters

    model = tiny_qwen3()
    r = CacheRouters.for_model(model)
    native = [layer.mlp.gate.weight for layer in model.model.layers]
    for l in range(L):
        assert torch.equal(r.temporal[l].weight, native[l])
        assert torch.equal(r.spatio[l].weight, native[(l + 1) % L])
    assert torch.equal(r.spatio[L - 1].weight, native[0])
    assert r.temporal[0].weight.data_ptr() != native[0].data_ptr()   # a copy, not a view
    assert r.added_parameters(spatio=False) == L * N * D
    assert r.added_parameters(spatio=True) == 2 * L * N * D


ARCH = {
    "qwen2_moe": dict(num_experts=N, num_experts_per_tok=2, moe_intermediate_size=16,
                      shared_expert_intermediate_size=16),
    "olmoe": dict(num_experts=N, num_experts_per_tok=2),
    "mixtral": dict(num_local_experts=N, num_experts_per_tok=2),
    "granitemoe": dict(num_local_experts=N, num_experts_per_tok=2),
    "gpt_oss": dict(num_local_experts=N, num_experts_per_tok=2, head_dim=16,
                    layer_types=["sliding_attention", "full_attention"]),
    "deepseek_v3": dict(n_routed_experts=N, num_experts_per_tok=2, moe_intermediate_size=16, first_k_dense_replace=1,
                        n_group=2, topk_group=1, kv_lora_rank=16, q_lora_rank=16, qk_rope_head_dim=8,
                        qk_nope_head_dim=8, v_head_dim=16, num_hidden_layers=3),
}


@pytest.mark.parametrize("model_type", sorted(ARCH))
def test_every_architecture_attaches(model_type):
    """Routers found in layer order (dense layers skipped), hooks see exactly what the router sees."""
    from transformers import AutoConfig, AutoModelForCausalLM

    from expertcache.routers.modules import CacheRouters, RouterTap

    kw = dict(vocab_size=64, hidden_size=D, num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1,
              intermediate_size=32, max_position_embeddings=64)
    kw.update(ARCH[model_type])
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(AutoConfig.for_model(model_type, **kw)).eval()
    r = CacheRouters.for_model(model)
    assert r.n_layers == 2
    ids = torch.randint(0, 64, (2, 5))
    with torch.no_grad(), RouterTap(model) as tap:
        model(input_ids=ids)
        hidden, logits = tap.stacked()
    assert hidden.shape == (10, 2, D) and logits.shape == (10, 2, N)
    for l, nr in enumerate(tap.natives):
        w = nr.router.weight.float()
        b = getattr(nr.router, "bias", None)
        want = hidden[:, l].float() @ w.T + (b.float() if b is not None else 0.0)
        assert torch.allclose(logits[:, l].float(), want, atol=1e-5)
        assert torch.equal(r.temporal[l].weight, w)
        if b is not None:
            assert torch.equal(r.temporal[l].bias, b.float())
            assert torch.equal(r.spatio[l].bias, tap.natives[(l + 1) % 2].router.bias.float())


def test_unsupported_architecture_is_a_clear_error():
    from transformers import LlamaConfig, LlamaForCausalLM

    from expertcache.routers.modules import CacheRouters

    model = LlamaForCausalLM(LlamaConfig(vocab_size=32, hidden_size=16, num_hidden_layers=1,
                                         num_attention_heads=2, intermediate_size=16))
    with pytest.raises(ValidationError, match="unsupported architecture model_type=.llama."):
        CacheRouters.for_model(model)


# ------------------------------------------------------------------ losses against a naive twin


def naive_losses(r, hidden, logits, prev, b, tau):
    """L_T and L_ST with explicit loops over (pair, layer), in float64."""
    def sm(x):
        x = np.asarray(x, dtype=np.float64)
        e = np.exp(x - x.max())
        return e / e.sum()

    def member(s):
        order = sorted(s, reverse=True)
        theta = (order[b - 1] + order[b]) / 2
        return np.array([1 / (1 + math.exp(-(x - theta) / tau)) for x in s])

    wt = [r.temporal[l].weight.detach().double().numpy() for l in range(L)]
    ws = [r.spatio[l].weight.detach().double().numpy() for l in range(L)]
    h, lg = hidden.double().numpy(), logits.double().numpy()
    lt, lst = [], []
    for l in range(L):
        at, ast = [], []
        for row, p in enumerate(prev.tolist()):
            if p < 0:
                continue
            q = sm(lg[row, l])
            s_t = sm(lg[p, l]) + sm(wt[l] @ h[p, l])
            src = h[row, l - 1] if l > 0 else h[p, L - 1]
            s_st = sm(ws[(l - 1) % L] @ src) + s_t
            at.append(float(q @ (1 - member(s_t))))
            ast.append(float(q @ (1 - member(s_st))))
        lt.append(np.mean(at))
        lst.append(np.mean(ast))
    return np.mean(lt), np.mean(lst)


def test_cache_losses_match_naive_twin():
    from expertcache.routers.modules import CacheRouters, cache_losses, predecessor_rows

    torch.manual_seed(3)
    r = CacheRouters(L, N, D)
    with torch.no_grad():
        for lin in [*r.temporal, *r.spatio]:
            lin.weight.normal_(0, 0.5)
    mask = torch.tensor([[1, 1, 1, 1, 1], [1, 1, 1, 0, 0]])
    prev = predecessor_rows(mask)
    assert prev.tolist() == [-1, 0, 1, 2, 3, -1, 5, 6, -1, -1]
    hidden = torch.randn(10, L, D)
    logits = torch.randn(10, L, N) * 2
    got = cache_losses(r, hidden, logits, prev, capacity=3, tau=0.05, objective="both")
    want_t, want_st = naive_losses(r, hidden, logits, prev, 3, 0.05)
    assert got.n_pairs == 6
    assert math.isclose(float(got.temporal.detach()), want_t, rel_tol=1e-5)
    assert math.isclose(float(got.spatio_temporal.detach()), want_st, rel_tol=1e-5)


# ------------------------------------------------------------------ training modes


def small_cfg(**kw):
    base = dict(mode="aux-temporal", capacity=3, tau=0.05, lr=1e-2, grad_accum=2, batch_size=2, max_steps=3,
                warmup_ratio=0.0, max_length=16, seed=0)
    base.update(kw)
    return TrainConfig(**base)


def test_frozen_backbone_stays_bit_identical(tmp_path):
    from expertcache.routers.modules import CacheRouters
    from expertcache.routers.train import train_model

    model = tiny_qwen3()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    routers = CacheRouters.for_model(model)
    t0 = [w.weight.clone() for w in routers.temporal]
    s0 = [w.weight.clone() for w in routers.spatio]
    res = train_model(model, sequences(), small_cfg(mode="aux-temporal"), tmp_path / "ck", routers=routers)
    assert res.steps == 3 and len(res.history) == 3
    after = model.state_dict()
    assert before.keys() == after.keys()
    for k in before:
        assert torch.equal(before[k], after[k]), k
    assert any(not torch.equal(a, w.weight) for a, w in zip(t0, routers.temporal, strict=True))   # the routers did learn
    assert all(torch.equal(a, w.weight) for a, w in zip(s0, routers.spatio, strict=True))         # spatio not in temporal mode
    assert not (tmp_path / "ck" / "backbone.safetensors").exists()


def test_joint_mode_does_change_the_backbone(tmp_path):
    """The frozen-backbone test above can fail: the same loop in joint mode moves the weights."""
    from expertcache.routers.train import train_model

    model = tiny_qwen3()
    gate0 = model.model.layers[0].mlp.gate.weight.clone()
    emb0 = model.model.embed_tokens.weight.clone()
    res = train_model(model, sequences(), small_cfg(mode="full", cache_weight=0.5), tmp_path / "ck")
    assert not torch.equal(gate0, model.model.layers[0].mlp.gate.weight)
    assert not torch.equal(emb0, model.model.embed_tokens.weight)
    assert {"lm", "cache", "loss"} <= set(res.history[-1])
    assert res.added_parameters == 2 * L * N * D


def test_aux_training_lowers_the_temporal_loss(tmp_path):
    from expertcache.routers.train import train_model

    model = tiny_qwen3()
    res = train_model(model, sequences(8), small_cfg(max_steps=12, lr=5e-2, grad_accum=1, batch_size=4),
                      tmp_path / "ck")
    first = np.mean([h["cache"] for h in res.history[:3]])
    last = np.mean([h["cache"] for h in res.history[-3:]])
    assert last < first


# ------------------------------------------------------------------ checkpoints


def test_checkpoint_round_trip_is_bit_identical(tmp_path):
    from expertcache.routers.checkpoint import load_checkpoint_into, load_router_weights
    from expertcache.routers.modules import CacheRouters
    from expertcache.routers.train import train_model

    model = tiny_qwen3()
    routers = CacheRouters.for_model(model)
    train_model(model, sequences(), small_cfg(mode="full", max_steps=2), tmp_path / "ck", routers=routers)
    fresh_model = tiny_qwen3(seed=9)
    fresh = CacheRouters(L, N, D)
    state = load_checkpoint_into(tmp_path / "ck", routers=fresh, backbone=fresh_model)
    assert state["step"] == 2
    for k, v in routers.state_dict().items():
        assert torch.equal(v, fresh.state_dict()[k]), k
    for k, v in model.state_dict().items():
        assert torch.equal(v, fresh_model.state_dict()[k]), k
    w = load_router_weights(tmp_path / "ck")       # numpy reader
    for l in range(L):
        assert np.array_equal(w.temporal_w[l], routers.temporal[l].weight.detach().numpy())
        assert np.array_equal(w.spatio_w[l], routers.spatio[l].weight.detach().numpy())
    assert w.meta["mode"] == "full" and w.meta["capacity"] == 3


@pytest.mark.parametrize("mode", ["aux-full", "temporal"])
def test_resumed_training_equals_uninterrupted(tmp_path, mode):
    from expertcache.routers.modules import CacheRouters
    from expertcache.routers.train import train_model

    cfg = small_cfg(mode=mode, max_steps=4, warmup_ratio=0.25, max_grad_norm=0.5)
    m1 = tiny_qwen3()
    r1 = CacheRouters.for_model(m1)
    full = train_model(m1, sequences(), cfg, tmp_path / "a", routers=r1)

    m2 = tiny_qwen3()
    part = train_model(m2, sequences(), cfg, tmp_path / "b", stop_after=2)
    assert part.steps == 2
    # joint modes: start from other weights, the checkpoint must restore them; auxiliary-only
    # checkpoints hold no backbone (the frozen base model is given again)
    m3 = tiny_qwen3(seed=5 if cfg.trains_backbone else 0)
    r3 = CacheRouters(L, N, D)
    rest = train_model(m3, sequences(), cfg, tmp_path / "b", routers=r3, resume=tmp_path / "b")
    assert rest.steps == 4
    for k, v in r1.state_dict().items():
        assert torch.equal(v, r3.state_dict()[k]), k
    if cfg.trains_backbone:
        for k, v in m1.state_dict().items():
            assert torch.equal(v, m3.state_dict()[k]), k
    assert [h["loss"] for h in full.history] == [h["loss"] for h in rest.history]


def test_resume_refuses_a_different_config(tmp_path):
    from expertcache.routers.train import train_model

    train_model(tiny_qwen3(), sequences(), small_cfg(max_steps=2), tmp_path / "ck", stop_after=1)
    with pytest.raises(ValidationError, match="capacity"):
        train_model(tiny_qwen3(), sequences(), small_cfg(max_steps=2, capacity=4), tmp_path / "ck",
                    resume=tmp_path / "ck")


def test_config_validation():
    with pytest.raises(ValidationError, match="mode must be one of"):
        TrainConfig(mode="both")
    with pytest.raises(ValidationError, match="tau must be > 0"):
        TrainConfig(tau=0)
    assert TrainConfig(mode="aux-full").uses_spatio and not TrainConfig(mode="aux-full").trains_backbone
    assert TrainConfig(mode="lm-only").objective == "none"


# ------------------------------------------------------------------ offline training and advice


def synthetic_trace(n_requests=3, prefill=2, decode=5, seed=0):
    """A RoutingTrace with hidden states and logits from a known linear router."""
    from expertcache.trace import RoutingTrace

    rng = np.random.default_rng(seed)
    w = rng.normal(0, 0.7, (L, N, D)).astype(np.float32)
    req, phase, pos = [], [], []
    for r in range(n_requests):
        for p in range(prefill + decode):
            req.append(r)
            phase.append(0 if p < prefill else 1)
            pos.append(p)
    n = len(req)
    hidden = rng.normal(0, 1, (n, L, D)).astype(np.float16)
    logits = np.einsum("nld,led->nle", hidden.astype(np.float32), w).astype(np.float16)
    experts = np.argsort(-logits.astype(np.float32), axis=-1)[..., :2].astype(np.int16)
    trace = RoutingTrace(L, N, 2, tuple(f"r{i}" for i in range(n_requests)), np.array(req, np.int32),
                         np.array(phase, np.int8), np.array(pos, np.int32), experts, None,
                         np.full(n, -1, np.int64), {})
    return trace, hidden, logits, w


def test_offline_training_and_least_squares_init(tmp_path):
    from expertcache.routers.checkpoint import load_router_weights
    from expertcache.routers.train import fit_native_routers, pair_rows, train_offline

    trace, hidden, logits, w = synthetic_trace(n_requests=6, decode=10)
    fitted, resid = fit_native_routers(hidden, logits)
    assert resid < 5e-3 and np.allclose(fitted, w, atol=2e-2)
    for l in range(L):          # the least-squares solution, as an SVD-based solver finds it
        want = np.linalg.lstsq(hidden[:, l].astype(np.float64), logits[:, l].astype(np.float64), rcond=None)[0]
        assert np.allclose(fitted[l], want.T, atol=1e-5)
    assert np.allclose(fit_native_routers(hidden, logits, chunk=7)[0], fitted, atol=1e-6)
    with pytest.raises(ValidationError, match="fewer than the hidden size"):
        fit_native_routers(hidden[:D - 1], logits[:D - 1])
    prev = pair_rows(trace.request, trace.position)
    assert prev[0] == -1 and prev[1] == 0 and prev[12] == -1 and prev[13] == 12
    cfg = small_cfg(mode="aux-full", batch_size=16, grad_accum=1, max_steps=30, lr=3e-2)
    res = train_offline(prev, hidden, logits, cfg, tmp_path / "ck", native_weights=w)
    assert res.steps == 30 and res.added_parameters == 2 * L * N * D
    assert np.mean([h["cache"] for h in res.history[-5:]]) < np.mean([h["cache"] for h in res.history[:5]])
    assert load_router_weights(tmp_path / "ck").meta["source"] == "trace"
    with pytest.raises(ValidationError, match="freezes the backbone"):
        train_offline(prev, hidden, logits, small_cfg(mode="temporal"), tmp_path / "x", native_weights=w)


def _weights(seed=1):
    from expertcache.routers.checkpoint import RouterWeights

    rng = np.random.default_rng(seed)
    return RouterWeights(rng.normal(0, 0.5, (L, N, D)).astype(np.float32),
                         rng.normal(0, 0.5, (L, N, D)).astype(np.float32), None, None, "softmax", {})


def naive_row_scores(hidden, logits, weights, prev, row, l):
    """s^T(row, l) and s^ST(row, l) from the definitions, one row at a time."""
    def sm(x):
        e = np.exp(x - x.max())
        return e / e.sum()

    h = hidden.astype(np.float64)
    lg = logits.astype(np.float64)

    def st(r, layer):
        return sm(lg[r, layer]) + sm(weights.temporal_w[layer] @ h[r, layer])

    p = prev[row]
    if p < 0:
        return st(row, l), None
    src = h[row, l - 1] if l > 0 else h[p, L - 1]
    return st(row, l), sm(weights.spatio_w[(l - 1) % L] @ src) + st(p, l)


@pytest.mark.parametrize("path", ["scores", "layerwise"])
@pytest.mark.parametrize("batch", [1, 2])
def test_advice_sums_per_request_scores_over_the_active_requests(batch, path):
    from expertcache.events import build_events
    from expertcache.routers.advice import advice_for_trace, router_advice, router_scores
    from expertcache.routers.train import pair_rows

    trace, hidden, logits, _ = synthetic_trace(n_requests=3, prefill=2, decode=4)
    # request 2 without prefill rows: its first decode row has no predecessor
    keep = ~((trace.request == 2) & (trace.phase == 0))
    from expertcache.trace import RoutingTrace
    t2 = RoutingTrace(L, N, 2, trace.request_ids, trace.request[keep], trace.phase[keep], trace.position[keep],
                      trace.experts[keep], None, trace.token_id[keep], {})
    h2, lg2 = hidden[keep], logits[keep]
    prev = pair_rows(t2.request, t2.position)
    w = _weights()
    if path == "scores":
        adv = advice_for_trace(t2, router_scores(h2, lg2, prev, w), batch, stream=build_events(t2, batch))
    else:
        adv = router_advice(t2, h2, lg2, w, batch, stream=build_events(t2, batch))
    stream = build_events(t2, batch)
    assert adv.priority.shape == adv.prefetch_score.shape == (stream.n_events, N)
    assert adv.priority.dtype == np.float32
    # naive schedule: FCFS with all arrivals at 0 -> requests in order, `batch` at a time
    dec = {r: list(np.flatnonzero((t2.request == r) & (t2.phase == 1))) for r in range(3)}
    running, queue, step_rows = [], [0, 1, 2], []
    while queue or running:
        while len(running) < batch and queue:
            running.append([queue.pop(0), 0])
        step_rows.append([dec[r][i] for r, i in running])
        for x in running:
            x[1] += 1
        running = [x for x in running if x[1] < len(dec[x[0]])]
    assert stream.n_events == len(step_rows) * L
    for s, rows in enumerate(step_rows):
        for l in range(L):
            ev = s * L + l
            want_p = sum(naive_row_scores(h2, lg2, w, prev, r, l)[0] for r in rows)
            assert np.allclose(adv.priority[ev], want_p, atol=1e-5)
            pre = [naive_row_scores(h2, lg2, w, prev, r, l)[1] for r in rows]
            pre = [x for x in pre if x is not None]
            if pre:
                assert np.allclose(adv.prefetch_score[ev], sum(pre), atol=1e-5)
            else:
                assert np.isneginf(adv.prefetch_score[ev]).all()
    if batch == 1:      # request 2's first decode step has no predecessor (no s^T carry-over) at any layer
        assert np.isneginf(adv.prefetch_score).all(axis=1).sum() == L


def _layered_trace(n_requests, prefill, decode, n_layers, n_experts, d, seed=0):
    """A RoutingTrace of any shape with random hidden states and logits (hidden, logits in float16)."""
    from expertcache.trace import RoutingTrace

    rng = np.random.default_rng(seed)
    n = n_requests * (prefill + decode)
    pos = np.tile(np.arange(prefill + decode), n_requests).astype(np.int32)
    logits = rng.normal(0, 2, (n, n_layers, n_experts)).astype(np.float16)
    experts = np.argsort(-logits.astype(np.float32), axis=-1)[..., :2].astype(np.int16)
    trace = RoutingTrace(n_layers, n_experts, 2, tuple(f"r{i}" for i in range(n_requests)),
                         np.repeat(np.arange(n_requests), prefill + decode).astype(np.int32),
                         (pos >= prefill).astype(np.int8), pos, experts, None, np.full(n, -1, np.int64), {})
    return trace, rng.normal(0, 1, (n, n_layers, d)).astype(np.float16), logits


@pytest.mark.parametrize("batch", [1, 3])
def test_layerwise_advice_equals_advice_from_stored_scores(batch):
    """router_advice (per layer, executed rows only) == advice_for_trace(router_scores(...)), bit for bit,
    with a prefill warm-up, with arrival offsets, and for the native reference."""
    from expertcache.events import ArrivalOffsets
    from expertcache.events.prefill import prefill_initialised_events
    from expertcache.routers.advice import advice_for_trace, router_advice, router_scores
    from expertcache.routers.checkpoint import RouterWeights
    from expertcache.routers.train import pair_rows

    Lb, Nb, Db = 3, 8, 16
    trace, hidden, logits = _layered_trace(5, 4, 7, Lb, Nb, Db, seed=5)
    rng = np.random.default_rng(6)
    w = RouterWeights(*(rng.normal(0, 0.5, (Lb, Nb, Db)).astype(np.float32) for _ in range(2)),
                      *(rng.normal(0, 0.1, (Lb, Nb)).astype(np.float32) for _ in range(2)), "softmax", {})
    offs = ArrivalOffsets.parse("stagger:2")
    stream = prefill_initialised_events(trace, batch, 2, offsets=offs)
    sc = router_scores(hidden, logits, pair_rows(trace.request, trace.position), w)
    for use in ("routers", "native"):
        a = advice_for_trace(trace, sc, batch, offs, stream=stream, use=use)
        b = router_advice(trace, hidden if use == "routers" else None, logits, w, batch, offs, stream=stream,
                          use=use)      # the native reference reads no hidden states
        assert a.warmup_events == b.warmup_events > 0
        assert np.array_equal(a.priority, b.priority)
        if use == "routers":
            assert np.array_equal(a.prefetch_score, b.prefetch_score)
            assert np.isfinite(b.prefetch_score[a.warmup_events:]).all()   # every row has a predecessor
        else:
            assert a.prefetch_score is None and b.prefetch_score is None
        b.to_advice().validate(stream, need=("priority",))
    with pytest.raises(ValidationError, match="needs the hidden states"):
        router_advice(trace, None, logits, w, batch, offs, stream=stream)
    from expertcache.routers.evaluate import results_table

    rows = results_table(stream, b, 2, 2)      # native advice (no prefetch array): no pre-access row
    assert [r.method for r in rows] == ["LRU", "LFU", "LRFU", "Least-Stale (SpecMD)", "Temporal Router"]


def test_layerwise_advice_memory_does_not_grow_with_layers():
    """Beyond its two float32[n_events, N] outputs, router_advice holds per-layer arrays only:
    the traced peak stays within outputs + a bound independent of L (stored scores take ~7x the outputs)."""
    import tracemalloc

    from expertcache.routers.advice import router_advice
    from expertcache.routers.checkpoint import RouterWeights

    Lb, Nb, Db = 32, 64, 8
    trace, hidden, logits = _layered_trace(4, 2, 120, Lb, Nb, Db, seed=7)
    rng = np.random.default_rng(8)
    w = RouterWeights(*(rng.normal(0, 0.5, (Lb, Nb, Db)).astype(np.float32) for _ in range(2)), None, None,
                      "softmax", {})
    tracemalloc.start()
    try:
        adv = router_advice(trace, hidden, logits, w, 1)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    outputs = adv.priority.nbytes + adv.prefetch_score.nbytes
    n_exec = 4 * 120
    per_layer = n_exec * Nb * 8                     # one float64 (rows, N) array of one layer
    assert outputs == 2 * n_exec * Lb * Nb * 4
    assert peak < outputs + 16 * per_layer         # 16 per-layer arrays: a quarter of the outputs here


def test_advice_refuses_a_stream_from_another_schedule():
    from expertcache.events import build_events
    from expertcache.routers.advice import advice_for_trace, router_advice, router_scores
    from expertcache.routers.train import pair_rows

    trace, hidden, logits, _ = synthetic_trace()
    sc = router_scores(hidden, logits, pair_rows(trace.request, trace.position), _weights())
    with pytest.raises(ValidationError, match="same --batch"):
        advice_for_trace(trace, sc, 1, stream=build_events(trace, 2))
    for bad in (0, -1, True):       # checked before scheduling (fcfs_schedule would fail obscurely)
        with pytest.raises(ValidationError, match="batch must be a positive integer"):
            advice_for_trace(trace, sc, bad)
        with pytest.raises(ValidationError, match="batch must be a positive integer"):
            router_advice(trace, hidden, logits, _weights(), bad)


# ------------------------------------------------------------------ task data


def test_gsm8k_numbers():
    from expertcache.routers.data import final_number, reference_number

    assert reference_number("so 3+4=7\n#### 1,234") == "1234"
    assert reference_number("no marker 5") is None
    assert final_number("The answer is 18.") == "18"
    assert final_number("x 3 then #### 42.50") == "42.5"
    assert final_number("nothing") is None


def test_text_and_task_files_bad_input(tmp_path):
    """Binary, empty, non-object and field-less files are one ValidationError each, naming the file."""
    from expertcache.routers.data import load_tasks, load_texts

    cases = {"bin.jsonl": (b"\x97\xff\x00abc", "UTF-8"), "empty.jsonl": (b"\n\n", "no records"),
             "list.jsonl": (b"[1, 2]\n", "JSON object"), "none.jsonl": (b'{"x": 1}\n', '"text"')}
    for name, (data, msg) in cases.items():
        (tmp_path / name).write_bytes(data)
        with pytest.raises(ValidationError, match=msg):
            load_texts(tmp_path / name)
    (tmp_path / "t.jsonl").write_text('{"question": "q", "answer": "no marker"}\n')
    with pytest.raises(ValidationError, match="####"):
        load_tasks(tmp_path / "t.jsonl")
    with pytest.raises(ValidationError, match="cannot open"):
        load_texts(tmp_path / "missing.jsonl")


# ------------------------------------------------------------------ CLI


@pytest.fixture()
def trace_with_arrays(tmp_path):
    from expertcache.collect.store import shard_dir, write_shard

    trace, hidden, logits, w = synthetic_trace(n_requests=4, prefill=3, decode=8, seed=2)
    write_shard(tmp_path / "t", 0, trace, {"hidden": hidden, "logits": logits})
    return shard_dir(tmp_path / "t", 0), trace, hidden, logits


def test_cli_train_export_eval(tmp_path, trace_with_arrays):
    import json

    from click.testing import CliRunner

    from expertcache.cli import main
    from expertcache.events import build_events
    from expertcache.nextuse.advice import load_advice
    from expertcache.routers.advice import advice_for_trace, router_scores
    from expertcache.routers.checkpoint import load_router_weights
    from expertcache.routers.train import pair_rows

    tdir, trace, hidden, logits = trace_with_arrays
    run = CliRunner().invoke
    ck = str(tmp_path / "ck")
    res = run(main, ["routers", "train", "--trace", str(tdir), "--mode", "aux-full", "--capacity", "3",
                     "--max-steps", "3", "--batch-size", "16", "--grad-accum", "1", "--lr", "0.01", "-o", ck, "--json"])
    assert res.exit_code == 0, res.output
    out = json.loads(res.output)
    assert out["steps"] == 3 and out["added_parameters"] == 2 * L * N * D
    res = run(main, ["routers", "export", ck, "--trace", str(tdir), "--batch", "2", "-o", str(tmp_path / "a.npz")])
    assert res.exit_code == 0, res.output
    adv = load_advice(tmp_path / "a.npz")
    direct = advice_for_trace(trace, router_scores(hidden, logits, pair_rows(trace.request, trace.position),
                                                   load_router_weights(ck)), 2)
    assert np.array_equal(adv.priority, direct.priority)
    assert np.array_equal(adv.prefetch_score, direct.prefetch_score)
    adv.validate(build_events(trace, 2), need=("priority", "prefetch_score"))
    res = run(main, ["routers", "eval", ck, "--trace", str(tdir), "--capacity", "3", "--budget", "2",
                     "--sweep-budget", "0,1,2", "--sweep-capacity", "2,4", "--json"])
    assert res.exit_code == 0, res.output
    ev = json.loads(res.output)
    methods = [r["method"] for r in ev["table"]]
    assert methods == ["LRU", "LFU", "LRFU", "Least-Stale (SpecMD)", "Temporal Router", "Spatio-Temporal Router"]
    temporal = ev["table"][4]
    assert temporal["proactive_loads"] == 0 and temporal["adj_hit"] == temporal["hit"]
    st = ev["table"][5]
    assert st["category"] == "prefetch" and st["adj_hit"] <= st["hit"]
    assert ev["scope"]["warmup_events"] > 0          # prefill-initialised by default
    assert [r["budget"] for r in ev["budget_sweep"]] == [0, 1, 2]
    assert ev["budget_sweep"][0] == {**temporal, "added_parameters": 0}
    assert [(r["method"], r["capacity"]) for r in ev["capacity_sweep"]] == [
        ("LRU", 2), ("Temporal Router", 2), ("LRU", 4), ("Temporal Router", 4)]
    res = run(main, ["routers", "eval", ck, "--trace", str(tdir), "--capacity", "3", "--reference"])
    assert res.exit_code == 0 and "CLR Table 1 shape" in res.output and "Native p^R (untrained)" in res.output


def test_cli_errors_are_one_line(tmp_path, trace_with_arrays):
    from click.testing import CliRunner

    from expertcache.cli import main

    tdir, trace, *_ = trace_with_arrays
    run = CliRunner().invoke
    res = run(main, ["routers", "train", "--trace", str(tdir), "--data", "x.jsonl", "--capacity", "3", "-o",
                     str(tmp_path / "ck")])
    assert res.exit_code == 2 and "exactly one of --data" in res.output
    res = run(main, ["routers", "train", "--trace", str(tdir), "--capacity", "8", "--max-steps", "1", "-o",
                     str(tmp_path / "ck")])
    assert res.exit_code == 2 and "capacity must be below" in res.output and "Traceback" not in res.output
    assert not (tmp_path / "ck").exists()
    bare = tmp_path / "bare"
    trace.save(bare)
    res = run(main, ["routers", "train", "--trace", str(bare), "--capacity", "3", "-o", str(tmp_path / "ck")])
    assert res.exit_code == 2 and "hidden" in res.output and "--save-hidden" in res.output


def test_cli_eval_export_bad_options_are_one_line(tmp_path, trace_with_arrays, monkeypatch):
    """Bad options fail with one line (exit 2) before any advice is computed, and write nothing."""
    from click.testing import CliRunner

    import expertcache.routers.advice as advice_mod
    from expertcache.cli import main

    tdir, *_ = trace_with_arrays
    run = CliRunner().invoke
    ck = str(tmp_path / "ck")
    res = run(main, ["routers", "train", "--trace", str(tdir), "--capacity", "3", "--max-steps", "1", "-o", ck])
    assert res.exit_code == 0, res.output

    def no_advice(*a, **k):
        raise AssertionError("advice computed before the options were checked")

    monkeypatch.setattr(advice_mod, "router_advice", no_advice)
    (tmp_path / "bin.jsonl").write_bytes(b"\x97\xff")
    cases = [
        (["eval", ck, "--trace", str(tdir), "--capacity", "0"], "capacity B must be in [1, N)"),
        (["eval", ck, "--trace", str(tdir), "--capacity", str(N)], "capacity B must be in [1, N)"),
        (["eval", ck, "--trace", str(tdir), "--capacity", "3", "--sweep-capacity", "2,9"], "capacity B must be in"),
        (["eval", ck, "--trace", str(tdir), "--capacity", "3", "--budget", "-1"], "R >= 0"),
        (["eval", ck, "--trace", str(tdir), "--capacity", "3", "--sweep-budget", "0,-2"], "R >= 0"),
        (["eval", ck, "--trace", str(tdir), "--capacity", "3", "--tasks", str(tmp_path / "bin.jsonl"),
          "--model", str(tmp_path)], "UTF-8"),
        (["export", ck, "--trace", str(tdir), "-o", str(tmp_path / "no" / "a.npz")], "does not exist"),
    ]
    for args, msg in cases:
        res = run(main, ["routers", *args])
        assert res.exit_code == 2, (args, res.output)
        assert msg in res.output and "Traceback" not in res.output, (args, res.output)
        assert len(res.output.strip().splitlines()) == 1, res.output
    monkeypatch.undo()
    res = run(main, ["routers", "export", ck, "--trace", str(tdir), "--batch", "0", "-o", str(tmp_path / "a.npz")])
    assert res.exit_code == 2 and "batch must be a positive integer" in res.output, res.output
    res = run(main, ["routers", "eval", ck, "--trace", str(tdir), "--capacity", "3", "--budget", "1", "--json"])
    assert res.exit_code == 0, res.output     # aux-temporal checkpoint: the R > 0 row uses untrained W^S
    assert "Spatio Routers were not trained" in __import__("json").loads(res.output)["scope"]["note"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bin.jsonl", "ck", "t"]


def test_cli_model_must_be_a_local_directory(tmp_path, monkeypatch):
    """A --model that is not a local directory is refused at once: never looked up on a hub."""
    import transformers
    from click.testing import CliRunner

    from expertcache.cli import main

    def no_load(*a, **k):
        raise AssertionError("tried to load a model that is not a local directory")

    monkeypatch.setattr(transformers.AutoTokenizer, "from_pretrained", no_load)
    data = tmp_path / "d.jsonl"
    data.write_text('{"text": "hello world"}\n')
    res = CliRunner().invoke(main, ["routers", "train", "--model", "someone/some-moe", "--data", str(data),
                                    "--capacity", "2", "-o", str(tmp_path / "ck")])
    assert res.exit_code == 2 and "no such model directory" in res.output, res.output
    assert not (tmp_path / "ck").exists()


# ------------------------------------------------------------------ accuracy hook and concentration


class _StubTokenizer:
    """Maps text to one token per character; decodes the model's reply table."""

    chat_template = None
    pad_token_id = 0
    eos_token_id = 0

    def __init__(self, replies):
        self.replies = replies

    def __call__(self, text, return_tensors=None):
        return {"input_ids": torch.tensor([[ord(c) % 50 + 1 for c in text]])}

    def decode(self, ids, skip_special_tokens=True):
        return self.replies[int(ids[0])]


class _StubModel(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.w = torch.nn.Parameter(torch.zeros(1))
        self.calls = 0

    def generate(self, input_ids, attention_mask, max_new_tokens, do_sample, pad_token_id):
        assert do_sample is False                 # greedy
        reply = torch.tensor([[self.calls]])
        self.calls += 1
        return torch.cat([input_ids, reply], dim=1)


def test_exact_match_counts_final_numbers(tmp_path):
    from expertcache.routers.data import load_tasks
    from expertcache.routers.evaluate import exact_match

    p = tmp_path / "gsm.jsonl"
    p.write_text('{"question": "1+1?", "answer": "1+1=2\\n#### 2"}\n'
                 '{"question": "2*3?", "answer": "#### 6"}\n'
                 '{"question": "10*100?", "answer": "#### 1,000"}\n')
    tasks = load_tasks(p)
    replies = ["so it is 2", "the answer is #### 7 not 6", "It is 1,000."]
    res = exact_match(_StubModel(), _StubTokenizer(replies), tasks, max_new_tokens=8)
    assert res.predictions == ("2", "7", "1000")
    assert (res.n_correct, res.n_tasks) == (2, 3) and math.isclose(res.accuracy, 2 / 3)
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"question": "q", "answer": "no marker"}\n')
    with pytest.raises(ValidationError, match="####"):
        load_tasks(bad)


def test_concentration_by_weight_hand_values():
    from expertcache.routers.evaluate import concentration_by_weight
    from expertcache.trace import RoutingTrace

    def trace(experts):
        n = len(experts)
        ex = np.array([[e] * L for e in experts], dtype=np.int16)    # (n, L, k=2)
        return RoutingTrace(L, N, 2, ("r",), np.zeros(n, np.int32), np.ones(n, np.int8), np.arange(n, dtype=np.int32),
                            ex, None, np.full(n, -1, np.int64), {})

    conc = trace([[0, 1]] * 4)                                      # experts 0, 1 only
    spread = trace([[0, 1], [2, 3], [4, 5], [6, 7]])                # all 8 once
    out = concentration_by_weight([(0.5, conc), (0.0, spread)])
    assert [o["cache_weight"] for o in out] == [0.0, 0.5]
    assert math.isclose(out[0]["max_frequency"], 1 / 8) and math.isclose(out[0]["effective_experts"], 8)
    assert math.isclose(out[1]["max_frequency"], 1 / 2) and math.isclose(out[1]["entropy"], math.log(2))
    assert math.isclose(out[1]["top8_mass"], 1.0) and math.isclose(out[1]["effective_experts"], 2)


def test_cli_trains_on_a_model_and_text(tmp_path):
    """`routers train --model DIR --data FILE`: a saved tiny model with a word-level tokenizer."""
    import json

    from click.testing import CliRunner
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    from expertcache.cli import main

    words = "the cache keeps experts that the next token will want and evicts the rest".split()
    vocab = {"[PAD]": 0, "[UNK]": 1, **{w: i + 2 for i, w in enumerate(dict.fromkeys(words))}}
    tk = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tk.pre_tokenizer = pre_tokenizers.Whitespace()
    PreTrainedTokenizerFast(tokenizer_object=tk, pad_token="[PAD]", unk_token="[UNK]").save_pretrained(tmp_path / "m")
    tiny_qwen3().save_pretrained(tmp_path / "m")
    data = tmp_path / "d.jsonl"
    rng = np.random.default_rng(0)
    data.write_text("".join(json.dumps({"text": " ".join(rng.choice(words, 10))}) + "\n" for _ in range(6)))
    res = CliRunner().invoke(main, ["routers", "train", "--model", str(tmp_path / "m"), "--data", str(data),
                                    "--mode", "temporal", "--capacity", "3", "--max-steps", "2", "--grad-accum", "1",
                                    "--batch-size", "2", "-o", str(tmp_path / "ck"), "--model-out", str(tmp_path / "m2"),
                                    "--json"])
    assert res.exit_code == 0, res.output
    out = json.loads(next(x for x in res.output.splitlines() if x.startswith("{")))
    assert out["steps"] == 2 and {"lm", "cache"} <= set(out["final"])
    assert (tmp_path / "ck" / "backbone.safetensors").is_file()       # joint mode saves the backbone
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    saved = AutoModelForCausalLM.from_pretrained(tmp_path / "m2")     # --model-out: the trained backbone
    backbone = load_file(str(tmp_path / "ck" / "backbone.safetensors"))
    gate = "model.layers.0.mlp.gate.weight"
    assert torch.equal(saved.state_dict()[gate], backbone[gate])
    assert not torch.equal(backbone[gate], tiny_qwen3().state_dict()[gate])
    res = CliRunner().invoke(main, ["routers", "train", "--model", str(tmp_path / "m"), "--data", str(data),
                                    "--mode", "aux-temporal", "--capacity", "3", "-o", str(tmp_path / "ck3"),
                                    "--model-out", str(tmp_path / "m3")])
    assert res.exit_code == 2 and "--model-out needs a joint mode" in res.output
    from expertcache.routers.checkpoint import load_router_weights

    digests = []
    for i in range(2):     # --deterministic: two runs give the same bytes; torch's global flag is restored
        res = CliRunner().invoke(main, ["routers", "train", "--model", str(tmp_path / "m"), "--data", str(data),
                                        "--mode", "temporal", "--capacity", "3", "--max-steps", "2", "--grad-accum",
                                        "1", "--batch-size", "2", "-o", str(tmp_path / f"d{i}"), "--deterministic"])
        assert res.exit_code == 0, res.output
        assert not torch.are_deterministic_algorithms_enabled()
        digests.append((tmp_path / f"d{i}" / "backbone.safetensors").read_bytes())
    assert digests[0] == digests[1]
    assert load_router_weights(tmp_path / "d0").meta["deterministic"] is True


def test_advice_pads_the_prefill_warmup():
    from expertcache.events.prefill import prefill_initialised_events
    from expertcache.routers.advice import advice_for_trace, router_scores
    from expertcache.routers.train import pair_rows

    trace, hidden, logits, _ = synthetic_trace(n_requests=3, prefill=4, decode=5, seed=4)
    sc = router_scores(hidden, logits, pair_rows(trace.request, trace.position), _weights())
    stream = prefill_initialised_events(trace, 2, 2)
    warm = stream.provenance["warmup_events"]
    assert warm > 0
    adv = advice_for_trace(trace, sc, 2, stream=stream)
    plain = advice_for_trace(trace, sc, 2)
    assert adv.warmup_events == warm and adv.priority.shape == (stream.n_events, N)
    assert np.array_equal(adv.priority[warm:], plain.priority)
    assert np.array_equal(adv.prefetch_score[warm:], plain.prefetch_score)
    assert np.isneginf(adv.prefetch_score[:warm]).all()
    for i in range(warm):
        want = np.zeros(N, np.float32)
        for e, m in zip(stream.members(i), stream.multiplicity[stream.offsets[i]:stream.offsets[i + 1]], strict=True):
            want[e] = m
        assert np.array_equal(adv.priority[i], want)
    assert adv.to_advice().provenance["warmup_events"] == warm


def test_routers_eval_and_prefetch_compare_score_the_baselines_under_one_protocol(tmp_path, trace_with_arrays):
    """CLR §4.1 per-request prefill-initialised decode in both commands: identical LRU/LFU/LRFU rows."""
    import json

    from click.testing import CliRunner

    from expertcache.cli import main

    tdir, trace, _, _ = trace_with_arrays
    run = CliRunner().invoke
    ck = str(tmp_path / "ck")
    res = run(main, ["routers", "train", "--trace", str(tdir), "--mode", "aux-temporal", "--capacity", "3",
                     "--max-steps", "2", "--batch-size", "16", "--grad-accum", "1", "-o", ck, "--json"])
    assert res.exit_code == 0, res.output
    for tie in ("id", "random"):
        res = run(main, ["routers", "eval", ck, "--trace", str(tdir), "--capacity", "3", "--tie-break", tie,
                         "--expert-bytes", "1000000", "--json"])
        assert res.exit_code == 0, res.output
        ev = json.loads(res.output)
        assert ev["scope"]["protocol"].startswith("per-request prefill-initialised decode")
        res = run(main, ["prefetch", "compare", str(tdir), "--calibration", str(tdir), "--capacity", "3",
                         "--policy", "lru,lfu,lrfu,least-stale", "--tie-break", tie, "--expert-bytes", "1000000",
                         "--json"])
        assert res.exit_code == 0, res.output
        cmp_rows = {r["name"]: r for r in json.loads(res.output)["rows"]}
        rows = {r["method"]: r for r in ev["table"]}
        for name in ("lru", "lfu", "lrfu", "least-stale"):
            a = rows["Least-Stale (SpecMD)" if name == "least-stale" else name.upper()]
            b = cmp_rows[name]
            for key in ("hit", "adj_hit", "load_per_token", "demand_misses", "accesses", "tokens"):
                assert a[key] == b[key], (tie, name, key)
            assert b["load_unit"] == a["load_unit"] == "bytes/token"
        assert rows["Least-Stale (SpecMD)"]["demand_misses"] == rows["LRU"]["demand_misses"]
        assert ev["scope"]["warmup_events"] == trace.n_requests * trace.n_layers   # one prefill event per layer
    assert 0 < ev["scope"]["concentration"]["effective_experts"] <= N


def test_training_log_carries_the_hard_coverage(tmp_path):
    """The logged loss is the soft surrogate (detached top-B threshold); the log also holds the hard coverage."""
    from expertcache.routers.modules import CacheRouters, cache_losses, predecessor_rows
    from expertcache.routers.train import pair_rows, train_offline

    torch.manual_seed(5)
    r = CacheRouters(L, N, D)
    with torch.no_grad():
        for lin in [*r.temporal, *r.spatio]:
            lin.weight.normal_(0, 0.5)
    mask = torch.tensor([[1, 1, 1, 1, 1], [1, 1, 1, 0, 0]])
    prev = predecessor_rows(mask)
    hidden = torch.randn(10, L, D)
    logits = torch.randn(10, L, N) * 2
    got = cache_losses(r, hidden, logits, prev, capacity=3, tau=0.05, objective="both")

    def sm(x):
        e = np.exp(x - x.max())
        return e / e.sum()

    wt = [r.temporal[l].weight.detach().double().numpy() for l in range(L)]
    ws = [r.spatio[l].weight.detach().double().numpy() for l in range(L)]
    h, lg = hidden.double().numpy(), logits.double().numpy()
    cov_t, cov_st = [], []
    for l in range(L):
        at, ast = [], []
        for row, p in enumerate(prev.tolist()):
            if p < 0:
                continue
            q = sm(lg[row, l])
            s_t = sm(lg[p, l]) + sm(wt[l] @ h[p, l])
            src = h[row, l - 1] if l > 0 else h[p, L - 1]
            s_st = sm(ws[(l - 1) % L] @ src) + s_t
            at.append(sum(q[e] for e in np.argsort(-s_t)[:3]))
            ast.append(sum(q[e] for e in np.argsort(-s_st)[:3]))
        cov_t.append(np.mean(at))
        cov_st.append(np.mean(ast))
    assert math.isclose(got.coverage_temporal, np.mean(cov_t), rel_tol=1e-5)
    assert math.isclose(got.coverage_spatio_temporal, np.mean(cov_st), rel_tol=1e-5)
    trace, hid, lgt, w = synthetic_trace(n_requests=4, decode=6)
    res = train_offline(pair_rows(trace.request, trace.position), hid, lgt, small_cfg(), tmp_path / "ck",
                        native_weights=w)
    assert all(0.0 <= rec["coverage"] <= 1.0 for rec in res.history) and len(res.history) == 3


def test_routers_eval_holds_the_prefetch_baselines_in_the_same_table(tmp_path, trace_with_arrays):
    import json

    from click.testing import CliRunner

    from expertcache.cli import main

    tdir, _, _, _ = trace_with_arrays
    run = CliRunner().invoke
    ck = str(tmp_path / "ck")
    res = run(main, ["routers", "train", "--trace", str(tdir), "--mode", "aux-temporal", "--capacity", "3",
                     "--max-steps", "2", "--batch-size", "16", "--grad-accum", "1", "-o", ck, "--json"])
    assert res.exit_code == 0, res.output
    res = run(main, ["routers", "eval", ck, "--trace", str(tdir), "--capacity", "3", "--budget", "2",
                     "--baselines", str(tdir), "--json"])
    assert res.exit_code == 0, res.output
    rows = {r["method"]: r for r in json.loads(res.output)["table"]}
    res = run(main, ["prefetch", "compare", str(tdir), "--calibration", str(tdir), "--capacity", "3", "--budget", "2",
                     "--lookahead", "1", "--json"])
    assert res.exit_code == 0, res.output
    for b in json.loads(res.output)["rows"]:
        if b["name"] in ("lru", "lfu", "lrfu", "least-stale"):
            continue
        a = rows[f"{b['name']} ({b['family']})"]
        assert (a["hit"], a["adj_hit"], a["proactive_loads"], a["budget"]) == (
            b["hit"], b["adj_hit"], b["proactive_loads"], b["prefetch_budget"]), b["name"]
        assert a["availability"] == b["availability"]
    assert {"Temporal Router", "LRU", "Least-Stale (SpecMD)"} <= set(rows)
    res = run(main, ["routers", "eval", ck, "--trace", str(tdir), "--capacity", "3", "--baselines", str(tdir),
                     "--batch", "2"])
    assert res.exit_code == 2 and "--baselines" in res.output


def test_training_log_hit_is_what_routers_eval_prints(tmp_path, trace_with_arrays):
    """`--eval-trace` logs the live Temporal Router's Hit; it equals `routers eval` on the checkpoint of that step.

    The two sides share no code path for the weights: the log reads the live torch modules, `routers eval`
    reads the safetensors checkpoint written after the step.
    """
    import json

    from click.testing import CliRunner

    from expertcache.cli import main
    from expertcache.routers.checkpoint import read_trainer_state

    tdir, trace, hidden, logits = trace_with_arrays
    run = CliRunner().invoke
    for steps in (2, 4):
        ck = str(tmp_path / f"ck{steps}")
        res = run(main, ["routers", "train", "--trace", str(tdir), "--capacity", "3", "--max-steps", str(steps),
                         "--batch-size", "16", "--grad-accum", "1", "--lr", "0.05", "--eval-trace", str(tdir),
                         "--eval-every", "2", "-o", ck, "--json"])
        assert res.exit_code == 0, res.output
        hist = read_trainer_state(ck)["history"]
        logged = [rec.get("hit") for rec in hist]
        assert [h is not None for h in logged] == [(i + 1) % 2 == 0 for i in range(steps)]
        assert json.loads(res.output)["final"]["hit"] == logged[-1]
        ev = run(main, ["routers", "eval", ck, "--trace", str(tdir), "--capacity", "3", "--json"])
        assert ev.exit_code == 0, ev.output
        row = next(r for r in json.loads(ev.output)["table"] if r["method"] == "Temporal Router")
        assert logged[-1] == row["hit"]


def test_eval_trace_errors_are_one_line(tmp_path, trace_with_arrays):
    from click.testing import CliRunner

    from expertcache.cli import main

    tdir = str(trace_with_arrays[0])
    run = CliRunner().invoke
    base = ["routers", "train", "--trace", tdir, "--capacity", "3", "--max-steps", "1", "-o", str(tmp_path / "c")]
    for extra, needle in ((["--eval-every", "2"], "--eval-every needs --eval-trace"),
                          (["--eval-trace", tdir, "--eval-every", "-1"], "--eval-every takes N >= 0"),
                          (["--eval-trace", str(tmp_path / "nope")], "nope")):
        res = run(main, base + extra)
        assert res.exit_code == 2, (extra, res.output)
        assert needle in res.output and "Traceback" not in res.output
        assert not (tmp_path / "c").exists()
