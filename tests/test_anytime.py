"""Anytime solving with checked answers (utils/solve/anytime.py; solve.py and evaluate.py --budget), and rollouts
answered side by side (utils/eval/reasoning.py), on the CPU with the bundled Sudoku model. The clock is the test's:
a fake one that moves a fixed step each time it is read, so a budget's rounds never depend on the machine's pace."""

import dataclasses
import logging
import re
import threading
from pathlib import Path

import numpy as np
import pytest
import torch

import evaluate
import solve
from utils.data.user_puzzles import parse_sudoku
from utils.eval import reasoning
from utils.solve import anytime
from utils.solve import solving
from utils.eval.reasoning import Cancelled, TestTimeCompute, dihedral_order, reason
from utils.solve.solving import open_model
from utils.serve.fields import MAX_PAGE_BUDGET_S
from tests.test_serve import call, shipped, until  # noqa: F401  (a fixture)

CPU = torch.device("cpu")
HELD_OUT = "...3...9.2....9..1...5...3...94...151....8...6.4...7.8..2.64....9..3.4...8..5...."  # the README's puzzle
ESCARGOT = "1....7.9..3..2...8..96..5....53..9...1..8...26....4...3......1..4......7..7...3.."  # AI Escargot (2006)


class FakeClock:
    """Seconds that advance ``step`` each time they are read, and by what :func:`each_round` charges a segment."""

    def __init__(self, step: float = 0.0):
        self.now, self.step = 0.0, step

    def __call__(self) -> float:
        self.now += self.step
        return self.now


PASS_S = 1 / 64  # what the fake clock charges a segment pass of one trajectory (a power of 2: sums are exact)


@pytest.fixture(scope="module")
def bundled():
    return open_model(None, "sudoku", 81, 1, CPU, torch.float32)


@pytest.fixture()
def each_round(monkeypatch):
    """The rounds :func:`anytime.solve_anytime` runs (first trajectory, count, and the clock's time before each of
    their segments); every segment moves ``each_round.clock`` by :data:`PASS_S` a trajectory, so a budget buys the
    same segments on any machine, however slow the clock's steps make it."""
    rounds = Rounds()
    real = anytime.run_trajectories

    def spy(trained, task, tokens, search, first, count, seed, device, stop=None):
        starts = []
        rounds.append((first, count, starts))
        for segment in real(trained, task, tokens, search, first, count, seed, device, stop):
            starts.append(rounds.clock.now)  # the time the segment was begun at: stop() read the clock just before
            rounds.clock.now += PASS_S * count
            yield segment

    monkeypatch.setattr(anytime, "run_trajectories", spy)
    return rounds


class Rounds(list):
    """The rounds :func:`each_round` saw, and the clock they move."""

    def __init__(self):
        super().__init__()
        self.clock = FakeClock()


def own_compute(bundled) -> TestTimeCompute:
    return dataclasses.replace(TestTimeCompute.of_run(bundled.cfg), rollouts=1, views=1)


def never(monkeypatch):
    """No answer obeys the rules, for this test."""
    monkeypatch.setitem(reasoning.RULES, "sudoku", lambda answer, puzzle: ["never, in this test"])


def test_round_0_is_the_models_own_answer_and_a_consistent_one_ends_the_solve(bundled, each_round):
    tokens = parse_sudoku(HELD_OUT, "p")
    solved = anytime.solve_anytime(bundled, "sudoku", "p", tokens, 5.0, own_compute(bundled), CPU,
                                   clock=each_round.clock)
    assert solved.ended == "consistent" and solved.answer.consistent and solved.answer.selection == "checked"
    assert solved.answer.unique is True and "NOT unique" not in solved.answer.verdict
    assert [(first, count) for first, count, _ in each_round] == [(0, 1)]
    inputs = torch.from_numpy(tokens[None].astype(np.int32))
    plain = reason(bundled.head, bundled.head, {"inputs": inputs, "labels": inputs.long(),
                                                "puzzle_identifiers": torch.zeros(1, dtype=torch.int32)},
                   TestTimeCompute(segments=4, keep_segments=True))
    t = solved.answer.segments  # checked after every segment: the first consistent segment of the model's own
    assert solved.spent.passes == t and np.array_equal(solved.answer.grid, plain["segment_preds"][0, t - 1].numpy())
    assert np.array_equal(solved.answer.segment_grids, plain["segment_preds"][0, :t].numpy())


