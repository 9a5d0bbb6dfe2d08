"""Optimizer step time: our AdamATan2 (eager and compiled) against torch's AdamW and other AdamATan2s.

Two parameter sets: HRM's (hrm_v1 on Sudoku: 36 fp32 tensors, 27,275,266 parameters; the puzzle
embedding is a buffer trained by sign-SGD, so it is not here) and one tensor of the same size.
Every optimizer gets its own copy of the parameters with fixed random gradients; the timed
steps of all optimizers are interleaved round by round, so load from other processes hits them
alike. Reported: median and minimum ms per step after warm-up, and the median over rounds of the
per-round ratio to fused AdamW and to adam-atan2-pytorch (when installed). adam-atan2-pytorch
(lucidrains) is a different algorithm (a = 1.27, its own weight decay), listed for speed only.

    python scripts/benchmark_optimizers.py                      # CPU, both sets, 30 timed steps
    python scripts/benchmark_optimizers.py --device cuda --steps 100
"""

from __future__ import annotations

import argparse
import importlib.util
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from utils.bench import paired_ratio  # noqa: E402
from utils.cli import ArgumentParser, positive_int  # noqa: E402
from utils.device import select_device  # noqa: E402
from utils.hardware_optimizer import machine_line  # noqa: E402
from utils.optimizer_utils import AdamATan2, native_unavailable_reason  # noqa: E402

LR, BETAS, WEIGHT_DECAY = 1e-4, (0.9, 0.95), 0.1  # HRM's cfg_pretrain


def hrm_shapes(hidden: int = 512, layers_per_level: int = 4, vocab: int = 11) -> list[tuple[int, ...]]:
    """Parameter shapes of HRM hrm_v1 (docs/REFERENCE.md, HRM): 4 H + 4 L blocks, embeddings, heads."""
    inter = -(-round(4 * hidden * 2 / 3) // 256) * 256  # SwiGLU width rounded up to a multiple of 256: 1536
    block = [(3 * hidden, hidden), (hidden, hidden), (2 * inter, hidden), (hidden, inter)]  # qkv, o, gate_up, down
    return block * (2 * layers_per_level) + [(vocab, hidden), (vocab, hidden), (2, hidden), (2,)]


def candidates(device: torch.device, compile_ours: bool) -> list[tuple[str, object, str]]:
    """(name, factory(params) -> optimizer, note) for every optimizer available here."""
    kw = dict(lr=LR, betas=BETAS, weight_decay=WEIGHT_DECAY)
    out = [("AdamATan2 ours, eager", lambda p: AdamATan2(p, **kw), "")]
    if compile_ours:
        out.append(("AdamATan2 ours, compile=True", lambda p: AdamATan2(p, compile=True, **kw), ""))
    out += [("AdamW foreach", lambda p: torch.optim.AdamW(p, foreach=True, **kw), "not AdamATan2"),
            ("AdamW fused", lambda p: torch.optim.AdamW(p, fused=True, **kw), "not AdamATan2; baseline")]
    if importlib.util.find_spec("adam_atan2_pytorch"):
        from adam_atan2_pytorch import AdamAtan2 as Lucidrains

        out.append(("adam-atan2-pytorch", lambda p: Lucidrains(p, **kw), "DIFFERENT algorithm (a=1.27)"))
    if native_unavailable_reason({device}) is None:
        from adam_atan2 import AdamATan2 as Native

        out.append(("adam-atan2 native CUDA", lambda p: Native(p, **kw), "same algorithm"))
    return out


def make_params(shapes, device: torch.device, seed: int = 0) -> list[torch.nn.Parameter]:
    """Parameters ~ N(0, 0.02^2) with gradients ~ N(0, 0.001^2), fp32, on ``device``."""
    gen = torch.Generator().manual_seed(seed)
    params = []
    for shape in shapes:
        p = torch.nn.Parameter((torch.randn(shape, generator=gen) * 0.02).to(device))
        p.grad = (torch.randn(shape, generator=gen) * 1e-3).to(device)
        params.append(p)
    return params


def bench_set(name: str, shapes, device: torch.device, args) -> list[dict]:
    """Warm up every optimizer, then time ``args.steps`` interleaved rounds; one row per optimizer."""
    sync = {"cuda": torch.cuda.synchronize, "mps": torch.mps.synchronize}.get(device.type, lambda: None)
    runs = []
    for label, factory, note in candidates(device, not args.no_compile):
        opt = factory(make_params(shapes, device))
        start = time.perf_counter()
        for _ in range(args.warmup):
            opt.step()
        sync()
        runs.append(dict(label=label, opt=opt, note=note, warmup_s=time.perf_counter() - start, times=[]))
    for _ in range(args.steps):
        for run in runs:
            start = time.perf_counter()
            run["opt"].step()
            sync()
            run["times"].append(time.perf_counter() - start)
    times = {r["label"]: r["times"] for r in runs}
    n = sum(torch.Size(s).numel() for s in shapes)
    print(f"\n{name}: {len(shapes)} tensors, {n:,} parameters, fp32, {device}")
    print("| optimizer | ms/step median | ms/step min | vs fused AdamW | vs adam-atan2-pytorch | warm-up s | note |")
    print("|---|---:|---:|---:|---:|---:|---|")
    for r in runs:
        vs_fused = paired_ratio(r["times"], times["AdamW fused"])
        vs_lucid = paired_ratio(r["times"], times["adam-atan2-pytorch"]) if "adam-atan2-pytorch" in times else "-"
        print(f"| {r['label']} | {statistics.median(r['times']) * 1e3:.1f} | {min(r['times']) * 1e3:.1f} | "
              f"{vs_fused} | {vs_lucid} | {r['warmup_s']:.1f} | {r['note']} |")
        r.pop("opt")
    return runs


def main(argv: list[str] | None = None) -> int:
    summary, details = __doc__.split("\n\n", 1)
    parser = ArgumentParser(description=summary, epilog=details,
                            formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cpu", help="cpu, cuda, cuda:N, mps or auto (default: cpu)")
    parser.add_argument("--steps", type=int, default=30, help="timed steps per optimizer (default: 30)")
    parser.add_argument("--warmup", type=int, default=3, help="untimed steps first; includes compilation (default: 3)")
    parser.add_argument("--sets", default="hrm,single", help="comma list of hrm, single (default: both)")
    parser.add_argument("--no-compile", action="store_true",
                        help="skip our compile=True row (its warm-up takes up to a minute on CPU)")
    parser.add_argument("--threads", type=positive_int, default=None, help="torch.set_num_threads (default: torch's choice)")
    args = parser.parse_args(argv)
    if args.steps < 1 or args.warmup < 1:
        parser.error("--steps and --warmup must be >= 1")
    sets = {"hrm": ("HRM hrm_v1 (Sudoku, vocab 11)", hrm_shapes()),
            "single": ("one large tensor", [(sum(torch.Size(s).numel() for s in hrm_shapes()),)])}
    unknown = set(args.sets.split(",")) - set(sets)
    if unknown:
        parser.error(f"--sets: unknown {', '.join(sorted(unknown))}; choose from {', '.join(sets)}")
    if args.threads:
        torch.set_num_threads(args.threads)
    device = select_device(args.device).device
    print(f"{machine_line(device)}\nlr {LR}, betas {BETAS}, weight_decay {WEIGHT_DECAY}; "
          f"median of {args.steps} interleaved steps after {args.warmup} warm-up steps")
    for key in args.sets.split(","):
        bench_set(*sets[key], device, args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
