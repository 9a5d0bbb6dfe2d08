"""Tests for utils/hardware_optimizer.py.

CPU paths run for real. CUDA and MPS paths run by simulation: the torch.cuda / torch.mps functions the
module reads are monkeypatched with fixed answers, so these tests need no GPU and never skip.
"""

import os
import platform
import re
import shutil
import subprocess
import sys
import textwrap
import warnings
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from torch import nn

import utils.device as device_mod
import utils.hardware_optimizer as ho
from utils.config import ConfigError

GiB = 2**30


def _cpu_flags() -> set[str]:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            return set(re.findall(r"\w+", f.read()))
    except OSError:
        return set()


@pytest.fixture
def fake_cuda(monkeypatch):
    """A simulated CUDA GPU; change ``gpu.name/memory/cc`` in the test before calling the code."""
    gpu = SimpleNamespace(name="NVIDIA GeForce RTX 4090", memory=23.6 * GiB, cc=(8, 9))
    monkeypatch.setattr(torch.cuda, "get_device_properties",
                        lambda device=None: SimpleNamespace(name=gpu.name, total_memory=int(gpu.memory)))
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: gpu.cc)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(torch.backends.cudnn, "version", lambda: 91000)
    return gpu


@pytest.fixture
def fake_mac(monkeypatch):
    """A simulated Apple Silicon Mac on macOS 14 with a 21 GiB Metal working-set limit."""
    mac = SimpleNamespace(version="14.5")
    monkeypatch.setattr(platform, "system", lambda: "Darwin")
    monkeypatch.setattr(platform, "mac_ver", lambda: (mac.version, ("", "", ""), "arm64"))
    monkeypatch.setattr(torch.mps, "recommended_max_memory", lambda: 21 * GiB)
    return mac


@pytest.fixture
def restore_torch_settings():
    saved = (torch.get_float32_matmul_precision(), torch.backends.cudnn.benchmark, torch.get_num_threads())
    yield
    torch.set_float32_matmul_precision(saved[0])
    torch.backends.cudnn.benchmark = saved[1]
    torch.set_num_threads(saved[2])


# ---- detection -----------------------------------------------------------------------------------

def test_detect_cpu_reports_native_bf16_from_the_cpu_flags():
    info = ho.detect_gpu_info("cpu")
    flags = _cpu_flags()
    assert info["device"] == "cpu" and not info["gpu_available"] and info["gpu_memory_gb"] is None
    assert info["supports_bfloat16"] == bool({"avx512_bf16", "amx_bf16"} & flags)
    assert set(info["cpu_bf16_features"]) == {"avx512_bf16", "amx_bf16", "amx_tile"} & flags
    assert info["cpu_cores"] >= 1 and info["system_memory_gb"] > 0 and not info["supports_tf32"]


@pytest.mark.parametrize("cc,bf16", [((8, 6), True), ((9, 0), True), ((7, 5), False)])
def test_detect_cuda_gates_bf16_and_tf32_on_compute_capability(fake_cuda, cc, bf16):
    fake_cuda.cc = cc
    info = ho.detect_gpu_info("cuda")
    assert info["gpu_name"] == "NVIDIA GeForce RTX 4090" and info["gpu_memory_gb"] == pytest.approx(23.6)
    assert info["compute_capability"] == cc and info["cudnn_version"] == 91000
    assert info["supports_bfloat16"] is bf16 and info["supports_tf32"] is bf16
    assert ("emulated" in info["bfloat16_reason"]) is not bf16


@pytest.mark.parametrize("macos,bf16", [("14.5", True), ("13.6", False)])
def test_detect_mps_bf16_needs_macos_14(fake_mac, macos, bf16):
    fake_mac.version = macos
    info = ho.detect_gpu_info("mps")
    assert info["device"] == "mps" and info["gpu_memory_gb"] == 21 and info["supports_bfloat16"] is bf16


# ---- profiles ------------------------------------------------------------------------------------

@pytest.mark.parametrize("memory,profile", [(80, "gpu_24gb"), (23.6, "gpu_24gb"), (15.7, "gpu_16gb"),
                                            (11.7, "gpu_16gb"), (10.75, "gpu_low_mem"), (7.8, "gpu_low_mem")])
