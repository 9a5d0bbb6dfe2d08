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

    python scripts/benchmark_step.py                                   # CPU: every model, batch 64, 5 rounds
    python scripts/benchmark_step.py --models trm_cpu,hrm_cpu --rounds 20
    python scripts/benchmark_step.py --device cuda                     # each recipe's own batch
    python scripts/benchmark_step.py --models trm_cpu --no-compile arch.hidden_size=64   # arch overrides
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402
from torch.utils.flop_counter import FlopCounterMode, sdpa_backward_flop_count, sdpa_flop_count  # noqa: E402

from models import build_model, validate_arch  # noqa: E402
from models.sparse_embedding import SparseEmbeddingSignSGD  # noqa: E402
from utils.config import recipe_config  # noqa: E402
from utils.device import select_device, select_dtype  # noqa: E402
from utils.hardware_optimizer import compile_model, machine_line  # noqa: E402
from utils.optimizer_utils import get_adam_atan2_optimizer  # noqa: E402
from utils.run.main import ArgumentParser, cli_main  # noqa: E402

# name -> (recipe, what it is)
MODELS = {
    "hrm_v1": ("cfg_pretrain", "HRM, the reference 27M hrm_v1"),
    "hrm_cpu": ("cfg_pretrain_cpu", "HRM, the CPU quickstart"),
    "trm_att": ("cfg_pretrain_trm_sudoku_att", "TRM attention, the reference Sudoku recipe"),
    "trm_mlp": ("cfg_pretrain_trm_sudoku_mlp", "TRM-MLP (mlp_t), the reference Sudoku recipe"),
    "trm_cpu": ("cfg_pretrain_trm_cpu", "TRM-MLP (mlp_t), the CPU quickstart"),
}
SUDOKU = dict(seq_len=81, vocab_size=11, num_puzzle_identifiers=1)
CPU_BATCH = 64  # the reference batches (768) take tens of seconds per step on a few CPU cores


def _cpu_sdpa_flops(query, key, value, *args, out_val=None, **kwargs) -> int:
    return sdpa_flop_count(query, key, value)


def _cpu_sdpa_backward_flops(grad_out, query, key, value, *args, out_val=None, **kwargs) -> int:
    return sdpa_backward_flop_count(grad_out, query, key, value)


# FlopCounterMode knows the CUDA attention kernels but not the CPU one; count it with torch's own SDPA formulas
# (arguments arrive as shapes).
CPU_ATTENTION_FLOPS = {torch.ops.aten._scaled_dot_product_flash_attention_for_cpu: _cpu_sdpa_flops,
                       torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward: _cpu_sdpa_backward_flops}


def recipe_arch(recipe: str, overrides: list[str]) -> tuple[dict, int]:
    """The validated ``arch`` and ``global_batch_size`` of ``config/<recipe>.yaml`` with ``key=value`` overrides.

    Raises:
        ConfigError: a bad recipe or override.
    """
    cfg = recipe_config(recipe, overrides)
    return validate_arch(cfg.arch), cfg.global_batch_size


def sudoku_batch(batch_size: int, device: torch.device, seed: int = 0) -> dict[str, torch.Tensor]:
    """A random batch in the Sudoku layout: ``inputs`` [B, 81] tokens 1..10, ``labels`` [B, 81] 2..10, ids [B] 0."""
    gen = torch.Generator().manual_seed(seed)
    labels = torch.randint(2, 11, (batch_size, 81), generator=gen, dtype=torch.int32)
    inputs = torch.where(torch.rand(batch_size, 81, generator=gen) < 0.5, labels, torch.ones_like(labels))
    return {"inputs": inputs.to(device), "labels": labels.to(device),
            "puzzle_identifiers": torch.zeros(batch_size, dtype=torch.int32, device=device)}


