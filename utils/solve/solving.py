"""The model a user's solve runs, and its answers under fixed compute: a checkpoint the user names (a file, a run
directory, ``hf://owner/repo``) or, without one, the model bundled for the task (``models/pretrained/``, each with its
card), opened and warmed; puzzles as a user writes them (utils/data/user_puzzles.py), prepared
(utils/solve/precheck.py) and answered under a test-time compute policy (utils/eval/reasoning.py), each answer's
verdict with every segment's grid (utils/solve/verdict.py). Anytime solving is utils/solve/anytime.py; an ARC task
is adapted to first: utils/train/arc_adapt.py.

Every request is bounded before any work (:func:`compute_budget`): its segment passes a puzzle (segments × rollouts
× views) by what the model costs, and the segment answers it keeps by the memory available, so that neither
``solve.py --segments 10000`` nor the page's fields can ask for more than the machine gives.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import Callable, Optional

import numpy as np
import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode

from utils.data.user_puzzles import PuzzleInputError, read_mazes, read_sudokus
from utils.device import host_memory, memory_available
from utils.eval.load import BUNDLED_DIR, Trained, load_trained
from utils.eval.reasoning import (CHECKED, FLAG_NAMES, SETTING_NAMES, TEST_TIME_FLAGS, TestTimeCompute,
                                  TestTimeComputeError, initial_carry, reason, run_segments, stacked_initial_carry)
from utils.solve.bundled import BUNDLED
from utils.solve.precheck import VOCAB, check_fits
from utils.solve.verdict import Answer, answer_of


# What one puzzle's answer may cost, by device: about a minute of a laptop's CPU for the bundled models (1.4 GFLOP a
# segment), and about as long on a GPU that is ~10x (Apple) or ~100x (CUDA) faster at small batches.
PUZZLE_FLOPS = {"cpu": 10**12, "mps": 10**13, "cuda": 10**14}
# Whatever the FLOPs: a tiny model's segment still costs a few milliseconds of overhead per call.
MAX_PASSES = 4096
# One cell of one kept segment answer: the tensor on the device and on the host, the page's rows, lists and JSON.
FRAME_CELL_BYTES = 64
MEMORY_SHARE = 4  # a request keeps at most this fraction (1/4) of the memory available
# A long answer's GIF shows this many of its segments, evenly spaced with the first and the last (each frame is a
# picture of ~0.5 MB while it is encoded: all 1000 segments of one answer took 2.4 GB).
GIF_FRAMES = 32


class BundledModelMissing(PuzzleInputError):
    """The bundled model's file is not in BUNDLED_DIR (a checkout without it): the page offers the other models."""


def bundled_checkpoint(task: str) -> Path:
    """The bundled model for ``task``.

    Raises:
        PuzzleInputError: no model is bundled for the task (ARC needs one trained on ARC).
        BundledModelMissing: its file is missing.
    """
    if task not in BUNDLED:
        raise PuzzleInputError(f"no model is bundled for {VOCAB[task][1]} (only for "
                               f"{' and '.join(b.what for b in BUNDLED.values())}): give --checkpoint")
    path = BUNDLED_DIR / BUNDLED[task].file
    if not path.is_file():
        raise BundledModelMissing(f"the bundled model for {BUNDLED[task].what} is missing ({path}): give --checkpoint "
                               "(scripts/bundle_model.py makes one from a run)")
    return path


def read_puzzles(task: str, spec: str) -> list[tuple[str, np.ndarray, Optional[tuple[int, int]]]]:
    """``(name, tokens [S], shape)`` for each puzzle ``spec`` gives: Sudoku as :func:`read_sudokus` reads them (shape
    None), mazes as :func:`read_mazes` reads a file of them (tokens framed into a square, shape their own rows x
    columns).

    Raises:
        PuzzleInputError: a malformed puzzle or an unreadable file, named.
    """
    if task == "sudoku":
        return [(name, tokens, None) for name, tokens in read_sudokus(spec)]
    return read_mazes(spec)


def open_model(spec: Optional[str], task: str, seq_len: int, batch_size: int, device: torch.device,
               dtype: torch.dtype) -> Trained:
    """The model that answers ``task`` puzzles of ``seq_len`` tokens: the checkpoint ``spec`` names, or without one
    the bundled model (its ``note`` says so).

    Raises:
        PuzzleInputError: no bundled model for the task, or a model of other puzzles.
        CheckpointError, ConfigError: see :func:`utils.eval.load.load_trained`.
    """
    trained = load_trained(spec or str(bundled_checkpoint(task)), device, dtype, batch_size, seq_len=seq_len)
    trained.bundled = spec is None
    check_fits(trained, task, seq_len)
    if spec is None:
        card = f" (its card: {trained.card})" if trained.card else ""  # the card the load checked, never a guess
        trained.note = f"the bundled model for {BUNDLED[task].what}, {trained.path}{card}"
    warm_up(trained, seq_len if trained.grid else trained.seq_len, device)
    return trained


