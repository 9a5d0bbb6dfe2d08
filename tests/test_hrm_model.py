"""HRM model: reference-compatible construction and state dict, layer numerics, ACT semantics, losses."""

import math

import pytest
import torch

import models.layers as layers
from models.checkpoints import strip_reference_prefix
from models.hrm.hrm_act_v1 import HierarchicalReasoningModel_ACTV1
from models.layers import (Attention, RotaryEmbedding, apply_rotary_pos_emb, attention_backend, rms_norm,
                           sdpa_in_float32, trunc_normal_init_)
from models.losses import ACTLossHead, log_stablemax, softmax_cross_entropy, stablemax_cross_entropy, stablemax_dtype
from models.sparse_embedding import CastedSparseEmbedding, SparseEmbeddingSignSGD

SUDOKU_HRM_V1 = dict(
    batch_size=8, seq_len=81, vocab_size=11, num_puzzle_identifiers=1, H_cycles=2, L_cycles=2, H_layers=4, L_layers=4,
    hidden_size=512, expansion=4, num_heads=8, pos_encodings="rope", halt_max_steps=16, halt_exploration_prob=0.1,
    puzzle_emb_ndim=512, causal=False,
)


def tiny_config(**over):
    cfg = dict(batch_size=4, seq_len=9, vocab_size=6, num_puzzle_identifiers=3, H_cycles=2, L_cycles=2, H_layers=1,
               L_layers=1, hidden_size=32, expansion=2, num_heads=4, pos_encodings="rope", halt_max_steps=4,
               halt_exploration_prob=0.1, puzzle_emb_ndim=32, forward_dtype="float32")
    cfg.update(over)
    return cfg


def tiny_batch(cfg, seed=0):
    g = torch.Generator().manual_seed(seed)
    b, s, v = cfg["batch_size"], cfg["seq_len"], cfg["vocab_size"]
    return {"inputs": torch.randint(0, v, (b, s), generator=g, dtype=torch.int32),
            "labels": torch.randint(1, v, (b, s), generator=g, dtype=torch.int32),
            "puzzle_identifiers": torch.randint(0, cfg["num_puzzle_identifiers"], (b,), generator=g, dtype=torch.int32)}


def test_sudoku_hrm_v1_matches_reference_parameter_count_and_state_dict():
    model = HierarchicalReasoningModel_ACTV1(SUDOKU_HRM_V1)
    assert sum(p.numel() for p in model.parameters()) == 27_275_266
    sd = model.state_dict()
    expected = {
        "inner.H_init": ((512,), torch.bfloat16), "inner.L_init": ((512,), torch.bfloat16),
        "inner.embed_tokens.embedding_weight": ((11, 512), torch.float32),
        "inner.lm_head.weight": ((11, 512), torch.float32),
        "inner.q_head.weight": ((2, 512), torch.float32), "inner.q_head.bias": ((2,), torch.float32),
        "inner.puzzle_emb.weights": ((1, 512), torch.float32),
    }
    for level in "HL":
        for i in range(4):
            p = f"inner.{level}_level.layers.{i}."
            expected[p + "self_attn.qkv_proj.weight"] = ((1536, 512), torch.float32)
            expected[p + "self_attn.o_proj.weight"] = ((512, 512), torch.float32)
            expected[p + "mlp.gate_up_proj.weight"] = ((3072, 512), torch.float32)
            expected[p + "mlp.down_proj.weight"] = ((512, 1536), torch.float32)
    assert {k: (tuple(v.shape), v.dtype) for k, v in sd.items()} == expected
    # Initialisation facts from the reference.
    assert torch.all(model.inner.q_head.weight == 0) and torch.all(model.inner.q_head.bias == -5)
    assert torch.all(model.inner.puzzle_emb.weights == 0)


def test_learned_positions_add_embed_pos():
    model = HierarchicalReasoningModel_ACTV1({**SUDOKU_HRM_V1, "pos_encodings": "learned"})
    assert model.state_dict()["inner.embed_pos.embedding_weight"].shape == (82, 512)


