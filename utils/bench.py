"""What the benchmark scripts share: paired ratios, and the step benchmark's worker protocol and batch.

A benchmark times its candidates interleaved, round by round, so a slow spell on a shared machine hits them alike;
:func:`paired_median` then pairs the rounds. ``scripts/benchmark_step.py`` times each training step in its own
process (the project's, and the reference's through ``scripts/reference_trm.py``): both sides serve steps with
:func:`serve_steps` on the same :func:`sudoku_batch`.
"""

from __future__ import annotations

import json
import statistics
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Callable

# torch is imported where a batch is made: the step benchmark's scripts check their command lines with this module
# before torch loads (seconds), so --help and a bad argument are answered at once.
if TYPE_CHECKING:
    import torch

SUDOKU = dict(seq_len=81, vocab_size=11, num_puzzle_identifiers=1)  # the data sizes of the benchmark's batch
PROTOCOL = "@@ "  # marks the step benchmark's lines on a worker's stdout (anything else there is passed on)


def paired_median(times: list[float], baseline: list[float]) -> float:
    """Median over rounds of ``times[i] / baseline[i]`` (both in seconds, timed in the same round, seconds apart).

    A slow spell scales both times of a round and cancels in their ratio; a ratio of medians would not pair them.
    """
    return statistics.median(t / b for t, b in zip(times, baseline))


def paired_ratio(times: list[float], baseline: list[float]) -> str:
    """:func:`paired_median` as a table cell, e.g. "0.71x"."""
    return f"{paired_median(times, baseline):.2f}x"


def sudoku_batch(batch_size: int, device: torch.device | str = "cpu", seed: int = 0) -> dict[str, torch.Tensor]:
    """A random batch in the Sudoku layout: ``inputs`` [B, 81] int32 tokens 1..10 (1 blank), ``labels`` [B, 81]
    int32 2..10, ``puzzle_identifiers`` [B] int32 zeros. The same ``seed`` gives the same batch in every process."""
    import torch

    gen = torch.Generator().manual_seed(seed)
    labels = torch.randint(2, 11, (batch_size, 81), generator=gen, dtype=torch.int32)
    inputs = torch.where(torch.rand(batch_size, 81, generator=gen) < 0.5, labels, torch.ones_like(labels))
    return {"inputs": inputs.to(device), "labels": labels.to(device),
            "puzzle_identifiers": torch.zeros(batch_size, dtype=torch.int32, device=device)}


def serve_steps(step: Callable[[], object], info: dict, warmup: int) -> None:
    """The worker side of the step benchmark: ``warmup`` untimed steps, then ``info`` plus the last warmup step's
    seconds (``step_s``) as one JSON line; then for each line ``N`` read from stdin, ``N`` steps and their total
    seconds as one line. An empty line or the end of input ends it."""
    for _ in range(warmup):
        begin = time.perf_counter()
        step()
    print(PROTOCOL + json.dumps({**info, "step_s": time.perf_counter() - begin}), flush=True)
    for line in sys.stdin:
        if not line.strip():
            return
        begin = time.perf_counter()
        for _ in range(int(line)):
            step()
        print(f"{PROTOCOL}{time.perf_counter() - begin:.6f}", flush=True)


def not_a_checkout(reference_dir: str) -> str | None:
    """Why ``reference_dir`` is not a TinyRecursiveModels checkout, in one line; None when it is one."""
    if (Path(reference_dir).expanduser() / "models" / "recursive_reasoning" / "trm.py").is_file():
        return None
    return (f"--reference-dir {reference_dir}: no models/recursive_reasoning/trm.py there; give a checkout of "
            "github.com/SamsungSAILMontreal/TinyRecursiveModels")
