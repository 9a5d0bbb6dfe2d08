"""Solving an ARC task the model never saw: augment its demonstrations, adapt, answer every copy, vote.

The recipe of TRM-based ARC Prize entries (and TRM's own evaluation, whose test tasks give their demonstrations to
training under the same puzzle identifiers):

1. the task becomes a one-task dataset (utils/data/arc.write_subsets): its demonstration pairs, in ``num_aug``
   augmented copies (dihedral transform and colour permutation), train; its test inputs, in the same copies, are
   the test split;
2. the trainer of ``pretrain.py`` (utils/train/puzzle_trainer.py) adapts the checkpoint to it for ``adapt_steps``
   steps: ``load_checkpoint`` starts every new puzzle-embedding row as the checkpoint's mean row (TRM's rule), and
   ``freeze_weights=true`` trains that embedding only (``--adapt-all`` trains every weight);
3. the adapted model answers every copy of each test input under the test-time compute policy, and the published
   voting (utils/eval/arc.py: undo each copy's augmentation, rank distinct answers by votes, then mean
   ``sigmoid(q_halt)``) picks two attempts per test input for ``submission.json``.
"""

from __future__ import annotations

import json
import logging
import math
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from utils.data.arc import ArcTask, Subset, fill_missing_outputs, grid_to_tokens, parse_task, write_subsets
from utils.data.puzzle_dataset import DatasetError, PuzzleDataset
from utils.distributed import Dist
from utils.errors import RunFailure
from utils.eval.arc import ARC, write_json
from utils.eval.load import checkpoint_settings, load_trained, resolve_checkpoint
from utils.eval.puzzle import evaluate_puzzles
from utils.eval.reasoning import TestTimeCompute
from utils.train import puzzle_trainer
from utils.checkpoint import safe_load
from utils.outputs import unused_name, unused_stem
from utils.viz.puzzles import ANSWER_ENDINGS, render_example, render_segments, save_picture, save_segments

log = logging.getLogger(__name__)


class AdaptationError(RunFailure):
    """The adaptation run stopped before it finished."""


def read_task(path: Path):
    """The task in an ARC Prize task file (test outputs optional), named by the file's stem.

    Raises:
        DatasetError: not JSON, or not a task (named by the pair and grid at fault).
    """
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise DatasetError(f"{path}: cannot be read as a JSON task ({e}); give a file in the ARC Prize format") from None
    return task_from_json(raw, path.stem, str(path))


def task_from_json(raw, name: str, where: str):
    """The task ``raw`` (an ARC Prize task, test outputs optional) holds, named ``name``, and whether it holds the test
    outputs.

    Raises:
        DatasetError: not a task (named by ``where``, the pair and the grid at fault).
    """
    answers_known = isinstance(raw, dict) and not fill_missing_outputs(raw)
    return parse_task(name, raw, where), answers_known


