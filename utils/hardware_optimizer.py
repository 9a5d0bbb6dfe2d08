"""Hardware report, per-hardware training knobs, and speed/memory helpers (the seed-003 API).

    python -m utils.hardware_optimizer                      # report + recommended commands for this machine
    python -m utils.hardware_optimizer --gpu-memory-gb 12   # what a 12 GB NVIDIA GPU would get

Device, precision and compile policy stay in :mod:`utils.device`; this module reads them to describe
the machine and to pick a hardware profile: the memory-dependent batch sizes, accumulation and
DataLoader workers for HRM (``global_batch_size``) and CAPE (the other knobs).
"""

from __future__ import annotations

import gc
import logging
import os
import platform
import re
import resource
import time
import warnings
from typing import Any, Callable, Iterable

import torch
from torch import nn

from utils.cli import ArgumentParser
from utils.config import ConfigError
from utils.device import (DeviceError, bf16_support, compile_decision, configure_backends, cpu_bf16_features, cpu_name,
                          host_memory, select_device, select_dtype)
from utils.errors import first_in_chain

log = logging.getLogger(__name__)

GiB = 2**30

# Per-profile knobs: the memory-dependent settings only. A profile fills what the YAML recipe and the
# command line leave unset (settings merge in the order defaults, profile, recipe, command line).
# CAPE's effective batch (batch_size x accumulation_steps) is 16 everywhere: the CapeFormer recipe's
# batch (docs/REFERENCE.md, CAPE), reached with accumulation where memory is short. HRM's
# global_batch_size is the true batch (HRM has no accumulation): 768 is the reference recipe, 384 the
# published single laptop GPU (8 GB) recipe; lr is not rescaled with it.
HARDWARE_PROFILES: dict[str, dict[str, Any]] = {
    "gpu_24gb": dict(global_batch_size=768, batch_size=16, accumulation_steps=1, num_workers=8),
    "gpu_16gb": dict(global_batch_size=512, batch_size=8, accumulation_steps=2, num_workers=6),
    "gpu_low_mem": dict(global_batch_size=384, batch_size=4, accumulation_steps=4, num_workers=4),
    "apple_silicon": dict(global_batch_size=256, batch_size=8, accumulation_steps=2, num_workers=2),
    "cpu": dict(global_batch_size=64, batch_size=2, accumulation_steps=8, num_workers=2),
}

PROFILE_DESCRIPTIONS = {
    "gpu_24gb": "NVIDIA GPU with >= 20 GiB (RTX 3090/4090, A6000, A100, H100)",
    "gpu_16gb": "NVIDIA GPU with 11-20 GiB (RTX 3060 12 GB, 4060 Ti/4080 16 GB)",
    "gpu_low_mem": "NVIDIA GPU with < 11 GiB (RTX 3070/3080 8-10 GB, 2080 Ti)",
    "apple_silicon": "Apple Silicon GPU (MPS) sharing unified memory with the CPU",
    "cpu": "CPU only: for smoke tests and small runs",
}

# HRM config per device type, and the CAPE launcher; both take the profile name.
HRM_CONFIGS = {"cuda": "cfg_pretrain", "mps": "cfg_pretrain_apple_silicon", "cpu": "cfg_pretrain_cpu"}

_OOM_RE = re.compile(r"out of memory|CUBLAS_STATUS_ALLOC_FAILED|CUDNN_STATUS_ALLOC_FAILED|"
                     r"DefaultCPUAllocator: (can't allocate memory|not enough memory)", re.IGNORECASE)


# ---- detection -----------------------------------------------------------------------------------

def _cpu_count() -> int:
    try:
        return len(os.sched_getaffinity(0))  # honours container CPU limits, unlike os.cpu_count()
    except AttributeError:
        return os.cpu_count() or 1


def _as_device(device: torch.device | str | None) -> torch.device:
    return select_device("auto").device if device is None else torch.device(device)