def test_memory_classes(memory, profile):
    rec = ho.get_recommended_config(gpu_memory_gb=memory)
    assert rec["profile"] == profile and rec["effective_batch_size"] == rec["batch_size"] * rec["accumulation_steps"]


def test_every_profile_has_the_same_knobs_and_cape_keeps_batch_16():
    keys = {"global_batch_size", "batch_size", "accumulation_steps", "num_workers"}  # memory-dependent knobs only
    assert set(ho.HARDWARE_PROFILES) == set(ho.PROFILE_DESCRIPTIONS) == {
        "gpu_24gb", "gpu_16gb", "gpu_low_mem", "apple_silicon", "cpu"}
    for knobs in ho.HARDWARE_PROFILES.values():
        assert set(knobs) == keys and knobs["batch_size"] * knobs["accumulation_steps"] == 16


def test_auto_profile_from_each_kind_of_device(fake_cuda, fake_mac, monkeypatch):
    monkeypatch.delenv("DISABLE_COMPILE", raising=False)
    name, knobs, reason = ho.resolve_hardware_profile("auto", "cuda")
    assert name == "gpu_24gb" and knobs["global_batch_size"] == 768 and "RTX 4090 has 23.6 GiB" in reason
    assert knobs["num_workers"] == min(8, ho.get_optimal_num_workers())
    fake_cuda.memory = 8 * GiB
    assert ho.resolve_hardware_profile(None, torch.device("cuda", 0))[0] == "gpu_low_mem"
    name, knobs, _ = ho.resolve_hardware_profile("auto", "mps")
    assert name == "apple_silicon" and knobs["global_batch_size"] == 256
    assert ho.resolve_hardware_profile("auto", "cpu")[0] == "cpu"


def test_core_count_caps_the_workers(fake_cuda, monkeypatch):
    monkeypatch.setattr(ho, "_cpu_count", lambda: 3)
    name, knobs, reason = ho.resolve_hardware_profile("auto", "cuda")
    assert knobs["num_workers"] == 2 and "capped at 2 by 3 CPU cores" in reason
    assert ho.HARDWARE_PROFILES[name]["num_workers"] == 8  # the table is copied, not changed


def test_explicit_profiles_are_validated():
    with pytest.raises(ConfigError, match=r"hardware='gpu_4090' is not a profile: use auto or one of gpu_24gb"):
        ho.resolve_hardware_profile("gpu_4090", "cpu")
    name, knobs, reason = ho.resolve_hardware_profile("gpu_low_mem", "cpu")
    assert name == "gpu_low_mem" and "made for cuda, running on cpu" in reason
    with pytest.raises(ValueError, match="positive"):
        ho.get_recommended_config(gpu_memory_gb=0)


@pytest.mark.parametrize("cores,workers", [(1, 0), (2, 1), (6, 5), (64, 8)])
def test_optimal_num_workers(monkeypatch, cores, workers):
    monkeypatch.setattr(ho, "_cpu_count", lambda: cores)
    assert ho.get_optimal_num_workers() == workers


def test_training_commands_per_device():
    assert ho.training_commands("cpu", "cpu") == {
        "hrm": "python pretrain.py --config-name=cfg_pretrain_cpu hardware=cpu",
        "cape": "./START_CAPE_TRAINING.sh --hardware cpu"}
    assert ho.training_commands("apple_silicon", "mps")["hrm"].startswith("python pretrain.py --config-name=cfg_pretrain_apple_silicon ")
    assert ho.training_commands("gpu_16gb", "cuda")["hrm"] == "python pretrain.py --config-name=cfg_pretrain hardware=gpu_16gb"


def test_cli_report_on_this_cpu(capsys):
    ho.main(["--device", "cpu", "--gpu-memory-gb", "12"])
    out = capsys.readouterr().out
    bf16 = bool({"avx512_bf16", "amx_bf16"} & _cpu_flags())
    assert f"bfloat16       {'yes' if bf16 else 'no'}:" in out
    assert f"training dtype {'bfloat16' if bf16 else 'float32'}" in out
    assert "python pretrain.py --config-name=cfg_pretrain_cpu hardware=cpu" in out
    assert "./START_CAPE_TRAINING.sh --hardware cpu" in out
    assert "For a 12 GiB NVIDIA GPU: profile gpu_16gb" in out and "hardware=gpu_16gb" in out