def adapt(args, task, data: Path, run: Path, checkpoint: Path) -> None:
    """Train on the task's dataset from ``checkpoint`` for ``args.adapt_steps`` steps (the trainer of pretrain.py, in
    this process).

    Raises:
        AdaptationError: the run exited with a non-zero code (its error is printed above).
    """

    cfg = checkpoint_settings(checkpoint, safe_load(checkpoint))
    arch = {k: v for k, v in cfg.arch.items() if not isinstance(v, (dict, list))}
    arch_file = arch.pop("name")  # config/arch/<name>.yaml replaces the recipe's; the checkpoint's values go over it
    demos = len(task.pairs["train"])
    epochs = math.ceil(args.adapt_steps * args.adapt_batch_size / demos)  # an epoch draws one copy's demonstrations
    settings = dict(
        data_path=str(data), arch=arch, load_checkpoint=str(checkpoint), freeze_weights=not args.adapt_all,
        epochs=epochs, eval_interval=epochs, min_eval_interval=1, ema=False, global_batch_size=args.adapt_batch_size,
        lr=cfg.lr, puzzle_emb_lr=cfg.puzzle_emb_lr, weight_decay=cfg.weight_decay,
        puzzle_emb_weight_decay=cfg.puzzle_emb_weight_decay,
        lr_warmup_steps=min(cfg.lr_warmup_steps, args.adapt_steps // 10), lr_min_ratio=1.0, checkpoint_path=str(run),
        keep_last_checkpoints=1, device=args.device, forward_dtype=args.forward_dtype, evaluators=[],
        compile=False)  # too short to repay compiling
    log.info("adapting %s to %s: %d steps of %d examples (%s)", checkpoint, task.id, args.adapt_steps,
             args.adapt_batch_size, "every weight" if args.adapt_all else "the puzzle embedding")
    # In this process: a run inside solve.py or the page, whose points go to no watcher (utils/run/points.py).
    code = puzzle_trainer.run(puzzle_trainer.Launch("cfg_pretrain", settings, arch=arch_file,
                                                    source="the ARC adaptation"))
    if code != 0:
        raise AdaptationError(f"adapting to {task.id} stopped with exit code {code} (its error is above)")


class OriginalSegments:
    """An evaluation consumer that keeps every segment's answer for the rows of the task as given (identifier
    ``original``, the un-augmented copy), for the pictures."""

    def __init__(self, original: int):
        self.original, self.rows = original, []

    def update_batch(self, batch: dict, preds: dict) -> None:
        for i in np.flatnonzero(batch["puzzle_identifiers"].numpy() == self.original):
            self.rows.append((batch["inputs"][i], preds["segment_preds"][i], preds["segment_q_halt"][i]))


@dataclass
class ArcResult:
    """A task adapted to and answered: the ``submission`` (ARC Prize format) written to ``submission_path``, the
    ``scores`` (pass@K; meaningful when the task file holds the test outputs, ``answers_known``), the mean
    ``segments`` per copy, and every segment's answer of the task's un-augmented copies (``original``)."""

    task: ArcTask
    answers_known: bool
    submission: dict
    submission_path: Path
    scores: dict
    segments: float
    original: OriginalSegments


def adapt_and_answer(task: ArcTask, answers_known: bool, source: str, args, ttc: TestTimeCompute,
                     device: torch.device, dtype: torch.dtype, out: Path) -> ArcResult:
    """Augment ``task`` into a dataset under ``out``, adapt ``args.checkpoint`` to it (``args.adapt_steps``,
    ``args.adapt_batch_size``, ``args.adapt_all``, ``args.num_aug``), answer every copy of each test input under
    ``ttc``, vote, and write the submission (beside any file already there).

    Raises:
        CheckpointError: a bad checkpoint. AdaptationError: the adaptation failed.
    """
    checkpoint, note = resolve_checkpoint(args.checkpoint)
    if note:
        log.info("starting from %s", note)
    work = out / unused_stem(out, f"arc_{task.id}_{time.strftime('%Y%m%d-%H%M%S')}", ("",))
    data, run = work / "data", work / "adapt"
    write_subsets(data, [Subset("evaluation", [task], source, is_test=True)], args.num_aug, 42,
                  {"dataset": "user task", "num_aug": args.num_aug, "seed": 42, "task": source})
    adapt(args, task, data, run, checkpoint)

    trained = load_trained(str(run), device, dtype, args.adapt_batch_size, data_path=str(data))
    arc = ARC(data)
    names = json.loads((data / "identifiers.json").read_text())
    original = OriginalSegments(names.index(task.id))
    metrics = evaluate_puzzles(trained.head, trained.head, PuzzleDataset(str(data), "test", args.adapt_batch_size),
                               device, Dist(), consumers=[arc, original], ttc=ttc)
    scores, submission = arc.score()
    submission_path = out / unused_name(out, "submission.json")  # a file already there is kept
    write_json(submission_path, submission, "ARC submission")
    return ArcResult(task, answers_known, submission, submission_path, scores, metrics["steps"], original)


def solve_arc_task(args, ttc: TestTimeCompute, device: torch.device, dtype: torch.dtype, out: Path) -> int:
    """``solve.py --arc``: adapt, answer, vote; print the attempts and write ``submission.json`` and the pictures.

    Raises:
        DatasetError: a bad task file. CheckpointError: a bad checkpoint. AdaptationError: the adaptation failed.
    """
    task, answers_known = read_task(Path(args.arc))
    result = adapt_and_answer(task, answers_known, args.arc, args, ttc, device, dtype, out)
    for i, attempts in enumerate(result.submission[task.id]):
        truth = task.pairs["test"][i][1] if answers_known else None
        print(f"\n{task.id} test input {i + 1}:")
        for name, grid in attempts.items():
            mark = "" if truth is None else (" (right)" if np.array_equal(np.array(grid), truth) else " (wrong)")
            print(f"{name}{mark}:\n" + "\n".join("".join(map(str, row)) for row in grid))
        draw(task, i, np.array(attempts["attempt_1"], np.uint8), truth, result.original, out)
    if answers_known:
        print(f"\npass@2 {result.scores['ARC/pass@2']:.3f} (the task file holds the test outputs)")
    print(f"segments per copy: {result.segments:.1f}; submission: {result.submission_path}")
    return 0


def draw(task, i: int, attempt: np.ndarray, truth, segments: OriginalSegments, out: Path) -> None:
    """The picture of test input ``i`` with attempt 1 (marked against the true output when known), and the GIF and
    strip of the un-augmented copy's segments."""
    inputs = grid_to_tokens(task.pairs["test"][i][0])
    answer = grid_to_tokens(attempt) if attempt.size else np.zeros_like(inputs)  # a 0x0 answer is a valid vote
    labels = grid_to_tokens(truth) if truth is not None else answer
    stem = out / unused_stem(out, f"arc_{task.id}_test{i + 1}", ANSWER_ENDINGS)
    picture = render_example("arc", inputs, labels, answer, title=f"arc · {task.id} · test input "
                             f"{i + 1} · attempt 1" + ("" if truth is not None else " (true output unknown)"))
    save_picture(picture, stem.with_suffix(".png"))
    if i < len(segments.rows):
        row_inputs, frames, q_halt = segments.rows[i]
        save_segments(render_segments("arc", row_inputs.numpy(), labels, frames.numpy(), q_halt.numpy(),
                                      title=f"arc · {task.id} · test input {i + 1}, as given"), stem)