def detect_gpu_info(device: torch.device | str | None = None) -> dict[str, Any]:
    """Describe the training device and the host.

    Args:
        device: the device to describe; None picks it with :func:`utils.device.select_device`.

    Returns:
        A dict with ``device`` (cuda/mps/cpu), ``gpu_available``, ``gpu_name``, ``gpu_memory_gb``
        (GiB; for MPS the Metal working-set limit of unified memory), ``gpu_count``,
        ``compute_capability`` ((major, minor) or None), ``supports_bfloat16`` and ``bfloat16_reason``
        (native bf16 only: CUDA cc >= 8.0, MPS on macOS >= 14, CPUs with AVX512-BF16/AMX),
        ``supports_tf32`` (CUDA cc >= 8.0), ``cuda_version``, ``cudnn_version``, ``torch_version``,
        ``cpu_name``, ``cpu_cores``, ``torch_threads``, ``cpu_bf16_features`` and ``system_memory_gb``.
    """
    device = _as_device(device)
    bf16, bf16_reason = bf16_support(device)
    info: dict[str, Any] = {
        "device": device.type, "gpu_available": device.type != "cpu", "gpu_name": None, "gpu_memory_gb": None,
        "gpu_count": 0, "compute_capability": None, "supports_bfloat16": bf16, "bfloat16_reason": bf16_reason,
        "supports_tf32": False, "cuda_version": torch.version.cuda, "cudnn_version": None,
        "torch_version": torch.__version__, "cpu_name": cpu_name(), "cpu_cores": _cpu_count(),
        "torch_threads": torch.get_num_threads(), "cpu_bf16_features": cpu_bf16_features(),
        "system_memory_gb": host_memory() / GiB,
    }
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        cc = torch.cuda.get_device_capability(device)
        info.update(gpu_name=props.name, gpu_memory_gb=props.total_memory / GiB, gpu_count=torch.cuda.device_count(),
                    compute_capability=cc, supports_tf32=cc[0] >= 8, cudnn_version=torch.backends.cudnn.version())
    elif device.type == "mps":
        info.update(gpu_name="Apple Silicon GPU (MPS)", gpu_count=1,
                    gpu_memory_gb=torch.mps.recommended_max_memory() / GiB)
    return info


def machine_line(device: torch.device | str = "cpu") -> str:
    """The hardware in one line, for benchmark output beside every figure: the GPU if any, then the CPU model,
    cores, torch threads and native-bf16 features (AVX512-BF16/AMX; without them bf16 is emulated and CPU
    runs use fp32), and the torch version."""
    info = detect_gpu_info(device)
    bf16 = ", ".join(info["cpu_bf16_features"]) or "none (bf16 emulated; CPU runs use fp32)"
    gpu = f"GPU {info['gpu_name']}, " if info["gpu_name"] else ""
    return (f"{gpu}CPU {info['cpu_name']}, {info['cpu_cores']} cores, torch {info['torch_threads']} threads, "
            f"bf16 features: {bf16}; torch {info['torch_version']}")


# ---- profiles and recommendations ----------------------------------------------------------------

def profile_for_memory(gpu_memory_gb: float) -> str:
    """The NVIDIA profile for a GPU with ``gpu_memory_gb`` GiB (a "12 GB" card reports about 11.7)."""
    if gpu_memory_gb >= 20:
        return "gpu_24gb"
    return "gpu_16gb" if gpu_memory_gb >= 11 else "gpu_low_mem"


def get_optimal_num_workers() -> int:
    """DataLoader workers for this host: one core is left to the training loop, at most 8 (more rarely
    helps, and every worker holds its own copy of the dataset)."""
    return max(0, min(8, _cpu_count() - 1))


def _finish(name: str, reason: str) -> tuple[str, dict[str, Any], str]:
    """Copy the profile's knobs and fit them to this host's cores."""
    knobs = dict(HARDWARE_PROFILES[name])
    workers = get_optimal_num_workers()
    if knobs["num_workers"] > workers:
        knobs["num_workers"] = workers
        reason += f"; num_workers capped at {workers} by {_cpu_count()} CPU cores"
    return name, knobs, reason


