"""Training-step speed of HRM and TRM: examples/s eager and compiled, and the fraction of the machine's matmul peak.

Each model is built from its recipe (config/<recipe>.yaml, arch and global batch) on Sudoku shapes
(81 cells, vocabulary 11, one puzzle identifier) in the precision a run would pick (bf16 where the
hardware runs it natively, else fp32). One step is what pretrain.py does per batch: one ACT segment
forward, the backward, the AdamATan2 and sign-SGD updates, zero_grad.

Rounds are interleaved: each round times one eager step, one compiled step and one large square GEMM
in the same dtype (the matmul peak), seconds apart, so a slow spell on a shared machine hits all three
and cancels in the per-round ratios; the table gives the median over rounds. Matmul FLOPs per step are
counted once by torch.utils.flop_counter.FlopCounterMode on an eager step (forward and backward,
attention included; elementwise ops are not counted), so "of peak" is the share of the GEMM's rate the step reaches.

Beside the reference (``--reference-dir``, a checkout of SamsungSAILMontreal/TinyRecursiveModels, never part of
this repository): four processes per TRM model, the project's eager and compiled steps and the reference code's
eager and compiled ones (scripts/reference_trm.py: its model and loss head, the project's AdamATan2, since the
reference's is a CUDA extension), on the same configuration, batch, dtype and batch contents. Each round asks
every process in turn (the order rotating) for about 2 s of steps and times the GEMM in this process while they
wait (the fastest of three, as its threads wake from idle); the ratios are medians of per-round ratios.

    python scripts/benchmark_step.py                                   # CPU: every model, batch 64, 5 rounds
    python scripts/benchmark_step.py --models trm_cpu,hrm_cpu --rounds 20
    python scripts/benchmark_step.py --device cuda                     # each recipe's own batch
    python scripts/benchmark_step.py --models trm_cpu --no-compile arch.hidden_size=64   # arch overrides
    python scripts/benchmark_step.py --reference-dir ../TinyRecursiveModels        # trm_cpu and trm_mlp, side by side
    python scripts/benchmark_step.py --device cuda --models hrm_v1,trm_mlp,trm_att --profile 10   # where the time goes
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from utils.bench import PROTOCOL, SUDOKU, not_a_checkout, paired_median, serve_steps, sudoku_batch  # noqa: E402
from utils.cli import ArgumentParser, positive_int  # noqa: E402

# torch, the models and the trainer's parts are imported where they are used: they take seconds to load, and --help
# or a bad command line is answered before any of them (main checks the command line first, as pretrain.py does).
if TYPE_CHECKING:
    import torch

# name -> (recipe, what it is)
MODELS = {
    "hrm_v1": ("cfg_pretrain", "HRM, the reference 27M hrm_v1"),
    "hrm_cpu": ("cfg_pretrain_cpu", "HRM, the CPU quickstart"),
    "trm_att": ("cfg_pretrain_trm_sudoku_att", "TRM attention, the reference Sudoku recipe"),
    "trm_mlp": ("cfg_pretrain_trm_sudoku_mlp", "TRM-MLP (mlp_t), the reference Sudoku recipe"),
    "trm_cpu": ("cfg_pretrain_trm_cpu", "TRM-MLP (mlp_t), the CPU quickstart"),
}
CPU_BATCH = 64  # the reference batches (768) take tens of seconds per step on a few CPU cores
REFERENCE_MODELS = ("trm_cpu", "trm_mlp")  # the quickstart and the Sudoku MLP recipe


def cpu_attention_flops() -> dict:
    """FlopCounterMode's ``custom_mapping`` for the CPU attention kernels: it knows the CUDA ones but not these, so
    they are counted with torch's own SDPA formulas (the arguments arrive as shapes)."""
    import torch
    from torch.utils.flop_counter import sdpa_backward_flop_count, sdpa_flop_count

    def forward(query, key, value, *args, out_val=None, **kwargs) -> int:
        return sdpa_flop_count(query, key, value)

    def backward(grad_out, query, key, value, *args, out_val=None, **kwargs) -> int:
        return sdpa_backward_flop_count(grad_out, query, key, value)

    return {torch.ops.aten._scaled_dot_product_flash_attention_for_cpu: forward,
            torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward: backward}


