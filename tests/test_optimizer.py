"""AdamATan2 numerics, state and edge cases (utils/optimizer_utils.py).

Parity follows the native adam-atan2 package's own test (docs/REFERENCE.md, AdamATan2): params
~ N(0, 0.02^2), grads ~ N(0, 0.001^2), weight_decay 0.1, betas (0.9, 0.95), 100 steps, against
an fp32 (fp64) re-computation rounded to the param dtype each step, with absolute tolerances.
Backend selection is checked in test_optimizer_fallback.py (also collected by pytest).
"""

from __future__ import annotations

import io
import logging
import math

import pytest
import torch

import utils.optimizer_utils as ou
from test_optimizer_fallback import reference_step
from utils.optimizer_utils import AdamATan2

TOL = {torch.float64: 1e-15, torch.float32: 1e-6, torch.float16: 2e-3, torch.bfloat16: 5e-3}
BETAS, WD = (0.9, 0.95), 0.1
# Spans several CPU pieces (CPU_CHUNK_NUMEL is lowered to 1000 below), has tensors smaller than a
# piece, and includes a non-contiguous (transposed) parameter that goes whole.
SHAPES = [(37, 53), (2500,), (7,), (3, 4, 5)]


def make_params(dtype, gen, shapes=SHAPES, transposed=True):
    params = [torch.nn.Parameter((torch.randn(s, generator=gen) * 0.02).to(dtype)) for s in shapes]
    if transposed:
        params.append(torch.nn.Parameter((torch.randn(19, 23, generator=gen) * 0.02).to(dtype).t()))
    return params


def set_grads(params, gen, scale=1e-3):
    for p in params:
        p.grad = (torch.randn(p.shape, generator=gen) * scale).to(p.dtype)


def run_against_reference(opt, params, gen, lrs, atol):
    """Step ``opt`` and the reference side by side with lr ``lrs[t-1]``; return the max abs difference seen."""
    ref = [(p.detach().clone(), torch.zeros_like(p), torch.zeros_like(p)) for p in params]
    worst = 0.0
    for t, lr in enumerate(lrs, start=1):
        set_grads(params, gen)
        for group in opt.param_groups:
            group["lr"] = lr
        ref = [reference_step(*r[:1], p.grad, *r[1:], t, lr, BETAS, WD) for r, p in zip(ref, params)]
        opt.step()
        for p, (rp, rm, rv) in zip(params, ref):
            state = opt.state[p]
            for ours, want in ((p.detach(), rp), (state["exp_avg"], rm), (state["exp_avg_sq"], rv)):
                worst = max(worst, (ours.double() - want.double()).abs().max().item())
    assert worst <= atol, f"max |ours - reference| = {worst:.3g} > {atol:.0e}"
    return worst


@pytest.fixture(autouse=True)
def small_cpu_pieces(monkeypatch):
    monkeypatch.setattr(ou, "CPU_CHUNK_NUMEL", 1000)