def test_rounds_grow_in_fresh_trajectories_until_the_budget_is_spent(bundled, each_round, monkeypatch):
    never(monkeypatch)
    tokens = parse_sudoku(ESCARGOT, "escargot")
    solved = anytime.solve_anytime(bundled, "sudoku", "escargot", tokens, 3.0, own_compute(bundled), CPU,
                                   clock=each_round.clock)
    assert solved.ended == "budget" and not solved.answer.consistent and solved.own_seconds is None
    most = reasoning.rows_per_call(CPU, 81)
    sizes = [count for _, count, _ in each_round]
    assert sizes[:4] == [1, 1, 2, 4] and set(sizes[4:]) <= {min(8, most), most}
    firsts = [first for first, _, _ in each_round]
    assert firsts == list(np.cumsum([0] + sizes[:-1]))  # no trajectory repeats another
    assert solved.spent.trajectories == sum(sizes) and solved.spent.passes == sum(
        count * len(starts) for _, count, starts in each_round)
    assert len(each_round[-1][2]) < 4  # the last round was cut by the deadline, not skipped


@pytest.mark.parametrize("step", [0.0, 0.3, 5.0])  # a clock that also moves when read: a slow, busy machine
def test_the_budget_is_a_ceiling_round_0_included(bundled, each_round, monkeypatch, step):
    never(monkeypatch)
    each_round.clock.step = step
    budget = 1.0
    solved = anytime.solve_anytime(bundled, "sudoku", "e", parse_sudoku(ESCARGOT, "e"), budget, own_compute(bundled),
                                   CPU, clock=each_round.clock)
    starts = [t for _, _, times in each_round for t in times]
    # Every segment after round 0's first began before the deadline: at most one segment runs past the budget.
    assert all(t < budget + starts[0] for t in starts[1:]) and solved.answer is not None
    if step == 5.0:  # round 0 did not fit: it is cut, and the solve says what it would need
        assert len(starts) == 1 and solved.own_seconds is not None and solved.own_seconds > budget


def test_a_sudoku_with_no_solution_ends_at_once_and_one_with_two_says_so(bundled, each_round):
    no_solution = "12345678." + "........9" + "." * 63  # row 1 needs a 9 where column 9 has one: no clash in sight
    solved = anytime.solve_anytime(bundled, "sudoku", "x", parse_sudoku(no_solution, "x"), 5.0, own_compute(bundled),
                                   CPU, clock=each_round.clock)
    assert solved.ended == "unsolvable" and solved.answer is None and solved.spent == anytime.Spent()
    assert each_round == []  # the model never ran
    two = parse_sudoku(HELD_OUT, "p")
    two[np.flatnonzero(two > 1)[:20]] = 1  # 20 givens fewer: more than one solution
    solved = anytime.solve_anytime(bundled, "sudoku", "y", two, 0.5, own_compute(bundled), CPU,
                                   clock=each_round.clock)
    assert solved.answer.unique is False and "the puzzle is NOT unique" in solved.answer.verdict


def test_a_maze_whose_s_and_g_are_not_connected_spends_nothing(monkeypatch):
    from utils.data.user_puzzles import parse_maze

    maze = open_model(None, "maze", 100, 1, CPU, torch.float32)
    rows = ["S    #    ", "     #    ", *["     #    "] * 7, "     #   G"]
    tokens, _ = parse_maze("\n".join(rows), "m")
    monkeypatch.setattr(anytime, "run_trajectories", lambda *a, **k: pytest.fail("the model ran"))
    solved = anytime.solve_anytime(maze, "maze", "m", tokens, 5.0, own_compute(maze), CPU)
    assert solved.ended == "unsolvable" and solved.spent.passes == 0


def test_the_first_answer_that_obeys_the_rules_wins(bundled, each_round, monkeypatch):
    tokens = parse_sudoku(ESCARGOT, "escargot")
    first = anytime.solve_anytime(bundled, "sudoku", "e", tokens, 0.001, own_compute(bundled), CPU,
                                  clock=FakeClock(1.0)).answer.grid  # round 0's first segment alone
    monkeypatch.setitem(reasoning.RULES, "sudoku",
                        lambda answer, puzzle: [] if not np.array_equal(answer, first) else ["round 0's answer"])
    each_round.clear()
    solved = anytime.solve_anytime(bundled, "sudoku", "e", tokens, 1e6, own_compute(bundled), CPU,
                                   clock=each_round.clock)
    assert solved.ended == "consistent" and not np.array_equal(solved.answer.grid, first)
    assert solved.spent.rounds == len(each_round) and solved.spent.passes >= 2