def test_reference_checkpoint_loads_after_prefix_strip():
    src = HierarchicalReasoningModel_ACTV1(tiny_config())
    ref = {"_orig_mod.model." + k: v.clone() for k, v in src.state_dict().items()}
    dst = HierarchicalReasoningModel_ACTV1(tiny_config())
    dst.load_state_dict(strip_reference_prefix(ref))
    for k, v in src.state_dict().items():
        assert torch.equal(dst.state_dict()[k], v)


def test_unknown_config_key_is_a_clear_error():
    with pytest.raises(ValueError, match="unknown keys \\['hiden_size'\\]"):
        HierarchicalReasoningModel_ACTV1({**tiny_config(), "hiden_size": 3})


def test_trunc_normal_has_exact_std_and_bounds():
    t = trunc_normal_init_(torch.empty(400_000, dtype=torch.float64), std=0.5)
    assert abs(t.std().item() - 0.5) < 0.005
    assert t.abs().max().item() <= 2 * 0.5 * 1.2  # clipped at 2 corrected stds


def test_rms_norm_matches_float64():
    x = torch.randn(3, 5, 16, dtype=torch.bfloat16)
    ref = x.double() / torch.sqrt(x.double().pow(2).mean(-1, keepdim=True) + 1e-5)
    out = rms_norm(x, 1e-5)
    assert out.dtype == torch.bfloat16
    torch.testing.assert_close(out.double(), ref, atol=1e-2, rtol=1e-2)


def test_rope_matches_complex_rotation():
    dim, seq = 8, 6
    rope = RotaryEmbedding(dim, seq, 10000.0)
    cos, sin = rope()
    q = torch.randn(2, seq, 3, dim, dtype=torch.float64)
    q_rot, _ = apply_rotary_pos_emb(q, q, cos, sin)
    # rotate-half pairs dimension i with i + dim/2 and rotates the pair by pos * theta_i.
    half = dim // 2
    theta = 10000.0 ** (-torch.arange(half, dtype=torch.float64) * 2 / dim)
    angle = torch.arange(seq, dtype=torch.float64)[:, None] * theta
    z = torch.complex(q[..., :half], q[..., half:]) * torch.polar(torch.ones_like(angle), angle)[None, :, None, :]
    torch.testing.assert_close(q_rot, torch.cat([z.real, z.imag], -1), atol=1e-6, rtol=1e-6)


def test_attention_matches_manual_softmax_attention():
    torch.manual_seed(0)
    attn = Attention(hidden_size=16, head_dim=4, num_heads=4, num_key_value_heads=4).double()
    x = torch.randn(2, 5, 16, dtype=torch.float64)
    q, k, v = attn.qkv_proj(x).view(2, 5, 12, 4).split([4, 4, 4], dim=2)
    scores = torch.einsum("bqhd,bkhd->bhqk", q, k) / 2.0
    manual = torch.einsum("bhqk,bkhd->bqhd", scores.softmax(-1), v).reshape(2, 5, 16)
    torch.testing.assert_close(attn(x), attn.o_proj(manual))


@pytest.mark.parametrize("seq_len, kernel_calls", [(30, []), (layers.SHORT_SEQUENCE + 1, [torch.float32])])
def test_bf16_attention_on_a_cpu_runs_in_fp32_and_is_as_close_to_float64(monkeypatch, seq_len, kernel_calls):
    torch.manual_seed(0)
    attn = Attention(hidden_size=64, head_dim=16, num_heads=4, num_key_value_heads=4)
    x = torch.randn(4, seq_len, 64)
    exact = attn.double()(x.double())
    attn.float()
    seen, torch_sdpa = [], layers.F.scaled_dot_product_attention
    monkeypatch.setattr(layers.F, "scaled_dot_product_attention",
                        lambda q, k, v, **kw: seen.append(q.dtype) or torch_sdpa(q, k, v, **kw))
    out = attn(x.to(torch.bfloat16))
    assert out.dtype == torch.bfloat16 and seen == kernel_calls  # short sequences: the definition, no SDPA kernel
    assert sdpa_in_float32(torch.device("cpu"), torch.bfloat16) and not sdpa_in_float32(torch.device("cpu"), torch.float32)
    assert not sdpa_in_float32(torch.device("cuda"), torch.bfloat16) and not sdpa_in_float32(torch.device("mps"), torch.float16)
    # bf16 rounding of x, the weights and the projections bounds the error; fp32 inside attention adds nothing visible.
    assert ((out.double() - exact).norm() / exact.norm()).item() < 1e-2