@pytest.mark.parametrize("lr", [1e-3, 5e-4, 1e-4])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16, torch.float64], ids=str)
def test_eager_matches_reference(dtype, lr):
    gen = torch.Generator().manual_seed(0)
    params = make_params(dtype, gen)
    opt = AdamATan2(params, lr=lr, betas=BETAS, weight_decay=WD)
    run_against_reference(opt, params, gen, [lr] * 100, TOL[dtype])
    for p in params:
        assert opt.state[p]["exp_avg"].dtype == dtype and opt.state[p]["step"].item() == 100


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64], ids=str)
def test_cpu_scratch_path_agrees_with_the_foreach_path(dtype):
    """The CPU path ((1/c) / rsqrt(v), fused decay, temporaries in a reused buffer) and the allocating
    foreach path used on GPUs (sqrt(v) / c): moments bitwise equal, parameters within the parity
    tolerance, and v = 0 handled alike (m = 0 gives no update, m != 0 a full +-pi/2 step)."""
    gen = torch.Generator().manual_seed(3)
    params = make_params(dtype, gen)
    set_grads(params, gen)
    tiny = 1e-170 if dtype == torch.float64 else 1e-30  # g*g underflows to v = 0
    params[1].grad[:5] = torch.tensor([0.0, 0.0, tiny, -tiny, 0.0], dtype=dtype)
    state = [[p.detach().clone() for p in params], [p.grad.clone() for p in params],
             [torch.randn(p.shape, generator=gen).to(dtype) * 1e-3 for p in params],
             [torch.rand(p.shape, generator=gen).to(dtype) * 1e-6 for p in params]]
    state[2][1][:5] = 0.0
    state[3][1][:5] = 0.0
    twin = [[t.clone() for t in ts] for ts in state]
    coef = (1 - 1e-4, 0.1, 0.05, 1e-3, math.sqrt(0.05))
    ou._cpu_update(tuple(state), coef, {})
    ou._foreach_update(*twin, *coef)
    for ours, theirs in zip(state[2:], twin[2:]):
        assert all(torch.equal(a, b) for a, b in zip(ours, theirs))
    for a, b in zip(state[0], twin[0]):
        torch.testing.assert_close(a, b, rtol=0, atol=TOL[dtype])
    p0, g0 = params[1].detach()[:5].double() * (1 - 1e-4), params[1].grad[:5].double()
    want = p0 - 1e-3 * torch.sign(g0) * math.pi / 2 * (g0 != 0)
    torch.testing.assert_close(state[0][1][:5].double(), want, rtol=0, atol=TOL[dtype])
    assert torch.equal(state[0][1][:5], twin[0][1][:5])


def test_cpu_scratch_is_reused_and_grows_for_a_big_non_contiguous_tensor():
    gen = torch.Generator().manual_seed(4)
    params = make_params(torch.float32, gen) + [torch.nn.Parameter(torch.randn(60, 50, generator=gen).t())]
    opt = AdamATan2(params, lr=1e-3, betas=BETAS, weight_decay=WD)
    set_grads(params, gen)
    opt.step()
    buffer = opt._scratch[torch.float32]
    assert buffer.numel() == 3000  # the transposed 50x60 parameter goes whole, past the 1000-element pieces
    set_grads(params, gen)
    opt.step()
    assert opt._scratch[torch.float32].data_ptr() == buffer.data_ptr()


def test_decay_to_zero_keeps_nan_like_the_reference():
    """lr * weight_decay = 1 multiplies p by 0, which must keep a NaN weight NaN (0 * NaN), not drop it."""
    p = torch.nn.Parameter(torch.tensor([1.0, float("nan"), -2.0]))
    p.grad = torch.tensor([0.5, 0.5, -0.5])
    AdamATan2([p], lr=1.0, betas=(0.9, 0.99), weight_decay=1.0).step()
    step = -1.0 / (1 - 0.9) * math.atan2(0.05, math.sqrt(0.0025) / math.sqrt(0.01))
    assert math.isnan(p[1].item())
    assert [p[0].item(), p[2].item()] == pytest.approx([step, -step], abs=1e-6)


def test_matches_float64_math_by_hand():
    """One step with numbers worked out by hand: m = 0.05, v = 0.0025, corrections 0.1 and 0.01."""
    p = torch.nn.Parameter(torch.ones(4, dtype=torch.float64))
    p.grad = torch.full_like(p, 0.5)
    AdamATan2([p], lr=0.1, betas=(0.9, 0.99), weight_decay=0.5).step()
    want = 1 * (1 - 0.1 * 0.5) - 0.1 / 0.1 * math.atan2(0.05, math.sqrt(0.0025) / math.sqrt(0.01))
    assert p.detach().tolist() == pytest.approx([want] * 4, abs=1e-15)


def test_lr_zero_then_changing_lr():
    """HRM builds with lr=0 and writes param_group['lr'] every step (warmup, then cosine)."""
    gen = torch.Generator().manual_seed(1)
    params = make_params(torch.float32, gen)
    opt = AdamATan2(params, lr=0.0, betas=BETAS, weight_decay=WD)
    before = [p.detach().clone() for p in params]
    set_grads(params, gen)
    opt.step()
    assert all(torch.equal(p, b) for p, b in zip(params, before)), "lr=0 must leave the weights alone"
    assert all(opt.state[p]["exp_avg"].abs().sum() > 0 for p in params), "but the moments still update"
    params = make_params(torch.float32, gen)
    opt = AdamATan2(params, lr=0.0, betas=BETAS, weight_decay=WD)
    run_against_reference(opt, params, gen, [1e-3 * min(1.0, t / 10) for t in range(1, 31)], TOL[torch.float32])


