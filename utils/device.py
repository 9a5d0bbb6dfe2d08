"""Device and precision policy: the one place that decides where and in what dtype we run.

Every trainer calls :func:`select_device` and :func:`select_dtype` once and passes the
results down; no other module asks ``torch.cuda.is_available()`` on its own.
"""

from __future__ import annotations

import importlib.util
import logging
import os
import platform
import re
import shutil
import subprocess
import sys
import sysconfig
import tempfile
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import torch

from utils.errors import UserError
from utils.threads import choose_threads, thread_note

log = logging.getLogger(__name__)

_DEVICE_RE = re.compile(r"^(auto|cpu|mps|cuda)(:\d+)?$")


class DeviceError(UserError):
    """A requested device or dtype is malformed, or names hardware this machine lacks."""


@dataclass(frozen=True)
class DeviceChoice:
    """The device a command runs on and why it was chosen (a human-readable sentence), and torch's CPU threads with
    their reason (``N threads: why``, :func:`utils.threads.thread_note`)."""

    device: torch.device
    reason: str
    threads: str = ""


def is_apple_silicon() -> bool:
    """True on an arm64 Mac, even when this Python runs under Rosetta (x86_64)."""
    if platform.system() != "Darwin":
        return False
    if platform.machine() == "arm64":
        return True
    try:  # Rosetta reports x86_64; the kernel still knows the truth.
        out = subprocess.run(["sysctl", "-n", "sysctl.proc_translated"], capture_output=True, text=True, timeout=5)
        return out.stdout.strip() == "1"
    except (OSError, subprocess.SubprocessError):
        return False


def mps_unavailable_reason() -> str | None:
    """Why MPS cannot be used here, or None when it can."""
    if torch.backends.mps.is_available():
        return None
    if platform.system() != "Darwin":
        return "not a Mac"
    if not torch.backends.mps.is_built():
        return "this torch is not an Apple Silicon (MPS) build"
    if platform.machine() != "arm64":
        return "Python runs under Rosetta (x86_64), which hides MPS; install an arm64 Python"
    return "macOS is older than 12.3 or the GPU is not supported"


def select_device(requested: str | None = "auto", deterministic: bool = False) -> DeviceChoice:
    """Pick the device: ``cuda``, then ``mps``, then ``cpu``; an explicit request wins. Torch's CPU threads are
    chosen here too, once a process (:func:`utils.threads.choose_threads`: the free cores at start).

    Args:
        requested: ``"auto"``/None, or ``"cpu"``, ``"mps"``, ``"cuda"``, ``"cuda:N"``.
        deterministic: a bitwise-reproducible run: torch's default threads whatever the load.

    Raises:
        DeviceError: the string is malformed, or names a device this machine does not have.
    """
    choice = _pick_device(requested)
    choose_threads(deterministic, physical_cores())
    return DeviceChoice(choice.device, choice.reason, thread_note())


def _pick_device(requested: str | None) -> DeviceChoice:
    """:func:`select_device`'s device and its reason (same arguments and errors)."""
    req = (requested or "auto").strip().lower()
    if not _DEVICE_RE.match(req):
        raise DeviceError(f"device={requested!r} is not a device: use auto, cpu, mps, cuda or cuda:N")
    if req == "auto":
        if torch.cuda.is_available():
            return DeviceChoice(torch.device("cuda", 0), f"CUDA available: {torch.cuda.get_device_name(0)}")
        skipped = ["cuda not available" + ("" if torch.version.cuda else ": this torch is a CPU-only build")]
        mps_reason = mps_unavailable_reason()
        if mps_reason is None:
            return DeviceChoice(torch.device("mps"), "; ".join(skipped) + "; using Apple Silicon GPU (MPS)")
        skipped.append(f"mps not available: {mps_reason}")
        return DeviceChoice(torch.device("cpu"), "; ".join(skipped) + "; using CPU")
    if req.startswith("cuda"):
        if not torch.cuda.is_available():
            raise DeviceError(
                f"device={requested!r} but CUDA is not available on this machine "
                f"({'CPU-only torch build' if not torch.version.cuda else 'no NVIDIA GPU or driver'}); "
                "use device=auto or device=cpu"
            )
        index = int(req.split(":")[1]) if ":" in req else 0
        if index >= torch.cuda.device_count():
            raise DeviceError(
                f"device={requested!r} but only {torch.cuda.device_count()} CUDA device(s) exist; "
                f"use cuda:0..cuda:{torch.cuda.device_count() - 1}"
            )
        return DeviceChoice(torch.device("cuda", index), "requested explicitly")
    if req.startswith("mps"):
        reason = mps_unavailable_reason()
        if reason is not None:
            raise DeviceError(f"device={requested!r} but MPS is not available: {reason}; use device=auto or device=cpu")
        return DeviceChoice(torch.device("mps"), "requested explicitly")
    return DeviceChoice(torch.device("cpu"), "requested explicitly")


