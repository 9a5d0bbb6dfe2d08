"""Checks that the right AdamATan2 backend is chosen, for the right reason, on every kind of machine.

Runs standalone (``python test_optimizer_fallback.py``: prints PASS/FAIL per check and exits
non-zero on any failure) and under pytest (pytest.ini lists this file). Machines this one is
not are simulated: fake ``adam_atan2`` packages in ``sys.modules`` (working, not installed, or
installed without its compiled backend, the way pip's build isolation leaves it) and a patched
``torch.cuda.get_device_capability``. ``reference_step`` is the independent re-computation that
tests/test_optimizer.py also uses.
"""

from __future__ import annotations

import contextlib
import logging
import math
import sys
import tempfile
import traceback
import types
from pathlib import Path

import torch

import utils.optimizer_utils as ou

CUDA0 = torch.device("cuda", 0)


def reference_step(p: torch.Tensor, g: torch.Tensor, m: torch.Tensor, v: torch.Tensor, t: int,
                   lr: float, betas: tuple[float, float], weight_decay: float):
    """One AdamATan2 step by the formula of docs/REFERENCE.md, AdamATan2, the native package's test protocol.

    The math runs in fp32 (fp64 for fp64 tensors); the new ``p, m, v`` are returned rounded to
    ``p``'s dtype. ``t`` is the 1-based step count.
    """
    dtype = p.dtype
    md = torch.float64 if dtype == torch.float64 else torch.float32
    p, g, m, v = (x.to(md) for x in (p, g, m, v))
    beta1, beta2 = betas
    p = p * (1 - lr * weight_decay)
    m = m + (1 - beta1) * (g - m)
    v = v + (1 - beta2) * (g * g - v)
    p = p - lr / (1 - beta1 ** t) * torch.atan2(m, v.sqrt() / math.sqrt(1 - beta2 ** t))
    return p.to(dtype), m.to(dtype), v.to(dtype)


class _FakeNativeAdamATan2:
    """Stands in for ``adam_atan2.AdamATan2``: records how it was built."""

    def __init__(self, params, lr, betas, weight_decay):
        self.params, self.lr, self.betas, self.weight_decay = list(params), lr, betas, weight_decay


@contextlib.contextmanager
def native_package(state: str):
    """Make ``adam_atan2`` importable as ``"working"``, ``"missing"`` or ``"no-backend"`` inside the block."""
    names = ("adam_atan2", "adam_atan2_backend")
    saved = {n: sys.modules.pop(n) for n in names if n in sys.modules}
    tmp = tempfile.TemporaryDirectory()
    try:
        if state == "working":
            sys.modules["adam_atan2"] = types.SimpleNamespace(AdamATan2=_FakeNativeAdamATan2)
            sys.modules["adam_atan2_backend"] = types.ModuleType("adam_atan2_backend")
        elif state == "missing":
            sys.modules["adam_atan2"] = None  # makes `import adam_atan2` raise ModuleNotFoundError
        elif state == "no-backend":  # the real package's first line is `import adam_atan2_backend`
            pkg = Path(tmp.name) / "adam_atan2"
            pkg.mkdir()
            (pkg / "__init__.py").write_text("import adam_atan2_backend\n")
            sys.path.insert(0, tmp.name)
            sys.modules["adam_atan2_backend"] = None
        else:
            raise ValueError(f"state={state!r}: use working, missing or no-backend")
        yield
    finally:
        if tmp.name in sys.path:
            sys.path.remove(tmp.name)
        for n in names:
            sys.modules.pop(n, None)
        sys.modules.update(saved)
        tmp.cleanup()


@contextlib.contextmanager
def gpu_capability(cap: tuple[int, int]):
    """Pretend every CUDA device has compute capability ``cap``."""
    saved = torch.cuda.get_device_capability
    torch.cuda.get_device_capability = lambda device=None: cap
    try:
        yield
    finally:
        torch.cuda.get_device_capability = saved