def test_weight_decay_alone_with_zero_grads():
    p = torch.nn.Parameter(torch.full((5,), 2.0, dtype=torch.float64))
    opt = AdamATan2([p], lr=0.01, betas=BETAS, weight_decay=0.5)
    for _ in range(3):
        p.grad = torch.zeros_like(p)
        opt.step()
    assert p.detach().tolist() == pytest.approx([2.0 * (1 - 0.01 * 0.5) ** 3] * 5, abs=1e-15)
    assert opt.state[p]["exp_avg"].abs().max() == 0 and opt.state[p]["exp_avg_sq"].abs().max() == 0


def test_none_grads_skipped_and_late_params_count_their_own_steps():
    gen = torch.Generator().manual_seed(2)
    early, late = make_params(torch.float32, gen, shapes=[(30,), (40,)], transposed=False)
    opt = AdamATan2([early, late], lr=1e-3, betas=BETAS, weight_decay=WD)
    late_before = late.detach().clone()
    ref_early = (early.detach().clone(), torch.zeros_like(early), torch.zeros_like(early))
    for t in range(1, 4):
        early.grad = torch.randn(early.shape, generator=gen) * 1e-3
        ref_early = reference_step(ref_early[0], early.grad, *ref_early[1:], t, 1e-3, BETAS, WD)
        opt.step()
    assert torch.equal(late, late_before) and late not in opt.state
    late.grad = torch.randn(late.shape, generator=gen) * 1e-3
    zeros = torch.zeros_like(late)
    ref_late = reference_step(late.detach(), late.grad, zeros, zeros, 1, 1e-3, BETAS, WD)
    early.grad = torch.randn(early.shape, generator=gen) * 1e-3
    ref_early = reference_step(ref_early[0], early.grad, *ref_early[1:], 4, 1e-3, BETAS, WD)
    opt.step()  # two buckets: step 4 and step 1
    assert opt.state[late]["step"].item() == 1 and opt.state[early]["step"].item() == 4
    assert (late.detach() - ref_late[0]).abs().max() <= 1e-6 and (early.detach() - ref_early[0]).abs().max() <= 1e-6


def test_closure_contract():
    gen = torch.Generator().manual_seed(3)
    x, y = torch.randn(16, 4, generator=gen), torch.randn(16, 1, generator=gen)
    models = [torch.nn.Linear(4, 1), torch.nn.Linear(4, 1)]
    models[1].load_state_dict(models[0].state_dict())
    opts = [AdamATan2(m.parameters(), lr=1e-2) for m in models]
    calls = []

    def closure():
        calls.append(torch.is_grad_enabled())
        opts[0].zero_grad()
        loss = torch.nn.functional.mse_loss(models[0](x), y)
        loss.backward()
        return loss

    loss = opts[0].step(closure)
    torch.nn.functional.mse_loss(models[1](x), y).backward()
    assert opts[1].step() is None
    assert calls == [True] and loss.item() > 0
    for a, b in zip(models[0].parameters(), models[1].parameters()):
        assert torch.equal(a, b)


def test_params_on_several_devices_in_one_group():
    """CPU tensors update correctly next to tensors on another device (meta stands in for a GPU here)."""
    gen = torch.Generator().manual_seed(4)
    cpu = make_params(torch.float32, gen, shapes=[(50,)], transposed=False)[0]
    other = torch.nn.Parameter(torch.zeros(8, device="meta"))
    other.grad = torch.zeros(8, device="meta")
    opt = AdamATan2([cpu, other], lr=1e-3, betas=BETAS, weight_decay=WD)
    run_against_reference(opt, [cpu], gen, [1e-3] * 3, TOL[torch.float32])
    assert opt.state[other]["exp_avg"].device.type == "meta" and opt.state[other]["step"].item() == 3


