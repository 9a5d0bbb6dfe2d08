"""TRM model: reference state dict and checkpoints, float64 re-computation of the recursion, ACT semantics, compile.

The parity with the reference code itself (bitwise on identical weights) was measured outside the
repository; these tests check the same facts against values written out here and against an
independent float64 implementation of the recursion.
"""

import math

import pytest
import torch
import torch.nn.functional as F
from omegaconf import OmegaConf

from models.checkpoints import strip_reference_prefix
from models.losses import ACTLossHead
from models.trm.trm_act_v1 import TinyRecursiveReasoningModel_ACTV1
from tests.test_hrm_model import evaluate_segments, tiny_batch
from utils.config import merge_layers, recipe_layers

# The README's Sudoku-Extreme recipes (batch 768 is the global batch; 8 keeps construction cheap).
SUDOKU_TRM = dict(batch_size=8, seq_len=81, vocab_size=11, num_puzzle_identifiers=1, H_cycles=3, L_cycles=6, H_layers=0,
                  L_layers=2, hidden_size=512, expansion=4, num_heads=8, pos_encodings="rope", halt_max_steps=16,
                  halt_exploration_prob=0.1, puzzle_emb_ndim=512, forward_dtype="bfloat16", mlp_t=False,
                  puzzle_emb_len=16, no_ACT_continue=True, causal=False)
SUDOKU_TRM_MLP = {**SUDOKU_TRM, "mlp_t": True, "pos_encodings": "none"}

F32 = torch.float32
# Written out from the reference model (TinyRecursiveModels, models/recursive_reasoning/trm.py) built
# with the configs above: keys in state-dict order, shapes and dtypes.
SHARED_HEAD = [  # the same in both variants
    ("inner.H_init", (512,), torch.bfloat16),
    ("inner.L_init", (512,), torch.bfloat16),
    ("inner.embed_tokens.embedding_weight", (11, 512), F32),
    ("inner.lm_head.weight", (11, 512), F32),
    ("inner.q_head.weight", (2, 512), F32),
    ("inner.q_head.bias", (2,), F32),
    ("inner.puzzle_emb.weights", (1, 512), F32),
]
EXPECTED_MLP_T = SHARED_HEAD + [
    ("inner.L_level.layers.0.mlp_t.gate_up_proj.weight", (1024, 97), F32),
    ("inner.L_level.layers.0.mlp_t.down_proj.weight", (97, 512), F32),
    ("inner.L_level.layers.0.mlp.gate_up_proj.weight", (3072, 512), F32),
    ("inner.L_level.layers.0.mlp.down_proj.weight", (512, 1536), F32),
    ("inner.L_level.layers.1.mlp_t.gate_up_proj.weight", (1024, 97), F32),
    ("inner.L_level.layers.1.mlp_t.down_proj.weight", (97, 512), F32),
    ("inner.L_level.layers.1.mlp.gate_up_proj.weight", (3072, 512), F32),
    ("inner.L_level.layers.1.mlp.down_proj.weight", (512, 1536), F32),
]
EXPECTED_ATTENTION = SHARED_HEAD + [
    ("inner.L_level.layers.0.self_attn.qkv_proj.weight", (1536, 512), F32),
    ("inner.L_level.layers.0.self_attn.o_proj.weight", (512, 512), F32),
    ("inner.L_level.layers.0.mlp.gate_up_proj.weight", (3072, 512), F32),
    ("inner.L_level.layers.0.mlp.down_proj.weight", (512, 1536), F32),
    ("inner.L_level.layers.1.self_attn.qkv_proj.weight", (1536, 512), F32),
    ("inner.L_level.layers.1.self_attn.o_proj.weight", (512, 512), F32),
    ("inner.L_level.layers.1.mlp.gate_up_proj.weight", (3072, 512), F32),
    ("inner.L_level.layers.1.mlp.down_proj.weight", (512, 1536), F32),
]
# With learned positions the reference adds one table right after the puzzle embedding.
EMBED_POS = ("inner.embed_pos.embedding_weight", (97, 512), F32)