def resolve_hardware_profile(name: str | None, device: torch.device | str) -> tuple[str, dict[str, Any], str]:
    """Pick the hardware profile for ``device``.

    Args:
        name: ``"auto"``/None to choose from the device (NVIDIA by memory, MPS, CPU), or a key of
            :data:`HARDWARE_PROFILES`.
        device: the training device.

    Returns:
        ``(profile_name, knobs, reason)``: ``knobs`` is a fresh dict with ``global_batch_size``,
        ``batch_size``, ``accumulation_steps`` and ``num_workers`` (capped by this host's cores).

    Raises:
        ConfigError: ``name`` is not a profile.
    """
    device = torch.device(device)
    if name in (None, "auto"):
        if device.type == "cuda":
            props = torch.cuda.get_device_properties(device)
            mem = props.total_memory / GiB
            return _finish(profile_for_memory(mem), f"auto: {props.name} has {mem:.1f} GiB")
        if device.type == "mps":
            return _finish("apple_silicon", f"auto: Apple Silicon GPU, {host_memory() / GiB:.0f} GiB unified memory")
        return _finish("cpu", "auto: no GPU")
    if name not in HARDWARE_PROFILES:
        raise ConfigError(f"hardware={name!r} is not a profile: use auto or one of {', '.join(HARDWARE_PROFILES)}")
    expected = "cuda" if name.startswith("gpu_") else "mps" if name == "apple_silicon" else "cpu"
    reason = "requested explicitly" + ("" if expected == device.type else f" (made for {expected}, running on {device.type})")
    return _finish(name, reason)


def get_recommended_config(gpu_memory_gb: float | None = None,
                           device: torch.device | str | None = None) -> dict[str, Any]:
    """Recommended training knobs.

    Args:
        gpu_memory_gb: size the recommendation for an NVIDIA GPU with this many GiB instead of detecting.
        device: the device to recommend for (ignored when ``gpu_memory_gb`` is given); None detects it.

    Returns:
        ``{"profile": name, **knobs, "effective_batch_size": batch_size * accumulation_steps, "reason": str}``
        with the knobs of :func:`resolve_hardware_profile`.

    Raises:
        ValueError: ``gpu_memory_gb`` is not positive.
    """
    if gpu_memory_gb is not None:
        if not gpu_memory_gb > 0:
            raise ValueError(f"gpu_memory_gb={gpu_memory_gb} must be a positive number of GiB")
        name, knobs, reason = _finish(profile_for_memory(gpu_memory_gb), f"{gpu_memory_gb:g} GiB of GPU memory")
    else:
        name, knobs, reason = resolve_hardware_profile("auto", _as_device(device))
    return {"profile": name, **knobs, "effective_batch_size": knobs["batch_size"] * knobs["accumulation_steps"],
            "reason": reason}


def training_commands(profile: str, device_type: str) -> dict[str, str]:
    """The HRM and CAPE command lines that train with ``profile`` on a ``device_type`` machine."""
    return {"hrm": f"python pretrain.py --config-name={HRM_CONFIGS[device_type]} hardware={profile}",
            "cape": f"./START_CAPE_TRAINING.sh --hardware {profile}"}


