"""Segment passes a second at test time: one puzzle answered in K rollouts, the rollouts one forward call each with
the SwiGLU out of place (as before rollouts were answered side by side), all K in one call, and side by side as
utils/eval/reasoning.py now does (``rows_per_call``: on a CPU about a thousand tokens a call), measured in this run,
interleaved, on the same puzzle and seeds; the answers of all three are compared.

A segment pass is one ACT segment of one rollout of one puzzle: what solve.py, the page, evaluate.py and anytime
solving (utils/solve/anytime.py) spend. The table gives, for each K, the median over ``--repeats`` of passes a second
for each way, the ratio of now to before, and whether the answers agree (every rollout's answer equal, q_halt within
1e-4); the first lines name the machine and its fp32 GEMM rate, measured in this run.

    python scripts/benchmark_passes.py                                   # the bundled Sudoku model, K = 1..256
    python scripts/benchmark_passes.py --checkpoint RUN --rollouts 1,16 --threads 1
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path
from typing import Optional

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script: make the repo root importable

from utils.cli import ArgumentParser, positive_int  # noqa: E402

HARD_SUDOKU = "...3...9.2....9..1...5...3...94...151....8...6.4...7.8..2.64....9..3.4...8..5...."  # the README's puzzle


def counts(text: str) -> list[int]:
    """``1,4,16`` as whole numbers of 1 to 1024.

    Raises:
        argparse.ArgumentTypeError: anything else.
    """
    values = [part.strip() for part in text.split(",")]
    if not values or not all(v.isdecimal() and 1 <= int(v) <= 1024 for v in values):
        raise argparse.ArgumentTypeError(f"{text!r}: give rollout counts from 1 to 1024, comma-separated")
    return [int(v) for v in values]


def parse_args(argv: Optional[list[str]]) -> argparse.Namespace:
    parser = ArgumentParser(prog="benchmark_passes.py", description=__doc__.split("\n\n")[0],
                            formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__.split("\n\n", 3)[-1])
    parser.add_argument("--checkpoint", help="a Sudoku checkpoint (default: the bundled sudoku_hard_trm.pt)")
    parser.add_argument("--sudoku", default=HARD_SUDOKU, help="the puzzle, 81 characters (default: the README's)")
    parser.add_argument("--rollouts", type=counts, default=[1, 4, 16, 64, 256], metavar="K,K,...",
                        help="rollouts of the puzzle, each a row of the table (default: 1,4,16,64,256)")
    parser.add_argument("--segments", type=int, default=4, help="segments a rollout (default: 4, the card's)")
    parser.add_argument("--repeats", type=int, default=3, help="timed repeats of each way, interleaved (default: 3)")
    parser.add_argument("--threads", type=positive_int, default=None, help="torch threads (default: torch's, all cores)")
    parser.add_argument("--min-seconds", type=float, default=1.0, metavar="S",
                        help="each measurement, and the GEMM's, repeats its work for at least S seconds: shorter is "
                             "noisier (default: 1.0)")
    args = parser.parse_args(argv)
    for flag in ("segments", "repeats", "threads"):
        value = getattr(args, flag)
        if value is not None and value < 1:
            parser.error(f"--{flag} {value} is out of range: at least 1")
    if not 0 < args.min_seconds <= 600:
        parser.error(f"--min-seconds {args.min_seconds} is out of range: more than 0, at most 600")
    return args


def main(argv: Optional[list[str]] = None) -> int:
    args = parse_args(argv)
    import torch

    from utils.data.user_puzzles import parse_sudoku
    from utils.solve.solving import open_model
    from utils.hardware_optimizer import machine_line
    from utils.run.estimate import matmul_rate
    from utils.run.main import cli_main

    def run() -> int:
        if args.threads:
            torch.set_num_threads(args.threads)
        cpu = torch.device("cpu")
        tokens = torch.from_numpy(parse_sudoku(args.sudoku, "--sudoku").astype("int32"))[None]  # before the model
        trained = open_model(args.checkpoint, "sudoku", 81, 1, cpu, torch.float32)
        print(machine_line(cpu))
        rate = matmul_rate(cpu, torch.float32, seconds=args.min_seconds)
        print(f"fp32 GEMM 1024^3, this run: {rate / 1e9:.0f} GFLOP/s; model: {trained.path.name}, {args.segments} "
              "segments a rollout")
        print(f"\n| rollouts K | {' | '.join(f'{way} (passes/s)' for way in WAYS)} | now / before | answers agree |")
        print(f"|---:|{'---:|' * len(WAYS)}---:|---|")
        for k in args.rollouts:
            rates, agree = measure(trained, tokens, k, args.segments, args.repeats, args.min_seconds)
            before, now = rates[next(iter(WAYS))], rates[list(WAYS)[-1]]
            print(f"| {k} | {' | '.join(f'{r:.1f}' for r in rates.values())} | {now / before:.2f}x | "
                  f"{'yes' if agree else 'NO'} |", flush=True)
        return 0

    return cli_main(run)


WAYS = {  # name: (ROLLOUT_ROWS, CPU_TOKENS_PER_CALL) of utils/eval/reasoning.py, SwiGLU in place without autograd
    "one rollout a call (before)": (1, 10**9, False),
    "all K in one call": (1024, 10**9, True),
    "side by side, <=1024 tokens a call (now)": (None, None, True),  # the module's own settings
}


def out_of_place_swiglu(self, x):
    """models.layers.SwiGLU.forward as it was before it ran in place without autograd: the before's baseline."""
    import torch.nn.functional as F

    gate, up = self.gate_up_proj(x).chunk(2, dim=-1)
    return self.down_proj(F.silu(gate) * up)