def cpuinfo() -> str:
    """The text of /proc/cpuinfo (empty where there is none, e.g. macOS)."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            return f.read()
    except OSError:
        return ""


@lru_cache(maxsize=None)
def physical_cores() -> int:
    """The CPU's cores without their hyperthread siblings (distinct ``physical id``/``core id`` pairs of
    /proc/cpuinfo), where torch's default number of threads comes from; ``os.cpu_count()`` where that is unknown."""
    pairs, physical = set(), "0"
    for line in cpuinfo().splitlines():
        key, _, value = line.partition(":")
        if key.strip() == "physical id":
            physical = value.strip()
        elif key.strip() == "core id":
            pairs.add((physical, value.strip()))
    return len(pairs) or os.cpu_count() or 1


def cpu_name() -> str:
    """The CPU model as the OS names it (/proc/cpuinfo, macOS sysctl), else the platform's processor or machine."""
    m = re.search(r"^model name\s*:\s*(.+)$", cpuinfo(), re.MULTILINE)
    if m:
        return m.group(1).strip()
    if platform.system() == "Darwin":
        try:
            out = subprocess.run(["sysctl", "-n", "machdep.cpu.brand_string"], capture_output=True, text=True, timeout=5)
            if out.stdout.strip():
                return out.stdout.strip()
        except (OSError, subprocess.SubprocessError):
            pass
    return platform.processor() or platform.machine()


def cpu_bf16_features() -> list[str]:
    """The x86 CPU flags that give native bf16 matmuls (AVX512-BF16, AMX), sorted; empty elsewhere."""
    return sorted(set(re.findall(r"\b(avx512_bf16|amx_bf16|amx_tile)\b", cpuinfo())))


@lru_cache(maxsize=None)
def cpu_has_fast_bf16() -> bool:
    """True when the CPU has native bf16 matmul (x86 AVX512-BF16 or AMX, or arm64 FEAT_BF16).

    On such CPUs a bf16 matmul runs several times faster than fp32 (about 3.7x on the
    AVX512-BF16 machine this project is developed on); elsewhere bf16 is emulated and slower.
    """
    if {"avx512_bf16", "amx_bf16"} & set(cpu_bf16_features()):
        return True
    if platform.system() == "Darwin":
        try:
            out = subprocess.run(["sysctl", "-n", "hw.optional.arm.FEAT_BF16"], capture_output=True, text=True, timeout=5)
            return out.stdout.strip() == "1"
        except (OSError, subprocess.SubprocessError):
            return False
    return False


def mps_supports_bf16() -> bool:
    """MPS runs bf16 from macOS 14 (Sonoma) on."""
    if platform.system() != "Darwin":
        return False
    try:
        return int(platform.mac_ver()[0].split(".")[0]) >= 14
    except ValueError:
        return False


def bf16_support(device: torch.device) -> tuple[bool, str]:
    """Whether ``device`` runs bf16 natively (fast), with the reason.

    CUDA needs compute capability >= 8.0: ``torch.cuda.is_bf16_supported()`` also says yes
    for older GPUs where bf16 is emulated and slow.
    """
    if device.type == "cuda":
        major, minor = torch.cuda.get_device_capability(device)
        if major >= 8:
            return True, f"compute capability {major}.{minor} >= 8.0"
        return False, f"compute capability {major}.{minor} < 8.0 (bf16 would be emulated)"
    if device.type == "mps":
        return (True, "macOS >= 14") if mps_supports_bf16() else (False, "MPS bf16 needs macOS >= 14")
    if cpu_has_fast_bf16():
        return True, "CPU has AVX512-BF16/AMX"
    return False, "CPU has no native bf16 (no AVX512-BF16/AMX)"


_DTYPES = {"bfloat16": torch.bfloat16, "bf16": torch.bfloat16, "float32": torch.float32, "fp32": torch.float32}


def select_dtype(device: torch.device, forced: str | None = None) -> tuple[torch.dtype, str]:
    """The activation dtype: bf16 where the device runs it natively, else fp32.

    Args:
        device: the training device.
        forced: None/``"auto"``, or ``"bfloat16"``/``"float32"`` to override the policy.

    Raises:
        DeviceError: ``forced`` is not one of the names above (float16 included: the recurrent models
            overflow in fp16 without loss scaling, and CPUs have no fast fp16).
    """
    if forced not in (None, "auto"):
        if forced in ("float16", "fp16", "half"):
            raise DeviceError(f"forward_dtype={forced} is not supported: the recurrent state overflows in fp16 without "
                              "loss scaling; use forward_dtype=bfloat16 where the device runs it, else float32")
        if forced not in _DTYPES:
            raise DeviceError(f"forward_dtype={forced!r} is not supported: use auto, bfloat16 or float32")
        return _DTYPES[forced], "forced by forward_dtype"
    ok, why = bf16_support(device)
    return (torch.bfloat16, why) if ok else (torch.float32, why)