def hardware_report(device: torch.device | str | None = None) -> str:
    """The text :func:`print_hardware_info` prints: the hardware, precision support and recommendations.

    Args:
        device: the device to report on; None picks it with :func:`utils.device.select_device` and
            also says why.
    """
    if device is None:
        choice = select_device("auto")
        device, why = choice.device, f" ({choice.reason})"
    else:
        device, why = torch.device(device), ""
    info = detect_gpu_info(device)
    lines = ["Hardware",
             f"  device         {device}{why}",
             f"  torch          {info['torch_version']} "
             + (f"(CUDA {info['cuda_version']})" if info["cuda_version"] else "(no CUDA in this build)"),
             f"  CPU            {info['cpu_name']}, {info['cpu_cores']} cores, torch uses {info['torch_threads']} threads",
             f"  CPU bf16       {', '.join(info['cpu_bf16_features']) or 'none (bf16 matmuls are emulated)'}",
             f"  memory         {info['system_memory_gb']:.1f} GiB"]
    if device.type == "cuda":
        cc = ".".join(map(str, info["compute_capability"]))
        lines += [f"  GPU            {info['gpu_count']} x {info['gpu_name']}, {info['gpu_memory_gb']:.1f} GiB, "
                  f"compute capability {cc}, cuDNN {info['cudnn_version']}",
                  f"  TF32           {'yes' if info['supports_tf32'] else 'no (needs compute capability >= 8.0)'}"]
    elif device.type == "mps":
        lines.append(f"  GPU            {info['gpu_name']}, working-set limit {info['gpu_memory_gb']:.1f} GiB of "
                     f"unified memory, macOS {platform.mac_ver()[0]}")
    lines.append(f"  bfloat16       {'yes' if info['supports_bfloat16'] else 'no'}: {info['bfloat16_reason']}; "
                 f"training dtype {str(select_dtype(device)[0]).removeprefix('torch.')}")
    rec = get_recommended_config(device=device)
    cmds = training_commands(rec["profile"], device.type)
    ok, why = compile_decision(device)
    lines += [f"Recommended profile: {rec['profile']} ({PROFILE_DESCRIPTIONS[rec['profile']]})",
              f"  why            {rec['reason']}",
              f"  HRM            global_batch_size={rec['global_batch_size']}",
              f"  CAPE           batch_size={rec['batch_size']} x accumulation_steps={rec['accumulation_steps']} "
              f"(effective {rec['effective_batch_size']}), num_workers={rec['num_workers']}",
              "  torch.compile  {} ({})".format(*(("on", why) if ok else ("off", why))),
              "Commands",
              f"  HRM            {cmds['hrm']}",
              f"  CAPE           {cmds['cape']}"]
    return "\n".join(lines)


def print_hardware_info(device: torch.device | str | None = None) -> None:
    """Print :func:`hardware_report` for ``device`` (None: the auto-selected device)."""
    print(hardware_report(device))


# ---- settings ------------------------------------------------------------------------------------

def optimize_pytorch_settings(config: dict[str, Any] | None = None,
                              device: torch.device | str | None = None) -> dict[str, Any]:
    """Apply speed settings for ``device`` and return what was set.

    Args:
        config: optional ``cudnn_benchmark`` (default True), ``tf32`` (default True; only on CUDA with
            compute capability >= 8.0) and ``num_threads`` (int >= 1; default: leave torch's choice).
        device: None picks it with :func:`utils.device.select_device`.

    TF32 goes through ``torch.set_float32_matmul_precision`` only (via
    :func:`utils.device.configure_backends`): mixing it with the ``allow_tf32``/``fp32_precision``
    attributes raises on torch >= 2.9.

    Raises:
        ValueError: an unknown key, or ``num_threads`` that is not a positive int.
    """
    cfg = {"cudnn_benchmark": True, "tf32": True, "num_threads": None}
    unknown = set(config or {}) - set(cfg)
    if unknown:
        raise ValueError(f"optimize_pytorch_settings: unknown keys {sorted(unknown)}; use {sorted(cfg)}")
    cfg.update(config or {})
    device = _as_device(device)
    applied: dict[str, Any] = {"device": str(device)}
    if device.type == "cuda":
        configure_backends(device, cudnn_benchmark=bool(cfg["cudnn_benchmark"]))
        if not cfg["tf32"] or torch.cuda.get_device_capability(device)[0] < 8:
            torch.set_float32_matmul_precision("highest")
        applied.update(cudnn_benchmark=torch.backends.cudnn.benchmark,
                       float32_matmul_precision=torch.get_float32_matmul_precision())
    threads = cfg["num_threads"]
    if threads is not None:
        if not isinstance(threads, int) or isinstance(threads, bool) or threads < 1:
            raise ValueError(f"num_threads={threads!r} must be a positive int")
        torch.set_num_threads(threads)
    applied["num_threads"] = torch.get_num_threads()
    return applied


def _release_cached_memory(device: torch.device | None = None) -> None:
    """Collect garbage and hand the allocator caches back to the driver."""
    gc.collect()
    if (device is None or device.type == "cuda") and torch.cuda.is_initialized():
        torch.cuda.empty_cache()
    if (device is None or device.type == "mps") and torch.backends.mps.is_available():
        torch.mps.empty_cache()


