"""AdamATan2 in pure PyTorch, and the choice between it and the native CUDA kernel.

AdamATan2 (Everett et al., "Scaling Exponents Across Parameterizations and Optimizers",
arXiv 2407.05872) is Adam with the epsilon division replaced by ``atan2``. This module follows
the CUDA package ``adam-atan2`` 0.0.3 that HRM imports (docs/REFERENCE.md, AdamATan2). Per step
``t = 1, 2, ...``, for each parameter ``p`` with gradient ``g``::

    p <- p * (1 - lr * weight_decay)                           # decoupled decay, first
    m <- m + (1 - beta1) * (g   - m)                           # lerp
    v <- v + (1 - beta2) * (g*g - v)                           # lerp
    p <- p - lr / (1 - beta1^t) * atan2(m, sqrt(v) / sqrt(1 - beta2^t))

There is no epsilon and no scale constant (a = b = 1): ``atan2`` is bounded by pi/2 and
defined at ``v = 0``, so an update is never larger than ``lr * pi/2 / (1 - beta1^t)``.

Two execution paths, same math:

* eager (default): on GPUs and MPS, ``torch._foreach_*`` ops over the tensors of one
  device/dtype. On the CPU each tensor is cut into cache-sized flat pieces, and the one
  temporary (``g*g``, then the denominator, then the angle) lives in a buffer the optimizer
  keeps, so it never leaves the cache and no step allocates; only the state itself streams
  through memory. Two cheaper rewrites of the same math (rsqrt for sqrt, decay fused into the
  update) are described in ``_cpu_update``. Its floor is ``torch.atan2`` itself (see the
  README's benchmark).
* ``compile=True``: one ``torch.compile``'d function updates every tensor in a single pass.
  The learning rate and bias corrections enter as a tensor, so a per-step lr never recompiles.
  In fp32 it evaluates atan2 with a polynomial (within 2.5e-7 rad of the exact angle, about
  2 ulp; ``torch.atan2`` is within 6e-8 and CUDA's ``atan2f`` within a few ulp) because the
  library ``atan2`` alone costs more than a whole AdamW step on CPU. A compile failure warns
  once and falls back to the eager path.

fp16/bf16 parameters keep their state in their own dtype but the math runs in fp32 and is
rounded on store; fp64 runs in fp64. ``python -m utils.optimizer_utils`` prints which backend
this machine will use and why.
"""

from __future__ import annotations

import importlib
import logging
import math
import platform
import sys
import time
import warnings
from collections import defaultdict
from collections.abc import Callable, Iterable
from functools import cache

import torch
from torch import Tensor

from utils.cli import ArgumentParser
from utils.device import DeviceError, compile_support, describe, is_apple_silicon, select_device

log = logging.getLogger(__name__)

BACKENDS = ("auto", "native", "torch", "adamw")
NATIVE_ARCH = ((8, 0), (9, 0))  # compute capabilities adam-atan2 0.0.3 builds kernels for
NATIVE_INSTALL = "pip install --no-build-isolation adam-atan2==0.0.3 (needs nvcc and CUDA_HOME)"

# Elements per CPU piece: p, g, m, v and the temporary, 2 MiB each in fp32, stay in a typical L3;
# smaller pieces mean more ops per step, each its own OpenMP region (measured: 2^18..2^20 tie).
CPU_CHUNK_NUMEL = 1 << 19

_LOW_PRECISION = (torch.float16, torch.bfloat16)
_UNSUPPORTED_HINTS = {
    "eps": "AdamATan2 has no epsilon: atan2 replaces the division",
    "amsgrad": "not part of AdamATan2",
    "maximize": "not supported: minimise the negated loss instead",
    "capturable": "not supported: the step count lives on the CPU, so a step cannot be captured in a CUDA graph",
    "fused": "not supported: use compile=True, or backend='native' on CUDA",
    "foreach": "not needed: the eager path is always multi-tensor (foreach)",
    "differentiable": "not supported",
}