def tiny_config(**over):
    cfg = dict(batch_size=4, seq_len=9, vocab_size=6, num_puzzle_identifiers=3, H_cycles=3, L_cycles=2, H_layers=0,
               L_layers=2, hidden_size=32, expansion=2, num_heads=4, pos_encodings="rope", halt_max_steps=4,
               halt_exploration_prob=0.0, puzzle_emb_ndim=48, puzzle_emb_len=3, forward_dtype="float32")
    cfg.update(over)
    return cfg


def randomised(model, seed=1):
    """Give the zero-initialised q_head and puzzle embedding random values, so every path carries signal."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        model.inner.q_head.weight.copy_(torch.randn(model.inner.q_head.weight.shape, generator=g) * 0.3)
        model.inner.puzzle_emb.weights.copy_(torch.randn(model.inner.puzzle_emb.weights.shape, generator=g))
    return model


# ---- construction, state dict, checkpoints ---------------------------------------------------------

@pytest.mark.parametrize("cfg, expected, params", [
    (SUDOKU_TRM_MLP, EXPECTED_MLP_T, 5_028_866),
    (SUDOKU_TRM, EXPECTED_ATTENTION, 6_828_034),
    ({**SUDOKU_TRM_MLP, "pos_encodings": "learned"}, EXPECTED_MLP_T[:7] + [EMBED_POS] + EXPECTED_MLP_T[7:], 5_078_530),
    ({**SUDOKU_TRM, "pos_encodings": "learned"}, EXPECTED_ATTENTION[:7] + [EMBED_POS] + EXPECTED_ATTENTION[7:],
     6_877_698),
], ids=["mlp_t", "attention", "mlp_t-learned", "attention-learned"])
def test_state_dict_keys_shapes_dtypes_and_parameter_count_equal_the_reference(cfg, expected, params):
    model = TinyRecursiveReasoningModel_ACTV1(cfg)
    assert [(k, tuple(v.shape), v.dtype) for k, v in model.state_dict().items()] == expected
    assert sum(p.numel() for p in model.parameters()) == params  # the puzzle table is a buffer
    inner = model.inner
    assert torch.all(inner.q_head.weight == 0) and torch.all(inner.q_head.bias == -5)
    assert torch.all(inner.puzzle_emb.weights == 0)
    # H_init/L_init: truncated normal with std 1 (the JAX-corrected truncation), in the forward dtype.
    both = torch.cat([inner.H_init, inner.L_init]).float()
    assert 0.8 < both.std().item() < 1.2 and both.abs().max().item() <= 2 * 1.2


def test_reference_format_checkpoint_loads_and_reproduces_outputs(tmp_path):
    cfg = tiny_config(mlp_t=True, pos_encodings="none")
    src = randomised(TinyRecursiveReasoningModel_ACTV1(cfg)).eval()
    for prefix, name in (("_orig_mod.model.", "step_1234"), ("model.", "step_7")):  # compiled, and compile off
        torch.save({prefix + k: v for k, v in src.state_dict().items()}, tmp_path / name)
        dst = TinyRecursiveReasoningModel_ACTV1(cfg).eval()
        result = dst.load_state_dict(strip_reference_prefix(torch.load(tmp_path / name, weights_only=True)))
        assert not result.missing_keys and not result.unexpected_keys
        batch = tiny_batch(cfg)
        with torch.no_grad():
            carry_s, carry_d = src.initial_carry(batch), dst.initial_carry(batch)
            for _ in range(cfg["halt_max_steps"]):
                carry_s, out_s = src(carry=carry_s, batch=batch)
                carry_d, out_d = dst(carry=carry_d, batch=batch)
                assert all(torch.equal(out_s[k], out_d[k]) for k in out_s)
        assert torch.equal(carry_s.inner_carry.z_H, carry_d.inner_carry.z_H)


@pytest.mark.parametrize("over, match", [
    ({"hiden_size": 3}, r"unknown keys \['hiden_size'\]"),
    ({"puzzle_emb_ndim": 0}, "with puzzle_emb_ndim=0 set puzzle_emb_len=0"),
    ({"puzzle_emb_ndim": 200}, "does not fit in puzzle_emb_len=3"),
    ({"pos_encodings": "rotary"}, "use 'rope', 'learned' or 'none'"),
    ({"causal": True}, "TRM is non-causal"),
    ({"forward_dtype": "float64"}, "use bfloat16, float32 or float16"),
])
def test_bad_config_is_a_one_line_error(over, match):
    with pytest.raises(ValueError, match=match):
        TinyRecursiveReasoningModel_ACTV1(tiny_config(**over))


def test_puzzle_embedding_fills_the_prefix_row_major_and_the_rest_is_zero():
    # puzzle_emb_ndim 48 over hidden 32: position 0 takes values 0..31, position 1 takes 32..47 then
    # 16 zeros, position 2 is all zeros; everything is scaled by sqrt(32).
    cfg = tiny_config(pos_encodings="none")
    model = randomised(TinyRecursiveReasoningModel_ACTV1(cfg)).eval()
    batch = tiny_batch(cfg)
    x = model.inner.input_embeddings(batch["inputs"], batch["puzzle_identifiers"])
    table = model.inner.puzzle_emb.weights[batch["puzzle_identifiers"].long()]
    scale = math.sqrt(32)
    assert x.shape == (4, 3 + 9, 32)
    torch.testing.assert_close(x[:, 0], scale * table[:, :32])
    torch.testing.assert_close(x[:, 1, :16], scale * table[:, 32:])
    assert torch.all(x[:, 1, 16:] == 0) and torch.all(x[:, 2] == 0)
    torch.testing.assert_close(x[:, 3:], scale * model.inner.embed_tokens.embedding_weight[batch["inputs"].long()])


def test_puzzle_emb_len_zero_means_ceil_of_ndim_over_hidden():
    model = TinyRecursiveReasoningModel_ACTV1(tiny_config(puzzle_emb_len=0, mlp_t=True))
    assert model.inner.puzzle_emb_len == 2
    # mlp_t mixes over the whole sequence, prefix included: round(2 * 11 * 2/3) = 15, rounded up to 256.
    assert model.inner.L_level.layers[0].mlp_t.gate_up_proj.weight.shape == (512, 11)


def test_bfloat16_forward_keeps_fp32_master_weights():
    cfg = tiny_config(forward_dtype="bfloat16")
    model = TinyRecursiveReasoningModel_ACTV1(cfg).train()
    batch = tiny_batch(cfg)
    carry, out = model(carry=model.initial_carry(batch), batch=batch)
    assert all(p.dtype == torch.float32 for p in model.parameters())
    assert model.inner.H_init.dtype == torch.bfloat16 and carry.inner_carry.z_H.dtype == torch.bfloat16
    assert out["logits"].dtype == torch.bfloat16 and out["q_halt_logits"].dtype == torch.float32


# The TRM README's commands on top of the reference cfg_pretrain.yaml (global batch 768, lr 1e-4, puzzle_emb_lr 1e-2,
# weight decays 0.1, 100000 epochs, eval every 10000, ARC evaluator) and arch/trm.yaml (H 3, L 6, 2 layers, rope).
SUDOKU_RECIPE = dict(data_paths=["data/sudoku-extreme-1k-aug-1000"], evaluators=[], global_batch_size=768, epochs=50000,
                     eval_interval=5000, lr=1e-4, puzzle_emb_lr=1e-4, weight_decay=1.0, puzzle_emb_weight_decay=1.0,
                     ema=True, ema_rate=0.999, lr_warmup_steps=2000, lr_min_ratio=1.0)
ARC_RECIPE = dict(data_paths=["data/arc1concept-aug-1000"], evaluators=[{"name": "arc@ARC"}], global_batch_size=768,
                  epochs=100000, eval_interval=10000, lr=1e-4, puzzle_emb_lr=1e-2, weight_decay=0.1,
                  puzzle_emb_weight_decay=0.1, ema=True, ema_rate=0.999, lr_warmup_steps=2000, lr_min_ratio=1.0)
RECIPES = {
    "cfg_pretrain_trm_sudoku_mlp": (SUDOKU_RECIPE, dict(mlp_t=True, pos_encodings="none", H_cycles=3, L_cycles=6)),
    "cfg_pretrain_trm_sudoku_att": (SUDOKU_RECIPE, dict(mlp_t=False, pos_encodings="rope", H_cycles=3, L_cycles=6)),
    "cfg_pretrain_trm_maze": ({**SUDOKU_RECIPE, "data_paths": ["data/maze-30x30-hard-1k"]},
                              dict(mlp_t=False, pos_encodings="rope", H_cycles=3, L_cycles=4)),
    "cfg_pretrain_trm_arc1": (ARC_RECIPE, dict(mlp_t=False, pos_encodings="rope", H_cycles=3, L_cycles=4)),
    "cfg_pretrain_trm_arc2": ({**ARC_RECIPE, "data_paths": ["data/arc2concept-aug-1000"]},
                              dict(mlp_t=False, pos_encodings="rope", H_cycles=3, L_cycles=4)),
}


@pytest.mark.parametrize("recipe", sorted(RECIPES))
def test_readme_recipes_compose_to_the_reference_settings(recipe):
    expected, arch = RECIPES[recipe]
    merged, _ = merge_layers([(label, OmegaConf.to_container(c)) for label, c in recipe_layers(recipe)])
    merged = OmegaConf.to_container(OmegaConf.create(merged), resolve=True)
    assert {k: merged[k] for k in expected} == expected
    common = dict(name="trm", L_layers=2, hidden_size=512, num_heads=8, expansion=4, puzzle_emb_ndim=512,
                  puzzle_emb_len=16, halt_max_steps=16, halt_exploration_prob=0.1, no_ACT_continue=True)
    assert {k: merged["arch"][k] for k in {**common, **arch}} == {**common, **arch}
    keys = {k: v for k, v in merged["arch"].items() if k not in ("name", "loss")}
    model = TinyRecursiveReasoningModel_ACTV1({**keys, "batch_size": 2, "seq_len": 81, "vocab_size": 11,
                                               "num_puzzle_identifiers": 1})
    assert sum(p.numel() for p in model.parameters()) == (5_028_866 if arch["mlp_t"] else 6_828_034)


# ---- the recursion against an independent float64 re-computation -----------------------------------

def _rms(x, eps=1e-5):
    return x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + eps)


def _swiglu(x, w_gate_up, w_down):
    gate, up = (x @ w_gate_up.T).chunk(2, dim=-1)
    return (F.silu(gate) * up) @ w_down.T


def _rope(x, theta=10000.0):
    """Rotate pairs (i, i + d/2) of ``x`` [B, S, H, d] by position * theta^(-2i/d), as complex numbers."""
    d = x.shape[-1]
    angle = torch.arange(x.shape[1], dtype=torch.float64)[:, None] * theta ** (-torch.arange(d // 2) * 2 / d)
    z = torch.complex(x[..., :d // 2], x[..., d // 2:]) * torch.polar(torch.ones_like(angle), angle)[None, :, None]
    return torch.cat([z.real, z.imag], dim=-1)


def _attention(x, w_qkv, w_o, heads, rope):
    b, s, dim = x.shape
    q, k, v = (x @ w_qkv.T).view(b, s, 3, heads, dim // heads).unbind(2)
    if rope:
        q, k = _rope(q), _rope(k)
    scores = torch.einsum("bqhd,bkhd->bhqk", q, k) / math.sqrt(dim // heads)
    return torch.einsum("bhqk,bkhd->bqhd", scores.softmax(-1), v).reshape(b, s, dim) @ w_o.T


def _net(w, cfg, z, injection):
    """The reference's L_level: ``layers(z + injection)``, post-norm blocks."""
    z = z + injection
    for i in range(cfg["L_layers"]):
        p = f"inner.L_level.layers.{i}."
        if cfg.get("mlp_t"):  # SwiGLU over the sequence axis, normalised over that axis too
            zt = z.transpose(1, 2)
            zt = _rms(zt + _swiglu(zt, w[p + "mlp_t.gate_up_proj.weight"], w[p + "mlp_t.down_proj.weight"]))
            z = zt.transpose(1, 2)
        else:
            z = _rms(z + _attention(z, w[p + "self_attn.qkv_proj.weight"], w[p + "self_attn.o_proj.weight"],
                                    cfg["num_heads"], cfg["pos_encodings"] == "rope"))
        z = _rms(z + _swiglu(z, w[p + "mlp.gate_up_proj.weight"], w[p + "mlp.down_proj.weight"]))
    return z