@pytest.mark.parametrize("kwargs, match", [
    (dict(lr=-1e-3), "lr=-0.001 must be >= 0"),
    (dict(lr=float("nan")), "must be >= 0"),
    (dict(betas=(1.0, 0.9)), r"betas\[0\]=1.0 must be in \[0, 1\)"),
    (dict(betas=(0.9, -0.1)), r"betas\[1\]=-0.1"),
    (dict(weight_decay=-0.1), "weight_decay=-0.1 must be >= 0"),
    (dict(betas=0.9), "pair of numbers"),
])
def test_bad_hyperparameters(kwargs, match):
    with pytest.raises(ValueError, match=match):
        AdamATan2([torch.nn.Parameter(torch.zeros(2))], **kwargs)


def test_bad_lr_written_later_is_caught_at_step():
    p = torch.nn.Parameter(torch.zeros(2))
    p.grad = torch.ones(2)
    opt = AdamATan2([p])
    opt.param_groups[0]["lr"] = -1.0
    with pytest.raises(ValueError, match=r"param_groups\[0\]: lr=-1.0"):
        opt.step()


@pytest.mark.parametrize("option, match", [("eps", "no epsilon"), ("maximize", "negated loss"),
                                           ("capturable", "CUDA graph"), ("fused", "compile=True")])
def test_adamw_only_options_are_rejected(option, match):
    with pytest.raises(TypeError, match=match):
        AdamATan2([torch.nn.Parameter(torch.zeros(2))], **{option: True})


def test_sparse_and_complex_are_rejected():
    emb = torch.nn.Embedding(10, 3, sparse=True)
    emb(torch.tensor([1, 2])).sum().backward()
    with pytest.raises(RuntimeError, match="sparse gradient"):
        AdamATan2(emb.parameters()).step()
    c = torch.nn.Parameter(torch.zeros(2, dtype=torch.complex64))
    c.grad = torch.ones_like(c)
    with pytest.raises(RuntimeError, match="complex"):
        AdamATan2([c]).step()


def _trained(steps=5, seed=5):
    gen = torch.Generator().manual_seed(seed)
    params = make_params(torch.float32, gen, shapes=[(30, 20), (20,)], transposed=False)
    opt = AdamATan2(params, lr=1e-3, betas=BETAS, weight_decay=WD)
    for _ in range(steps):
        set_grads(params, gen)
        opt.step()
    return params, opt, gen


def test_state_dict_has_the_native_layout():
    params, opt, _ = _trained()
    sd = opt.state_dict()
    assert [sorted(g) for g in sd["param_groups"]] == [["betas", "lr", "params", "weight_decay"]]
    for i, p in enumerate(params):
        state = sd["state"][i]
        assert sorted(state) == ["exp_avg", "exp_avg_sq", "step"]
        assert state["step"].dtype == torch.float32 and state["step"].shape == () and state["step"].item() == 5
        assert state["exp_avg"].shape == p.shape and state["exp_avg_sq"].dtype == p.dtype


def test_round_trip_through_a_native_layout_dict():
    """ours -> a dict built by hand in adam_atan2.AdamATan2's layout -> torch.save/load -> ours."""
    params, opt, gen = _trained()
    sd = opt.state_dict()
    native = {"state": {i: {"step": torch.tensor(float(s["step"]), dtype=torch.float32),
                            "exp_avg": s["exp_avg"].clone(), "exp_avg_sq": s["exp_avg_sq"].clone()}
                        for i, s in sd["state"].items()},
              "param_groups": [{"lr": 1e-3, "betas": BETAS, "weight_decay": WD, "params": [0, 1]}]}
    buf = io.BytesIO()
    torch.save(native, buf)
    buf.seek(0)
    loaded = torch.load(buf, map_location="cpu", weights_only=True)
    twins = [torch.nn.Parameter(p.detach().clone()) for p in params]
    resumed = AdamATan2(twins, lr=0.0)
    resumed.load_state_dict(loaded)
    assert resumed.param_groups[0]["lr"] == 1e-3
    for _ in range(3):
        set_grads(params, gen)
        for p, q in zip(params, twins):
            q.grad = p.grad.clone()
        opt.step()
        resumed.step()
    for p, q in zip(params, twins):
        assert torch.equal(p, q)
        assert torch.equal(opt.state[p]["exp_avg_sq"], resumed.state[q]["exp_avg_sq"])
        assert resumed.state[q]["step"].item() == 8