def _check_hparams(lr, betas, weight_decay, where: str) -> tuple[float, float, float, float]:
    """Validate one param group's hyperparameters; return ``lr, beta1, beta2, weight_decay`` as floats."""
    try:
        lr, weight_decay = float(lr), float(weight_decay)
        beta1, beta2 = (float(b) for b in betas)
    except (TypeError, ValueError):
        raise ValueError(f"AdamATan2 {where}: lr={lr!r}, betas={betas!r}, weight_decay={weight_decay!r} must be "
                         "a number, a pair of numbers and a number") from None
    if not lr >= 0.0:
        raise ValueError(f"AdamATan2 {where}: lr={lr} must be >= 0 (0 is fine when a schedule sets it every step)")
    for i, beta in enumerate((beta1, beta2)):
        if not 0.0 <= beta < 1.0:
            raise ValueError(f"AdamATan2 {where}: betas[{i}]={beta} must be in [0, 1), e.g. betas=(0.9, 0.95)")
    if not weight_decay >= 0.0:
        raise ValueError(f"AdamATan2 {where}: weight_decay={weight_decay} must be >= 0")
    return lr, beta1, beta2, weight_decay


class AdamATan2(torch.optim.Optimizer):
    """AdamATan2 (arXiv 2407.05872), a drop-in for the native ``adam_atan2.AdamATan2``.

    The update is the one in the module docstring. Param-group keys (``lr``, ``betas``,
    ``weight_decay``) and per-parameter state (``step``: 0-dim float32 tensor; ``exp_avg``,
    ``exp_avg_sq``: like the parameter, in its dtype) match the native package, so state dicts
    load either way. ``step`` is kept on the CPU: the bias corrections are computed on the host
    and no step ever waits on the GPU.

    Args:
        params: parameters or param-group dicts, as for any ``torch.optim`` optimizer.
        lr: learning rate, >= 0. HRM constructs with 0 and writes ``param_group["lr"]`` each step.
        betas: ``(beta1, beta2)``, each in [0, 1).
        weight_decay: decoupled decay rate, >= 0; the per-step factor is ``1 - lr * weight_decay``.
        compile: run the ``torch.compile``'d single-pass update (see module docstring). Each
            distinct parameter set (shapes, dtype, device) compiles once; past torch.compile's
            recompile limit (8 per process) the optimizer warns and stays on the eager path.

    Raises:
        ValueError: a hyperparameter is out of range (checked again at every step, since
            schedules write them).
        TypeError: an AdamW/Adam-only option (``eps``, ``maximize``, ``fused``, ...) was passed.
        RuntimeError (from ``step``): a gradient is sparse or a parameter is complex.
    """

    def __init__(self, params, lr: float = 1e-3, betas: tuple[float, float] = (0.9, 0.999),
                 weight_decay: float = 1e-2, compile: bool = False, **unsupported):
        if unsupported:
            hints = "; ".join(f"{k}: {_UNSUPPORTED_HINTS.get(k, 'unknown option')}" for k in sorted(unsupported))
            raise TypeError(f"AdamATan2 takes params, lr, betas, weight_decay and compile only ({hints})")
        _check_hparams(lr, betas, weight_decay, "constructor")
        super().__init__(params, dict(lr=lr, betas=betas, weight_decay=weight_decay))
        self.use_compile = bool(compile)
        self._compiled_signatures: set = set()
        self._scratch: dict[torch.dtype, Tensor] = {}  # CPU temporaries, reused every step

    @torch.no_grad()
    def step(self, closure: Callable[[], Tensor] | None = None):
        """One update of every parameter that has a gradient (``None`` gradients are skipped).

        Args:
            closure: optional; re-evaluates the model with grad enabled and returns the loss.

        Returns:
            The closure's loss, or None.
        """
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for gi, group in enumerate(self.param_groups):
            lr, beta1, beta2, wd = _check_hparams(group["lr"], group["betas"], group["weight_decay"],
                                                  f"param_groups[{gi}]")
            for (device, dtype, t), tensors in self._bucket(group, gi).items():
                coef = (1.0 - lr * wd, 1.0 - beta1, 1.0 - beta2, lr / (1.0 - beta1 ** t), math.sqrt(1.0 - beta2 ** t))
                if not (self.use_compile and self._compiled_update(tensors, coef, device, dtype)):
                    _eager_update(tensors, coef, device, self._scratch)
        return loss

    def _bucket(self, group: dict, gi: int) -> dict[tuple, tuple[list[Tensor], ...]]:
        """Advance ``step`` of every param with a grad; bucket ``(params, grads, m, v)`` by (device, dtype, step)."""
        with_grad = [(pi, p) for pi, p in enumerate(group["params"]) if p.grad is not None]
        for pi, p in with_grad:  # all checks before any state changes
            if p.grad.is_sparse:
                raise RuntimeError(f"AdamATan2: param_groups[{gi}]['params'][{pi}] has a sparse gradient, which is "
                                   "not supported; use a dense embedding (sparse=False) or torch.optim.SparseAdam")
            if p.is_complex():
                raise RuntimeError(f"AdamATan2: param_groups[{gi}]['params'][{pi}] is complex ({p.dtype}); "
                                   "atan2 needs real tensors: optimise torch.view_as_real(p) instead")
        buckets: dict[tuple, tuple[list[Tensor], ...]] = defaultdict(lambda: ([], [], [], []))
        for _, p in with_grad:
            state = self.state[p]
            if not state:
                state["step"] = torch.zeros((), dtype=torch.float32)
                state["exp_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                state["exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)
            step = _host_step(state)
            step += 1
            bucket = buckets[(p.device, p.dtype, step.item())]
            for lst, t in zip(bucket, (p, p.grad, state["exp_avg"], state["exp_avg_sq"])):
                lst.append(t)
        return buckets

    def _compiled_update(self, tensors, coef, device: torch.device, dtype: torch.dtype) -> bool:
        """Run the compiled update; on a compile failure warn once, switch to eager and return False."""
        math_dtype = _math_dtype(dtype)
        signature = (device, dtype, tuple(p.shape for p in tensors[0]))
        first = signature not in self._compiled_signatures
        if first:
            log.info("AdamATan2: compiling the update for %d %s tensors on %s (%.1fM elements); "
                     "this takes a while once", len(tensors[0]), str(dtype).removeprefix("torch."), device,
                     sum(p.numel() for p in tensors[0]) / 1e6)
            start = time.perf_counter()
        try:
            decay, w1, w2, step_size, bc2_sqrt = coef
            coef_t = torch.tensor((decay, w1, w2, step_size, 1.0 / bc2_sqrt), dtype=math_dtype, device=device)
            _compiled_kernel()(*tensors, coef_t)
        except Exception as e:  # compilation errors surface here, before any tensor is written
            self.use_compile = False
            first_line = (str(e).strip().splitlines() or [""])[0][:200]
            warnings.warn(f"AdamATan2: torch.compile failed ({type(e).__name__}: {first_line}); "
                          "using the eager foreach path from now on", RuntimeWarning, stacklevel=2)
            return False
        if first:
            self._compiled_signatures.add(signature)
            log.info("AdamATan2: compiled in %.1f s", time.perf_counter() - start)
        return True

    def load_state_dict(self, state_dict: dict) -> None:
        """Load a state dict from this class or the native ``adam_atan2.AdamATan2``.

        ``exp_avg``/``exp_avg_sq`` follow their parameter's device and dtype (torch's rule);
        ``step`` becomes a private 0-dim float32 CPU tensor wherever it was saved or mapped (torch
        would keep the caller's tensor, and stepping would then write into the caller's dict).
        """
        super().load_state_dict(state_dict)
        for state in self.state.values():
            if "step" in state:
                _host_step(state, copy=True)