def float64_segment(w, cfg, z_H, z_L, batch, puzzle):
    """One TRM segment in float64: ``H_cycles - 1`` recursions without gradient, the last one with it.

    ``puzzle`` [B, puzzle_emb_ndim] are the batch's puzzle-embedding rows (a leaf, to check their gradient).
    """
    hidden, prefix = cfg["hidden_size"], cfg["puzzle_emb_len"]
    tokens = w["inner.embed_tokens.embedding_weight"][batch["inputs"].long()]
    prefix_rows = F.pad(puzzle, (0, prefix * hidden - puzzle.shape[1])).view(-1, prefix, hidden)
    x = torch.cat([prefix_rows, tokens], dim=1)
    if cfg["pos_encodings"] == "learned":
        x = 0.707106781 * (x + w["inner.embed_pos.embedding_weight"])
    x = math.sqrt(hidden) * x

    def recursion(z_H, z_L):
        for _ in range(cfg["L_cycles"]):
            z_L = _net(w, cfg, z_L, z_H + x)
        return _net(w, cfg, z_H, z_L), z_L

    with torch.no_grad():
        for _ in range(cfg["H_cycles"] - 1):
            z_H, z_L = recursion(z_H, z_L)
    z_H, z_L = recursion(z_H, z_L)
    logits = z_H[:, prefix:] @ w["inner.lm_head.weight"].T
    q = z_H[:, 0] @ w["inner.q_head.weight"].T + w["inner.q_head.bias"]
    return z_H, z_L, logits, q


