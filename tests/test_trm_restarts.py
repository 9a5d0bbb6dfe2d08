"""TRM's opt-in settings for restarts (EqR, arXiv 2605.21488; locuslab/EqR models/eqr.py), device=cpu: at their
defaults nothing changes, bitwise and in the random stream; damping and noise follow EqR's update rule, checked
against a float64 re-computation; a random reset draws a fresh latent per row and position."""

import math

import pytest
import torch

from models.losses import ACTLossHead
from models.trm.trm_act_v1 import TinyRecursiveReasoningModel_ACTV1
from tests.test_hrm_model import tiny_batch
from tests.test_trm_model import _net, randomised, rel_err, tiny_config

DEFAULTS = dict(random_reset=False, H_init_std=1.0, L_init_std=1.0, lambda_=1.0, noise_scale=0.0)
EQR = dict(random_reset=True, H_init_std=1.0, L_init_std=1.0, lambda_=0.95, noise_scale=0.01)  # EqR's Sudoku arch


def _run(cfg, segments=3):
    torch.manual_seed(0)
    model = randomised(TinyRecursiveReasoningModel_ACTV1(cfg)).train()
    batch = tiny_batch(cfg)
    carry, outs = model.initial_carry(batch), []
    for _ in range(segments):
        carry, out = model(carry=carry, batch=batch)
        outs.append(out)
    return model, carry, outs, torch.get_rng_state()


def test_at_their_defaults_the_settings_change_nothing_bitwise_nor_the_random_stream():
    plain, carry_p, outs_p, rng_p = _run(tiny_config())
    named, carry_n, outs_n, rng_n = _run(tiny_config(**DEFAULTS))
    assert all(torch.equal(a, b) for a, b in zip(plain.state_dict().values(), named.state_dict().values()))
    assert all(torch.equal(a[k], b[k]) for a, b in zip(outs_p, outs_n) for k in a)
    assert torch.equal(carry_p.inner_carry.z_H, carry_n.inner_carry.z_H) and torch.equal(rng_p, rng_n)


def test_damping_follows_eqrs_update_rule_against_a_float64_recomputation():
    lam = 0.8
    cfg = tiny_config(mlp_t=True, pos_encodings="none", lambda_=lam)
    torch.manual_seed(0)
    model = randomised(TinyRecursiveReasoningModel_ACTV1(cfg)).eval()
    w = {k: v.double() for k, v in model.state_dict().items()}
    g = torch.Generator().manual_seed(3)
    z_H, z_L, x = (torch.randn(4, 12, 32, generator=g) for _ in range(3))

    def damped(z, injection):  # EqR: (1 - lambda) z + lambda net(z + injection)
        return (1 - lam) * z + lam * _net(w, cfg, z, injection)

    want_L = z_L.double()
    for _ in range(cfg["L_cycles"]):
        want_L = damped(want_L, z_H.double() + x.double())
    want_H = damped(z_H.double(), want_L)
    with torch.no_grad():
        got_H, got_L = model.inner.latent_recursion(z_H, z_L, x, None)
    assert rel_err(got_L, want_L) < 1e-5 and rel_err(got_H, want_H) < 1e-5
    undamped = _net(w, cfg, z_H.double(), want_L)
    assert rel_err(got_H, undamped) > 1e-2  # the damping changes the result by far more than rounding


def test_noise_is_added_after_every_update_with_std_noise_scale():
    cfg = tiny_config(noise_scale=0.25, batch_size=64)
    torch.manual_seed(0)
    model = TinyRecursiveReasoningModel_ACTV1(cfg).eval()
    z, injection = torch.randn(64, 12, 32), torch.randn(64, 12, 32)
    with torch.no_grad():
        torch.manual_seed(7)
        noisy = model.inner.update(z, injection, model.inner.rope())
        clean = model.inner.L_level(z, injection, model.inner.rope())
        torch.manual_seed(7)
        expected_noise = torch.randn_like(clean) * 0.25
    assert torch.equal(noisy, clean + expected_noise)
    assert abs((noisy - clean).std().item() - 0.25) < 0.01


