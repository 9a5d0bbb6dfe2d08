"""The ARC evaluator: voting over augmented predictions, pass@K, and the ARC Prize ``submission.json``.

Follows TRM ``evaluators/arc.py`` (class ``ARC``), and gives its numbers exactly:

1. Each test row's prediction (argmax tokens) is cropped at the end markers (:func:`utils.data.arc.crop_shapes`)
   and mapped back through the inverse of its row's augmentation (colour map and dihedral, read from
   the puzzle name in ``identifiers.json``). The row's input is treated the same way and names the
   test pair: the task's test input with exactly that grid. Rows with the blank identifier are padding.
2. Per (task, test input), identical answers pool their votes. Answers are ranked by
   ``(vote count, mean sigmoid(q_halt_logit))``, higher first; exact ties keep the order in which the
   answers first appeared (rank 0's rows first, in batch order). sigmoid is taken in float64 and the
   mean as a running sum in that same order, so ties break exactly as in the reference.
3. A test pair passes at K when the true output is among the top K answers. A task scores the
   fraction of its test pairs that pass; a pair or task with no prediction scores 0. pass@K is the
   mean over all tasks of ``test_puzzles.json``, reported as ``ARC/pass@K`` (K = 1, 2, 5, 10, 100, 1000;
   the papers publish pass@2), each with its 95% Wilson interval over the tasks (``ARC/pass@K_ci95_low``
   / ``_high``, :func:`pass_at_k_intervals`) and the number of tasks as ``ARC/tasks``.
4. ``submission.json`` (ARC Prize format): ``{task: [{"attempt_1": grid, "attempt_2": grid}, ...]}``,
   one entry per test input in order, the two best answers, the first repeated when there is only one.
   Where the reference writes nothing for a test input without predictions (an empty list for a task
   without any, so the file lacks test inputs), this writes ``[[0]]`` attempts so every test input has
   an entry; scores are unaffected. An answer cropped to nothing (the prediction's top-left cell is no
   colour) is a candidate like any other, as in the reference, and is written as ``[]``.

Padding rows are dropped together with their confidences. (The reference drops the rows but not
the confidences, which would misalign them if blank rows came between real ones; its loader only
pads the end of the last batch, where the two agree.)

As in the reference's default (``aggregated_voting=True``), votes accumulate over every evaluation
the same evaluator sees; ``begin_eval`` clears them only with ``aggregated_voting=False``.
"""

from __future__ import annotations

import json
import logging
import os
import re
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist
from tqdm import tqdm

from utils.data.arc import (GRID_SIZE, SEQ_LEN, COLOUR_OFFSET, crop_shapes, grid_key, inverse_colour_map, parse_grid,
                            parse_puzzle_name)
from utils.data.common import inverse_dihedral
from utils.data.puzzle_dataset import DatasetError, load_metadata
from utils.data.saved_outputs import OutputsError, load_outputs
from utils.eval.stats import with_interval
from utils.outputs import write_atomically

log = logging.getLogger(__name__)

PASS_KS = (1, 2, 5, 10, 100, 1000)
PLACEHOLDER = [[0]]  # attempt written for a test input without any prediction
PASS_KEY = re.compile(r"ARC/pass@\d+")  # a pass@K fraction among the metrics (not its interval fields)


def rank_answers(votes: dict[bytes, list[float]]) -> list[tuple[bytes, int, float]]:
    """Rank distinct answers by (vote count, mean confidence), best first, stable on exact ties.

    Args:
        votes: answer key -> the confidences (sigmoid of q_halt) of the copies that gave it, in arrival order.
    Returns:
        [(answer key, votes, mean confidence)], best first.
    """
    stats = []
    for key, confidences in votes.items():
        total = 0.0
        for q in confidences:  # a running sum in arrival order, as the reference accumulates it
            total += q
        stats.append((key, len(confidences), total / len(confidences)))
    return sorted(stats, key=lambda s: (s[1], s[2]), reverse=True)