def rel_err(a, b):
    return ((a.double() - b).abs().max() / b.abs().max()).item()


# One fp32 segment differs from float64 by rounding only, amplified by the ~20 nonlinear block applications
# of the recursion; how much depends on the weights, so they are seeded. Every segment starts from the model's
# own carry, so errors do not compound across segments. Measured with seed 0, forward / gradients: attention
# 3.3e-6 / 2.2e-5 (rope), 2.3e-6 / 8.0e-6 (learned). The mlp_t recursion amplifies rounding more: the
# reference's own fp32 result is ~1e-5 from float64 after one segment (H_cycles=3, L_cycles=6) and drifts
# ~30x further per chained segment. Here: 2.0e-5 / 6.6e-5 (L_cycles=6), 1.1e-5 / 1.6e-5 (learned). Hence
# tol 1e-4 for mlp_t against 2e-5 for attention, and 10 * tol for gradients (sums over far more products);
# a wrong operation, norm axis or gradient boundary is off by more than 1e-2.
@pytest.mark.parametrize("over, tol", [
    ({}, 2e-5),
    ({"pos_encodings": "learned"}, 2e-5),
    ({"mlp_t": True, "pos_encodings": "none", "L_cycles": 6}, 1e-4),
    ({"mlp_t": True, "pos_encodings": "learned"}, 1e-4),
], ids=["attention-rope", "attention-learned", "mlp_t", "mlp_t-learned"])
def test_segments_and_gradients_match_a_float64_recomputation(over, tol):
    cfg = tiny_config(**over)
    torch.manual_seed(0)
    model = randomised(TinyRecursiveReasoningModel_ACTV1(cfg)).train()
    w = {k: v.double().requires_grad_(v.is_floating_point() and "puzzle_emb" not in k and "_init" not in k)
         for k, v in model.state_dict().items()}
    g = torch.Generator().manual_seed(5)
    batch = tiny_batch(cfg)
    carry = model.initial_carry(batch)
    for segment in range(3):
        z_H_in = torch.where(carry.halted.view(-1, 1, 1), model.inner.H_init, carry.inner_carry.z_H).double()
        z_L_in = torch.where(carry.halted.view(-1, 1, 1), model.inner.L_init, carry.inner_carry.z_L).double()
        carry, out = model(carry=carry, batch=batch)
        puzzle = w["inner.puzzle_emb.weights"][batch["puzzle_identifiers"].long()].detach().requires_grad_(True)
        z_H, z_L, logits, q = float64_segment(w, cfg, z_H_in, z_L_in, batch, puzzle)
        assert rel_err(out["logits"], logits) < tol, segment
        assert rel_err(out["q_halt_logits"], q[:, 0]) < tol and rel_err(out["q_continue_logits"], q[:, 1]) < tol
        assert rel_err(carry.inner_carry.z_H, z_H) < tol and rel_err(carry.inner_carry.z_L, z_L) < tol

        # Gradients of a random projection of every output, through the last recursion only.
        r_logits = torch.randn(logits.shape, generator=g, dtype=torch.float64)
        r_q = torch.randn(4, 2, generator=g, dtype=torch.float64)
        q_ours = torch.stack([out["q_halt_logits"], out["q_continue_logits"]], -1)
        ours = (out["logits"] * r_logits).sum() + (q_ours * r_q).sum()
        ours.backward()
        ((logits * r_logits).sum() + (q * r_q).sum()).backward()
        for name, p in model.named_parameters():
            assert rel_err(p.grad, w[name].grad) < 10 * tol, (segment, name)
            p.grad, w[name].grad = None, None
        assert rel_err(model.puzzle_emb.local_weights.grad, puzzle.grad) < 10 * tol
        model.puzzle_emb.local_weights.grad = None