class Trainer:
    """One model with its optimizers and ACT carry; :meth:`step` runs one training step through ``forward``."""

    def __init__(self, arch: dict, batch_size: int, device: torch.device, dtype: torch.dtype):
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

    def step(self, forward) -> None:
        self.carry, loss, _, _, _ = forward(self.carry, self.batch)
        (loss / self.batch_size).backward()
        for opt in self.optimizers:
            opt.step()
            opt.zero_grad(set_to_none=True)

    def matmul_flops(self) -> int:
        """Matmul and attention FLOPs of one eager step (forward and backward), counted by FlopCounterMode."""
        counter = FlopCounterMode(display=False, custom_mapping=CPU_ATTENTION_FLOPS)
        with counter:
            self.step(self.head)
        return counter.get_total_flops()


def synchronizer(device: torch.device):
    return {"cuda": torch.cuda.synchronize, "mps": torch.mps.synchronize}.get(device.type, lambda: None)


def timed(fn, sync) -> float:
    sync()
    start = time.perf_counter()
    fn()
    sync()
    return time.perf_counter() - start


def gemm(n: int, device: torch.device, dtype: torch.dtype):
    """A function running one ``n x n`` GEMM (``2 n^3`` FLOPs) in ``dtype``."""
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
    modes = {"eager": trainer.head}
    if not args.no_compile:
        modes["compiled"] = compile_model(trainer.head)
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
        row["compiled_speedup"] = statistics.median(e / c for e, c in zip(times["eager"], times["compiled"]))
    return row



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
    summary, details = __doc__.split("\n\n", 1)
    parser = ArgumentParser(description=summary, epilog=details, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default=",".join(MODELS),
                        help=f"comma list of {', '.join(f'{k} ({v[1]})' for k, v in MODELS.items())} (default: all)")
    parser.add_argument("--device", default="cpu", help="cpu, cuda, cuda:N, mps or auto (default: cpu)")
    parser.add_argument("--batch-size", type=int, default=None,
                        help=f"rows per step (default: {CPU_BATCH} on a CPU, each recipe's global_batch_size elsewhere)")
    parser.add_argument("--rounds", type=int, default=5, help="timed interleaved rounds per model (default: 5)")
    parser.add_argument("--warmup", type=int, default=2, help="untimed steps per mode first, compilation included (default: 2)")
    parser.add_argument("--gemm-size", type=int, default=None, help="side of the peak GEMM (default: 2048 CPU, 8192 GPU)")
    parser.add_argument("--no-compile", action="store_true", help="time the eager step only")
    parser.add_argument("--json", action="store_true", help="also print each row as one JSON line")
    parser.add_argument("overrides", nargs="*", metavar="key=value", help="settings applied to every recipe, e.g. arch.hidden_size=64")
    args = parser.parse_args(argv)
    unknown = [m for m in args.models.split(",") if m not in MODELS]
    if unknown:
        parser.error(f"--models: unknown {', '.join(unknown)}; choose from {', '.join(MODELS)}")
    if args.rounds < 1 or args.warmup < 1 or (args.batch_size is not None and args.batch_size < 1):
        parser.error("--rounds, --warmup and --batch-size must be >= 1")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)

    def body() -> int:
        device = select_device(args.device).device
        dtype, why = select_dtype(device)
        args.gemm_size = args.gemm_size or (2048 if device.type == "cpu" else 8192)
        print(f"{machine_line(device)}\nprecision {str(dtype).removeprefix('torch.')} ({why}); one step = segment "
              f"forward + backward + optimizer updates; median of {args.rounds} interleaved rounds; peak = "
              f"{args.gemm_size}x{args.gemm_size} {str(dtype).removeprefix('torch.')} GEMM timed in each round", flush=True)
        rows = []
        for name in args.models.split(","):
            arch, recipe_batch = recipe_arch(MODELS[name][0], args.overrides)
            batch = args.batch_size or (CPU_BATCH if device.type == "cpu" else recipe_batch)
            rows.append(bench_model(name, arch, batch, device, dtype, args))
            if args.json:
                print(json.dumps(rows[-1]), flush=True)
        print(f"\nmatmul peak: {statistics.median(r['peak_gflop_s'] for r in rows):.0f} GFLOP/s (median over models)")
        print(format_table(rows))
        return 0

    try:
        return cli_main(body)
    except torch.OutOfMemoryError as e:
        print(f"error: out of memory ({str(e).splitlines()[0]}); use a smaller --batch-size", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