AdamATan2Fallback = AdamATan2  # the name the seed code imports; it is the exact algorithm, not AdamW


def _math_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype the update computes in: fp64 for fp64 parameters, fp32 for every other dtype."""
    return torch.float64 if dtype == torch.float64 else torch.float32


def _host_step(state: dict, copy: bool = False) -> Tensor:
    """``state["step"]`` as a 0-dim float32 CPU tensor, replaced by one if it is not (or if ``copy``)."""
    step = state["step"]
    if copy or not (isinstance(step, Tensor) and step.device.type == "cpu" and step.dtype == torch.float32
                    and step.dim() == 0):
        step = state["step"] = torch.tensor(float(step), dtype=torch.float32)
    return step


def _eager_update(tensors: tuple[list[Tensor], ...], coef: tuple[float, ...], device: torch.device,
                  scratch: dict[torch.dtype, Tensor]) -> None:
    """Eager update of one bucket: foreach ops on accelerators, cache-sized pieces on the CPU."""
    if device.type == "cpu":
        _cpu_update(tensors, coef, scratch)
    else:
        _foreach_update(*tensors, *coef)


def _cpu_update(tensors: tuple[list[Tensor], ...], coef: tuple[float, ...], scratch: dict[torch.dtype, Tensor]) -> None:
    """The AdamATan2 update on the CPU, one flat piece of at most ``CPU_CHUNK_NUMEL`` elements at a time.

    ``coef`` as in :func:`_foreach_update`. A piece's p, g, m, v and its one temporary (``g*g``, then
    the denominator, then the angle) stay in cache across its seven ops, so only the state streams
    through memory; the temporary lives in ``scratch`` (math dtype -> flat buffer, grown on demand and
    kept by the optimizer), so fp32/fp64 steps allocate no piece-sized tensor. Two rewrites, each
    measured on this project's AVX512 CPU and within 2 ulp of the plain formula:

    * ``sqrt(v) / bc2_sqrt`` as ``(1 / bc2_sqrt) / rsqrt(v)``: ATen's CPU rsqrt costs about 60% of its
      sqrt, and ``1 / rsqrt(0) = 1 / inf = 0`` keeps ``v = 0`` exact (``v * rsqrt(v)`` would be NaN);
    * decay and update in one pass, ``p <- decay * p - step_size * angle``, as ``addr_`` with the
      outer product ``angle x [1]`` (torch has no scaled add that also scales its input).
    """
    decay, w1, w2, step_size, bc2_sqrt = coef
    math_dtype = _math_dtype(tensors[0][0].dtype)
    low = tensors[0][0].dtype in _LOW_PRECISION
    inv_bc2_sqrt = torch.tensor(1.0 / bc2_sqrt, dtype=math_dtype)
    one = torch.ones(1, dtype=math_dtype)
    buffer = scratch.get(math_dtype)
    for members in zip(*tensors):
        for piece in _cpu_pieces(members, CPU_CHUNK_NUMEL):
            p, g, m, v = (t.float() for t in piece) if low else piece
            if buffer is None or buffer.numel() < g.numel():
                buffer = scratch[math_dtype] = torch.empty(max(g.numel(), CPU_CHUNK_NUMEL), dtype=math_dtype)
            tmp = buffer[:g.numel()].view(g.shape)
            m.lerp_(g, w1)
            torch.mul(g, g, out=tmp)
            v.lerp_(tmp, w2)
            torch.rsqrt(v, out=tmp)
            torch.div(inv_bc2_sqrt, tmp, out=tmp)
            torch.atan2(m, tmp, out=tmp)
            if p.dim() == 1 and decay != 0.0:  # addr ignores its input at beta = 0, even NaN
                p.unsqueeze(1).addr_(tmp, one, beta=decay, alpha=-step_size)
            else:
                p.mul_(decay).add_(tmp, alpha=-step_size)
            if low:  # round on store
                for dst, src in ((piece[0], p), (piece[2], m), (piece[3], v)):
                    dst.copy_(src)


def _cpu_pieces(members: tuple[Tensor, ...], chunk: int):
    """Yield ``(p, g, m, v)`` as flat views of at most ``chunk`` elements, in near-equal pieces.

    A tensor whose four members are not all contiguous goes whole, in its own shape.
    """
    if not all(t.is_contiguous() for t in members):
        yield members
        return
    flat = [t.view(-1) for t in members]
    n = flat[0].numel()
    pieces = max(1, -(-n // chunk))
    size = -(-n // pieces)
    for start in range(0, n, size):
        yield tuple(t[start:start + size] for t in flat)


def _foreach_update(params: list[Tensor], grads: list[Tensor], exp_avgs: list[Tensor], exp_avg_sqs: list[Tensor],
                    decay: float, w1: float, w2: float, step_size: float, bc2_sqrt: float) -> None:
    """The AdamATan2 update of same-device, same-dtype tensors with ``torch._foreach_*`` ops (GPU, MPS).

    ``decay = 1 - lr*wd``, ``w1 = 1 - beta1``, ``w2 = 1 - beta2``, ``step_size = lr / (1 - beta1^t)``,
    ``bc2_sqrt = sqrt(1 - beta2^t)``. fp16/bf16 run on fp32 copies that are rounded back at the end.
    Each foreach op is one launch; its temporaries are allocated.
    """
    low = params[0].dtype in _LOW_PRECISION
    p, g, m, v = ([t.float() for t in ts] for ts in (params, grads, exp_avgs, exp_avg_sqs)) if low else \
        (params, grads, exp_avgs, exp_avg_sqs)
    torch._foreach_lerp_(m, g, w1)
    torch._foreach_lerp_(v, torch._foreach_mul(g, g), w2)
    tmp = torch._foreach_sqrt(v)
    if bc2_sqrt != 1.0:  # exactly 1 once beta2^t underflows the mantissa (t > ~700 for beta2 = 0.95)
        torch._foreach_div_(tmp, bc2_sqrt)
    for mi, ti in zip(m, tmp):  # torch has no _foreach_atan2
        torch.atan2(mi, ti, out=ti)
    if decay != 1.0:  # lr * weight_decay == 0, e.g. the lr=0 first step of a warmup
        torch._foreach_mul_(p, decay)
    torch._foreach_add_(p, tmp, alpha=-step_size)
    if low:
        for dst, src in ((params, p), (exp_avgs, m), (exp_avg_sqs, v)):
            torch._foreach_copy_(dst, src)


# atan(x)/x ~= sum_k C[k] * x^(2k) on [0, 1]: a least-squares fit of the relative error, reweighted
# towards min-max (Lawson). Evaluated in fp32 its error is <= 1.6e-7 relative (1.3 ulp).
_ATAN_COEFFS = (0.9999999847659492, -0.3333307334501254, 0.19992619380601656, -0.14203644340394844,
                0.10640933440148766, -0.07504293156227794, 0.04269150170959449, -0.016068617539239063,
                0.0028498866346076124)


def atan2_nonneg_x(y: Tensor, x: Tensor) -> Tensor:
    """``atan2(y, x)`` for ``x >= 0`` (any shape, fp32) from a polynomial; a compiled kernel fuses it.

    Reduces to ``r = min(|y|, x) / max(|y|, x)`` in [0, 1], evaluates ``atan(r)`` by the
    polynomial above, reflects with ``pi/2 - atan(r)`` when ``|y| > x``, and takes ``y``'s sign.
    ``atan2(0, 0) = 0`` and ``atan2(y, 0) = +-pi/2`` as in ``torch.atan2``; NaN propagates.
    Max error vs float64 ``atan2``: 2.5e-7 rad (``torch.atan2`` in fp32: 6e-8).
    """
    ay = y.abs()
    hi = torch.maximum(ay, x)
    r = torch.where(hi == 0, 0.0, torch.minimum(ay, x) / hi)
    r2 = r * r
    poly = torch.full_like(r, _ATAN_COEFFS[-1])
    for c in reversed(_ATAN_COEFFS[:-1]):
        poly = poly * r2 + c
    angle = r * poly
    return torch.copysign(torch.where(ay > x, math.pi / 2 - angle, angle), y)


def _fused_update(params: list[Tensor], grads: list[Tensor], exp_avgs: list[Tensor], exp_avg_sqs: list[Tensor],
                  coef: Tensor) -> None:
    """Single-pass update, elementwise for ``torch.compile``; ``coef`` = [decay, w1, w2, step_size, 1/bc2_sqrt].

    The reciprocal turns a division per element into a multiplication (<= 1 ulp apart).
    """
    decay, w1, w2, step_size, inv_bc2_sqrt = coef.unbind()
    atan2 = torch.atan2 if coef.dtype == torch.float64 else atan2_nonneg_x
    for p, g, m, v in zip(params, grads, exp_avgs, exp_avg_sqs):
        g32 = g.to(coef.dtype)
        m_new = m.to(coef.dtype) + w1 * (g32 - m.to(coef.dtype))
        v_new = v.to(coef.dtype) + w2 * (g32 * g32 - v.to(coef.dtype))
        p_new = p.to(coef.dtype) * decay - step_size * atan2(m_new, v_new.sqrt() * inv_bc2_sqrt)
        p.copy_(p_new)
        m.copy_(m_new)
        v.copy_(v_new)


@cache
def _compiled_kernel() -> Callable:
    """The compiled ``_fused_update`` (static shapes: one specialisation per parameter set)."""
    return torch.compile(_fused_update, fullgraph=True, dynamic=False)


# ---------------------------------------------------------------------------------------------
# Backend selection


def native_import_error() -> str | None:
    """Why ``adam_atan2`` (the CUDA package) cannot be imported with its backend, or None if it can."""
    for module in ("adam_atan2", "adam_atan2_backend"):
        try:
            importlib.import_module(module)
        except (ImportError, OSError) as e:
            if module == "adam_atan2" and getattr(e, "name", None) == "adam_atan2":
                return f"adam-atan2 is not installed (CUDA only: {NATIVE_INSTALL})"
            return (f"adam-atan2 is installed but its compiled backend adam_atan2_backend does not load ({e}); "
                    f"reinstall with --force-reinstall: {NATIVE_INSTALL}")
    return None


def native_unavailable_reason(devices: Iterable[torch.device]) -> str | None:
    """Why the native kernel cannot run parameters on ``devices``, or None when it can.

    It needs the package and its compiled backend, every parameter on CUDA, and every GPU
    within sm_80..sm_90.
    """
    reason = native_import_error()
    if reason:
        return reason
    devices = set(devices)
    if not devices:
        return "there are no parameters"
    others = sorted(str(d) for d in devices if d.type != "cuda")
    if others:
        return f"parameters are on {', '.join(others)}; the native kernel runs on CUDA only"
    for d in sorted(devices, key=str):
        cap = torch.cuda.get_device_capability(d)
        if not NATIVE_ARCH[0] <= cap <= NATIVE_ARCH[1]:
            return f"{d} is sm_{cap[0]}{cap[1]}; adam-atan2 0.0.3 has kernels for sm_80..sm_90 only"
    return None


def select_backend(devices: Iterable[torch.device], backend: str = "auto") -> tuple[str, str]:
    """Pick ``"native"``, ``"torch"`` or ``"adamw"`` for parameters on ``devices``, with the reason.

    Raises:
        ValueError: ``backend`` is not one of auto, native, torch, adamw.
        RuntimeError: ``backend="native"`` and the native kernel cannot run here (the message says why).
    """
    if backend not in BACKENDS:
        raise ValueError(f"optimizer backend={backend!r} is not one of {', '.join(BACKENDS)}")
    if backend == "adamw":
        return "adamw", "requested explicitly: plain AdamW, a different algorithm (eps 1e-8, no atan2)"
    if backend == "torch":
        return "torch", "requested explicitly: pure-PyTorch AdamATan2"
    reason = native_unavailable_reason(devices)
    if backend == "native":
        if reason:
            raise RuntimeError(f"optimizer backend='native' but {reason}; use backend='auto' or 'torch' "
                               "for the pure-PyTorch AdamATan2 (same algorithm)")
        return "native", "requested explicitly: adam-atan2 CUDA kernel"
    if reason:
        return "torch", f"pure-PyTorch AdamATan2 (same algorithm) because {reason}"
    return "native", "adam-atan2 CUDA kernel available and every parameter is on a supported GPU"


def _compile_choice(devices: set[torch.device], requested: bool | None) -> tuple[bool, str]:
    """Compile the pure-PyTorch update? Auto (None): on CUDA only.

    On CUDA one fused kernel replaces about ten foreach launches per step. On CPU the first
    compile takes up to a minute (about 40 s for HRM on 2 cores), so it runs only when asked for.
    """
    if requested is False:
        return False, "compile=False"
    if requested is None and not (devices and all(d.type == "cuda" for d in devices)):
        return False, "eager foreach path: compile is automatic on CUDA only (pass compile=True to force)"
    for d in sorted(devices, key=str):
        ok, why = compile_support(d)
        if not ok:
            return False, f"compile off on {d}: {why}"
    return True, "compiled single-pass update" + (" (requested)" if requested else " (automatic on CUDA)")


def _materialize(params) -> tuple[list, set[torch.device]]:
    """``params`` as a list (generators are consumed once) and the set of devices it spans."""
    if isinstance(params, Tensor):
        raise TypeError("params must be an iterable of tensors or param-group dicts, e.g. model.parameters(), "
                        f"not a single {type(params).__name__}")
    items, tensors = [], []
    for item in params:
        if isinstance(item, dict):
            group = [item["params"]] if isinstance(item["params"], Tensor) else list(item["params"])
            item = {**item, "params": group}
            tensors += group
        else:
            tensors.append(item)
        items.append(item)
    return items, {t.device for t in tensors}


def get_adam_atan2_optimizer(params, lr: float = 1e-3, betas: tuple[float, float] = (0.9, 0.999),
                             weight_decay: float = 1e-2, backend: str = "auto",
                             compile: bool | None = None) -> torch.optim.Optimizer:
    """Build the AdamATan2 optimizer for ``params`` on the best available backend.

    Backends: ``auto`` picks the native ``adam_atan2.AdamATan2`` when the package and its
    compiled backend load, every parameter is on CUDA and every GPU is sm_80..sm_90, else the
    pure-PyTorch :class:`AdamATan2`; ``native`` demands the former; ``torch`` demands the latter;
    ``adamw`` gives plain ``torch.optim.AdamW`` (a different algorithm, only when asked for).
    ``compile`` applies to the pure-PyTorch optimizer: None compiles on CUDA only, True asks for
    it everywhere except MPS or when DISABLE_COMPILE is set. The choice and the reason are logged
    at INFO.

    Raises:
        ValueError: unknown backend, or a hyperparameter out of range.
        RuntimeError: ``backend="native"`` and it cannot run here (the message says why and what to do).
    """
    params, devices = _materialize(params)
    name, reason = select_backend(devices, backend)
    if name == "native":
        from adam_atan2 import AdamATan2 as NativeAdamATan2

        if compile:
            log.info("optimizer: compile=True is ignored by the native kernel")
        log.info("optimizer: native adam_atan2.AdamATan2 - %s", reason)
        return NativeAdamATan2(params, lr=lr, betas=betas, weight_decay=weight_decay)
    if name == "adamw":
        log.info("optimizer: torch.optim.AdamW - %s", reason)
        return torch.optim.AdamW(params, lr=lr, betas=betas, weight_decay=weight_decay)
    use_compile, compile_reason = _compile_choice(devices, compile)
    log.info("optimizer: utils.optimizer_utils.AdamATan2 - %s; %s", reason, compile_reason)
    return AdamATan2(params, lr=lr, betas=betas, weight_decay=weight_decay, compile=use_compile)


def get_optimizer_info(device: torch.device | str | None = None) -> dict:
    """What :func:`get_adam_atan2_optimizer` (backend ``auto``) would use for parameters on ``device``.

    Args:
        device: a torch device or string; None picks the training device (``select_device("auto")``).

    Raises:
        DeviceError: ``device`` is malformed or not present on this machine.

    Returns:
        dict with ``platform``, ``torch``, ``device``, ``hardware``, ``backends`` (name ->
        ``{"available": bool, "reason": str}`` for native, torch, torch-compiled, adamw),
        ``selected``, ``reason``, ``compile`` and ``compile_reason``.
    """
    device = select_device("auto" if device is None else str(device)).device
    native_reason = native_unavailable_reason({device})
    compile_ok, compile_why = compile_support(device)
    selected, reason = select_backend({device}, "auto")
    use_compile, compile_reason = _compile_choice({device}, None)
    return {
        "platform": f"{platform.system()} {platform.machine()}" + (" (Apple Silicon)" if is_apple_silicon() else "")
                    + f", Python {platform.python_version()}",
        "torch": torch.__version__,
        "device": str(device),
        "hardware": describe(device),
        "backends": {
            "native": {"available": native_reason is None, "reason": native_reason or "adam-atan2 CUDA kernel loads"},
            "torch": {"available": True, "reason": "pure-PyTorch AdamATan2, eager foreach path, any device"},
            "torch-compiled": {"available": compile_ok, "reason": compile_why},
            "adamw": {"available": True,
                      "reason": "torch.optim.AdamW, only with backend='adamw' (a different algorithm)"},
        },
        "selected": selected if selected == "native" else ("torch-compiled" if use_compile else "torch"),
        "reason": reason,
        "compile": use_compile,
        "compile_reason": compile_reason,
    }


def format_optimizer_info(info: dict) -> str:
    """A readable multi-line report of :func:`get_optimizer_info`."""
    lines = [f"platform:  {info['platform']}, torch {info['torch']}",
             f"device:    {info['device']} ({info['hardware']})",
             "backends:"]
    for name, b in info["backends"].items():
        lines.append(f"  {'yes' if b['available'] else 'no ':3}  {name:15} {b['reason']}")
    lines += [f"selected:  {info['selected']}", f"reason:    {info['reason']}", f"compile:   {info['compile_reason']}"]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """``python -m utils.optimizer_utils [--device D]``: print which AdamATan2 backend runs here and why."""
    parser = ArgumentParser(description="Report the AdamATan2 backend this machine will use, and why.")
    parser.add_argument("--device", default=None, help="cpu, mps, cuda or cuda:N (default: the training device)")
    args = parser.parse_args(argv)
    try:
        info = get_optimizer_info(args.device)
    except DeviceError as e:
        parser.error(str(e))
    print(format_optimizer_info(info))
    return 0


if __name__ == "__main__":
    sys.exit(main())
