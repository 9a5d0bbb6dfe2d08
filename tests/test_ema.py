"""EMA of weights (TRM's EMAHelper): update formula, what it averages, swap semantics, bitwise state round trip."""

import copy

import pytest
import torch
from torch import nn

from models.ema import EMAHelper
from models.losses import ACTLossHead
from models.trm.trm_act_v1 import TinyRecursiveReasoningModel_ACTV1

TINY_TRM = dict(batch_size=4, seq_len=9, vocab_size=6, num_puzzle_identifiers=3, H_cycles=2, L_cycles=2, H_layers=0,
                L_layers=1, hidden_size=32, expansion=2, num_heads=4, pos_encodings="rope", halt_max_steps=3,
                halt_exploration_prob=0.0, puzzle_emb_ndim=32, puzzle_emb_len=2, forward_dtype="float32")


def tiny_batch(seed=0):
    g = torch.Generator().manual_seed(seed)
    return {"inputs": torch.randint(0, 6, (4, 9), generator=g, dtype=torch.int32),
            "labels": torch.randint(1, 6, (4, 9), generator=g, dtype=torch.int32),
            "puzzle_identifiers": torch.randint(0, 3, (4,), generator=g, dtype=torch.int32)}


class Two(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = nn.Parameter(torch.tensor([1.0, -2.0]))
        self.b = nn.Parameter(torch.tensor([[4.0]]))
        self.frozen = nn.Parameter(torch.tensor([7.0]), requires_grad=False)
        self.register_buffer("table", torch.tensor([3.0]))


def test_update_matches_the_formula_by_hand():
    model = Two()
    ema = EMAHelper(model, mu=0.9)
    assert ema.names == ["a", "b"]  # trainable parameters only: no frozen parameter, no buffer
    with torch.no_grad():
        model.a.copy_(torch.tensor([3.0, 0.0]))
        model.b.copy_(torch.tensor([[-6.0]]))
    ema.update()
    # shadow = 0.1 * param + 0.9 * shadow: a = (0.1*3 + 0.9*1, 0.1*0 + 0.9*-2), b = 0.1*-6 + 0.9*4
    torch.testing.assert_close(ema.state_dict()["a"], torch.tensor([1.2, -1.8]))
    torch.testing.assert_close(ema.state_dict()["b"], torch.tensor([[3.0]]))
    with torch.no_grad():
        model.a.copy_(torch.tensor([1.2, -1.8]))  # a fixed point: the average stays
        model.b.copy_(torch.tensor([[13.0]]))
    ema.update()
    torch.testing.assert_close(ema.state_dict()["a"], torch.tensor([1.2, -1.8]))
    torch.testing.assert_close(ema.state_dict()["b"], torch.tensor([[0.1 * 13.0 + 0.9 * 3.0]]))


def test_update_rounds_exactly_as_the_reference_expression():
    torch.manual_seed(0)
    model = nn.Linear(64, 48)
    ema = EMAHelper(model, mu=0.999)
    expected = {n: p.detach().clone() for n, p in model.named_parameters()}
    for _ in range(20):
        with torch.no_grad():
            for p in model.parameters():
                p.add_(torch.randn_like(p) * 0.1)
        ema.update()
        # TRM models/ema.py: shadow = (1. - mu) * param.data + mu * shadow
        expected = {n: (1.0 - 0.999) * p.detach() + 0.999 * expected[n] for n, p in model.named_parameters()}
    assert all(torch.equal(ema.state_dict()[n], expected[n]) for n in expected)


def test_swapped_exposes_the_average_and_restores_the_live_weights_in_place():
    model = Two()
    ema = EMAHelper(model, mu=0.5)
    params = list(model.parameters())
    with torch.no_grad():
        model.a.copy_(torch.tensor([5.0, 6.0]))
        model.table.fill_(-1.0)
    ema.update()  # a: (3, 2)
    live = model.a.detach().clone()
    with ema.swapped():
        assert model.a.tolist() == [3.0, 2.0] and model.b.tolist() == [[4.0]]
        assert model.table.item() == -1.0 and model.frozen.item() == 7.0  # buffers and frozen ones stay live
        assert model.a.requires_grad and isinstance(model.a, nn.Parameter)
    assert torch.equal(model.a, live) and ema.state_dict()["a"].tolist() == [3.0, 2.0]
    assert all(p is q for p, q in zip(model.parameters(), params))  # the optimizer's references stay valid


def test_swapped_restores_on_error_and_refuses_state_changes_inside():
    model = Two()
    ema = EMAHelper(model, mu=0.5)
    with torch.no_grad():
        model.a.copy_(torch.tensor([5.0, 6.0]))
    with pytest.raises(KeyError):
        with ema.swapped():
            raise KeyError("evaluation failed")
    assert model.a.tolist() == [5.0, 6.0]
    with ema.swapped():
        for call in (ema.update, ema.state_dict, lambda: ema.load_state_dict({})):
            with pytest.raises(RuntimeError, match="inside swapped"):
                call()
        with pytest.raises(RuntimeError, match="inside swapped"):
            with ema.swapped():
                pass
    assert model.a.tolist() == [5.0, 6.0]


def test_state_round_trip_through_a_file_resumes_bitwise(tmp_path):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 8), nn.Linear(8, 2))
    ema = EMAHelper(model, mu=0.99)
    steps = [[torch.randn_like(p) for p in model.parameters()] for _ in range(6)]

    def train(m, e, deltas):
        for delta in deltas:
            with torch.no_grad():
                for p, d in zip(m.parameters(), delta):
                    p.add_(d)
            e.update()

    train(model, ema, steps[:3])
    torch.save({"model": model.state_dict(), "ema": ema.state_dict()}, tmp_path / "ckpt.pt")
    train(model, ema, steps[3:])

    resumed = nn.Sequential(nn.Linear(8, 8), nn.Linear(8, 2))
    saved = torch.load(tmp_path / "ckpt.pt", weights_only=True)
    resumed.load_state_dict(saved["model"])
    ema2 = EMAHelper(resumed, mu=0.99)
    ema2.load_state_dict(saved["ema"])
    train(resumed, ema2, steps[3:])
    assert all(torch.equal(ema.state_dict()[k], v) for k, v in ema2.state_dict().items())


