"""Attention on a CPU: torch's SDPA on bf16 q, k, v against SDPA on fp32 copies and the project's choice.

Why the project runs CPU attention in fp32 (``models.layers.sdpa_in_float32``): PyTorch's CPU
flash-attention kernel is much slower in bf16 than in fp32 at the recursive models' shapes; and why it
attends short sequences by the definition (``models.layers.SHORT_SEQUENCE``): there the flash kernel's
blocking costs more than it saves. The variants are timed in interleaved rounds (forward + backward,
then a forward alone, of each per round, so a slow spell on a shared machine hits all) and the table
gives the median ms and the median per-round ratio to the bf16 kernel, measured in this run. Each
variant's output and input gradients are also compared with a float64 computation (relative Frobenius
error), so the speed-up is not bought with accuracy.

    python scripts/benchmark_attention.py                       # [64, 4, 100, 32]: the maze quickstart
    python scripts/benchmark_attention.py --shape 64,8,81,64 --compile
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from models.layers import sdpa  # noqa: E402
from utils.bench import paired_ratio  # noqa: E402
from utils.cli import ArgumentParser  # noqa: E402
from utils.hardware_optimizer import machine_line  # noqa: E402


def sdpa_bf16(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """SDPA on the bf16 tensors as given ([B, H, S, D] each -> [B, H, S, D] bf16)."""
    return F.scaled_dot_product_attention(q, k, v)


def sdpa_fp32(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """SDPA (its flash kernel) on fp32 copies of the bf16 tensors, the result in bf16."""
    return F.scaled_dot_product_attention(q.float(), k.float(), v.float()).to(q.dtype)


VARIANTS = {"SDPA on bf16 (baseline)": sdpa_bf16, "SDPA on fp32 copies": sdpa_fp32,
            "the project's (models.layers.sdpa)": sdpa}


def relative_errors(fn, shape: tuple[int, ...], seed: int = 0) -> tuple[float, float]:
    """(output error, largest input-gradient error) of ``fn`` on bf16 inputs against float64 SDPA."""
    gen = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(shape, generator=gen).to(torch.bfloat16).requires_grad_() for _ in range(3))
    grad = torch.randn(shape, generator=gen).to(torch.bfloat16)
    out = fn(q, k, v)
    out.backward(grad)
    exact = [t.detach().double().requires_grad_() for t in (q, k, v)]
    out64 = F.scaled_dot_product_attention(*exact)
    out64.backward(grad.double())

    def rel(a: torch.Tensor, b: torch.Tensor) -> float:
        return ((a.double() - b).norm() / b.norm()).item()

    return rel(out, out64), max(rel(t.grad, e.grad) for t, e in zip((q, k, v), exact))


def time_rounds(fns: dict, shape: tuple[int, ...], rounds: int, warmup: int) -> dict[tuple[str, str], list[float]]:
    """Seconds of one forward + backward ("train") and of one forward under no_grad ("forward") of each function
    per round, keyed (name, kind), the functions interleaved."""
    q, k, v = (torch.randn(shape, dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
    grad = torch.randn(shape, dtype=torch.bfloat16)
    times: dict[tuple[str, str], list[float]] = {(name, kind): [] for name in fns for kind in ("train", "forward")}
    for i in range(warmup + rounds):
        for name, fn in fns.items():
            start = time.perf_counter()
            fn(q, k, v).backward(grad)
            middle = time.perf_counter()
            with torch.no_grad():
                fn(q, k, v)
            if i >= warmup:
                times[name, "train"].append(middle - start)
                times[name, "forward"].append(time.perf_counter() - middle)
    return times


def parse_shape(text: str) -> tuple[int, ...]:
    """"B,H,S,D" -> (B, H, S, D), each a positive integer."""
    try:
        shape = tuple(int(x) for x in text.split(","))
    except ValueError:
        shape = ()
    if len(shape) != 4 or min(shape) < 1:
        raise argparse.ArgumentTypeError(f"--shape {text!r}: give batch,heads,seq_len,head_dim, e.g. 64,4,100,32")
    return shape


def main(argv: list[str] | None = None) -> None:
    parser = ArgumentParser(description=__doc__.split("\n\n")[0],
                            formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shape", type=parse_shape, default=(64, 4, 100, 32),
                        help="batch,heads,seq_len,head_dim (default: 64,4,100,32, the maze quickstart's attention)")
    parser.add_argument("--rounds", type=int, default=30, help="timed rounds (default: 30)")
    parser.add_argument("--warmup", type=int, default=3, help="untimed rounds first (default: 3)")
    parser.add_argument("--compile", action="store_true", help="time both under torch.compile, as training runs")
    args = parser.parse_args(argv)
    if args.rounds < 1 or args.warmup < 0:
        parser.error("--rounds must be >= 1 and --warmup >= 0")

    fns = {name: torch.compile(fn) if args.compile else fn for name, fn in VARIANTS.items()}
    times = time_rounds(fns, args.shape, args.rounds, args.warmup)
    first = next(iter(VARIANTS))
    print(f"machine: {machine_line()}")
    print(f"attention [B, H, S, D] = {list(args.shape)}, {'compiled' if args.compile else 'eager'}, "
          f"{args.rounds} rounds\n")
    print("| variant | forward + backward ms (median) | time vs bf16 | forward ms | time vs bf16 "
          "| output error | gradient error |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for name, fn in VARIANTS.items():
        out_err, grad_err = relative_errors(fn, args.shape)
        cells = [f"{1000 * statistics.median(times[name, kind]):.1f} | {paired_ratio(times[name, kind], times[first, kind])}"
                 for kind in ("train", "forward")]
        print(f"| {name} | {' | '.join(cells)} | {out_err:.2e} | {grad_err:.2e} |")


if __name__ == "__main__":
    main()