# ---- ACT semantics ---------------------------------------------------------------------------------

def _with_q_bias(model, q_halt, q_continue):
    """Make q_halt and q_continue constant (weight 0, bias given) so the halting rule can be read off."""
    with torch.no_grad():
        model.inner.q_head.weight.zero_()
        model.inner.q_head.bias.copy_(torch.tensor([q_halt, q_continue]))
    return model


@pytest.mark.parametrize("q_halt, q_continue, no_act_continue, halts", [
    (1.0, 5.0, True, True),     # q_halt > 0 halts, whatever q_continue says
    (-1.0, -5.0, True, False),  # q_halt < 0 never halts early
    (1.0, 5.0, False, False),   # with Q-continue: q_halt < q_continue goes on
    (-1.0, -5.0, False, True),  # and q_halt > q_continue halts
])
def test_training_halting_rule(q_halt, q_continue, no_act_continue, halts):
    cfg = tiny_config(no_ACT_continue=no_act_continue)
    model = _with_q_bias(TinyRecursiveReasoningModel_ACTV1(cfg), q_halt, q_continue).train()
    batch = tiny_batch(cfg)
    carry, out = model(carry=model.initial_carry(batch), batch=batch)
    assert carry.halted.tolist() == [halts] * 4 and carry.steps.tolist() == [1] * 4
    assert ("target_q_continue" in out) == (not no_act_continue)