def configure_backends(device: torch.device, cudnn_benchmark: bool = True, deterministic: bool = False,
                       warn_only: bool = False, compiling: bool = True) -> None:
    """Turn on TF32 matmuls and cuDNN autotuning on CUDA; with ``deterministic``, bitwise-reproducible kernels
    everywhere instead (no autotuning, ``torch.use_deterministic_algorithms``; ``warn_only`` for models with
    backward passes that have no deterministic kernel, such as some upsamplings).

    TF32 is set through ``torch.set_float32_matmul_precision`` only: mixing it with the
    newer ``fp32_precision`` attributes raises on torch >= 2.9.

    ``compiling``: whether this process will ``torch.compile``. ``torch.use_deterministic_algorithms`` also sets
    inductor's ``deterministic``, and imports the compiler to do so (about 2 s on a 2-core CPU, in every process);
    a run that does not compile sets torch's own flag alone, unless the compiler is loaded already.
    """
    if deterministic:
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")  # deterministic cuBLAS needs it
    # Set both ways: a process that runs several trainings (a notebook, the tests) keeps no earlier run's choice.
    set_alone = getattr(torch._C, "_set_deterministic_algorithms", None)
    if compiling or "torch._inductor.config" in sys.modules or set_alone is None:
        torch.use_deterministic_algorithms(deterministic, warn_only=warn_only)
    else:
        set_alone(deterministic, warn_only=warn_only)
    torch.backends.cudnn.deterministic = deterministic
    if device.type == "cuda":
        torch.set_float32_matmul_precision("high")
        torch.backends.cudnn.benchmark = cudnn_benchmark and not deterministic


@lru_cache(maxsize=None)
def cpu_toolchain() -> tuple[bool, str]:
    """Whether torch.compile can build CPU kernels here: a C++ compiler that compiles against Python's headers.

    Inductor's CPU backend compiles C++ that includes ``Python.h``; a missing compiler or missing headers
    (no ``python3-dev``) only show up at the first compiled call otherwise. This compiles a one-line
    file once (about 0.3 s) and caches the answer.
    """
    compiler = os.environ.get("CXX") or next((c for c in ("g++", "c++", "clang++") if shutil.which(c)), None)
    if compiler is None or shutil.which(compiler) is None:
        return False, "no C++ compiler (g++/c++/clang++) on PATH"
    include = sysconfig.get_paths()["include"]
    with tempfile.TemporaryDirectory() as tmp:
        src = Path(tmp, "probe.cpp")
        src.write_text("#include <Python.h>\nint probe() { return 0; }\n")
        try:
            out = subprocess.run([compiler, "-c", str(src), "-I", include, "-o", str(Path(tmp, "probe.o"))],
                                 capture_output=True, text=True, timeout=60)
        except (OSError, subprocess.SubprocessError) as e:
            return False, f"{compiler} failed to run ({e})"
    if out.returncode != 0:
        return False, f"{compiler} cannot compile against Python's headers ({include}); install the Python dev headers"
    return True, f"C++ toolchain works ({compiler})"


def compile_support(device: torch.device) -> tuple[bool, str]:
    """Whether ``torch.compile`` can run on ``device``: Triton on CUDA, a working C++ toolchain on CPU, never on MPS."""
    if os.environ.get("DISABLE_COMPILE", "").lower() not in ("", "0", "false", "no"):
        return False, "DISABLE_COMPILE is set"
    if device.type == "mps":
        return False, "torch.compile is not reliable on MPS"
    if device.type == "cuda":
        if importlib.util.find_spec("triton") is None:
            return False, "Triton is not installed"
        return True, "CUDA with Triton"
    return cpu_toolchain()


def compile_decision(device: torch.device, requested: bool | str = "auto") -> tuple[bool, str]:
    """Whether to ``torch.compile`` the model, and why.

    Args:
        requested: ``"auto"`` (on for CUDA, and for the CPU when its C++ toolchain works; off on MPS),
            True (on wherever it can run) or False.
    """
    if requested is False:
        return False, "compile=false"
    ok, why = compile_support(device)
    if not ok:
        return False, why
    return True, f"{why}; compile={'auto' if requested == 'auto' else 'true'}"


def host_memory(field: str = "MemTotal") -> int:
    """Host RAM in bytes: a /proc/meminfo field (``MemTotal`` or ``MemAvailable``), else the physical total
    from ``sysconf``, else 0."""
    try:
        with open("/proc/meminfo", encoding="utf-8") as f:
            return int(re.search(rf"{field}:\s+(\d+) kB", f.read()).group(1)) * 1024
    except (OSError, AttributeError):
        pass
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return 0


def memory_available(device: torch.device) -> int:
    """Bytes a run can use on ``device``: the GPU's total memory, the Metal working-set limit, or the host's
    available RAM (``MemAvailable``; the total where that is unknown)."""
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).total_memory
    if device.type == "mps":
        return torch.mps.recommended_max_memory()
    return host_memory("MemAvailable") or 1 << 62


def describe(device: torch.device) -> str:
    """One line naming the hardware behind ``device`` (GPU name and memory, or CPU threads)."""
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        return (f"{props.name}, {props.total_memory / 2**30:.1f} GiB, CUDA {torch.version.cuda}, "
                f"cuDNN {torch.backends.cudnn.version()}")
    if device.type == "mps":
        return f"Apple Silicon GPU (MPS), macOS {platform.mac_ver()[0]}"
    threads = torch.get_num_threads()
    return f"CPU {cpu_name()}, {threads} thread{'s' * (threads != 1)}"