def test_short_sequence_attention_by_its_definition_matches_the_sdpa_kernel_in_fp32():
    torch.manual_seed(0)
    low = [torch.randn(3, 4, 97, 16).to(torch.bfloat16).requires_grad_() for _ in range(3)]
    grad = torch.randn(3, 4, 97, 16).to(torch.bfloat16)
    exact = [t.detach().double().requires_grad_() for t in low]
    expected = layers.F.scaled_dot_product_attention(*exact)
    expected_grads = torch.autograd.grad(expected, exact, grad.double())
    out = layers.sdpa(*low)
    grads = torch.autograd.grad(out, low, grad)
    assert out.dtype == torch.bfloat16 and all(g.dtype == torch.bfloat16 for g in grads)
    # the same inputs in float64: what is left is the bf16 rounding of the results (2^-9 relative), not the kernel's
    for got, want in zip((out, *grads), (expected, *expected_grads)):
        assert ((got.double() - want).norm() / want.norm()).item() < 4e-3


def test_attention_backend_choice(monkeypatch):
    monkeypatch.setattr(layers, "flash_attn_func", None)
    assert attention_backend(torch.device("cpu"), torch.bfloat16) == (
        "sdpa", "torch scaled_dot_product_attention in float32 (flash_attn not installed; its CPU kernel is ~3x slower "
        f"in torch.bfloat16), by its definition up to {layers.SHORT_SEQUENCE} positions")
    assert attention_backend(torch.device("cpu"), torch.float32)[1] == (
        "torch scaled_dot_product_attention (flash_attn not installed)")
    monkeypatch.setattr(layers, "flash_attn_func", lambda q, k, v, causal: q)
    assert attention_backend(torch.device("cuda"), torch.bfloat16)[0] == "flash_attn"
    assert attention_backend(torch.device("cuda"), torch.float32)[0] == "sdpa"
    assert attention_backend(torch.device("mps"), torch.bfloat16)[0] == "sdpa"


def test_stablemax_cross_entropy_matches_float64_formula():
    logits = torch.randn(3, 7, 5) * 4
    labels = torch.randint(0, 5, (3, 7))
    labels[0, 0] = -100
    s = torch.where(logits.double() < 0, 1 / (1 - logits.double()), logits.double() + 1)
    expected = -torch.log(s.gather(-1, labels.clamp_min(0).unsqueeze(-1)).squeeze(-1) / s.sum(-1))
    expected[0, 0] = 0
    torch.testing.assert_close(stablemax_cross_entropy(logits, labels), expected)
    assert torch.allclose(log_stablemax(logits.double()).exp().sum(-1), torch.ones(3, 7, dtype=torch.float64))


def test_stablemax_avoids_float64_on_mps():
    assert stablemax_dtype(torch.device("mps")) == torch.float32
    assert stablemax_dtype(torch.device("cpu")) == torch.float64


def test_softmax_cross_entropy_ignores_label():
    logits, labels = torch.randn(2, 3, 4), torch.tensor([[0, 1, -100], [3, -100, 2]])
    out = softmax_cross_entropy(logits, labels)
    assert out[0, 2] == 0 and out[1, 1] == 0
    assert torch.isclose(out[0, 0], -logits[0, 0].log_softmax(-1)[0])


def evaluate_segments(head: ACTLossHead, batch: dict, halt_max_steps: int):
    """Run an eval-mode head segment by segment, checking that every row halts at the last segment and none before;
    the final carry and metrics."""
    carry = head.initial_carry(batch)
    with torch.no_grad():
        for segment in range(1, halt_max_steps + 1):
            carry, _, metrics, _, all_halted = head(carry, batch)
            assert bool(all_halted) == (segment == halt_max_steps)
    return carry, metrics