def test_enough_ends_with_the_best_answer_so_far_and_cancel_abandons(bundled, each_round, monkeypatch):
    never(monkeypatch)
    tokens, asked = parse_sudoku(ESCARGOT, "e"), []

    def enough():
        asked.append(1)
        return len(asked) > 13  # at segment 2 of round 3 (4 segments a round)

    solved = anytime.solve_anytime(bundled, "sudoku", "e", tokens, 1e6, own_compute(bundled), CPU, enough=enough,
                                   clock=each_round.clock)
    assert solved.ended == "stopped" and solved.answer is not None
    assert (solved.spent.rounds, solved.spent.passes) == (4, 4 * (1 + 1 + 2) + 1 * 4)  # round 3: 1 segment of 4
    with pytest.raises(Cancelled):
        anytime.solve_anytime(bundled, "sudoku", "e", tokens, 1e6, own_compute(bundled), CPU, cancel=lambda: True,
                              clock=each_round.clock)


def test_rollouts_side_by_side_answer_as_one_at_a_time(bundled, monkeypatch):
    puzzles = np.stack([parse_sudoku(HELD_OUT, "a"), parse_sudoku(ESCARGOT, "b")]).astype(np.int32)
    inputs = torch.from_numpy(puzzles)
    batch = {"inputs": inputs, "labels": inputs.long(), "puzzle_identifiers": torch.zeros(2, dtype=torch.int32)}
    ttc = TestTimeCompute(segments=3, rollouts=12, noise=0.5, seed=7, keep_segments=True, early_exit=True)
    together = reason(bundled.head, bundled.head, batch, ttc)
    monkeypatch.setattr(reasoning, "ROLLOUT_ROWS", 2)  # one rollout of the 2 puzzles a call: the code before
    alone = reason(bundled.head, bundled.head, batch, ttc)
    for key in ("preds", "segment_preds", "segments"):
        assert torch.equal(together[key], alone[key]), key
    for key in ("logits", "q_halt_logits", "segment_q_halt"):
        torch.testing.assert_close(together[key], alone[key], rtol=1e-4, atol=1e-4)


def test_solve_py_exits_1_with_the_best_answer_and_what_would_help(tmp_path, capsys):
    args = ["--sudoku", ESCARGOT, "--device", "cpu", "--out", str(tmp_path / "out")]
    assert solve.main([*args, "--budget", "0.001"]) == 1  # round 0's first segment alone: it fails here
    out = capsys.readouterr().out.splitlines()
    assert any(line.startswith("checked, anytime, <=0.001 s a puzzle: none obeyed the rules in 1 round(s) of 1 "
                               "trajectories, 1 segment passes, ") for line in out)
    assert any(line.startswith("the budget (0.001 s) ended before the model's own answer (round 0) was complete: it "
                               "needs about ") and " here; --budget " in line for line in out)
    assert "checked selection found no answer that obeys the rules: this is the Q head's choice" in "\n".join(out)
    # not 4 x 0.001 s: the budget that holds the model's own answer, as the line above gives it (issue 74)
    held = re.search(r" here; --budget (\d+) holds it", "\n".join(out))
    assert out[-1].startswith(f"more time may find a consistent answer: --budget {held[1]} spends up to {held[1]} s")
    assert solve.main([*args, "--budget", "0"]) == 1  # fixed compute: the card's 16 rollouts of 4 segments
    out = capsys.readouterr().out.splitlines()
    assert "64 segment passes a puzzle in" in out[-2]
    assert out[-1].startswith("more test-time compute may find a consistent answer: --rollouts 64 (about ")
    assert "--budget 30" in out[-1]


def test_solve_py_says_a_puzzle_has_no_solution_with_no_hint_of_more_time(tmp_path, capsys):
    no_solution = "12345678." + "........9" + "." * 63
    assert solve.main(["--sudoku", no_solution, "--device", "cpu", "--out", str(tmp_path)]) == 1
    out = capsys.readouterr().out
    assert "puzzle 1: this Sudoku has no solution (an exact search found none)" in out and "nothing was run" in out
    assert "more time" not in out and "0 of 1 answer(s) consistent; 0 segment passes" in out
    assert not list(tmp_path.iterdir())  # nothing to draw