def recipe_arch(recipe: str, overrides: list[str]) -> tuple[dict, int]:
    """The validated ``arch`` and ``global_batch_size`` of ``config/<recipe>.yaml`` with ``key=value`` overrides.

    Raises:
        ConfigError: a bad recipe or override.
    """
    from models import validate_arch
    from utils.config import recipe_config

    cfg = recipe_config(recipe, overrides)
    return validate_arch(cfg.arch), cfg.global_batch_size


class Trainer:
    """One model with its optimizers and ACT carry; :meth:`step` runs one training step through the eager or the
    compiled model, as :meth:`forward` gives it."""

    def __init__(self, arch: dict, batch_size: int, device: torch.device, dtype: torch.dtype):
        import torch

        from models import build_model
        from models.sparse_embedding import SparseEmbeddingSignSGD
        from utils.optimizer_utils import get_adam_atan2_optimizer

        torch.manual_seed(0)
        self.head = build_model(arch, batch_size=batch_size, dtype=dtype, device=device, **SUDOKU)
        self.optimizers = [get_adam_atan2_optimizer(self.head.model.parameters(), lr=1e-4, betas=(0.9, 0.95),
                                                    weight_decay=0.1)]
        if self.head.model.config.puzzle_emb_ndim > 0:
            self.optimizers.append(SparseEmbeddingSignSGD([self.head.model.puzzle_emb], lr=1e-2, weight_decay=0.1))
        self.batch = sudoku_batch(batch_size, device)
        self.carry = self.head.initial_carry(self.batch)
        self.batch_size = batch_size
        self.params = sum(p.numel() for p in self.head.model.parameters())

    def forward(self, compiled: bool):
        """What :meth:`step` runs the batch through: the loss head, or it under torch.compile (eager fallback)."""
        from utils.hardware_optimizer import compile_model

        return compile_model(self.head) if compiled else self.head

    def step(self, forward) -> None:
        self.carry, loss, _, _, _ = forward(self.carry, self.batch)
        (loss / self.batch_size).backward()
        for opt in self.optimizers:
            opt.step()
            opt.zero_grad(set_to_none=True)

    def matmul_flops(self) -> int:
        """Matmul and attention FLOPs of one eager step (forward and backward), counted by FlopCounterMode."""
        from torch.utils.flop_counter import FlopCounterMode

        counter = FlopCounterMode(display=False, custom_mapping=cpu_attention_flops())
        with counter:
            self.step(self.head)
        return counter.get_total_flops()


def device_and_dtype(name: str, forced: str = "auto") -> tuple[torch.device, torch.dtype, str]:
    """The device ``--device`` names, the precision a run would pick on it (``forced``: ``--dtype``, as a run's
    ``forward_dtype``) and why.

    Raises:
        DeviceError: ``name`` is not a device of this machine.
    """
    from utils.device import select_device, select_dtype

    device = select_device(name).device
    dtype, why = select_dtype(device, forced)
    return device, dtype, why


def synchronizer(device: torch.device):
    import torch

    return {"cuda": torch.cuda.synchronize, "mps": torch.mps.synchronize}.get(device.type, lambda: None)


def timed(fn, sync) -> float:
    sync()
    start = time.perf_counter()
    fn()
    sync()
    return time.perf_counter() - start


def gemm(n: int, device: torch.device, dtype: torch.dtype):
    """A function running one ``n x n`` GEMM (``2 n^3`` FLOPs) in ``dtype``."""
    import torch

    a, b = torch.randn(n, n, device=device).to(dtype), torch.randn(n, n, device=device).to(dtype)
    return lambda: torch.mm(a, b)