def pass_at_k_intervals(metrics: dict[str, float], n_tasks: int) -> dict[str, float]:
    """``metrics`` with the 95% Wilson interval of each ``ARC/pass@K`` over ``n_tasks``, and ``ARC/tasks``.

    A task scores the fraction of its test inputs that pass, so pass@K * n_tasks is a number of
    successes only where every task has one test input. The interval treats each task's score as a
    proportion of one trial; for tasks with several test inputs (partial credit) that is an
    approximation (:func:`utils.eval.stats.wilson_interval`).

    Args:
        metrics: ``{"ARC/pass@K": fraction}``.
        n_tasks: the number of tasks the fractions are means over.
    Returns:
        a new dict: each ``ARC/pass@K`` followed by ``ARC/pass@K_ci95_low`` and ``ARC/pass@K_ci95_high``,
        then ``ARC/tasks`` (float ``n_tasks``).
    """
    for key in [key for key in metrics if PASS_KEY.fullmatch(key)]:
        metrics = with_interval(metrics, key, n_tasks)
    return {**metrics, "ARC/tasks": float(n_tasks)}


def write_json(path: Path, obj, what: str) -> None:
    """Write ``obj`` as JSON to ``path`` atomically; ``what`` names the file in an error.

    Raises:
        OutputWriteError: the write failed (full disk, ...); no partial file is left.
    """
    write_atomically(path, lambda f: f.write(json.dumps(obj).encode()), what)


def write_results(metrics: dict[str, float], submission: dict, submission_path: str | os.PathLike | None,
                  report_path: str | os.PathLike | None) -> None:
    """Write the ARC Prize ``submission.json`` and the ``{"pass@1": ..., "pass@2": ...}`` report where asked.

    Args:
        metrics: {"ARC/pass@K": fraction, ...}, as :meth:`ARC.score` returns; the report holds the pass@K
            fractions only (not their intervals or the task count).
        submission_path, report_path: where to write each; None or "" writes none.
    Raises:
        OutputWriteError: a write failed; no partial file is left.
    """
    if submission_path:
        write_json(Path(submission_path), submission, "ARC submission")
    if report_path:
        report = {key.split("/", 1)[1]: value for key, value in metrics.items() if PASS_KEY.fullmatch(key)}
        write_json(Path(report_path), report, "pass@K report")