def warm_up(trained: Trained, seq_len: int, device: torch.device) -> None:
    """One segment of the model on one blank puzzle of ``seq_len`` tokens, answered and thrown away, so that a
    budget's clock times solving: a framework's first call sets up kernels and buffers, which took seconds before a
    first maze's answer on some CPUs (issue 63), and 0.06 s on the warm page."""
    tokens = torch.ones(1, seq_len, dtype=torch.int32, device=device)  # 1: a token of every task (blank cell, wall)
    batch = {"inputs": tokens, "labels": tokens.long(), "puzzle_identifiers": torch.zeros(1, dtype=torch.int32,
                                                                                         device=device)}
    with torch.no_grad():
        for _ in run_segments(trained.head, stacked_initial_carry(trained.head, batch, [(0.0, 0)]), 1):
            pass


def answer(trained: Trained, task: str, puzzles: list[tuple[str, np.ndarray]], ttc: TestTimeCompute,
           device: torch.device, stop: Optional[Callable[[], bool]] = None) -> list[Answer]:
    """Answer ``puzzles`` (one batch) under ``ttc``, with every segment's answer kept, and check each answer. With
    checked selection (``ttc.checker``) the checked answers are given, and the rollouts stop once every puzzle has
    one that obeys the rules.

    Args:
        stop: asked before every segment (the page's: its client left, or the server stops).

    Raises:
        Cancelled: ``stop()`` said so; nothing is answered.
    """
    inputs = torch.from_numpy(np.stack([tokens for _, tokens in puzzles]).astype(np.int32)).to(device)
    batch = {"inputs": inputs, "labels": inputs.long(),
             "puzzle_identifiers": torch.zeros(len(puzzles), dtype=torch.int32, device=device)}
    checked = ttc.checker is not None
    out = reason(trained.head, trained.head, batch, replace(ttc, keep_segments=True, stop_when_checked=checked), stop)
    out = {k.removeprefix(CHECKED): v.cpu() for k, v in out.items() if k.startswith(CHECKED) == checked}
    return [answer_of(name, task, tokens, {k: v[i] for k, v in out.items()}, "checked" if checked else "model")
            for i, (name, tokens) in enumerate(puzzles)]


def gif_segments(total: int) -> list[int]:
    """The (0-based) segments of a ``total``-segment answer that its GIF shows: all of them, or :data:`GIF_FRAMES`
    evenly spaced ones with the first and the last."""
    most = GIF_FRAMES
    if total <= most:
        return list(range(total))
    return sorted({round(i * (total - 1) / (most - 1)) for i in range(most)})


def flops_per_pass(trained: Trained) -> int:
    """Floating-point operations of one ACT segment of one puzzle: its matrix products (linear layers, attention,
    matmuls), counted on one segment of a blank puzzle on the model's own device; every puzzle of the model's size
    costs the same. A kernel outside torch (flash_attn) is not counted."""
    device = next(trained.head.parameters()).device
    tokens = torch.ones(1, trained.seq_len, dtype=torch.int32, device=device)
    batch = {"inputs": tokens, "labels": tokens.long(),
             "puzzle_identifiers": torch.zeros(1, dtype=torch.int32, device=device)}
    with torch.no_grad(), _MatrixFlops() as counted:
        trained.head(initial_carry(trained.head, batch, 0.0, 0), batch)
    return max(1, counted.flops)


class _MatrixFlops(TorchFunctionMode):
    """Counts 2 x the multiply-adds of the matrix products and convolutions called under it (at torch's Python
    level: no dispatch mode, whose first use imports TorchDynamo, seconds of a solve's start, and whose counter on
    the CPU misses attention)."""

    MATMULS = (torch.matmul, torch.Tensor.matmul, torch.Tensor.__matmul__, torch.bmm, torch.mm)

    def __init__(self):
        super().__init__()
        self.flops = 0

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if func is F.linear:  # x [..., in] @ weight [out, in]
            self.flops += 2 * args[0].numel() // args[0].shape[-1] * args[1].numel()
        elif func is F.scaled_dot_product_attention:  # q [..., Sq, D] k [..., Sk, D] v [..., Sk, Dv]
            q, k, v = args[:3]
            self.flops += 2 * q.numel() * k.shape[-2] + 2 * q.numel() // q.shape[-1] * k.shape[-2] * v.shape[-1]
        elif func in self.MATMULS:  # a [..., n, k] @ b [..., k, m]
            self.flops += 2 * args[0].numel() * args[1].shape[-1]
        out = func(*args, **(kwargs or {}))
        if func is F.conv2d:  # weight [out, in / groups, kh, kw]: each output element is in / groups * kh * kw MACs
            self.flops += 2 * out.numel() * args[1][0].numel()
        return out