@contextlib.contextmanager
def captured_log():
    """Collect the optimizer module's log records (INFO and up) in a list."""
    records: list[logging.LogRecord] = []
    handler = logging.Handler(logging.INFO)
    handler.emit = records.append
    logger = logging.getLogger(ou.__name__)
    old_level = logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    try:
        yield records
    finally:
        logger.removeHandler(handler)
        logger.setLevel(old_level)


def _cuda_params(n: int = 2):
    """Objects that look like CUDA parameters to the selection logic (this machine may have no GPU)."""
    return [types.SimpleNamespace(device=CUDA0) for _ in range(n)]


def _expect_error(exc_type, fragment: str, fn, *args, **kwargs) -> str:
    try:
        fn(*args, **kwargs)
    except exc_type as e:
        assert fragment in str(e), f"{exc_type.__name__} message {str(e)!r} lacks {fragment!r}"
        return str(e)
    raise AssertionError(f"expected {exc_type.__name__} containing {fragment!r}")


def test_auto_without_package_uses_pure_torch():
    with native_package("missing"), captured_log() as records:
        opt = ou.get_adam_atan2_optimizer([torch.nn.Parameter(torch.zeros(3))], lr=1e-3)
    assert type(opt) is ou.AdamATan2, type(opt)
    messages = [r.getMessage() for r in records if r.levelno == logging.INFO]
    assert any("utils.optimizer_utils.AdamATan2" in m and "not installed" in m for m in messages), messages


def test_auto_with_backendless_install_uses_pure_torch():
    with native_package("no-backend"):
        name, reason = ou.select_backend({CUDA0}, "auto")
    assert name == "torch" and "adam_atan2_backend" in reason, (name, reason)


def test_auto_picks_native_on_supported_gpus():
    for cap in ((8, 0), (8, 6), (8, 9), (9, 0)):
        with native_package("working"), gpu_capability(cap), captured_log() as records:
            params = _cuda_params()
            opt = ou.get_adam_atan2_optimizer(params, lr=0.0, betas=(0.9, 0.95), weight_decay=0.1)
        assert isinstance(opt, _FakeNativeAdamATan2), (cap, type(opt))
        assert (opt.params, opt.lr, opt.betas, opt.weight_decay) == (params, 0.0, (0.9, 0.95), 0.1)
        assert any("native" in r.getMessage() for r in records)


def test_auto_skips_native_on_unsupported_gpus_and_non_cuda():
    cases = [({CUDA0}, (7, 5), "sm_75"), ({CUDA0}, (10, 0), "sm_100"), ({CUDA0}, (12, 0), "sm_120"),
             ({torch.device("cpu")}, (8, 0), "cpu"), ({torch.device("mps")}, (8, 0), "mps"),
             ({CUDA0, torch.device("cpu")}, (8, 0), "cpu")]
    for devices, cap, fragment in cases:
        with native_package("working"), gpu_capability(cap):
            name, reason = ou.select_backend(devices, "auto")
        assert name == "torch" and fragment in reason, (devices, cap, name, reason)


def test_native_request_fails_loudly_with_the_reason():
    cases = [("missing", {CUDA0}, (8, 0), "not installed"),
             ("no-backend", {CUDA0}, (8, 0), "adam_atan2_backend"),
             ("working", {torch.device("cpu")}, (8, 0), "CUDA only"),
             ("working", {CUDA0}, (7, 0), "sm_70")]
    for state, devices, cap, fragment in cases:
        with native_package(state), gpu_capability(cap):
            msg = _expect_error(RuntimeError, fragment, ou.select_backend, devices, "native")
        assert "backend='auto' or 'torch'" in msg, msg
    with native_package("missing"):
        _expect_error(RuntimeError, "not installed", ou.get_adam_atan2_optimizer,
                      [torch.nn.Parameter(torch.zeros(2))], backend="native")