def bench_model(name: str, arch: dict, batch_size: int, device: torch.device, dtype: torch.dtype, args) -> dict:
    """Warm up, then ``args.rounds`` interleaved rounds of an eager step, a compiled step and the peak GEMM.

    Returns one row: sizes, FLOPs per example, medians of examples/s, and the per-round ratios.
    """
    sync = synchronizer(device)
    trainer = Trainer(arch, batch_size, device, dtype)
    flops = trainer.matmul_flops()
    peak = gemm(args.gemm_size, device, dtype)
    modes = {"eager": trainer.forward(compiled=False)}
    if not args.no_compile:
        modes["compiled"] = trainer.forward(compiled=True)
    warmup_s = {mode: sum(timed(lambda: trainer.step(fwd), sync) for _ in range(args.warmup)) for mode, fwd in modes.items()}
    for _ in range(2):
        peak()
    times: dict[str, list[float]] = {mode: [] for mode in [*modes, "gemm"]}
    for _ in range(args.rounds):
        for mode, fwd in modes.items():
            times[mode].append(timed(lambda: trainer.step(fwd), sync))
        times["gemm"].append(timed(peak, sync))
    gemm_flops = 2 * args.gemm_size**3
    row = {"model": name, "recipe": MODELS.get(name, (name,))[0], "params": trainer.params, "batch": batch_size,
           "dtype": str(dtype).removeprefix("torch."), "flops_per_step": flops, "gflop_per_example": flops / batch_size / 1e9,
           "peak_gflop_s": gemm_flops / statistics.median(times["gemm"]) / 1e9}
    for mode in modes:
        row[f"{mode}_examples_s"] = batch_size / statistics.median(times[mode])
        row[f"{mode}_of_peak"] = statistics.median(flops / t / (gemm_flops / g) for t, g in zip(times[mode], times["gemm"]))
        row[f"{mode}_first_steps_s"] = warmup_s[mode]
    if "compiled" in modes:
        row["compiled_speedup"] = paired_median(times["eager"], times["compiled"])
    return row



# ---- side by side with the reference TRM code (--reference-dir) ----------------------------------------------

REPO = Path(__file__).resolve().parents[1]
ROUND_S = 2.0  # each timing covers about this many seconds of steps


class Worker:
    """One training step in its own process, which serves it with ``utils.bench.serve_steps`` (this script's worker
    or ``scripts/reference_trm.py``'s).

    Raises:
        RuntimeError: the worker process ended early (its own error message is on stderr above).
    """

    def __init__(self, label: str, argv: list[str]):
        self.label = label
        self.proc = subprocess.Popen([sys.executable, *argv], cwd=REPO, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     text=True)
        self.info = json.loads(self._reply())
        self.steps = max(1, round(ROUND_S / self.info["step_s"]))

    def _reply(self) -> str:
        while line := self.proc.stdout.readline():
            if line.startswith(PROTOCOL):
                return line[len(PROTOCOL):]
            print(line, end="", file=sys.stderr)
        raise RuntimeError(f"the {self.label} worker exited with code {self.proc.wait()}")

    def seconds_per_step(self) -> float:
        self.proc.stdin.write(f"{self.steps}\n")
        self.proc.stdin.flush()
        return float(self._reply()) / self.steps

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.stdin.write("\n")
            self.proc.stdin.flush()
        self.proc.wait()


def reference_arch(arch: dict, dtype: torch.dtype) -> dict:
    """The project's validated TRM ``arch`` in the reference config's keys (the same names, less the registry
    entries, plus ``forward_dtype``)."""
    return {**{k: v for k, v in arch.items() if k not in ("name", "loss")},
            "forward_dtype": str(dtype).removeprefix("torch.")}