def test_eval_runs_exactly_halt_max_steps_segments():
    cfg = tiny_config()
    head = ACTLossHead(HierarchicalReasoningModel_ACTV1(cfg)).eval()
    carry, metrics = evaluate_segments(head, tiny_batch(cfg), cfg["halt_max_steps"])
    assert torch.all(carry.steps == cfg["halt_max_steps"])
    assert metrics["count"] == cfg["batch_size"] and metrics["steps"] == cfg["batch_size"] * cfg["halt_max_steps"]


def test_training_segment_resets_halted_rows_and_keeps_others():
    cfg = tiny_config(halt_exploration_prob=0.0)
    head = ACTLossHead(HierarchicalReasoningModel_ACTV1(cfg)).train()
    first, second = tiny_batch(cfg, 0), tiny_batch(cfg, 1)
    carry = head.initial_carry(first)
    carry, loss, metrics, _, _ = head(carry, first)
    assert "q_continue_loss" in metrics and torch.isfinite(loss)
    # q_head starts with q_halt == q_continue == -5, and equal logits do not halt.
    assert not carry.halted.any()
    carry.halted[:2] = True  # pretend the first two rows finished
    kept = carry.current_data["inputs"][2:].clone()
    carry, _, _, _, _ = head(carry, second)
    assert torch.equal(carry.current_data["inputs"][:2], second["inputs"][:2])
    assert torch.equal(carry.current_data["inputs"][2:], kept)
    assert carry.steps.tolist() == [1, 1, 2, 2]


def test_one_step_gradient_reaches_every_weight_and_the_puzzle_embedding():
    cfg = tiny_config()
    head = ACTLossHead(HierarchicalReasoningModel_ACTV1(cfg)).train()
    batch = tiny_batch(cfg)
    _, loss, _, _, _ = head(head.initial_carry(batch), batch)
    loss.backward()
    model = head.model
    for name, p in model.named_parameters():
        if name != "inner.q_head.weight":  # zero-initialised q_head weight still gets a gradient
            assert p.grad is not None and p.grad.abs().sum() > 0, name
    assert model.inner.q_head.weight.grad is not None
    assert model.puzzle_emb.local_weights.grad.abs().sum() > 0


def test_sparse_embedding_sign_sgd_matches_formula_and_leaves_other_rows():
    emb = CastedSparseEmbedding(5, 3, batch_size=4, init_std=1.0, cast_to=torch.float32).train()
    before = emb.weights.clone()
    ids = torch.tensor([1, 3, 1, 4], dtype=torch.int32)
    out = emb(ids)
    grad = torch.tensor([[1.0, -2.0, 0.5], [0.0, 1.0, -1.0], [-3.0, 1.0, 0.25], [2.0, 2.0, 2.0]])
    (out * grad).sum().backward()
    opt = SparseEmbeddingSignSGD([emb], lr=0.1, weight_decay=0.5)
    opt.step()
    summed = {1: grad[0] + grad[2], 3: grad[1], 4: grad[3]}
    for row in range(5):
        if row in summed:
            expected = before[row] * (1 - 0.1 * 0.5) - 0.1 * torch.sign(summed[row])
            torch.testing.assert_close(emb.weights[row], expected)
        else:
            assert torch.equal(emb.weights[row], before[row])


def test_sparse_embedding_stays_a_leaf_after_moving():
    emb = CastedSparseEmbedding(5, 3, batch_size=2, init_std=0.0, cast_to=torch.float32).to(torch.float64)
    assert emb.local_weights.is_leaf and emb.local_weights.requires_grad


def test_sparse_embedding_rejects_wrong_batch_size():
    emb = CastedSparseEmbedding(5, 3, batch_size=2, init_std=0.0, cast_to=torch.float32).train()
    with pytest.raises(ValueError, match="exactly the local batch size"):
        emb(torch.tensor([0, 1, 2]))


def test_q_head_bias_starts_near_never_halting():
    model = HierarchicalReasoningModel_ACTV1(tiny_config())
    assert math.isclose(torch.sigmoid(model.inner.q_head.bias[0]).item(), 1 / (1 + math.exp(5)), rel_tol=1e-6)