def test_random_reset_draws_a_fresh_truncated_normal_latent_per_row_and_position():
    cfg = tiny_config(random_reset=True, H_init_std=0.5, L_init_std=2.0, batch_size=64)
    torch.manual_seed(0)
    model = TinyRecursiveReasoningModel_ACTV1(cfg)
    carry = model.inner.empty_carry(64)
    carry.z_H.fill_(7.0)
    carry.z_L.fill_(7.0)
    reset = torch.arange(64) % 2 == 0
    first = model.inner.reset_carry(reset, carry)
    second = model.inner.reset_carry(reset, carry)
    for z, std in ((first.z_H, 0.5), (first.z_L, 2.0)):
        fresh = z[reset]
        assert abs(fresh.std().item() - std) < 0.02 * std and fresh.abs().max().item() <= 2 * std * 1.2
        assert not torch.equal(fresh[0, 0], fresh[0, 1]) and not torch.equal(fresh[0], fresh[1])
        assert torch.all(z[~reset] == 7.0)  # rows that go on keep their carry
    assert not torch.equal(first.z_H[reset], second.z_H[reset])  # every restart is a new draw
    model.config.random_reset = False  # off: the fixed H_init of the reference
    fixed = model.inner.reset_carry(reset, carry)
    assert torch.equal(fixed.z_H[0], model.inner.H_init.expand(12, 32))


def test_eqrs_settings_train_and_compile_as_one_graph():
    cfg = tiny_config(**EQR, mlp_t=True, pos_encodings="none", halt_exploration_prob=0.5)
    head = ACTLossHead(TinyRecursiveReasoningModel_ACTV1(cfg)).train()
    batch = tiny_batch(cfg)
    torch._dynamo.reset()
    explained = torch._dynamo.explain(head)(head.initial_carry(batch), batch)  # the random reset and noise included
    assert explained.graph_count == 1 and not explained.break_reasons
    carry, loss, _, _, _ = head(head.initial_carry(batch), batch)
    head(carry, batch)[1].backward()
    assert math.isfinite(loss.item()) and all(p.grad is not None for p in head.model.parameters())


@pytest.mark.parametrize("over, match", [
    ({"lambda_": 0.0}, r"lambda_=0.0 \(EqR's damping\) must be in \(0, 1\]"),
    ({"lambda_": 1.5}, r"must be in \(0, 1\]"),
    ({"noise_scale": -0.1}, r"noise_scale=-0.1 \(EqR's latent noise std\) must be in \[0, 100\]"),
    ({"noise_scale": float("nan")}, "noise_scale=nan"),
    ({"noise_scale": 1e300}, "noise_scale=1e"),
    ({"H_init_std": 0.0}, r"H_init_std \(0.0\) and L_init_std \(1.0\) must be in \(0, 100\]"),
    ({"L_init_std": float("inf")}, "L_init_std"),
])
def test_bad_values_are_one_line_errors(over, match):
    with pytest.raises(ValueError, match=match):
        TinyRecursiveReasoningModel_ACTV1(tiny_config(**over))


def test_an_eqr_model_answers_a_batch_the_same_way_each_time_and_leaves_the_global_stream_alone():
    from utils.eval.reasoning import TestTimeCompute, reason

    cfg = tiny_config(**{**EQR, "noise_scale": 0.05})
    torch.manual_seed(0)
    head = ACTLossHead(randomised(TinyRecursiveReasoningModel_ACTV1(cfg))).eval()
    batch = tiny_batch(cfg)
    before = torch.get_rng_state()
    first, again = (reason(head, head, batch, TestTimeCompute(segments=3, seed=4)) for _ in range(2))
    other = reason(head, head, batch, TestTimeCompute(segments=3, seed=5))
    assert torch.equal(first["logits"], again["logits"]) and torch.equal(torch.get_rng_state(), before)
    assert not torch.equal(first["logits"], other["logits"])  # the seed decides the random starts and the noise