def test_cli_rejects_missing_device(capsys):
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA, so device=cuda is valid here")
    with pytest.raises(SystemExit) as exit_info:
        ho.main(["--device", "cuda"])
    assert exit_info.value.code == 2 and "CUDA is not available" in capsys.readouterr().err


def test_cuda_report_by_simulation(fake_cuda, monkeypatch):
    monkeypatch.delenv("DISABLE_COMPILE", raising=False)
    fake_cuda.memory, fake_cuda.name = 11.7 * GiB, "NVIDIA GeForce RTX 3060"
    text = ho.hardware_report("cuda")
    assert "1 x NVIDIA GeForce RTX 3060, 11.7 GiB, compute capability 8.9" in text
    assert "Recommended profile: gpu_16gb" in text and "--config-name=cfg_pretrain hardware=gpu_16gb" in text


# ---- settings ------------------------------------------------------------------------------------

@pytest.mark.parametrize("cc,tf32,precision", [((8, 0), True, "high"), ((8, 0), False, "highest"),
                                                ((7, 5), True, "highest")])
def test_tf32_through_matmul_precision_only(fake_cuda, restore_torch_settings, cc, tf32, precision):
    fake_cuda.cc = cc
    applied = ho.optimize_pytorch_settings({"tf32": tf32, "cudnn_benchmark": True}, device="cuda")
    assert applied["float32_matmul_precision"] == precision == torch.get_float32_matmul_precision()
    assert applied["cudnn_benchmark"] and torch.backends.cudnn.benchmark


def test_cpu_settings_threads_and_validation(restore_torch_settings):
    before = torch.get_float32_matmul_precision()
    assert ho.optimize_pytorch_settings({"num_threads": 1}, device="cpu") == {"device": "cpu", "num_threads": 1}
    assert torch.get_num_threads() == 1 and torch.get_float32_matmul_precision() == before
    with pytest.raises(ValueError, match="unknown keys"):
        ho.optimize_pytorch_settings({"tf_32": True}, device="cpu")
    with pytest.raises(ValueError, match="num_threads=0"):
        ho.optimize_pytorch_settings({"num_threads": 0}, device="cpu")


def test_memory_efficient_mode_on_cuda_by_simulation(fake_cuda, restore_torch_settings, monkeypatch):
    cuda = SimpleNamespace(initialized=False, emptied=0)
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: cuda.initialized)
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: setattr(cuda, "emptied", cuda.emptied + 1))
    for var in ("PYTORCH_ALLOC_CONF", "PYTORCH_CUDA_ALLOC_CONF"):
        monkeypatch.setenv(var, "x")  # recorded, so monkeypatch restores the real value afterwards
        monkeypatch.delenv(var)
    torch.backends.cudnn.benchmark = True
    # Before CUDA starts: there is no cache yet, but the allocator can still be configured.
    done = ho.enable_memory_efficient_mode("cuda")
    assert done == ["garbage collected", "cuDNN benchmark off", "PYTORCH_ALLOC_CONF=expandable_segments:True"]
    assert not torch.backends.cudnn.benchmark and cuda.emptied == 0
    assert os.environ["PYTORCH_ALLOC_CONF"] == "expandable_segments:True"
    # After: the cache is emptied; the allocator setting would come too late.
    cuda.initialized = True
    assert ho.enable_memory_efficient_mode("cuda")[-1] == "CUDA cache emptied" and cuda.emptied == 1
    assert ho.enable_memory_efficient_mode("cpu") == ["garbage collected"]


# ---- compile with fallback -----------------------------------------------------------------------

class Tiny(nn.Module):
    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(4, 3)

    def forward(self, x):
        return torch.tanh(self.proj(x))

    def initial_carry(self, batch_size: int):
        return torch.zeros(batch_size, 3)


