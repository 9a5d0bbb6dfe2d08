"""The test-time compute flags of ``evaluate.py`` and ``solve.py``, defined once, without importing torch: a
``--help`` answers at once (the policy they set lives in utils/eval/reasoning.py, the anytime budget in
utils/solve/anytime.py)."""

from __future__ import annotations

from typing import Optional

TEST_TIME_FLAGS = ("segments", "early_exit", "min_segments", "rollouts", "noise", "views")
# How a user sets each TestTimeCompute attribute: as flags of evaluate.py and solve.py, or as a run's settings.
FLAG_NAMES = {"segments": "--segments", "min_segments": "--min-segments", "rollouts": "--rollouts", "noise": "--noise",
              "views": "--views", "seed": "--rollout-seed"}
SETTING_NAMES = {"segments": "eval_halt_max_steps", "min_segments": "eval_min_segments", "rollouts": "eval_rollouts",
                 "noise": "eval_noise", "views": "eval_views", "seed": "seed"}


def add_test_time_arguments(parser) -> None:
    """The test-time compute flags of ``evaluate.py`` and ``solve.py`` (one definition for both)."""
    g = parser.add_argument_group("test-time compute (default: the training run's own evaluation settings, "
                                  "eval_halt_max_steps, eval_rollouts, ..., where the checkpoint has them; else the "
                                  "model's halt_max_steps segments and one answer, as the references evaluate; any of "
                                  "these flags replaces the run's settings, the rest at those defaults)")
    g.add_argument("--segments", type=int, default=None, metavar="T",
                   help="ACT segments at most per puzzle (more than training used is allowed)")
    g.add_argument("--early-exit", action="store_true", default=None,
                   help="a puzzle stops at the first segment where the Q head says halt (q_halt > 0)")
    g.add_argument("--min-segments", type=int, default=None, metavar="M",
                   help="with --early-exit, the fewest segments a puzzle runs (default: 1)")
    g.add_argument("--rollouts", type=int, default=None, metavar="K",
                   help="answer each puzzle K times (the first from the model's initial state, the others from it "
                        "plus noise) and keep the answer with the highest q_halt (default: 1)")
    g.add_argument("--noise", type=float, default=None,
                   help="std of the noise on the initial latent state of rollouts 2..K (default: 1.0 with K > 1)")
    g.add_argument("--views", type=int, default=None, metavar="V",
                   help="answer each puzzle in V dihedral views (rotations and reflections, 1..8; square grids "
                        "such as Sudoku and mazes) and keep the answer most views agree on (default: 1)")
    g.add_argument("--rollout-seed", type=int, default=None,
                   help="seed of the rollouts' noise (default: the run's seed with its own settings, else 0)")
    g.add_argument("--checked", action="store_true",
                   help="checked selection (Sudoku, mazes): among the rollouts and views, an answer that obeys the "
                        "puzzle's rules beats one the Q head prefers; reported beside the model-only selection (the "
                        "references' protocol), never instead of it. Off by default")



def add_budget_argument(parser, default: Optional[float], default_says: str) -> None:
    """``--budget SECONDS`` of ``solve.py`` and ``evaluate.py``: anytime solving (utils/solve/anytime.py)."""
    parser.add_argument("--budget", type=float, default=default, metavar="SECONDS",
                        help="anytime solving with checked answers (Sudoku, mazes): spend up to SECONDS a puzzle on "
                             "rounds of more and more trajectories, each in a symmetry of the puzzle with latent noise "
                             "(--noise, its std), every segment checked, until an answer obeys the puzzle's rules; not "
                             f"the references' protocol, and reported as 'checked, anytime' ({default_says})")