@pytest.mark.parametrize("step", [torch.tensor(5.0, dtype=torch.float64), torch.tensor([5.0]), 5.0, 5],
                         ids=["float64", "shape-1", "python-float", "python-int"])
def test_load_state_dict_normalises_step(step):
    params, opt, gen = _trained()
    sd = opt.state_dict()
    for s in sd["state"].values():
        s["step"] = step
    twins = [torch.nn.Parameter(p.detach().clone()) for p in params]
    resumed = AdamATan2(twins)
    resumed.load_state_dict(sd)
    for q in twins:
        s = resumed.state[q]["step"]
        assert s.device.type == "cpu" and s.dtype == torch.float32 and s.shape == () and s.item() == 5
    set_grads(twins, gen)
    resumed.step()
    assert resumed.state[twins[0]]["step"].item() == 6


@pytest.mark.gpu  # the CPU side of step handling: test_load_state_dict_normalises_step
def test_cpu_saved_state_loads_onto_cuda_params():
    params, opt, gen = _trained()
    buf = io.BytesIO()
    torch.save(opt.state_dict(), buf)
    buf.seek(0)
    cuda_params = [torch.nn.Parameter(p.detach().cuda()) for p in params]
    resumed = AdamATan2(cuda_params)
    resumed.load_state_dict(torch.load(buf, map_location="cpu", weights_only=True))
    set_grads(params, gen)
    for p, q in zip(params, cuda_params):
        q.grad = p.grad.cuda()
    opt.step()
    resumed.step()
    for p, q in zip(params, cuda_params):
        assert resumed.state[q]["exp_avg"].is_cuda and resumed.state[q]["step"].device.type == "cpu"
        assert (p - q.cpu()).abs().max() <= 1e-6


def test_polynomial_atan2_accuracy_and_special_values():
    gen = torch.Generator().manual_seed(6)
    n = 1 << 20
    y = torch.randn(n, generator=gen) * torch.exp(torch.randn(n, generator=gen) * 8)
    x = torch.rand(n, generator=gen) * torch.exp(torch.randn(n, generator=gen) * 8)
    err = (ou.atan2_nonneg_x(y, x).double() - torch.atan2(y.double(), x.double())).abs().max().item()
    assert err <= 2.5e-7, f"max abs error {err:.3g} rad"
    ys = torch.tensor([0.0, -0.0, 1.0, -1.0, 0.0, 1e-30, float("inf"), float("nan"), 2.0])
    xs = torch.tensor([0.0, 0.0, 0.0, 0.0, 3.0, 1e30, 1.0, 1.0, float("nan")])
    got, want = ou.atan2_nonneg_x(ys, xs), torch.atan2(ys, xs)
    assert torch.allclose(got, want, atol=2.5e-7, equal_nan=True), (got, want)
    assert torch.equal(torch.signbit(got[:2]), torch.signbit(want[:2]))


@pytest.mark.slow
def test_compiled_update_matches_reference_without_recompiling(caplog, scalar_cpu_kernels):
    """fp32 (polynomial atan2), bf16 (fp32 math, rounded store) and fp64 (library atan2), lr changing each step."""
    from torch._dynamo.utils import counters

    gen = torch.Generator().manual_seed(7)
    dtypes = (torch.float32, torch.bfloat16, torch.float64)
    params = [torch.nn.Parameter((torch.randn(s, generator=gen) * 0.02).to(dt))
              for s, dt in zip([(40, 30), (50,), (30,)], dtypes)]
    opt = AdamATan2(params, lr=0.0, betas=BETAS, weight_decay=WD, compile=True)
    ref = [(p.detach().clone(), torch.zeros_like(p), torch.zeros_like(p)) for p in params]
    with caplog.at_level(logging.INFO, logger=ou.__name__):
        for t in range(1, 13):
            lr = 1e-3 * (0.5 + 0.5 * math.cos(t))
            set_grads(params, gen)
            opt.param_groups[0]["lr"] = lr
            ref = [reference_step(*r[:1], p.grad, *r[1:], t, lr, BETAS, WD) for r, p in zip(ref, params)]
            opt.step()
            if t == 1:
                graphs = counters["stats"]["unique_graphs"]
    assert opt.use_compile, "compilation failed; see the RuntimeWarning"
    assert counters["stats"]["unique_graphs"] == graphs, "a changing lr or step count recompiled the update"
    assert sum("compiled in" in r.getMessage() for r in caplog.records) == 3
    for p, (rp, rm, rv) in zip(params, ref):
        for ours, want in ((p.detach(), rp), (opt.state[p]["exp_avg"], rm), (opt.state[p]["exp_avg_sq"], rv)):
            assert (ours.double() - want.double()).abs().max().item() <= TOL[p.dtype], p.dtype


