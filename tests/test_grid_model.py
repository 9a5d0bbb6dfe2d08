"""The size-agnostic TRM (``token_mixer: conv`` / ``conv_attention``, ``pos_encodings: rope2d``): its mixers against
independent re-computations, one set of weights on grids of any side, and its settings' one-line errors.

All on device=cpu. The reference variants' equivalence tests (tests/test_trm_model.py) are untouched: at the default
``token_mixer: attention`` none of this runs.
"""

import math

import pytest
import torch
import torch.nn.functional as F

from models import build_model, is_grid, validate_arch
from models.layers import GridConv, RotaryEmbedding2D, apply_rotary_pos_emb, grid_side
from utils.config import ConfigError

SMALL = {"name": "trm", "loss": {"loss_type": "stablemax_cross_entropy"}, "halt_exploration_prob": 0.1,
         "halt_max_steps": 3, "H_cycles": 2, "L_cycles": 2, "H_layers": 0, "L_layers": 2, "hidden_size": 32,
         "num_heads": 2, "expansion": 2, "puzzle_emb_ndim": 0, "puzzle_emb_len": 0, "pos_encodings": "none",
         "mlp_t": False, "no_ACT_continue": True}
MIXERS = [("conv", "none"), ("conv_attention", "rope2d"), ("attention", "rope2d")]


def grid_head(token_mixer: str, pos_encodings: str, side: int, seed: int = 0):
    torch.manual_seed(seed)
    arch = validate_arch({**SMALL, "token_mixer": token_mixer, "pos_encodings": pos_encodings})
    return build_model(arch, batch_size=2, seq_len=side * side, vocab_size=6, num_puzzle_identifiers=1,
                       dtype=torch.float32, device="cpu")


def maze_batch(side: int, seed: int = 1) -> dict:
    generator = torch.Generator().manual_seed(seed)
    inputs = torch.randint(1, 5, (2, side * side), generator=generator, dtype=torch.int32)
    return {"inputs": inputs, "labels": inputs.long(), "puzzle_identifiers": torch.zeros(2, dtype=torch.int32)}


def test_grid_conv_is_each_cell_weighed_with_its_eight_neighbours():
    """GridConv against a loop over cells and offsets (zero outside the grid), on a 5x5 grid."""
    torch.manual_seed(0)
    conv = GridConv(3)
    side, x = 5, torch.randn(2, 25, 3)
    grid = x.view(2, side, side, 3)
    expected = torch.zeros_like(grid)
    for r in range(side):
        for c in range(side):
            for dr in (-1, 0, 1):
                for dc in (-1, 0, 1):
                    if 0 <= r + dr < side and 0 <= c + dc < side:
                        expected[:, r, c] += grid[:, r + dr, c + dc] * conv.weight[:, 0, dr + 1, dc + 1]
    assert torch.allclose(conv(x), expected.view(2, 25, 3), atol=1e-6)


def test_rope2d_scores_depend_only_on_row_and_column_offsets():
    """After 2D RoPE, q(r1, c1) . k(r2, c2) is the same for every pair of cells with the same offsets, whatever the
    grid's side: a grid model's attention is the same function on every size."""
    torch.manual_seed(0)
    dim = 8
    q, k = torch.randn(dim), torch.randn(dim)

    def score(side: int, a: tuple[int, int], b: tuple[int, int]) -> float:
        cos, sin = RotaryEmbedding2D(dim, side, 10000.0)(side)
        qs = q.expand(side * side, dim).reshape(1, side * side, 1, dim)
        ks = k.expand(side * side, dim).reshape(1, side * side, 1, dim)
        rq, rk = apply_rotary_pos_emb(qs, ks, cos, sin)
        return float(rq[0, a[0] * side + a[1], 0] @ rk[0, b[0] * side + b[1], 0])

    base = score(5, (1, 1), (3, 4))
    assert score(5, (0, 0), (2, 3)) == pytest.approx(base, abs=1e-5)
    assert score(9, (5, 2), (7, 5)) == pytest.approx(base, abs=1e-5)
    assert score(5, (1, 1), (4, 3)) != pytest.approx(base, abs=1e-3)  # offsets swapped: rows and columns differ