def test_explicit_torch_and_adamw():
    with native_package("working"), gpu_capability((8, 0)):
        assert ou.select_backend({CUDA0}, "torch")[0] == "torch"
        assert ou.select_backend({CUDA0}, "auto")[0] == "native"
    p = torch.nn.Parameter(torch.zeros(2))
    opt = ou.get_adam_atan2_optimizer([p], lr=1e-3, betas=(0.9, 0.95), weight_decay=0.1, backend="adamw")
    assert type(opt) is torch.optim.AdamW and opt.defaults["betas"] == (0.9, 0.95)
    assert type(ou.get_adam_atan2_optimizer([p], backend="torch")) is ou.AdamATan2
    _expect_error(ValueError, "not one of auto, native, torch, adamw", ou.select_backend, {CUDA0}, "cuda")


def test_fallback_alias_is_the_exact_algorithm():
    assert ou.AdamATan2Fallback is ou.AdamATan2
    # Three steps of the seeds' name against the AdamATan2 formula, and against what AdamW would do instead.
    gen = torch.Generator().manual_seed(3)
    start, grads = torch.randn(64, generator=gen), [torch.randn(64, generator=gen) * 1e-3 for _ in range(3)]
    fallback, adamw = torch.nn.Parameter(start.clone()), torch.nn.Parameter(start.clone())
    opts = [ou.AdamATan2Fallback([fallback], lr=1e-3, betas=(0.9, 0.95), weight_decay=0.1),
            torch.optim.AdamW([adamw], lr=1e-3, betas=(0.9, 0.95), weight_decay=0.1)]
    p, m, v = start.clone(), torch.zeros(64), torch.zeros(64)
    for t, g in enumerate(grads, 1):
        for param, opt in zip((fallback, adamw), opts):
            param.grad = g.clone()
            opt.step()
        p, m, v = reference_step(p, g, m, v, t, 1e-3, (0.9, 0.95), 0.1)
    assert (fallback.detach() - p).abs().max() <= 1e-6  # the native package's fp32 tolerance
    assert (adamw.detach() - p).abs().max() > 1e-5  # AdamW's epsilon division is another rule


def test_optimizer_info_explains_the_choice():
    with native_package("missing"):
        info = ou.get_optimizer_info("cpu")
    assert info["device"] == "cpu" and info["selected"] in ("torch", "torch-compiled"), info
    assert info["backends"]["native"]["available"] is False and "not installed" in info["reason"], info
    assert info["backends"]["torch"]["available"] is True
    with native_package("working"):
        info = ou.get_optimizer_info("cpu")
    assert info["backends"]["native"]["available"] is False and "CUDA only" in info["reason"], info
    report = ou.format_optimizer_info(info)
    assert "selected:" in report and "CUDA only" in report, report


def test_selected_pure_torch_backend_matches_reference():
    gen = torch.Generator().manual_seed(0)
    p = torch.nn.Parameter(torch.randn(64, 33, generator=gen) * 0.02)
    with native_package("missing"):
        opt = ou.get_adam_atan2_optimizer([p], lr=1e-3, betas=(0.9, 0.95), weight_decay=0.1)
    ref = (p.detach().clone(), torch.zeros_like(p), torch.zeros_like(p))
    for t in range(1, 21):
        p.grad = torch.randn(p.shape, generator=gen) * 1e-3
        ref = reference_step(ref[0], p.grad, ref[1], ref[2], t, 1e-3, (0.9, 0.95), 0.1)
        opt.step()
    err = (p.detach() - ref[0]).abs().max().item()
    assert err <= 1e-6, f"max |p - reference| = {err:.3g} > 1e-6"


def main() -> int:
    checks = [(name, fn) for name, fn in globals().items() if name.startswith("test_") and callable(fn)]
    failed = 0
    for name, fn in checks:
        try:
            fn()
            print(f"PASS  {name}")
        except Exception:
            failed += 1
            print(f"FAIL  {name}\n" + "".join("      " + line for line in traceback.format_exc().splitlines(True)))
    print(f"\nfallback: {len(checks) - failed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