def test_compile_failure_on_first_call_falls_back_to_eager_with_one_warning(monkeypatch):
    monkeypatch.delenv("DISABLE_COMPILE", raising=False)

    def broken_backend(graph_module, example_inputs):  # what a missing C++ compiler looks like to dynamo
        raise RuntimeError("InvalidCxxCompiler: No working C++ compiler found")

    torch.manual_seed(0)
    model, x = Tiny(), torch.randn(5, 4)
    wrapped = ho.compile_model(model, mode=None, backend=broken_backend)  # compile is lazy: nothing fails yet
    assert isinstance(wrapped, ho.CompiledWithFallback) and wrapped.compile_error is None
    with pytest.warns(RuntimeWarning, match="torch.compile failed.*No working C\\+\\+ compiler") as record:
        out = wrapped(x)
    assert len(record) == 1 and torch.equal(out, model(x))
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the second call must not warn again
        assert torch.equal(wrapped(x), model(x))
    assert list(wrapped.state_dict()) == ["_orig_mod.proj.weight", "_orig_mod.proj.bias"]
    assert torch.equal(wrapped.initial_carry(2), torch.zeros(2, 3))


def test_compile_success_uses_the_compiled_graph(monkeypatch):
    monkeypatch.delenv("DISABLE_COMPILE", raising=False)
    compiled_graphs = []

    def counting_backend(graph_module, example_inputs):
        compiled_graphs.append(graph_module)
        return graph_module.forward

    model, x = Tiny(), torch.randn(5, 4)
    wrapped = ho.compile_model(model, mode=None, backend=counting_backend)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        torch.testing.assert_close(wrapped(x), model(x))
        wrapped(x)
    assert len(compiled_graphs) == 1 and wrapped.compile_error is None


def test_compile_oom_is_not_hidden_by_the_fallback(monkeypatch):
    monkeypatch.delenv("DISABLE_COMPILE", raising=False)

    def oom_backend(graph_module, example_inputs):
        def run(*args):
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
        return run

    wrapped = ho.compile_model(Tiny(), mode=None, backend=oom_backend)
    with pytest.raises(torch.OutOfMemoryError):
        wrapped(torch.randn(2, 4))
    assert wrapped.compile_error is None


class Stop(BaseException):
    """Stands for utils.run.stop.StoppedAtOnce: an exception a signal handler raises, not an error."""


def test_an_interrupt_that_the_compiler_wraps_is_raised_not_taken_for_a_compile_failure(monkeypatch):
    monkeypatch.delenv("DISABLE_COMPILE", raising=False)

    def interrupted_backend(graph_module, example_inputs):  # the signal lands in torch's code, which wraps it
        try:
            raise Stop("SIGTERM")
        except Stop as stop:
            raise RuntimeError("compilation failed") from stop

    wrapped = ho.compile_model(Tiny(), mode=None, backend=interrupted_backend)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no "torch.compile failed" warning
        with pytest.raises(Stop, match="SIGTERM"):
            wrapped(torch.randn(2, 4))
    assert wrapped.compile_error is None
    assert ho.wrapped_interrupt(RuntimeError("no interrupt in its chain")) is None


def test_compile_decision_is_taken_once_by_the_device_policy(monkeypatch):
    cpu, mps, cuda = torch.device("cpu"), torch.device("mps"), torch.device("cuda")
    assert device_mod.compile_decision(cpu, False) == (False, "compile=false")
    assert device_mod.compile_decision(mps, "auto") == (False, "torch.compile is not reliable on MPS")
    monkeypatch.setattr(device_mod, "cpu_toolchain", lambda: (False, "no C++ compiler (g++/c++/clang++) on PATH"))
    assert device_mod.compile_decision(cpu, "auto") == (False, "no C++ compiler (g++/c++/clang++) on PATH")
    monkeypatch.setattr(device_mod, "cpu_toolchain", lambda: (True, "C++ toolchain works (g++)"))
    assert device_mod.compile_decision(cpu, "auto") == (True, "C++ toolchain works (g++); compile=auto")
    monkeypatch.setattr(device_mod.importlib.util, "find_spec", lambda name: None)
    assert device_mod.compile_decision(cuda, True) == (False, "Triton is not installed")
    monkeypatch.setenv("DISABLE_COMPILE", "true")
    assert device_mod.compile_decision(cpu, True) == (False, "DISABLE_COMPILE is set")


def test_cpu_toolchain_check_compiles_against_python_headers(monkeypatch):
    device_mod.cpu_toolchain.cache_clear()
    ok, why = device_mod.cpu_toolchain()
    assert ok == (shutil.which("g++") is not None or shutil.which("c++") is not None), why
    monkeypatch.setenv("CXX", "/nonexistent/c++")
    device_mod.cpu_toolchain.cache_clear()
    assert device_mod.cpu_toolchain() == (False, "no C++ compiler (g++/c++/clang++) on PATH")
    device_mod.cpu_toolchain.cache_clear()