def test_exploration_sets_a_fresh_minimum_of_u2_to_max_segments_per_step():
    cfg = tiny_config(halt_exploration_prob=0.5, batch_size=64, halt_max_steps=5)
    model = _with_q_bias(TinyRecursiveReasoningModel_ACTV1(cfg), 1.0, 0.0).train()  # q_halt > 0: halt unless exploring
    batch = tiny_batch(cfg)
    carry = model.initial_carry(batch)
    for segment in range(1, 4):
        # The reference draws rand_like(q_halt) then randint_like(steps, 2, max + 1) every training segment.
        torch.manual_seed(segment)
        explore = torch.rand(64) < 0.5
        min_steps = explore * torch.randint(2, 6, (64,), dtype=torch.int32)
        steps = torch.where(carry.halted, 0, carry.steps) + 1
        torch.manual_seed(segment)
        carry, _ = model(carry=carry, batch=batch)
        assert torch.equal(carry.steps, steps)
        assert torch.equal(carry.halted, steps >= min_steps)
    assert 0 < carry.halted.sum() < 64


def test_evaluation_always_runs_halt_max_steps_segments():
    cfg = tiny_config()
    # q_halt = 3 > 0 would halt every row at once in training.
    head = ACTLossHead(_with_q_bias(TinyRecursiveReasoningModel_ACTV1(cfg), 3.0, -3.0)).eval()
    _, metrics = evaluate_segments(head, tiny_batch(cfg), cfg["halt_max_steps"])
    assert metrics["count"] == 4 and metrics["steps"] == 4 * cfg["halt_max_steps"]