def test_solve_py_refuses_budgets_it_cannot_keep(tmp_path, capsys):
    for flags, wanted in ((["--budget", "-1"], "--budget -1 is out of range"),
                          (["--budget", "5", "--rollouts", "4"], "--rollouts 4 with --budget"),
                          (["--budget", "5", "--views", "2"], "--views 2 with --budget"),
                          (["--budget", "nan"], "--budget nan is out of range")):
        assert solve.main(["--sudoku", HELD_OUT, "--device", "cpu", "--out", str(tmp_path), *flags]) == 2
        assert wanted in capsys.readouterr().err


def test_evaluate_py_reports_the_anytime_protocol_on_its_own_line(sudoku_dir, capsys, caplog, monkeypatch):
    """... and, its stderr not a terminal (captured here, as a redirected log), progress lines instead of a bar: one
    a puzzle with the interval at 0."""
    monkeypatch.setattr(anytime, "PROGRESS_LOG_S", 0.0)
    bundled = str(solving.bundled_checkpoint("sudoku"))
    with caplog.at_level(logging.INFO, logger=anytime.__name__):
        assert evaluate.main(["--checkpoint", bundled, "--data-path", str(sudoku_dir), "--device", "cpu",
                              "--max-examples", "3", "--budget", "2", "--batch-size", "4"]) == 0
    out = capsys.readouterr().out.splitlines()
    line = next(line for line in out if line.startswith("checked, anytime, <=2 s a puzzle: solved "))
    assert "(95% CI " in line and "n=3)" in line and "seconds median" in line and "segment passes median" in line
    assert any(line.strip().startswith("exact_accuracy:") for line in out)  # the model-only figure stays
    progress = [r.getMessage() for r in caplog.records if r.name == anytime.__name__ and " of 3 puzzles" in r.getMessage()]
    assert [m.split(": ", 1)[1].split(" puzzles")[0] for m in progress] == ["1 of 3", "2 of 3", "3 of 3"], progress
    assert all(m.startswith("checked, anytime, <=2 s a puzzle: ") and " solved exactly, " in m for m in progress)
    solved = [int(m.split(" puzzles, ")[1].split(" solved")[0]) for m in progress]
    assert solved == sorted(solved) and all(n <= done for n, done in zip(solved, (1, 2, 3))), progress


def test_a_longer_budget_also_reports_the_shorter_ones_as_lower_bounds():
    """A 60 s run gives the 1 s and 6 s figures: an exact answer found by the cut-off counts, a late or wrong one
    does not, and a cut-off at or past the budget is not reported (the run's own figure is the whole protocol)."""
    exact, seconds = [True, True, True, False, True], [0.4, 1.0, 5.9, 0.1, 30.0]
    assert anytime.solved_within(exact, seconds, 60.0) == {"anytime/solved_within_1s": 0.4,
                                                           "anytime/solved_within_6s": 0.6}
    assert anytime.solved_within(exact, seconds, 6.0) == {"anytime/solved_within_1s": 0.4}
    assert anytime.solved_within([], [], 60.0) == {"anytime/solved_within_1s": 0.0, "anytime/solved_within_6s": 0.0}
    metrics = {"anytime/exact_accuracy": 0.8, "anytime/exact_accuracy_ci95_low": 0.4,
               "anytime/exact_accuracy_ci95_high": 0.96, "anytime/count": 5.0, "anytime/seconds_median": 1.0,
               "anytime/seconds_p90": 20.0, "anytime/passes_median": 10.0, "anytime/passes_p90": 90.0,
               **anytime.solved_within(exact, seconds, 60.0)}
    assert anytime.anytime_line(metrics, 60.0).endswith("; within 1 s 0.4000; within 6 s 0.6000")


def test_evaluate_py_max_examples_answers_that_many_not_a_training_batch(sudoku_dir, capsys):
    """--max-examples 2 used to answer a whole batch of the run's global_batch_size (64: two minutes with 16
    rollouts on a CPU) and count them all; now the batch is cut to it."""
    bundled = str(solving.bundled_checkpoint("sudoku"))
    assert evaluate.main(["--checkpoint", bundled, "--data-path", str(sudoku_dir), "--device", "cpu",
                          "--max-examples", "2", "--rollouts", "1"]) == 0
    line = next(line for line in capsys.readouterr().out.splitlines() if line.strip().startswith("exact_accuracy:"))
    assert "n=2)" in line, line