# ---- measuring -----------------------------------------------------------------------------------

def test_benchmark_dataloader_skips_the_warmup_batch(monkeypatch):
    clock = SimpleNamespace(t=0.0)
    monkeypatch.setattr(ho.time, "perf_counter", lambda: clock.t)

    def loader():  # batch i takes 0.1 * (i + 1) seconds on the fake clock
        for i in range(5):
            clock.t += 0.1 * (i + 1)
            yield i

    assert ho.benchmark_dataloader(loader(), num_batches=3) == pytest.approx((0.2 + 0.3 + 0.4) / 3)
    assert ho.benchmark_dataloader(loader(), num_batches=10) == pytest.approx((0.2 + 0.3 + 0.4 + 0.5) / 4)
    with pytest.raises(ValueError, match="no batches"):
        ho.benchmark_dataloader([], 3)
    with pytest.raises(ValueError, match="only one batch"):
        ho.benchmark_dataloader([1], 3)
    with pytest.raises(ValueError, match="num_batches=0"):
        ho.benchmark_dataloader([1, 2], 0)


def test_benchmark_a_real_dataloader():
    data = torch.utils.data.TensorDataset(torch.arange(32.0))
    assert ho.benchmark_dataloader(torch.utils.data.DataLoader(data, batch_size=4), num_batches=4) > 0


