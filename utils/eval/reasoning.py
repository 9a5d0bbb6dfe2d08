"""Test-time compute for HRM and TRM: how many ACT segments a puzzle gets, when a row stops, and stochastic rollouts.

The references evaluate every puzzle for exactly ``halt_max_steps`` segments and ignore the Q head's halting
signal (``sapientinc/HRM`` ``evaluate``; HRM issue 7, TRM issue 64 ask why). :func:`reason` runs one batch with a
:class:`TestTimeCompute` policy:

- ``segments``: how many segments at most (more than training used is allowed: the carry simply goes on);
- ``early_exit``: a row stops at the first segment, from ``min_segments`` on, where its Q head says halt
  (``q_halt > 0``, the halting rule TRM trains), and keeps that answer;
- ``rollouts`` K: the batch is answered K times, rollout 0 from the model's initial state and rollouts 1..K-1 from
  it plus Gaussian noise of std ``noise`` (seeded by ``seed`` and the rollout), and each row keeps the rollout
  whose final ``q_halt`` is highest: the test-time exploration of arXiv 2605.19943 / 2605.25230, ranked by the
  model's own confidence, never by the labels;
- ``views`` V: the batch is answered once per dihedral view (the grid rotated or reflected by transform t0..t(V-1),
  :func:`utils.data.common.dihedral`), each answer mapped back to the original orientation, and each row keeps
  the answer most views agree on, ties broken by their mean ``sigmoid(q_halt)``: the voting of TRM's ARC evaluator
  (``evaluators/arc.py``: identical answers pool votes, rank by votes then mean confidence) over the symmetries
  of a square puzzle whose rules they preserve (Sudoku, mazes). Views need a square grid and no per-puzzle
  embedding (a rotated puzzle has no identifier of its own), so ARC keeps its own evaluator;
- ``checker`` (checked selection, off by default): for tasks whose answers can be checked against the puzzle's
  rules (Sudoku, mazes: :func:`rules_checker`), an answer that passes beats one that does not, whatever the Q head
  prefers; among answers alike in that, the model's own ranking decides (q_halt for rollouts, votes then
  confidence for views). This is not the references' protocol (they pick by the model alone), so the model-only
  answer is always returned too, and the checked one beside it under ``checked_*`` keys, from the same passes;
  ``stop_when_checked`` ends a batch's rollouts once every row has an answer that passes (solve.py, the page).

With the defaults (``halt_max_steps`` segments, no early exit, one rollout) the answer is bitwise the
reference's evaluation. The loop drives the (possibly compiled) ACT loss head one segment per call and keeps
every row reasoning by clearing ``halted`` after each call, so no second compiled graph is needed.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
from dataclasses import dataclass
from typing import Callable, Iterator, Optional

import numpy as np
import torch

from models.act import Carry
from utils.data.common import dihedral
from utils.data.user_puzzles import maze_problems, sudoku_problems
from utils.errors import UserError
from utils.eval.flags import FLAG_NAMES, SETTING_NAMES, TEST_TIME_FLAGS

MAX_SEED = 2**62  # rollout k draws with seed + k in a 64-bit generator


class Cancelled(Exception):
    """:func:`reason` was asked to stop between two segments (its caller's ``stop``): nothing to answer."""


class TestTimeComputeError(UserError):
    """A test-time compute setting is out of range."""

    __test__ = False  # not a pytest class despite its name


@dataclass(frozen=True)
class TestTimeCompute:
    """How many segments, when to stop, how many rollouts (see the module docstring).

    Attributes:
        segments: segments at most per rollout; None: the model's ``halt_max_steps``.
        early_exit: stop a row when ``q_halt > 0`` (from ``min_segments`` on).
        min_segments: the fewest segments a row runs with ``early_exit``.
        rollouts: K, answers per puzzle ranked by the final ``q_halt``.
        noise: std of the Gaussian noise on the initial latent state of rollouts 1..K-1.
        seed: seeds the noise (rollout k uses ``seed + k``).
        keep_segments: also return every segment's answer and ``q_halt`` (of the kept rollout).
        views: V, dihedral views of each puzzle answered and voted on (1..8; 1: the puzzle as given).
        checker: ``checker(inputs [B, S], preds [B, S]) -> bool [B]``, whether each answer obeys the puzzle's rules;
            None: model-only selection (the references').
        stop_when_checked: with a checker, stop a batch's rollouts once every row has an answer that passes.
    """

    __test__ = False  # not a pytest class despite its name

    segments: Optional[int] = None
    early_exit: bool = False
    min_segments: int = 1
    rollouts: int = 1
    noise: float = 0.0
    seed: int = 0
    keep_segments: bool = False
    views: int = 1
    checker: Optional[Callable[[torch.Tensor, torch.Tensor], torch.Tensor]] = None
    stop_when_checked: bool = False

    def check(self, halt_max_steps: Optional[int] = None, names: Optional[dict[str, str]] = None) -> "TestTimeCompute":
        """Check every setting's range (``min_segments`` against ``segments``, or without them against the model's
        ``halt_max_steps`` when given).

        Args:
            names: how the user set each attribute, for the messages: :data:`FLAG_NAMES` (``--min-segments``) or
                :data:`SETTING_NAMES` (``eval_min_segments``); the attribute names by default.

        Raises:
            TestTimeComputeError: naming the setting as the user set it, and its range.
        """
        def named(attribute: str) -> str:
            return f"{(names or {}).get(attribute, attribute)}={getattr(self, attribute)}"

        if self.segments is not None and not 1 <= self.segments <= 10_000:
            raise TestTimeComputeError(f"{named('segments')} is out of range: 1..10000")
        if self.min_segments < 1:
            raise TestTimeComputeError(f"{named('min_segments')} is out of range: at least 1")
        limit = self.segments if self.segments is not None else halt_max_steps
        if limit is not None and self.min_segments > limit:
            source = named("segments") if self.segments is not None else "the model's halt_max_steps"
            more = "" if self.segments is not None else f", or set {(names or {}).get('segments', 'segments')} higher"
            raise TestTimeComputeError(f"{named('min_segments')} is more than the {limit} segments each puzzle runs "
                                       f"({source}): lower it{more}")
        if not 1 <= self.rollouts <= 1024:
            raise TestTimeComputeError(f"{named('rollouts')} is out of range: 1..1024")
        if not 1 <= self.views <= 8:
            raise TestTimeComputeError(f"{named('views')} is out of range: 1..8 (the dihedral transforms of a square)")
        if not (0 <= self.noise <= 100) or (self.rollouts > 1 and self.noise == 0):
            raise TestTimeComputeError(f"{named('noise')} is out of range: a finite std in (0, 100] when rollouts > 1 "
                                       "(identical rollouts would add nothing), 0..100 otherwise")
        if not 0 <= self.seed <= MAX_SEED:
            raise TestTimeComputeError(f"{named('seed')} is out of range: 0..{MAX_SEED}")
        return self

    @classmethod
    def of_run(cls, cfg, keep_segments: bool = False) -> "TestTimeCompute":
        """What a training run's evaluations use: its ``eval_halt_max_steps``, ``eval_early_exit``,
        ``eval_min_segments``, ``eval_rollouts``, ``eval_noise`` and ``eval_views``, the rollouts seeded by its
        ``seed``. ``cfg`` is a ``PretrainConfig`` (or a checkpoint's settings, which may predate ``eval_views``)."""
        return cls(cfg.eval_halt_max_steps, cfg.eval_early_exit, cfg.eval_min_segments, cfg.eval_rollouts,
                   cfg.eval_noise, cfg.seed, keep_segments, getattr(cfg, "eval_views", 1))

    def passes(self, halt_max_steps: int) -> int:
        """Segment passes a puzzle costs: segments (the model's ``halt_max_steps`` when unset) x rollouts x views,
        the count every fixed-compute figure states."""
        return (self.segments or halt_max_steps) * self.rollouts * self.views

    def describe(self, halt_max_steps: int) -> str:
        """The fixed-compute protocol a figure carries, e.g. ``fixed: 4 segments x 16 rollouts (noise 0.5) x 1 views
        = 64 segment passes a puzzle, model-only selection``."""
        return (f"fixed: {self.segments or halt_max_steps} segments x {self.rollouts} rollouts (noise {self.noise:g}) "
                f"x {self.views} views = {self.passes(halt_max_steps)} segment passes a puzzle, "
                f"{'checked' if self.checker is not None else 'model-only'} selection")

    @property
    def plain(self) -> bool:
        """Whether this is the references' evaluation (all ``halt_max_steps`` segments, one rollout, one view)."""
        return (self.segments is None and not self.early_exit and self.rollouts == 1 and self.views == 1
                and self.checker is None)


def initial_carry(head, batch: dict[str, torch.Tensor], noise: float, seed: int) -> Carry:
    """The carry every row starts from (``H_init``/``L_init``, the batch's data), with seeded Gaussian noise of std
    ``noise`` added to the latent state (drawn on the CPU, so a seed gives the same noise on every device)."""
    return stacked_initial_carry(head, batch, [(noise, seed)])


def stacked_initial_carry(head, batch: dict[str, torch.Tensor], draws: list[tuple[float, int]]) -> Carry:
    """The initial carries of ``len(draws)`` rollouts of ``batch`` [B, ...] stacked into one carry of
    ``len(draws) x B`` rows (rollout-major): rollout i's B rows start from the model's initial state plus Gaussian
    noise of std ``draws[i][0]`` drawn, latent by latent, from a CPU generator seeded ``draws[i][1]``: row for row
    the noise :func:`initial_carry` gives that rollout alone, so rollouts answered side by side answer as they do
    one after the other."""
    rows = {k: v.repeat(len(draws), *[1] * (v.ndim - 1)) for k, v in batch.items()}
    carry = head.initial_carry(rows)
    inner = head.model.inner.reset_carry(carry.halted, carry.inner_carry)
    if any(noise for noise, _ in draws):
        latents = dataclasses.asdict(inner)
        size = batch["inputs"].shape[0]
        drawn = {name: [] for name in latents}
        for noise, seed in draws:
            generator = torch.Generator().manual_seed(seed)
            for name, z in latents.items():  # the order initial_carry draws in
                one = torch.randn((size, *z.shape[1:]), generator=generator)
                drawn[name].append(noise * one if noise else torch.zeros_like(one))
        inner = dataclasses.replace(inner, **{name: z + torch.cat(drawn[name]).to(z.device, z.dtype)
                                              for name, z in latents.items()})
    return Carry(inner, torch.zeros_like(carry.steps), torch.zeros_like(carry.halted), rows)


@contextlib.contextmanager
def seeded_model_randomness(head, seed: int, device: torch.device) -> Iterator[None]:
    """Within the block, a model with randomness of its own (TRM with EqR's ``random_reset`` or ``noise_scale``,
    drawn from torch's global generator as EqR draws it) draws it from ``seed``, and the global generator is
    restored afterwards: the model answers a batch the same way each time, and a training run's random stream is
    not moved by its evaluations. A model without such randomness (every reference setting) is left alone."""
    if not head.model.inner.stochastic:
        yield
        return
    with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
        torch.manual_seed(seed)
        yield


@torch.no_grad()
def reason(forward: Callable, head, batch: dict[str, torch.Tensor], ttc: TestTimeCompute,
           stop: Optional[Callable[[], bool]] = None) -> dict[str, torch.Tensor]:
    """Answer one batch under ``ttc``.

    Args:
        forward: the (possibly compiled) ACT loss head to call; ``head`` is the module it wraps (in eval mode).
        batch: ``inputs``, ``labels``, ``puzzle_identifiers`` on the model's device.
        stop: asked before every segment; True ends the answer there (the page's client left, or the server stops).

    Returns:
        ``logits`` [B, S, V], ``preds`` [B, S] int64, ``q_halt_logits`` [B] fp32 and ``segments`` [B] int32 of the
        kept answer; with ``keep_segments``, ``segment_preds`` [B, T, S] and ``segment_q_halt`` [B, T] of the kept
        rollout (segments after a row stopped repeat its answer). With views, all in the puzzle's own orientation,
        and ``votes`` [B] int64, the views that agree with the kept answer. With a ``checker``, the same keys
        prefixed ``checked_`` for the checked selection, and ``checked_passes`` [B] bool, whether its answer passes.

    Raises:
        TestTimeComputeError: ``views`` > 1 on a batch that is not a square grid or that has puzzle identifiers.
        Cancelled: ``stop`` said so.
    """
    with seeded_model_randomness(head, ttc.seed, batch["inputs"].device):
        if ttc.views == 1:
            return _best_rollout(forward, head, batch, ttc, stop)
        return _voted_views(forward, head, batch, ttc, stop)


def _voted_views(forward: Callable, head, batch: dict[str, torch.Tensor], ttc: TestTimeCompute,
                 stop: Optional[Callable[[], bool]]) -> dict[str, torch.Tensor]:
    """:func:`reason` with ``ttc.views`` > 1: each view answered, mapped back and voted on."""
    side = view_grid_side(batch["inputs"].shape[1], bool((batch["puzzle_identifiers"] != 0).any()))
    answers = []
    for t in range(ttc.views):
        order = torch.as_tensor(dihedral_order(side, t), device=batch["inputs"].device)
        view = {k: v[:, order] if k in ("inputs", "labels") else v for k, v in batch.items()}
        answer = _best_rollout(forward, head, view, ttc, stop)
        back = torch.argsort(order)
        answers.append({k: v.index_select(SEQUENCE_AXIS[k.removeprefix(CHECKED)], back)
                        if k.removeprefix(CHECKED) in SEQUENCE_AXIS else v for k, v in answer.items()})
    if ttc.checker is None:
        return vote(answers)
    checked = vote([_unprefixed(a) for a in answers], passes=[a[CHECKED + "passes"] for a in answers])
    return vote([{k: v for k, v in a.items() if not k.startswith(CHECKED)} for a in answers]) | _prefixed(checked)


SEQUENCE_AXIS = {"logits": 1, "preds": 1, "segment_preds": 2}  # the grid-cell axis of each answer tensor
CHECKED = "checked_"  # the prefix of the checked selection's answer


def _prefixed(answer: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return {CHECKED + k: v for k, v in answer.items()}


def _unprefixed(answer: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return {k.removeprefix(CHECKED): v for k, v in answer.items() if k.startswith(CHECKED) and k != CHECKED + "passes"}


def view_grid_side(seq_len: int, has_identifiers: bool = False) -> int:
    """The side of the square grid that dihedral views transform: ``sqrt(seq_len)``.

    Raises:
        TestTimeComputeError: ``seq_len`` is not a square, or a puzzle has an identifier (a learned per-puzzle
            embedding, which a rotated copy of the puzzle would not match; ARC's case).
    """
    side = math.isqrt(seq_len)
    if side * side != seq_len:
        raise TestTimeComputeError(f"views > 1 rotate a square grid, but the puzzles have {seq_len} cells; "
                                   "use views=1 for this dataset")
    if has_identifiers:
        raise TestTimeComputeError("views > 1 cannot rotate puzzles that have their own identifiers (a per-puzzle "
                                   "embedding, as ARC's): use views=1, and the ARC evaluator's voting for ARC")
    return side


def dihedral_order(side: int, t: int) -> np.ndarray:
    """[side²] int64: cell ``j`` of view ``t`` is cell ``order[j]`` of the puzzle (row-major), so that
    ``x[:, order]`` is :func:`utils.data.common.dihedral` ``t`` of each grid and ``argsort(order)`` undoes it."""
    return dihedral(np.arange(side * side).reshape(side, side), t).reshape(-1).copy()


def vote(answers: list[dict[str, torch.Tensor]], passes: Optional[list[torch.Tensor]] = None) -> dict[str, torch.Tensor]:
    """Per row, the answer most of ``answers`` (one per view, same keys and shapes) agree on exactly.

    Identical ``preds`` pool their votes; the most votes win, ties go to the higher mean ``sigmoid(q_halt)`` of
    the agreeing views, then to the earlier view (TRM ``evaluators/arc.py``'s ranking). The kept row is that of
    the first view in the winning group, with ``votes`` [B] int64: how many views gave that answer. With
    ``passes`` (bool [B] per view: the answer obeys the puzzle's rules), an answer that passes wins before votes
    count, and ``passes`` [B] of the kept answer is returned too (checked selection).
    """
    preds = torch.stack([a["preds"] for a in answers])  # [V, B, S]
    confidence = torch.sigmoid(torch.stack([a["q_halt_logits"] for a in answers]).float())  # [V, B]
    same = (preds[:, None] == preds[None]).all(-1)  # [V, V, B]: view v agrees with view w on row b
    votes = same.sum(1)
    mean_confidence = (same * confidence[None]).sum(1) / votes
    score = 2 * votes + mean_confidence  # votes first: a vote is worth more than any confidence in [0, 1]
    if passes is not None:
        passed = torch.stack(passes)
        score = score + 4 * len(answers) * passed  # passing first: more than any votes and confidence
    pick = score.argmax(0)
    rows = torch.arange(preds.shape[1], device=preds.device)
    kept = {k: torch.stack([a[k] for a in answers])[pick, rows] for k in answers[0]}
    return kept | {"votes": votes[pick, rows]} | ({} if passes is None else {"passes": passed[pick, rows]})


def _best_rollout(forward: Callable, head, batch: dict[str, torch.Tensor], ttc: TestTimeCompute,
                  stop: Optional[Callable[[], bool]]) -> dict[str, torch.Tensor]:
    """The rollouts of one view of the batch; each row keeps the rollout with the highest final ``q_halt``, and with
    a checker also (``checked_*``) the highest-``q_halt`` rollout among those whose answer passes, if any."""
    best = checked = None
    for run in rollouts(forward, head, batch, ttc, stop):
        best = run if best is None else _keep(run["q_halt_logits"] > best["q_halt_logits"], run, best)
        if ttc.checker is None:
            continue
        run = run | {"passes": ttc.checker(batch["inputs"], run["preds"]).to(run["preds"].device)}
        if checked is None:
            checked = run
        else:
            better = checked_better(run["passes"], run["q_halt_logits"], checked["passes"], checked["q_halt_logits"])
            checked = _keep(better, run, checked)
        if ttc.stop_when_checked and bool(checked["passes"].all()):
            break
    return best if checked is None else best | _prefixed(checked)


def checked_better(passes: torch.Tensor, q_halt: torch.Tensor, kept_passes: torch.Tensor,
                   kept_q_halt: torch.Tensor) -> torch.Tensor:
    """Where an answer beats the one kept so far under checked selection (any shape, elementwise): it obeys the rules
    and the kept one does not, or both alike in that and its ``q_halt`` is higher."""
    return (passes > kept_passes) | ((passes == kept_passes) & (q_halt > kept_q_halt))


# Rows one forward call holds when rollouts of a small batch are answered side by side. On a GPU, as many as fit
# (256: a large matrix product keeps it busy). On a CPU a segment pass is fastest at about a thousand tokens a call:
# measured with the bundled Sudoku model on a 2-core AVX2 EPYC, passes/s rose from 22 (1 row) to 46 (8-16 rows of 81
# tokens) and fell to 24 at 128 rows, whose activations no longer fit in the cache (scripts/benchmark_passes.py).
ROLLOUT_ROWS = 256
CPU_TOKENS_PER_CALL = 1024


def rows_per_call(device: torch.device, seq_len: int) -> int:
    """How many rows (puzzle x rollout) one forward call of rollouts side by side holds on ``device``, for puzzles
    of ``seq_len`` tokens: :data:`ROLLOUT_ROWS`, on a CPU at most :data:`CPU_TOKENS_PER_CALL` tokens' worth."""
    if device.type == "cpu":
        return max(1, min(ROLLOUT_ROWS, CPU_TOKENS_PER_CALL // seq_len))
    return ROLLOUT_ROWS


def rollouts(forward: Callable, head, batch: dict[str, torch.Tensor], ttc: TestTimeCompute,
             stop: Optional[Callable[[], bool]] = None) -> Iterator[dict[str, torch.Tensor]]:
    """Each of the ``ttc.rollouts`` rollouts of one view of the batch, in order, as :func:`reason` returns an answer
    (without views): rollout 0 from the initial state, rollout k from it plus noise seeded ``ttc.seed + k``. They
    are answered side by side (:func:`rollout_answers`), with the same answers as one at a time."""
    draws = [(ttc.noise if k else 0.0, ttc.seed + k) for k in range(ttc.rollouts)]
    yield from rollout_answers(forward, head, batch, ttc, draws, stop)


def _keep(better: torch.Tensor, run: dict[str, torch.Tensor], best: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Row by row, ``run``'s answer where ``better`` [B], else ``best``'s."""
    return {key: torch.where(better.view(-1, *[1] * (v.ndim - 1)), v, best[key]) for key, v in run.items()}


def rollout_answers(forward: Callable, head, batch: dict[str, torch.Tensor], ttc: TestTimeCompute,
                    draws: list[tuple[float, int]], stop: Optional[Callable[[], bool]] = None
                    ) -> Iterator[dict[str, torch.Tensor]]:
    """The answers of the rollouts ``draws`` ((noise std, seed) each, :func:`stacked_initial_carry`) of ``batch``
    [B, ...] under ``ttc``'s segments and early exit, in order, one per rollout, keyed as :func:`reason`'s (without
    views and checks). Rollouts are answered side by side, as many per forward call as :func:`rows_per_call` holds
    (one at a time when the batch alone fills a call): many small matrix products become a few larger ones, and
    since rows never mix the answers are those of one rollout at a time.

    Raises:
        Cancelled: ``stop`` said so before a segment.
    """
    inputs = batch["inputs"]
    together = max(1, rows_per_call(inputs.device, inputs.shape[1]) // inputs.shape[0])
    for first in range(0, len(draws), together):
        yield from _side_by_side(forward, head, batch, ttc, draws[first:first + together], stop)


def run_segments(forward: Callable, carry: Carry, total: int, stop: Optional[Callable[[], bool]] = None
                 ) -> Iterator[tuple[int, dict[str, torch.Tensor]]]:
    """``(t, outputs)`` after each segment t = 1..``total`` of every row of ``carry`` (its ``current_data`` the
    batch), every row reasoning on past the ACT wrapper's own halting.

    Raises:
        Cancelled: ``stop`` (asked before every segment) said so.
    """
    rows = carry.current_data
    for t in range(1, total + 1):
        if stop is not None and stop():
            raise Cancelled(f"stopped before segment {t} of {total}")
        carry, _, _, outputs, _ = forward(carry, rows)
        carry.halted = torch.zeros_like(carry.halted)  # keep reasoning past the ACT wrapper's own halting
        yield t, outputs


def _side_by_side(forward: Callable, head, batch: dict[str, torch.Tensor], ttc: TestTimeCompute,
                  draws: list[tuple[float, int]], stop: Optional[Callable[[], bool]]) -> list[dict[str, torch.Tensor]]:
    """The answers of the rollouts ``draws`` of ``batch``, in one batch of ``len(draws) x B`` rows."""
    total = ttc.segments or head.model.config.halt_max_steps
    carry = stacked_initial_carry(head, batch, draws)
    stopped = torch.zeros_like(carry.halted)
    kept: dict[str, torch.Tensor] = {}
    frames, confidences = [], []
    for t, outputs in run_segments(forward, carry, total, stop):
        fresh = {"logits": outputs["logits"], "q_halt_logits": outputs["q_halt_logits"].float(),
                 "segments": torch.full_like(carry.steps, t)}
        kept = fresh if not kept else {k: torch.where(stopped.view(-1, *[1] * (v.ndim - 1)), kept[k], v)
                                       for k, v in fresh.items()}
        if ttc.keep_segments:
            frames.append(kept["logits"].argmax(-1))
            confidences.append(kept["q_halt_logits"])
        if ttc.early_exit and t >= ttc.min_segments:
            stopped = stopped | (kept["q_halt_logits"] > 0)
            if bool(stopped.all()):
                break
    kept["preds"] = kept["logits"].argmax(-1)
    if ttc.keep_segments:
        frames += frames[-1:] * (total - len(frames))  # rows that all stopped early hold their answer
        confidences += confidences[-1:] * (total - len(confidences))
        kept["segment_preds"], kept["segment_q_halt"] = torch.stack(frames, 1), torch.stack(confidences, 1)
    return [dict(zip(kept, parts)) for parts in zip(*(v.chunk(len(draws)) for v in kept.values()))]


RULES = {"sudoku": sudoku_problems, "maze": maze_problems}  # what keeps an answer from being a solution, by task


def rules_checker(task: Optional[str]) -> Callable[[torch.Tensor, torch.Tensor], torch.Tensor]:
    """The checker of checked selection for ``task``: ``check(inputs [B, S], preds [B, S]) -> bool [B]`` (on the
    CPU), True where the answer obeys the puzzle's rules (Sudoku: every unit holds 1-9 once and the givens are kept;
    mazes: walls, S and G kept and the path is exactly one shortest S-G path; utils/data/user_puzzles.py). Padding
    rows (all 0) fail.

    Raises:
        TestTimeComputeError: ``task`` is not one whose answers can be checked (ARC's rules are the hidden answer).
    """
    problems = RULES.get(task or "")
    if problems is None:
        raise TestTimeComputeError(f"--checked selects answers by the puzzle's rules, which only Sudoku and mazes "
                                   f"have; these puzzles are {task or 'of an unknown kind'}: leave out --checked")

    def check(inputs: torch.Tensor, preds: torch.Tensor) -> torch.Tensor:
        rows = zip(inputs.cpu().numpy(), preds.cpu().numpy())
        return torch.tensor([bool(puzzle.any()) and not problems(answer, puzzle) for puzzle, answer in rows])
    return check


def test_time_compute(args, run_cfg=None, keep_segments: bool = False, task: Optional[str] = None) -> TestTimeCompute:
    """The :class:`TestTimeCompute` the flags of :func:`add_test_time_arguments` ask for, with ``--checked`` the
    :func:`rules_checker` of ``task`` (which leaves the other settings as they would be without it).

    With none of those flags given and ``run_cfg`` (the training run's config, ``Trained.cfg``) at hand, the run's
    own evaluation settings (:meth:`TestTimeCompute.of_run`), so that ``evaluate.py RUN`` scores what the run's
    evaluations scored; ``--rollout-seed`` may still change their seed. Otherwise the flags, each one not given at
    the references' default.

    Raises:
        TestTimeComputeError: a value out of range, or ``--checked`` for a task without rules to check.
    """
    ttc = _flagged_compute(args, run_cfg, keep_segments)
    return dataclasses.replace(ttc, checker=rules_checker(task)) if getattr(args, "checked", False) else ttc


def check_test_time_flags(args) -> None:
    """Check the test-time flags' own ranges, before a checkpoint is loaded to check them against its run.

    Raises:
        TestTimeComputeError: a value out of range.
    """
    _flagged_compute(args, None, False)


def _flagged_compute(args, run_cfg, keep_segments: bool) -> TestTimeCompute:
    halt_max_steps = getattr(run_cfg, "arch", {}).get("halt_max_steps")
    if run_cfg is not None and all(getattr(args, flag) is None for flag in TEST_TIME_FLAGS):
        ttc = TestTimeCompute.of_run(run_cfg, keep_segments)
        if args.rollout_seed is None:
            return ttc.check(halt_max_steps, SETTING_NAMES)
        return dataclasses.replace(ttc, seed=args.rollout_seed).check(halt_max_steps, SETTING_NAMES | {"seed": "--rollout-seed"})
    rollouts = 1 if args.rollouts is None else args.rollouts
    noise = args.noise if args.noise is not None else (1.0 if rollouts > 1 else 0.0)
    return TestTimeCompute(args.segments, bool(args.early_exit), 1 if args.min_segments is None else args.min_segments,
                           rollouts, noise, args.rollout_seed or 0, keep_segments,
                           1 if args.views is None else args.views).check(halt_max_steps, FLAG_NAMES)