def test_the_page_solves_under_a_budget_shows_its_progress_and_stops_with_its_best(shipped, monkeypatch):  # noqa: F811
    monkeypatch.setitem(reasoning.RULES, "sudoku", lambda answer, puzzle: ["never, in this test"])
    models = call(shipped, "GET", "/api/models")[1]["models"]
    assert models[0]["compute"]["budget"] == 0  # this page was started without one: fixed compute by default
    replies, progress = [], "/api/progress?solve=a-budgeted-solve"
    request = {"model": 0, "puzzle": ESCARGOT, "solve_id": "a-budgeted-solve",
               "compute": {"budget": MAX_PAGE_BUDGET_S, "segments": 2}}
    solving_thread = threading.Thread(target=lambda: replies.append(call(shipped, "POST", "/api/solve", request)))
    solving_thread.start()
    until(lambda: call(shipped, "GET", progress)[1].get("rounds", 0) >= 3, "three rounds are in")
    watched = call(shipped, "GET", progress)[1]
    assert watched["solving"] and watched["budget"] == MAX_PAGE_BUDGET_S and watched["passes"] >= 2 * 4
    assert call(shipped, "POST", "/api/stop", {"solve": "a-budgeted-solve"}) == (200, {"stopping": True})
    solving_thread.join(300)
    status, answer = replies[0]
    assert status == 200 and answer["anytime"]["ended"] == "stopped" and not answer["consistent"]
    assert answer["anytime"]["protocol"] == f"checked, anytime, <={MAX_PAGE_BUDGET_S} s a puzzle"
    assert answer["anytime"]["rounds"] >= 3 and answer["compute"]["budget"] == MAX_PAGE_BUDGET_S
    assert answer["compute"]["rollouts"] == answer["anytime"]["trajectories"] and answer["compute"]["checked"]
    assert call(shipped, "GET", progress)[1] == {"solving": False}
    assert call(shipped, "POST", "/api/stop", {"solve": "a-budgeted-solve"}) == (200, {"stopping": False})  # ended


def test_the_pages_budget_is_bounded_and_leaves_rollouts_to_its_rounds(shipped):  # noqa: F811
    for compute, wanted in (({"budget": MAX_PAGE_BUDGET_S + 1}, "budget=301 is out of range"),
                            ({"budget": 5, "rollouts": 4}, "rollouts 4 with budget: "),
                            ({"budget": "5"}, "budget='5' is not a float")):
        status, reply = call(shipped, "POST", "/api/solve", {"model": 0, "puzzle": HELD_OUT, "compute": compute})
        assert status == 400 and reply["error"].startswith(wanted) and "--" not in reply["error"], reply


def test_budget_0_is_fixed_compute_in_evaluate_as_in_solve(sudoku_dir, capsys):
    bundled = str(solving.bundled_checkpoint("sudoku"))
    assert evaluate.main(["--checkpoint", bundled, "--data-path", str(sudoku_dir), "--device", "cpu",
                          "--max-examples", "2", "--rollouts", "1", "--budget", "0"]) == 0  # was refused
    out = capsys.readouterr().out
    assert "exact_accuracy:" in out and "checked, anytime" not in out


def test_the_noise_flag_sets_the_latent_noise_of_anytime_solving_0_included(bundled):
    from types import SimpleNamespace

    flags = dict(budget=5.0, rollouts=None, views=None)
    for given, used in ((None, anytime.LATENT_NOISE), (0.0, 0.0), (0.25, 0.25)):
        ttc = anytime.anytime_compute(SimpleNamespace(noise=given, **flags), own_compute(bundled))
        assert anytime.default_search(bundled, ttc).latent_noise == used  # --noise 0 was replaced by 1.0


def test_opening_a_model_warms_it_up_once_before_any_clock_and_changes_no_answer(monkeypatch):
    from utils.data.user_puzzles import parse_maze

    calls = []
    real = solving.run_segments
    monkeypatch.setattr(solving, "run_segments",
                        lambda forward, carry, total, stop=None: calls.append((carry.halted.numel(), total))
                        or real(forward, carry, total, stop))
    warmed = open_model(None, "maze", 100, 1, CPU, torch.float32)
    assert calls == [(1, 1)]  # one segment of one blank puzzle, at load time: before any budget's clock starts
    monkeypatch.setattr(solving, "warm_up", lambda *args: None)
    cold = open_model(None, "maze", 100, 1, CPU, torch.float32)
    tokens, _ = parse_maze((Path(solve.__file__).parent / "docs/examples/maze_10x10.txt").read_text(), "m")
    answers = [anytime.solve_anytime(model, "maze", "m", tokens, 1e6, own_compute(model), CPU, clock=FakeClock())
               for model in (warmed, cold)]
    assert np.array_equal(answers[0].answer.grid, answers[1].answer.grid)
    assert answers[0].spent.passes == answers[1].spent.passes