def test_halted_rows_take_new_data_and_restart_while_others_continue():
    cfg = tiny_config()
    model = TinyRecursiveReasoningModel_ACTV1(cfg).train()  # q = -5: nobody halts early
    first, second = tiny_batch(cfg, 0), tiny_batch(cfg, 1)
    carry, _ = model(carry=model.initial_carry(first), batch=first)
    assert not carry.halted.any()
    carry.halted[:2] = True
    kept_z = carry.inner_carry.z_H[2:].clone()
    carry, _ = model(carry=carry, batch=second)
    assert torch.equal(carry.current_data["inputs"][:2], second["inputs"][:2])
    assert torch.equal(carry.current_data["inputs"][2:], first["inputs"][2:])
    assert carry.steps.tolist() == [1, 1, 2, 2]
    # Rows 2-3 continued from their carry: rerunning them from H_init/L_init gives something else.
    fresh = model.inner.reset_carry(torch.ones(4, dtype=torch.bool), carry.inner_carry)
    assert not torch.equal(kept_z, fresh.z_H[2:])


def test_no_act_continue_loss_is_lm_plus_half_q_halt_and_runs_no_target_segment():
    cfg = tiny_config()
    head = ACTLossHead(randomised(TinyRecursiveReasoningModel_ACTV1(cfg))).train()
    calls = []
    head.model.inner.register_forward_hook(lambda *args: calls.append(1))
    batch = tiny_batch(cfg)
    _, loss, metrics, _, _ = head(head.initial_carry(batch), batch)
    assert len(calls) == 1 and "q_continue_loss" not in metrics
    torch.testing.assert_close(loss, metrics["lm_loss"] + 0.5 * metrics["q_halt_loss"])