def side_by_side_workers(name: str, arch: dict, batch_size: int, dtype: torch.dtype, args) -> dict[str, Worker]:
    """The four processes of one model: the project eager and compiled, the reference eager and compiled."""
    project = [str(Path(__file__).resolve()), "--worker", "--models", name, "--batch-size", str(batch_size),
               "--warmup", str(args.warmup), "--dtype", args.dtype, *args.overrides]
    reference = [str(REPO / "scripts" / "reference_trm.py"), "--reference-dir", args.reference_dir]
    step = ["step-worker", "--arch", json.dumps(reference_arch(arch, dtype)), "--batch-size", str(batch_size),
            "--warmup", str(args.warmup)]
    workers = {}
    try:
        for label, argv in (("eager", [*project, "--no-compile"]), ("compiled", project),
                            ("reference", [*reference, *step]), ("reference compiled", [*reference, "--compile", *step])):
            workers[label] = Worker(label, argv)
    except BaseException:
        for worker in workers.values():
            worker.close()
        raise
    return workers


def bench_side_by_side(name: str, arch: dict, batch_size: int, device: torch.device, dtype: torch.dtype, args) -> dict:
    """Interleaved rounds over the four processes of :func:`side_by_side_workers` and the peak GEMM (timed here,
    while the workers wait); the order of the processes rotates every round. Returns one table row."""
    workers = side_by_side_workers(name, arch, batch_size, dtype, args)
    peak = gemm(args.gemm_size, device, dtype)
    peak()
    times: dict[str, list[float]] = {label: [] for label in [*workers, "gemm"]}
    try:
        for r in range(args.rounds):
            labels = list(workers)[r % len(workers):] + list(workers)[:r % len(workers)]
            for label in labels:
                times[label].append(workers[label].seconds_per_step())
            times["gemm"].append(min(timed(peak, lambda: None) for _ in range(3)))  # this process's threads wake up
    finally:
        for worker in workers.values():
            worker.close()
    flops, gemm_flops = workers["eager"].info["flops"], 2 * args.gemm_size**3
    row = {"model": name, "recipe": MODELS[name][0], "params": workers["eager"].info["params"],
           "reference_params": workers["reference"].info["params"], "batch": batch_size,
           "dtype": str(dtype).removeprefix("torch."), "gflop_per_example": flops / batch_size / 1e9,
           "peak_gflop_s": gemm_flops / statistics.median(times["gemm"]) / 1e9}
    for label in workers:
        key = label.replace(" ", "_")
        row[f"{key}_examples_s"] = batch_size / statistics.median(times[label])
        row[f"{key}_of_peak"] = statistics.median(flops / t / (gemm_flops / g) for t, g in zip(times[label], times["gemm"]))
    for label in ("reference", "reference compiled"):
        row[f"compiled_vs_{label.replace(' ', '_')}"] = paired_median(times[label], times["compiled"])
    return row