def test_loading_a_state_of_another_model_is_a_clear_error():
    ema = EMAHelper(nn.Linear(4, 3))
    with pytest.raises(ValueError, match=r"missing \['bias'\].*shape mismatches \['weight: saved \(3, 5\)"):
        ema.load_state_dict({"weight": torch.zeros(3, 5)})
    with pytest.raises(ValueError, match="unexpected \\['extra'\\]"):
        ema.load_state_dict({"weight": torch.zeros(3, 4), "bias": torch.zeros(3), "extra": torch.zeros(1)})
    with pytest.raises(ValueError, match="ema_rate=1.5"):
        EMAHelper(nn.Linear(4, 3), mu=1.5)


def test_names_look_through_compile_and_the_loss_head():
    model = nn.Linear(4, 3)
    assert EMAHelper(torch.compile(model)).names == ["weight", "bias"]
    head = ACTLossHead(TinyRecursiveReasoningModel_ACTV1(TINY_TRM))
    names = EMAHelper(torch.compile(head)).names
    assert names[0] == "model.inner.embed_tokens.embedding_weight" and "model.inner.puzzle_emb.weights" not in names


def test_trm_evaluation_under_swap_equals_the_reference_ema_copy():
    """The reference evaluates a deep copy whose parameters are overwritten by the shadow; buffers stay live."""
    torch.manual_seed(0)
    head = ACTLossHead(TinyRecursiveReasoningModel_ACTV1(TINY_TRM)).train()
    ema = EMAHelper(head, mu=0.9)
    opt = torch.optim.SGD(head.parameters(), lr=0.1)
    batch = tiny_batch()
    carry = head.initial_carry(batch)
    for _ in range(3):
        carry, loss, _, _, _ = head(carry, batch)
        loss.backward()
        opt.step()
        opt.zero_grad()
        with torch.no_grad():  # stands in for the sign-SGD step on the puzzle table (a buffer)
            head.model.puzzle_emb.weights.add_(0.5)
        ema.update()

    reference_copy = copy.deepcopy(head)
    with torch.no_grad():
        for name, p in reference_copy.named_parameters():
            p.copy_(ema.state_dict()[name])

    def evaluate(h):
        h.eval()
        c = h.initial_carry(batch)
        with torch.no_grad():
            for _ in range(TINY_TRM["halt_max_steps"]):
                c, _, metrics, outputs, _ = h(c, batch)
        h.train()
        return outputs["logits"], metrics["lm_loss"]

    live_logits, _ = evaluate(head)
    with ema.swapped():
        swapped_logits, swapped_loss = evaluate(head)
    expected_logits, expected_loss = evaluate(reference_copy)
    assert torch.equal(swapped_logits, expected_logits) and torch.equal(swapped_loss, expected_loss)
    assert not torch.equal(live_logits, swapped_logits)
    assert torch.equal(evaluate(head)[0], live_logits)


def test_swap_works_under_torch_compile():
    """Parameters are graph inputs of a compiled model, so swapping their data changes what it computes."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 6), nn.GELU(), nn.Linear(6, 2))
    ema = EMAHelper(model, mu=0.0)  # mu 0: the shadow becomes the current weights at the next update
    compiled = torch.compile(model, backend="aot_eager")
    x = torch.randn(3, 6)
    before = compiled(x)
    ema.update()
    averaged = copy.deepcopy(model)
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(2.0)
    with ema.swapped():
        assert torch.equal(compiled(x), averaged(x)) and torch.equal(compiled(x), before)
    assert not torch.equal(compiled(x), before)