def enable_memory_efficient_mode(device: torch.device | str | None = None) -> list[str]:
    """Trade speed for memory on ``device`` (after an OOM, or before a tight run); returns what was done.

    CUDA: empty the cache, turn cuDNN autotuning off (its trial workspaces cost memory) and, if CUDA
    is not initialised yet, ask the allocator for expandable segments (less fragmentation).
    MPS: empty the cache. Everywhere: a garbage collection.
    """
    device = _as_device(device)
    _release_cached_memory(device)
    done = ["garbage collected"]
    if device.type == "cuda":
        torch.backends.cudnn.benchmark = False
        done.append("cuDNN benchmark off")
        if torch.cuda.is_initialized():
            done.append("CUDA cache emptied")
        elif not (os.environ.get("PYTORCH_ALLOC_CONF") or os.environ.get("PYTORCH_CUDA_ALLOC_CONF")):
            os.environ["PYTORCH_ALLOC_CONF"] = "expandable_segments:True"  # read when CUDA initialises
            done.append("PYTORCH_ALLOC_CONF=expandable_segments:True")
    elif device.type == "mps":
        done.append("MPS cache emptied")
    return done


# ---- compile with an eager fallback --------------------------------------------------------------

class CompiledWithFallback(nn.Module):
    """``torch.compile(model)`` that runs eagerly, with one warning, if compilation fails.

    torch.compile is lazy: it traces and compiles on the first forward call, so a try/except around
    the ``torch.compile(...)`` call itself catches nothing. This wrapper catches the failure at the
    call. The model is registered as ``_orig_mod``, as in torch's own compiled wrapper, so state_dict
    keys match a ``torch.compile``d model; other attributes (e.g. HRM's ``initial_carry``) pass through.
    Out-of-memory errors are re-raised, not retried eagerly, and so is an interrupt (KeyboardInterrupt, a
    trainer's stop signal) that the compiler wrapped in its own error: a signal handler that raises during
    compilation can land in torch's code, which reports it as a compiler failure (seen with SIGTERM in the first
    step of a run), and falling back to eager there would hide the stop.
    """

    def __init__(self, model: nn.Module, mode: str | None = "default", backend: str | Callable = "inductor"):
        super().__init__()
        self._orig_mod = model
        # Kept out of _modules: it wraps the same parameters, which must not appear twice.
        object.__setattr__(self, "_compiled", torch.compile(model, mode=mode, backend=backend))
        self.compile_error: str | None = None

    def forward(self, *args, **kwargs):
        if self.compile_error is None:
            try:
                return self._compiled(*args, **kwargs)
            except Exception as exc:  # any compiler failure; a real bug re-raises from the eager call below
                if is_oom_error(exc):
                    raise
                if (interrupt := wrapped_interrupt(exc)) is not None:
                    raise interrupt from None
                self.compile_error = " ".join(ln.strip() for ln in str(exc).splitlines() if ln.strip())[:300] \
                    or type(exc).__name__
                warnings.warn(f"torch.compile failed, running the model eagerly from now on: {self.compile_error}",
                              RuntimeWarning, stacklevel=2)
        return self._orig_mod(*args, **kwargs)

    def __getattr__(self, name: str):
        try:
            return super().__getattr__(name)
        except AttributeError:
            modules = self.__dict__.get("_modules", {})
            if "_orig_mod" in modules:
                return getattr(modules["_orig_mod"], name)
            raise


def wrapped_interrupt(exc: BaseException) -> BaseException | None:
    """The first exception in ``exc``'s chain that is not an ``Exception``, such as KeyboardInterrupt or
    :class:`utils.run.stop.StoppedAtOnce`; None when there is none."""
    return first_in_chain(exc, lambda e: not isinstance(e, Exception))


def compile_model(model: nn.Module, mode: str | None = "default", backend: str | Callable = "inductor") -> nn.Module:
    """``torch.compile`` ``model`` with an eager fallback (:class:`CompiledWithFallback`).

    Whether to compile at all is decided once, by :func:`utils.device.compile_decision`, when a run
    resolves its plan; this function only wraps.
    """
    return CompiledWithFallback(model, mode=mode, backend=backend)


# ---- measuring -----------------------------------------------------------------------------------