class ARC:
    """ARC scoring with the reference's seam: ``begin_eval()``, ``update_batch(batch, preds)``, ``result(...)``.

    Args:
        data_path: the ARC dataset directory (``identifiers.json``, ``test_puzzles.json``, ``test/dataset.json``).
        pass_ks: the K of pass@K.
        submission_k: attempts per test input in ``submission.json``.
        aggregated_voting: keep votes across evaluations (the reference's default).
    Raises:
        DatasetError: a missing or malformed dataset file.
    """

    required_outputs = ("inputs", "puzzle_identifiers", "preds", "q_halt_logits")

    def __init__(self, data_path: str | os.PathLike, pass_ks: tuple[int, ...] = PASS_KS, submission_k: int = 2,
                 aggregated_voting: bool = True):
        data_path = Path(data_path)
        self.pass_ks, self.submission_k, self.aggregated_voting = tuple(pass_ks), submission_k, aggregated_voting
        self.blank_identifier_id = load_metadata(data_path, "test").blank_identifier_id
        self.identifiers = self._load_json(data_path / "identifiers.json", list)
        self.test_pairs = self._load_test_puzzles(data_path / "test_puzzles.json")
        self._inverse: dict[int, tuple] = {}  # puzzle id -> (task, dihedral, inverse colour map)
        self._reset()

    @staticmethod
    def _load_json(path: Path, kind: type):
        if not path.is_file():
            raise DatasetError(f"{path} not found; build the dataset with python scripts/build_arc_dataset.py")
        try:
            with open(path) as f:
                value = json.load(f)
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise DatasetError(f"{path} is not valid JSON ({e}); rebuild the dataset") from None
        if not isinstance(value, kind) or not value:
            raise DatasetError(f"{path} must hold a non-empty JSON {kind.__name__}; rebuild the dataset")
        return value

    def _load_test_puzzles(self, path: Path) -> dict[str, list[tuple[bytes, bytes, np.ndarray]]]:
        """task -> [(input key, output key, output grid)] per test pair, in ``test_puzzles.json`` order."""
        pairs = {}
        for task, puzzle in self._load_json(path, dict).items():
            tests = puzzle.get("test") if isinstance(puzzle, dict) else None
            if not isinstance(tests, list) or not tests or not all(isinstance(p, dict) for p in tests):
                raise DatasetError(f"{path}: task {task!r} needs a non-empty 'test' list of input/output pairs")
            pairs[task] = []
            for i, pair in enumerate(tests):
                grids = [parse_grid(pair.get(k), f"{path}: task {task!r} test[{i}].{k}") for k in ("input", "output")]
                pairs[task].append((grid_key(grids[0]), grid_key(grids[1]), grids[1]))
        return pairs

    def _reset(self) -> None:
        self._votes: dict[str, dict[bytes, dict[bytes, list[float]]]] = {}  # task -> input -> answer -> confidences
        self._grids: dict[bytes, np.ndarray] = {}  # answer -> grid
        self._unmatched = 0

    def begin_eval(self) -> None:
        """Start an evaluation; previous votes are dropped only with ``aggregated_voting=False``."""
        if not self.aggregated_voting:
            self._reset()

    def _augmentation(self, identifier: int) -> tuple:
        if identifier not in self._inverse:
            if not 0 <= identifier < len(self.identifiers):
                raise OutputsError(f"puzzle identifier {identifier} is outside identifiers.json ({len(self.identifiers)} "
                                   "names): the predictions come from another dataset")
            task, t, colour_map = parse_puzzle_name(self.identifiers[identifier])
            self._inverse[identifier] = (task, t, inverse_colour_map(colour_map))
        return self._inverse[identifier]

    def update_batch(self, batch: dict[str, torch.Tensor], preds: dict[str, torch.Tensor]) -> None:
        """Add one batch of this rank's rows.

        Args:
            batch: ``inputs`` [B, 900] tokens and ``puzzle_identifiers`` [B] (CPU tensors; padding rows
                carry the blank identifier and are skipped).
            preds: ``preds`` [B, 900] argmax tokens and ``q_halt_logits`` [B] float.
        Raises:
            OutputsError: a missing key, shapes that disagree, or an identifier outside ``identifiers.json``.
        """
        tensors = {**{k: batch.get(k) for k in ("inputs", "puzzle_identifiers")},
                   **{k: preds.get(k) for k in ("preds", "q_halt_logits")}}
        missing = [k for k, v in tensors.items() if v is None]
        if missing:
            raise OutputsError(f"ARC evaluation needs {', '.join(missing)}; the model or outputs file does not provide it")
        ids = tensors["puzzle_identifiers"].cpu().numpy().astype(np.int64)
        rows = len(ids)
        shapes = {k: tuple(v.shape) for k, v in tensors.items()}
        if (shapes["inputs"] != (rows, SEQ_LEN) or shapes["preds"] != (rows, SEQ_LEN) or shapes["q_halt_logits"] != (rows,)
                or shapes["puzzle_identifiers"] != (rows,)):
            raise OutputsError(f"ARC evaluation expects inputs/preds [B, {SEQ_LEN}] and "
                               f"puzzle_identifiers/q_halt_logits [B], got {shapes}")
        keep = ids != self.blank_identifier_id
        ids = ids[keep]
        inputs = tensors["inputs"].cpu().numpy()[keep]
        answers = tensors["preds"].cpu().numpy()[keep]
        confidence = tensors["q_halt_logits"].cpu().to(torch.float64).sigmoid().numpy()[keep]
        input_h, input_w = crop_shapes(inputs)
        answer_h, answer_w = crop_shapes(answers)
        for i, identifier in enumerate(ids.tolist()):
            task, t, inverse_map = self._augmentation(identifier)
            keys = []
            for tokens, h, w in ((inputs[i], input_h[i], input_w[i]), (answers[i], answer_h[i], answer_w[i])):
                cropped = tokens.reshape(GRID_SIZE, GRID_SIZE)[:h, :w] - COLOUR_OFFSET
                grid = inverse_map[inverse_dihedral(cropped, t).astype(np.uint8)]
                keys.append((grid_key(grid), grid))
            (input_key, _), (answer_key, answer) = keys
            if task not in self.test_pairs:
                self._unmatched += 1
            self._grids.setdefault(answer_key, answer)
            answers_to_input = self._votes.setdefault(task, {}).setdefault(input_key, {})
            answers_to_input.setdefault(answer_key, []).append(float(confidence[i]))

    def score(self, gathered: list[tuple[dict, dict]] | None = None) -> tuple[dict[str, float], dict[str, list[dict]]]:
        """pass@K and the submission from every rank's (grids, votes), rank 0 first (default: this process's only).

        Returns:
            ({"ARC/pass@K": fraction, its interval fields, "ARC/tasks": n} (:func:`pass_at_k_intervals`),
            submission {task: [{"attempt_1": grid, ...}, ...]}).
        """
        gathered = [(self._grids, self._votes)] if gathered is None else gathered
        correct = np.zeros(len(self.pass_ks))
        submission = {}
        no_prediction = 0
        for task, pairs in self.test_pairs.items():
            submission[task] = []
            passed = np.zeros(len(self.pass_ks))
            for input_key, label_key, _ in pairs:
                votes: dict[bytes, list[float]] = {}
                for _, rank_votes in gathered:
                    for answer_key, confidences in rank_votes.get(task, {}).get(input_key, {}).items():
                        votes.setdefault(answer_key, []).extend(confidences)
                if not votes:
                    no_prediction += 1
                    submission[task].append({f"attempt_{k + 1}": PLACEHOLDER for k in range(self.submission_k)})
                    continue
                ranked = [key for key, _, _ in rank_answers(votes)]
                passed += [label_key in ranked[:k] for k in self.pass_ks]
                best = ranked[:self.submission_k]
                best += best[:1] * (self.submission_k - len(best))
                grids = [next(g[key] for g, _ in gathered if key in g) for key in best]
                submission[task].append({f"attempt_{k + 1}": grid.tolist() for k, grid in enumerate(grids)})
            correct += passed / len(pairs)
        if no_prediction:
            log.warning("ARC: %d of %d test inputs have no prediction (scored 0)", no_prediction,
                        sum(len(p) for p in self.test_pairs.values()))
        metrics = {f"ARC/pass@{k}": float(c / len(self.test_pairs)) for k, c in zip(self.pass_ks, correct)}
        return pass_at_k_intervals(metrics, len(self.test_pairs)), submission

    def result(self, save_path: str | os.PathLike | None, rank: int, world_size: int,
               group: dist.ProcessGroup | None = None) -> dict[str, float] | None:
        """Gather every rank's votes on rank 0 and score them; rank 0 writes ``<save_path>/submission.json``.

        With ``world_size > 1`` this is a collective (``torch.distributed.gather_object``): call it on every rank.

        Returns:
            the metrics of :meth:`score` on rank 0, None on the other ranks.
        Raises:
            OutputWriteError: writing ``submission.json`` failed; no partial file is left.
        """
        gathered = None
        if world_size > 1:
            gathered = [None] * world_size if rank == 0 else None
            dist.gather_object((self._grids, self._votes), gathered, dst=0, group=group)
            if rank != 0:
                return None
        if self._unmatched:
            log.warning("ARC: %d rows on rank 0 belong to no task of test_puzzles.json (ignored)", self._unmatched)
        metrics, submission = self.score(gathered)
        if save_path is not None:
            write_json(Path(save_path) / "submission.json", submission, "ARC submission")
        return metrics