def test_memory_tracker_cpu_sees_a_64_mib_tensor():
    # A fresh interpreter: in a long test session the allocator may hand back memory that is already resident.
    code = textwrap.dedent("""
        import torch
        import utils.hardware_optimizer as ho
        tracker = ho.MemoryTracker("cpu")
        base = tracker.current
        x = torch.ones(16 * 2**20)  # 64 MiB of float32, written, so resident
        assert tracker.update() - base >= 48 * 2**20, (tracker.current, base)
        del x
        tracker.update()  # a 64 MiB block is mmap-backed and goes back to the OS when freed
        assert tracker.peak - base >= 48 * 2**20 and tracker.current < tracker.peak - 32 * 2**20
        stats = tracker.stats()
        assert 0 < stats["utilization"] < 1 and stats["total_gb"] > stats["peak_gb"]
        assert "CPU (process RSS) memory on cpu" in tracker.report()
        print("ok")
    """)
    result = subprocess.run([sys.executable, "-c", code], cwd=Path(__file__).resolve().parent.parent,
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0 and "Peak:" in result.stdout and result.stdout.strip().endswith("ok"), result.stderr


def test_memory_tracker_cuda_by_simulation(fake_cuda, monkeypatch):
    mem = SimpleNamespace(current=1 * GiB, peak=1 * GiB)
    monkeypatch.setattr(torch.cuda, "memory_allocated", lambda device=None: mem.current)
    monkeypatch.setattr(torch.cuda, "max_memory_allocated", lambda device=None: mem.peak)
    monkeypatch.setattr(torch.cuda, "reset_peak_memory_stats", lambda device=None: setattr(mem, "peak", mem.current))
    fake_cuda.memory = 24 * GiB
    tracker = ho.MemoryTracker(torch.device("cuda", 0))
    mem.current, mem.peak = 2 * GiB, 6 * GiB  # a spike between two update() calls
    tracker.update()
    assert tracker.stats() == {"current_gb": 2.0, "peak_gb": 6.0, "total_gb": 24.0, "utilization": 0.25}
    tracker.reset()
    assert (tracker.current, tracker.peak) == (2 * GiB, 2 * GiB)


def test_memory_tracker_mps_by_simulation(fake_mac, monkeypatch):
    mem = SimpleNamespace(current=0)
    monkeypatch.setattr(torch.mps, "current_allocated_memory", lambda: mem.current)
    monkeypatch.setattr(torch.mps, "driver_allocated_memory", lambda: 5 * GiB)
    tracker = ho.MemoryTracker("mps")
    for gib in (1, 3, 2):
        mem.current = gib * GiB
        tracker.update()
    stats = tracker.stats()
    assert (stats["current_gb"], stats["peak_gb"], stats["driver_gb"], stats["total_gb"]) == (2, 3, 5, 21)
    assert "Metal driver: 5.00 GiB" in tracker.report()


# ---- OOM handling --------------------------------------------------------------------------------

@pytest.mark.parametrize("exc,oom", [
    (torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB"), True),
    (RuntimeError("MPS backend out of memory (MPS allocated: 17.5 GB, other allocations: 1.2 GB, max allowed: "
                  "18.1 GB). Tried to allocate 256 MB on private pool."), True),
    (RuntimeError("CUDA error: out of memory"), True),
    (RuntimeError("cuDNN error: CUDNN_STATUS_ALLOC_FAILED"), True),
    (RuntimeError("[enforce fail at alloc_cpu.cpp:117] DefaultCPUAllocator: not enough memory: you tried to "
                  "allocate 4096 bytes."), True),
    (MemoryError(), True),
    (RuntimeError("mat1 and mat2 shapes cannot be multiplied (2x3 and 4x5)"), False),
    (ValueError("batch is out of range"), False),
])
def test_is_oom_error(exc, oom):
    assert ho.is_oom_error(exc) is oom


def _oom_above(limit, calls):
    def step(batch_size):
        calls.append(batch_size)
        if batch_size > limit:
            raise torch.OutOfMemoryError(f"CUDA out of memory at batch {batch_size}")
        return f"ran {batch_size}"
    return step


def test_oom_backoff_halves_until_it_fits():
    calls = []
    assert ho.run_with_oom_backoff(_oom_above(5, calls), 32) == ("ran 4", 4)
    assert calls == [32, 16, 8, 4]
    calls = []
    assert ho.run_with_oom_backoff(_oom_above(3, calls), 16, min_batch_size=3) == ("ran 3", 3)
    assert calls == [16, 8, 4, 3]


def test_oom_backoff_gives_up_at_the_minimum_and_passes_other_errors_through():
    calls = []
    with pytest.raises(RuntimeError, match="even at batch_size=2 \\(min_batch_size=2\\)") as info:
        ho.run_with_oom_backoff(_oom_above(0, calls), 8, min_batch_size=2)
    assert calls == [8, 4, 2] and isinstance(info.value.__cause__, torch.OutOfMemoryError)

    def shape_bug(batch_size):
        calls.append(batch_size)
        raise RuntimeError("mat1 and mat2 shapes cannot be multiplied")

    calls = []
    with pytest.raises(RuntimeError, match="shapes cannot be multiplied"):
        ho.run_with_oom_backoff(shape_bug, 8)
    assert calls == [8]
    with pytest.raises(ValueError, match="batch_size >= min_batch_size >= 1"):
        ho.run_with_oom_backoff(shape_bug, 2, min_batch_size=4)


def test_configure_backends_sets_determinism_both_ways(request):
    """device=cpu: a process that runs several trainings keeps no earlier run's choice, whether the run compiles
    (torch's setter, which tells inductor too) or not (torch's flag alone, without loading the compiler)."""
    from utils.device import configure_backends

    before = torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled()
    request.addfinalizer(lambda: torch.use_deterministic_algorithms(before[0], warn_only=before[1]))
    for compiling in (False, True):
        for deterministic, warn_only in ((True, False), (True, True), (False, False)):
            configure_backends(torch.device("cpu"), deterministic=deterministic, warn_only=warn_only,
                               compiling=compiling)
            assert torch.are_deterministic_algorithms_enabled() == deterministic
            assert torch.is_deterministic_algorithms_warn_only_enabled() == warn_only
            if compiling:
                import torch._inductor.config as inductor_config

                assert inductor_config.deterministic == deterministic


def test_a_run_that_does_not_compile_leaves_the_compiler_unloaded():
    """device=cpu: the setting costs no compiler import (about 3 s a process on a 2-core CPU)."""
    probe = ("import sys, torch\nfrom utils.device import configure_backends\n"
             "configure_backends(torch.device('cpu'), deterministic=True, compiling=False)\n"
             "assert torch.are_deterministic_algorithms_enabled()\n"
             "print('torch._inductor.config' in sys.modules)")
    done = subprocess.run([sys.executable, "-c", probe], cwd=Path(__file__).resolve().parent.parent,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and done.stdout.strip() == "False", done.stderr