def format_side_by_side(rows: list[dict]) -> str:
    """The side-by-side rows as a Markdown table. "ceiling vs reference eager" is 1 / (the reference eager step's
    share of the GEMM peak): how many times the reference's speed a step of the same matmul FLOPs would reach if it
    ran entirely at the GEMM's rate, with no elementwise work. No implementation of the same algorithm passes it."""
    head = ["model", "params (project / reference)", "batch", "dtype", "project eager ex/s", "project compiled ex/s",
            "reference eager ex/s", "reference compiled ex/s", "compiled vs reference eager",
            "compiled vs reference compiled", "project compiled of peak", "reference eager of peak",
            "ceiling vs reference eager"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        cells = [r["model"], f"{r['params']:,} / {r['reference_params']:,}", r["batch"], r["dtype"],
                 f"{r['eager_examples_s']:.1f}", f"{r['compiled_examples_s']:.1f}", f"{r['reference_examples_s']:.1f}",
                 f"{r['reference_compiled_examples_s']:.1f}", f"{r['compiled_vs_reference']:.2f}x",
                 f"{r['compiled_vs_reference_compiled']:.2f}x", f"{r['compiled_of_peak']:.0%}",
                 f"{r['reference_of_peak']:.0%}", f"{1 / r['reference_of_peak']:.2f}x"]
        lines.append("| " + " | ".join(map(str, cells)) + " |")
    return "\n".join(lines)


def serve_worker(args) -> int:
    """``--worker``: this process is one side of :func:`side_by_side_workers` (eager also counts the FLOPs)."""
    (name,) = args.models.split(",")
    arch, _ = recipe_arch(MODELS[name][0], args.overrides)
    device, dtype, _ = device_and_dtype(args.device, args.dtype)
    trainer = Trainer(arch, args.batch_size, device, dtype)
    info = {"params": trainer.params}
    if args.no_compile:
        info["flops"] = trainer.matmul_flops()
    forward = trainer.forward(compiled=not args.no_compile)
    serve_steps(lambda: trainer.step(forward), info, args.warmup)
    return 0


def profile_model(name: str, arch: dict, batch_size: int, device: torch.device, dtype: torch.dtype, args) -> str:
    """``args.profile`` steps of one model under torch.profiler after the warm-up; returns where the step's time
    goes (utils/step_profile.py: kernels by time, the GEMM share, launch gaps, host syncs), headed by the model and
    the step time. On a CPU the compiled step's C++ kernels are recorded one by one (inductor's
    ``cpp.enable_kernel_profile``), so they appear by name as a GPU's kernels do."""
    import torch._inductor.config as inductor

    from utils.step_profile import profiled_steps

    with inductor.patch({"cpp.enable_kernel_profile": device.type == "cpu"}):
        trainer = Trainer(arch, batch_size, device, dtype)
        forward = trainer.forward(compiled=not args.no_compile)
        for _ in range(args.warmup):
            trainer.step(forward)
        profile, seconds = profiled_steps(lambda: trainer.step(forward), args.profile, device, synchronizer(device))
    mode = "eager" if args.no_compile else "compiled"
    return (f"\n{name} ({mode}, batch {batch_size}, {str(dtype).removeprefix('torch.')}): {seconds * 1e3:.1f} ms per "
            f"step under the profiler\n" + profile.report())


def format_table(rows: list[dict]) -> str:
    """The rows as a Markdown table; columns of the compiled mode only when it was timed."""
    compiled = all("compiled_examples_s" in r for r in rows)
    head = ["model", "recipe", "params", "batch", "dtype", "matmul GFLOP/example", "eager ex/s", "eager of peak"]
    if compiled:
        head += ["compiled ex/s", "compiled of peak", "compiled/eager", "first compiled steps s"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        cells = [r["model"], r["recipe"], f"{r['params'] / 1e6:.2f}M", r["batch"], r["dtype"],
                 f"{r['gflop_per_example']:.2f}", f"{r['eager_examples_s']:.1f}", f"{r['eager_of_peak']:.0%}"]
        if compiled:
            cells += [f"{r['compiled_examples_s']:.1f}", f"{r['compiled_of_peak']:.0%}", f"{r['compiled_speedup']:.2f}x",
                      f"{r['compiled_first_steps_s']:.0f}"]
        lines.append("| " + " | ".join(map(str, cells)) + " |")
    return "\n".join(lines)


def parse_args(argv: list[str] | None):
    """The command line (default: ``sys.argv``), every check that needs no model made.

    Raises:
        SystemExit: 0 after ``--help``; 2 after one ``error:`` line for a bad command line.
    """
    summary, details = __doc__.split("\n\n", 1)
    parser = ArgumentParser(description=summary, epilog=details, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default=None,
                        help=f"comma list of {', '.join(f'{k} ({v[1]})' for k, v in MODELS.items())} (default: all; "
                             f"with --reference-dir: {','.join(REFERENCE_MODELS)})")
    parser.add_argument("--reference-dir", default=None,
                        help="a checkout of SamsungSAILMontreal/TinyRecursiveModels: time the project's eager and compiled "
                             "steps beside the reference code's eager and compiled ones, each in its own process, on the "
                             "same configuration, batch and dtype (TRM models, CPU; scripts/reference_trm.py)")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--device", default="cpu", help="cpu, cuda, cuda:N, mps or auto (default: cpu)")
    parser.add_argument("--dtype", choices=("auto", "bfloat16", "float32"), default="auto",
                        help="the precision, as a run's forward_dtype (default auto: bf16 where the device runs it "
                             "natively, else float32)")
    parser.add_argument("--batch-size", type=positive_int, default=None,
                        help=f"rows per step (default: {CPU_BATCH} on a CPU, each recipe's global_batch_size elsewhere)")
    parser.add_argument("--rounds", type=positive_int, default=5,
                        help="timed interleaved rounds per model (default: 5)")
    parser.add_argument("--warmup", type=positive_int, default=2,
                        help="untimed steps per mode first, compilation included (default: 2)")
    parser.add_argument("--gemm-size", type=positive_int, default=None,
                        help="side of the peak GEMM (default: 2048 CPU, 8192 GPU)")
    parser.add_argument("--no-compile", action="store_true", help="time the eager step only")
    parser.add_argument("--json", action="store_true", help="also print each row as one JSON line")
    parser.add_argument("--profile", type=positive_int, default=0, metavar="N",
                        help="instead of the table: N compiled steps (eager with --no-compile) of each model under "
                             "torch.profiler, and where their time goes: kernels by time, the GEMM and attention "
                             "shares, the gaps between kernels, the host syncs with the line that causes each")
    parser.add_argument("overrides", nargs="*", metavar="key=value", help="settings applied to every recipe, e.g. arch.hidden_size=64")
    args = parser.parse_args(argv)
    args.models = args.models or ",".join(REFERENCE_MODELS if args.reference_dir else MODELS)
    unknown = [m for m in args.models.split(",") if m not in MODELS]
    if unknown:
        parser.error(f"--models: unknown {', '.join(unknown)}; choose from {', '.join(MODELS)}")
    if args.reference_dir:
        if args.device != "cpu" or args.no_compile or args.profile:
            parser.error("--reference-dir times the CPU steps, compiled and eager: leave out --device, --no-compile "
                         "and --profile")
        if problem := not_a_checkout(args.reference_dir):
            parser.error(problem)
        not_trm = [m for m in args.models.split(",") if not m.startswith("trm")]
        if not_trm:
            parser.error(f"--reference-dir: {', '.join(not_trm)} is not a TRM model; choose from "
                         f"{', '.join(m for m in MODELS if m.startswith('trm'))}")
    return args


def main(argv: list[str] | None = None) -> int:
    """Benchmark as the command line (default: ``sys.argv``) says; the exit code."""
    args = parse_args(argv)
    if args.worker:
        return serve_worker(args)

    import torch

    from utils.hardware_optimizer import machine_line
    from utils.run.main import cli_main

    def body() -> int:
        device, dtype, why = device_and_dtype(args.device, args.dtype)
        args.gemm_size = args.gemm_size or (2048 if device.type == "cpu" else 8192)
        timing = (f"{args.profile} profiled steps per model" if args.profile else
                  f"median of {args.rounds} interleaved rounds; peak = {args.gemm_size}x{args.gemm_size} "
                  f"{str(dtype).removeprefix('torch.')} GEMM timed in each round")
        print(f"{machine_line(device)}\nprecision {str(dtype).removeprefix('torch.')} ({why}); one step = segment "
              f"forward + backward + optimizer updates; {timing}", flush=True)
        rows = []
        for name in args.models.split(","):
            arch, recipe_batch = recipe_arch(MODELS[name][0], args.overrides)
            batch = args.batch_size or (CPU_BATCH if device.type == "cpu" else recipe_batch)
            if args.profile:
                print(profile_model(name, arch, batch, device, dtype, args), flush=True)
                continue
            bench = bench_side_by_side if args.reference_dir else bench_model
            rows.append(bench(name, arch, batch, device, dtype, args))
            if args.json:
                print(json.dumps(rows[-1]), flush=True)
        if args.profile:
            return 0
        print(f"\nmatmul peak: {statistics.median(r['peak_gflop_s'] for r in rows):.0f} GFLOP/s (median over models)")
        print(format_side_by_side(rows) if args.reference_dir else format_table(rows))
        return 0

    try:
        return cli_main(body)
    except torch.OutOfMemoryError as e:
        print(f"error: out of memory ({str(e).splitlines()[0]}); use a smaller --batch-size", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