def benchmark_dataloader(loader: Iterable, num_batches: int = 10) -> float:
    """Mean seconds per batch over ``num_batches`` batches of ``loader``.

    The first batch (worker start-up, first file reads) is fetched first and not counted. Stops early
    when the loader runs out.

    Raises:
        ValueError: ``num_batches`` < 1, or the loader yields fewer than two batches.
    """
    if num_batches < 1:
        raise ValueError(f"num_batches={num_batches} must be >= 1")
    it = iter(loader)
    if next(it, None) is None:
        raise ValueError("benchmark_dataloader: the loader yielded no batches; check that its dataset is not empty")
    times = []
    for _ in range(num_batches):
        start = time.perf_counter()
        if next(it, None) is None:
            break
        times.append(time.perf_counter() - start)
    if not times:
        raise ValueError("benchmark_dataloader: the loader yielded only one batch (the uncounted warm-up one); "
                         "use a smaller batch_size or a larger dataset")
    return sum(times) / len(times)


def _process_rss_bytes() -> int:
    """Resident memory of this process: VmRSS from /proc; elsewhere the peak from getrusage, the best
    the standard library offers (kB on Linux, bytes on macOS)."""
    try:
        with open("/proc/self/status", encoding="utf-8") as f:
            return int(re.search(r"VmRSS:\s+(\d+) kB", f.read()).group(1)) * 1024
    except (OSError, AttributeError):
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        return peak if platform.system() == "Darwin" else peak * 1024


class MemoryTracker:
    """Current and peak memory on one device, in bytes; reported in GiB.

    - CUDA: ``torch.cuda.memory_allocated`` and ``max_memory_allocated`` (live tensors, not the cache);
      the peak includes spikes between :meth:`update` calls.
    - MPS: ``torch.mps.current_allocated_memory`` (tensors) and ``driver_allocated_memory`` (all Metal
      memory). MPS keeps no peak, so the peak is the highest value :meth:`update` saw.
    - CPU: the process's resident set size; the peak is the highest value :meth:`update` saw.

    Total: the GPU's memory, the Metal working-set limit, or the host RAM.
    """

    def __init__(self, device: torch.device | str | None = None):
        self.device = _as_device(device)
        self.current = self.peak = 0
        self.reset()

    def current_bytes(self) -> int:
        """Memory in use now, in bytes."""
        if self.device.type == "cuda":
            return torch.cuda.memory_allocated(self.device)
        if self.device.type == "mps":
            return torch.mps.current_allocated_memory()
        return _process_rss_bytes()

    def total_bytes(self) -> int:
        """Memory available to this device, in bytes."""
        if self.device.type == "cuda":
            return torch.cuda.get_device_properties(self.device).total_memory
        if self.device.type == "mps":
            return torch.mps.recommended_max_memory()
        return host_memory()

    def reset(self) -> None:
        """Start a new measurement window (e.g. each epoch)."""
        if self.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(self.device)
        self.current = self.peak = self.current_bytes()

    def update(self) -> int:
        """Sample memory now (call once per step); returns the current bytes."""
        self.current = self.current_bytes()
        device_peak = torch.cuda.max_memory_allocated(self.device) if self.device.type == "cuda" else 0
        self.peak = max(self.peak, self.current, device_peak)
        return self.current

    def stats(self) -> dict[str, float]:
        """``current_gb``, ``peak_gb``, ``total_gb`` (GiB), ``utilization`` (peak / total) and, on MPS,
        ``driver_gb``."""
        total = self.total_bytes()
        out = {"current_gb": self.current / GiB, "peak_gb": self.peak / GiB, "total_gb": total / GiB,
               "utilization": self.peak / total if total else float("nan")}
        if self.device.type == "mps":
            out["driver_gb"] = torch.mps.driver_allocated_memory() / GiB
        return out

    def report(self) -> str:
        """Print and return a short memory summary."""
        s = self.stats()
        kind = {"cuda": "GPU", "mps": "MPS", "cpu": "CPU (process RSS)"}[self.device.type]
        lines = [f"{kind} memory on {self.device}:", f"  Current: {s['current_gb']:.2f} GiB",
                 f"  Peak: {s['peak_gb']:.2f} GiB", f"  Total: {s['total_gb']:.2f} GiB",
                 f"  Utilization: {100 * s['utilization']:.1f}%"]
        if "driver_gb" in s:
            lines.append(f"  Metal driver: {s['driver_gb']:.2f} GiB")
        text = "\n".join(lines)
        print(text)
        return text