@pytest.mark.parametrize("token_mixer,pos_encodings", MIXERS)
def test_one_set_of_weights_answers_grids_of_any_side(token_mixer, pos_encodings):
    """A model built for 4x4 grids, given 7x7 ones, computes what the same weights built for 7x7 compute."""
    small, large = grid_head(token_mixer, pos_encodings, 4), grid_head(token_mixer, pos_encodings, 7, seed=5)
    large.load_state_dict(small.state_dict())
    batch = maze_batch(7)
    carry_small, loss_small, *_ = small(small.initial_carry(batch), batch)
    carry_large, loss_large, *_ = large(large.initial_carry(batch), batch)
    assert torch.equal(loss_small, loss_large)
    assert carry_small.inner_carry.z_H.shape == (2, 49, 32)
    assert torch.equal(carry_small.inner_carry.z_H, carry_large.inner_carry.z_H)


@pytest.mark.parametrize("token_mixer,pos_encodings", MIXERS)
def test_grid_model_has_no_size_dependent_weights_and_reads_q_off_every_cell(token_mixer, pos_encodings):
    head = grid_head(token_mixer, pos_encodings, 4)
    assert is_grid(validate_arch({**SMALL, "token_mixer": token_mixer, "pos_encodings": pos_encodings}))
    assert not any("embed_pos" in name or "mlp_t" in name for name in head.state_dict())
    inner = head.model.inner
    z = torch.randn(2, 16, 32)
    _, _, (q_halt, _) = inner.outputs(z, z)
    assert torch.equal(q_halt, inner.q_head(z).amin(dim=1)[:, 0])  # the least sure cell decides


def test_conv_attention_alternates_mixers_conv_first():
    inner = grid_head("conv_attention", "rope2d", 4).model.inner
    assert [hasattr(layer, "conv") for layer in inner.L_level.layers] == [True, False]
    assert [hasattr(layer, "self_attn") for layer in inner.L_level.layers] == [False, True]


def test_the_reference_variants_are_not_grid_models():
    assert not is_grid(validate_arch({**SMALL, "pos_encodings": "rope"}))
    assert not is_grid(validate_arch({**SMALL, "pos_encodings": "learned"}))


@pytest.mark.parametrize("changes,fragment", [
    ({"token_mixer": "mamba"}, "token_mixer='mamba': use one of attention, conv, conv_attention"),
    ({"token_mixer": "conv", "puzzle_emb_ndim": 32}, "it takes no mlp_t and no puzzle embedding"),
    ({"token_mixer": "conv", "pos_encodings": "learned"}, "ties a grid model to one sequence length"),
    ({"token_mixer": "conv_attention", "pos_encodings": "none"}, "attends without positions: set pos_encodings=rope2d"),
    ({"pos_encodings": "rope2d", "num_heads": 16}, "rope2d needs a head size divisible by 4"),
])
def test_grid_settings_refused_in_one_line(changes, fragment):
    with pytest.raises(ConfigError, match=fragment):
        validate_arch({**SMALL, **changes})


def test_a_grid_needs_a_square():
    assert grid_side(900) == 30
    with pytest.raises(ValueError, match="square grid"):
        grid_side(30)
    assert math.isqrt(17) ** 2 != 17


def test_the_solving_flop_count_includes_the_convolution():
    """flops_per_pass counts the depthwise convolution: 2 x 9 multiply-adds a channel a cell a block."""
    from utils.solve.solving import _MatrixFlops

    x = torch.randn(1, 16, 4)
    with _MatrixFlops() as counted:
        F.conv2d(x.view(1, 4, 4, 4).permute(0, 3, 1, 2), torch.randn(4, 1, 3, 3), padding=1, groups=4)
    assert counted.flops == 2 * 16 * 4 * 9