def test_q_continue_variant_adds_hrm_target_from_one_extra_no_grad_segment():
    cfg = tiny_config(no_ACT_continue=False)
    head = ACTLossHead(randomised(TinyRecursiveReasoningModel_ACTV1(cfg))).train()
    outputs = {}
    head.model.register_forward_hook(lambda module, args, kwargs, out: outputs.update(out[1]), with_kwargs=True)
    batch = tiny_batch(cfg)
    carry, loss, metrics, _, _ = head(head.initial_carry(batch), batch)
    with torch.no_grad():
        _, _, (next_halt, next_continue) = head.model.inner(carry.inner_carry, carry.current_data)
    # Not the last step (steps = 1 < 4): target = sigmoid(max(next q_halt, next q_continue)).
    target = torch.sigmoid(torch.maximum(next_halt, next_continue))
    torch.testing.assert_close(outputs["target_q_continue"], target)
    expected_q_continue = F.binary_cross_entropy_with_logits(outputs["q_continue_logits"], target, reduction="sum")
    torch.testing.assert_close(metrics["q_continue_loss"], expected_q_continue)
    torch.testing.assert_close(loss, metrics["lm_loss"] + 0.5 * (metrics["q_halt_loss"] + metrics["q_continue_loss"]))


@pytest.mark.parametrize("over", [{}, {"mlp_t": True, "pos_encodings": "learned"}], ids=["attention", "mlp_t"])
def test_gradients_reach_every_parameter_and_the_puzzle_embedding(over):
    cfg = tiny_config(**over)
    head = ACTLossHead(TinyRecursiveReasoningModel_ACTV1(cfg)).train()
    batch = tiny_batch(cfg)
    _, loss, _, _, _ = head(head.initial_carry(batch), batch)
    loss.backward()
    for name, p in head.model.named_parameters():
        assert p.grad is not None and p.grad.abs().sum() > 0, name
    assert head.model.puzzle_emb.local_weights.grad.abs().sum() > 0


# ---- torch.compile ---------------------------------------------------------------------------------

@pytest.mark.parametrize("over", [{}, {"mlp_t": True, "pos_encodings": "none"}], ids=["attention", "mlp_t"])
def test_a_training_segment_compiles_as_one_graph(over):
    cfg = tiny_config(**over, halt_exploration_prob=0.5)
    head = ACTLossHead(TinyRecursiveReasoningModel_ACTV1(cfg)).train()
    graphs = []

    def counting_backend(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    batch = tiny_batch(cfg)
    compiled = torch.compile(head, backend=counting_backend, fullgraph=True)  # fullgraph: a graph break raises
    torch._dynamo.reset()
    carry, loss, _, _, _ = compiled(head.initial_carry(batch), batch)
    compiled(carry, batch)[1].backward()
    assert len(graphs) == 1


@pytest.mark.slow
def test_compiled_training_step_matches_eager(scalar_cpu_kernels):
    cfg = tiny_config(mlp_t=True, pos_encodings="none", halt_exploration_prob=0.5, H_cycles=2, L_layers=1)
    batch = tiny_batch(cfg)
    results = []
    for compile_it in (False, True):
        torch.manual_seed(0)
        head = ACTLossHead(randomised(TinyRecursiveReasoningModel_ACTV1(cfg))).train()
        forward = torch.compile(head) if compile_it else head
        carry = head.initial_carry(batch)
        torch.manual_seed(1)
        carry, loss, _, _, _ = forward(carry, batch)
        loss.backward()
        grads = {n: p.grad for n, p in head.model.named_parameters()}
        results.append((loss.detach(), carry, grads, head.model.puzzle_emb.local_weights.grad))
    (loss_e, carry_e, grads_e, emb_e), (loss_c, carry_c, grads_c, emb_c) = results
    torch.testing.assert_close(loss_c, loss_e, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(carry_c.inner_carry.z_H, carry_e.inner_carry.z_H, rtol=1e-4, atol=1e-4)
    assert torch.equal(carry_c.halted, carry_e.halted) and torch.equal(carry_c.steps, carry_e.steps)
    for name, grad in grads_e.items():
        torch.testing.assert_close(grads_c[name], grad, rtol=1e-4, atol=1e-5, msg=name)
    torch.testing.assert_close(emb_c, emb_e, rtol=1e-4, atol=1e-5)