def test_failed_compile_warns_once_and_falls_back(monkeypatch):
    def broken_compile():
        def run(*args):
            raise RuntimeError("inductor: no working C++ compiler")
        return run

    monkeypatch.setattr(ou, "_compiled_kernel", broken_compile)
    gen = torch.Generator().manual_seed(8)
    params = make_params(torch.float32, gen)
    opt = AdamATan2(params, lr=1e-3, betas=BETAS, weight_decay=WD, compile=True)
    with pytest.warns(RuntimeWarning, match="torch.compile failed .*no working C\\+\\+ compiler") as record:
        run_against_reference(opt, params, gen, [1e-3] * 5, TOL[torch.float32])
    assert len(record) == 1 and not opt.use_compile


def test_factory_compile_policy(monkeypatch):
    cpu, cuda = {torch.device("cpu")}, {torch.device("cuda", 0)}
    assert ou._compile_choice(cpu, None)[0] is False
    assert ou._compile_choice(cpu, False)[0] is False
    assert ou._compile_choice(cpu, True)[0] is ou.compile_support(torch.device("cpu"))[0]
    monkeypatch.setattr(ou, "compile_support", lambda d: (True, "Triton available"))
    assert ou._compile_choice(cuda, None) == (True, "compiled single-pass update (automatic on CUDA)")
    monkeypatch.setattr(ou, "compile_support", lambda d: (False, "DISABLE_COMPILE is set"))
    assert ou._compile_choice(cuda, True) == (False, "compile off on cuda:0: DISABLE_COMPILE is set")
    monkeypatch.undo()
    monkeypatch.setenv("DISABLE_COMPILE", "1")
    assert ou.compile_support(torch.device("cpu")) == (False, "DISABLE_COMPILE is set")
    opt = ou.get_adam_atan2_optimizer(torch.nn.Linear(2, 2).parameters(), backend="torch", compile=True)
    assert type(opt) is AdamATan2 and not opt.use_compile


def test_factory_takes_generators_and_param_groups():
    model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Linear(4, 1))
    groups = [{"params": model[0].parameters(), "weight_decay": 0.0}, {"params": model[1].parameters()}]
    opt = ou.get_adam_atan2_optimizer(groups, lr=1e-3, backend="torch")
    assert [len(g["params"]) for g in opt.param_groups] == [2, 2]
    assert [g["weight_decay"] for g in opt.param_groups] == [0.0, 1e-2]
    with pytest.raises(TypeError, match="iterable of tensors"):
        ou.get_adam_atan2_optimizer(torch.nn.Parameter(torch.zeros(2)))


def test_report_cli(capsys):
    assert ou.main(["--device", "cpu"]) == 0
    out = capsys.readouterr().out
    assert "selected:" in out and "native" in out and "device:    cpu" in out


def test_benchmark_table_on_small_tensors(capsys):
    """scripts/benchmark_optimizers.py: every optimizer steps, and the table has one row each with its ratios."""
    from argparse import Namespace

    from scripts import benchmark_optimizers as bench

    runs = bench.bench_set("tiny", [(64, 32), (32,)], torch.device("cpu"),
                           Namespace(steps=2, warmup=1, no_compile=True))
    table = capsys.readouterr().out
    labels = [r["label"] for r in runs]
    assert labels[:3] == ["AdamATan2 ours, eager", "AdamW foreach", "AdamW fused"]
    assert all(len(r["times"]) == 2 for r in runs)
    assert "| AdamW fused |" in table and "| 1.00x |" in table
    assert table.count("\n| ") == len(runs) + 1  # the header and one row per optimizer