@dataclass(frozen=True)
class ComputeBudget:
    """The most test-time compute one request may ask of a model (:func:`compute_budget`).

    Attributes:
        passes: segment passes a puzzle, segments × rollouts × views.
        kept_frames: segment answers of ``seq_len`` cells that the answers of all ``puzzles`` may hold at once
            (segments × (2 × views + 2) × puzzles: every view's and two rollouts' answers, while they vote).
        seq_len: cells of one puzzle.
        puzzles: puzzles answered together.
        memory: bytes of memory available when the budget was set.
        why: what sets ``passes``, for the messages.
    """

    passes: int
    kept_frames: int
    seq_len: int
    puzzles: int
    memory: int
    why: str

    def check(self, ttc: TestTimeCompute, halt_max_steps: int, names: Optional[dict[str, str]] = None) -> None:
        """Refuse ``ttc`` when it asks for more than the budget (``halt_max_steps``: the segments of
        ``segments=None``; ``names``: how the user set each setting, :data:`FLAG_NAMES` by default).

        Raises:
            TestTimeComputeError: one line with the product, the budget, what sets it and what to lower.
        """
        names = names or FLAG_NAMES
        segments = ttc.segments or halt_max_steps
        passes = ttc.passes(halt_max_steps)
        flags = [names.get(k, k) for k in ("segments", "rollouts", "views")]
        if passes > self.passes:
            raise TestTimeComputeError(
                f"{' x '.join(flags)} = {segments} x {ttc.rollouts} x {ttc.views} = {passes:,} segment passes a "
                f"puzzle, more than this model's budget of {self.passes:,} ({self.why}): lower {', '.join(flags[:2])} "
                f"or {flags[2]}")
        frames = segments * (2 * ttc.views + 2) * self.puzzles
        if frames > self.kept_frames:
            many = f" for {self.puzzles} puzzles" if self.puzzles > 1 else ""
            fewer = ", or answer fewer puzzles at once" if self.puzzles > 1 else ""
            raise TestTimeComputeError(
                f"{flags[0]} {segments} with {flags[2]} {ttc.views} keeps {frames:,} segment answers of "
                f"{self.seq_len} cells{many}, about {frames * self.seq_len * FRAME_CELL_BYTES / 2**30:.1f} GiB, more "
                f"than 1/{MEMORY_SHARE} of the {self.memory / 2**30:.1f} GiB of memory available: lower "
                f"{flags[0]} or {flags[2]}{fewer}")

    def describe(self) -> dict[str, object]:
        """What the page shows of it: ``passes``, ``kept_frames`` (as above) and ``why``."""
        return {"passes": self.passes, "kept_frames": self.kept_frames, "why": self.why}


def compute_budget(trained: Trained, device: torch.device, puzzles: int = 1,
                   flops: Optional[int] = None) -> ComputeBudget:
    """The budget of a request answering ``puzzles`` at once on ``device``.

    Segment passes a puzzle: the device's :data:`PUZZLE_FLOPS` over the model's ``flops`` a pass
    (:func:`flops_per_pass`, counted when not given), at most :data:`MAX_PASSES`, and never fewer than the run's own
    evaluation settings ask for.
    Kept segment answers: 1/:data:`MEMORY_SHARE` of the memory available now (the device's, and the host's, which
    every answer reaches), at :data:`FRAME_CELL_BYTES` a cell.
    """
    flops = flops or flops_per_pass(trained)
    own = TestTimeCompute.of_run(trained.cfg)
    own_passes = own.passes(trained.cfg.arch["halt_max_steps"])
    puzzle_flops = PUZZLE_FLOPS.get(device.type, PUZZLE_FLOPS["cpu"])
    by_flops = puzzle_flops // flops
    if own_passes >= min(by_flops, MAX_PASSES):
        passes, why = own_passes, "the run's own evaluation settings"
    elif by_flops < MAX_PASSES:
        passes, why = by_flops, (f"{puzzle_flops / 1e12:g} TFLOP a puzzle on {device.type} at {flops / 1e9:.3g} "
                                 "GFLOP a segment pass")
    else:
        passes, why = MAX_PASSES, f"at most {MAX_PASSES:,} whatever the model"
    memory = memory_available(device)
    if device.type != "cpu":
        memory = min(memory, host_memory("MemAvailable") or memory)
    kept_frames = memory // MEMORY_SHARE // (FRAME_CELL_BYTES * trained.seq_len)
    return ComputeBudget(passes, kept_frames, trained.seq_len, puzzles, memory, why)


def check_budget(trained: Trained, ttc: TestTimeCompute, flags, device: torch.device, puzzles: int = 1,
                 flops: Optional[int] = None) -> ComputeBudget:
    """Refuse, before any work, a ``ttc`` over the budget of answering ``puzzles`` at once with ``trained``
    (:func:`compute_budget`); ``flags`` are the test-time flags ``ttc`` came from (the message names them, or the
    run's settings when none was given).

    Raises:
        TestTimeComputeError: the one line of :meth:`ComputeBudget.check`.
    """
    given = any(getattr(flags, name, None) is not None for name in TEST_TIME_FLAGS)
    budget = compute_budget(trained, device, puzzles, flops)
    budget.check(ttc, trained.cfg.arch["halt_max_steps"], FLAG_NAMES if given else SETTING_NAMES)
    return budget