def score_outputs(files, data_path: str | os.PathLike, submission_path: str | os.PathLike | None = None,
                  report_path: str | os.PathLike | None = None, batch_size: int = 4096) -> dict[str, float]:
    """Score saved outputs files (one per rank, see utils/data/saved_outputs.py) without a model.

    Args:
        files: the ``step_<N>_all_preds.<rank>`` files of one evaluation.
        data_path: the ARC dataset they were evaluated on.
        submission_path: write the ARC Prize ``submission.json`` here.
        report_path: write ``{"pass@1": ..., "pass@2": ..., ...}`` here.
    Returns:
        the metrics of :meth:`ARC.score`.
    Raises:
        OutputsError: bad or mismatched outputs files, or files without the keys ARC needs.
        DatasetError: a missing or malformed dataset.
        OutputWriteError: writing the submission or the report failed; no partial file is left.
    """
    outputs = load_outputs(files)
    missing = [k for k in ARC.required_outputs if k not in outputs]
    if missing:
        raise OutputsError(f"the outputs lack {', '.join(missing)}; evaluate with "
                           "eval_save_outputs=[inputs,labels,puzzle_identifiers,preds,q_halt_logits]")
    evaluator = ARC(data_path)
    rows = len(outputs["inputs"])
    for start in tqdm(range(0, rows, batch_size), desc="score", unit="batch"):
        part = {k: v[start:start + batch_size] for k, v in outputs.items()}
        evaluator.update_batch(part, part)
    metrics, submission = evaluator.score()
    write_results(metrics, submission, submission_path, report_path)
    return metrics