# ---- out-of-memory handling ----------------------------------------------------------------------

def is_oom_error(exc: BaseException) -> bool:
    """True for out-of-memory errors: ``torch.OutOfMemoryError``, ``MemoryError``, and RuntimeErrors
    whose message says so (CUDA "CUDA out of memory", MPS "MPS backend out of memory", cuBLAS/cuDNN
    allocation failures, the CPU allocator)."""
    if isinstance(exc, (torch.OutOfMemoryError, MemoryError)):
        return True
    return isinstance(exc, RuntimeError) and bool(_OOM_RE.search(str(exc)))


def run_with_oom_backoff(fn: Callable[[int], Any], batch_size: int, min_batch_size: int = 1,
                         device: torch.device | str | None = None) -> tuple[Any, int]:
    """Call ``fn(batch_size)``, halving the batch size after each out-of-memory error.

    Args:
        fn: runs the work for one batch size (e.g. a trial step); must be safe to call again.
        batch_size: the size to try first.
        min_batch_size: the smallest size to try (halving stops there, inclusive).
        device: whose cache to empty between attempts; None empties every initialised one.

    Returns:
        ``(fn's result, the batch size that worked)``.

    Raises:
        ValueError: not ``batch_size >= min_batch_size >= 1``.
        RuntimeError: still out of memory at ``min_batch_size`` (chained to the last OOM error).
        Any non-OOM exception from ``fn``, unchanged.
    """
    if not (isinstance(batch_size, int) and isinstance(min_batch_size, int) and batch_size >= min_batch_size >= 1):
        raise ValueError(f"run_with_oom_backoff needs ints batch_size >= min_batch_size >= 1, "
                         f"got batch_size={batch_size!r}, min_batch_size={min_batch_size!r}")
    while True:
        try:
            return fn(batch_size), batch_size
        except Exception as exc:
            if not is_oom_error(exc):
                raise
            if batch_size <= min_batch_size:
                raise RuntimeError(f"out of memory even at batch_size={batch_size} (min_batch_size={min_batch_size}): "
                                   "enable gradient checkpointing, shrink the model, or use hardware=gpu_low_mem") from exc
        # Outside the except block: the traceback, and the activations its frames hold, are gone now.
        _release_cached_memory(None if device is None else torch.device(device))
        smaller = max(min_batch_size, batch_size // 2)
        log.warning("out of memory at batch_size=%d; retrying with %d", batch_size, smaller)
        batch_size = smaller


def main(argv: list[str] | None = None) -> None:
    """``python -m utils.hardware_optimizer``: print the report, recommendations and commands."""
    p = ArgumentParser(description="Hardware report and recommended training settings for this machine.")
    p.add_argument("--device", default="auto", help="auto, cpu, mps, cuda or cuda:N (default: auto)")
    p.add_argument("--gpu-memory-gb", type=float,
                   help="also show the recommendation for an NVIDIA GPU with this many GiB")
    args = p.parse_args(argv)
    try:
        device = None if args.device == "auto" else select_device(args.device).device
    except DeviceError as e:
        p.error(str(e))
    if args.gpu_memory_gb is not None and not args.gpu_memory_gb > 0:
        p.error(f"--gpu-memory-gb {args.gpu_memory_gb:g} must be a positive number of GiB")
    print_hardware_info(device)
    if args.gpu_memory_gb is not None:
        rec = get_recommended_config(gpu_memory_gb=args.gpu_memory_gb)
        cmds = training_commands(rec["profile"], "cuda")
        print(f"For a {args.gpu_memory_gb:g} GiB NVIDIA GPU: profile {rec['profile']}, "
              + ", ".join(f"{k}={rec[k]}" for k in HARDWARE_PROFILES[rec["profile"]])
              + f"\n  HRM            {cmds['hrm']}\n  CAPE           {cmds['cape']}")


if __name__ == "__main__":
    main()