def measure(trained, tokens, k: int, segments: int, repeats: int,
            min_seconds: float) -> tuple[dict[str, float], bool]:
    """Median passes a second of ``k`` rollouts of ``tokens`` [1, 81] in each of :data:`WAYS`, each timed over at
    least ``min_seconds`` (short runs carry the clock's noise), and whether all ways give the same answers."""
    import torch

    from models.layers import SwiGLU
    from utils.eval import reasoning
    from utils.eval.reasoning import TestTimeCompute

    batch = {"inputs": tokens, "labels": tokens.long(), "puzzle_identifiers": torch.zeros(1, dtype=torch.int32)}
    ttc = TestTimeCompute(segments=segments, rollouts=k, noise=0.5 if k > 1 else 0.0)
    own = reasoning.ROLLOUT_ROWS, reasoning.CPU_TOKENS_PER_CALL, SwiGLU.forward
    rates: dict[str, list[float]] = {way: [] for way in WAYS}
    answers = {}
    try:
        for _ in range(repeats + 1):  # the first of each is a warm-up, not counted
            for way, (rows, tokens_per_call, in_place) in WAYS.items():
                reasoning.ROLLOUT_ROWS, reasoning.CPU_TOKENS_PER_CALL = (rows or own[0], tokens_per_call or own[1])
                SwiGLU.forward = own[2] if in_place else out_of_place_swiglu
                start, runs = time.perf_counter(), 0
                while not runs or time.perf_counter() - start < min_seconds:
                    answers[way] = list(reasoning.rollouts(trained.head, trained.head, batch, ttc))
                    runs += 1
                rates[way].append(runs * k * segments / (time.perf_counter() - start))
    finally:
        reasoning.ROLLOUT_ROWS, reasoning.CPU_TOKENS_PER_CALL, SwiGLU.forward = own
    first, *others = answers.values()
    agree = all(torch.equal(a["preds"], b["preds"]) and
                torch.allclose(a["q_halt_logits"], b["q_halt_logits"], rtol=1e-4, atol=1e-4)
                for other in others for a, b in zip(first, other))
    return {way: statistics.median(r[1:]) for way, r in rates.items()}, agree


if __name__ == "__main__":
    sys.exit(main())
