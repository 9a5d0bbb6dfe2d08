"""Checked selection (utils/eval/reasoning.py): among rollouts and views, an answer that obeys the puzzle's rules beats
one the Q head prefers; it is reported beside the model-only selection (the references'), never instead of it, in
evaluate.py, solve.py and the page. On the CPU."""

import json
from argparse import Namespace

import numpy as np
from PIL import Image
import pytest
import torch

import evaluate
import solve
from tests.test_reasoning import BATCH, batch, head  # noqa: F401  (fixtures)
from tests.test_serve import MAZE_10, call, shipped  # noqa: F401  (a fixture)
from tests.test_solve import SOLVED, SUDOKU, exit_code, sudoku_run  # noqa: F401  (a fixture)
from utils.data.user_puzzles import parse_maze, parse_sudoku
from utils.eval.reasoning import TestTimeCompute, TestTimeComputeError, reason, rollouts, rules_checker, vote


def test_the_rules_checker_of_sudoku_and_mazes():
    check = rules_checker("sudoku")
    puzzle, solved = parse_sudoku(SUDOKU, "p"), parse_sudoku(SOLVED, "s")
    swapped = solved.copy()
    swapped[[0, 1]] = swapped[[1, 0]]  # two digits of row 1 swapped: columns 1 and 2 now repeat a digit
    inputs = torch.from_numpy(np.stack([puzzle, puzzle, puzzle, np.zeros(81, np.uint8)]))
    preds = torch.from_numpy(np.stack([solved, swapped, puzzle, solved]))
    assert check(inputs, preds).tolist() == [True, False, False, False]  # padding rows (all 0) never pass
    maze = parse_maze("#####\n#S  #\n# # #\n#  G#\n#####\n", "m")[0]
    path = maze.copy()
    path[[7, 8, 13]] = 5  # S(1,1) -> (1,2) -> (1,3) -> (2,3) -> G(3,3)
    assert rules_checker("maze")(torch.from_numpy(np.stack([maze, maze])),
                                 torch.from_numpy(np.stack([path, maze]))).tolist() == [True, False]
    for task in ("arc", None):
        with pytest.raises(TestTimeComputeError, match="only Sudoku and mazes"):
            rules_checker(task)


def test_a_passing_answer_beats_the_q_heads_choice_and_the_model_only_answer_stays(head, batch):  # noqa: F811
    ttc = TestTimeCompute(rollouts=4, noise=1.0, seed=3)
    runs = list(rollouts(head, head, batch, ttc))
    wanted = runs[2]["preds"]  # "the rules" accept exactly rollout 2's answers

    def check(inputs, preds):
        return (preds == wanted).all(-1)

    plain = reason(head, head, batch, ttc)
    both = reason(head, head, batch, TestTimeCompute(rollouts=4, noise=1.0, seed=3, checker=check))
    for key in ("logits", "preds", "q_halt_logits", "segments"):
        assert torch.equal(both[key], plain[key])  # the model-only selection is untouched
    assert torch.equal(both["checked_preds"], wanted) and both["checked_passes"].all()
    q = torch.stack([r["q_halt_logits"] for r in runs])
    assert not torch.equal(plain["preds"], wanted) or (q.argmax(0) == 2).all()

    def nothing_passes(inputs, preds):
        return torch.zeros(len(preds), dtype=torch.bool)

    none = reason(head, head, batch, TestTimeCompute(rollouts=4, noise=1.0, seed=3, checker=nothing_passes))
    assert torch.equal(none["checked_preds"], plain["preds"]) and not none["checked_passes"].any()  # the Q head's


def test_rollouts_stop_once_every_row_has_a_passing_answer(head, batch):  # noqa: F811
    calls = []

    def second_passes(inputs, preds):
        calls.append(1)
        return torch.full((len(preds),), len(calls) >= 2)

    answer = reason(head, head, batch, TestTimeCompute(rollouts=8, noise=1.0, checker=second_passes,
                                                       stop_when_checked=True))
    assert len(calls) == 2 and answer["checked_passes"].all()


def test_a_passing_view_beats_more_votes():
    preds = [torch.tensor([[1, 1]]), torch.tensor([[1, 1]]), torch.tensor([[2, 2]])]
    answers = [{"preds": p, "q_halt_logits": torch.tensor([0.0])} for p in preds]
    assert vote(answers)["preds"].tolist() == [[1, 1]]
    kept = vote(answers, passes=[torch.tensor([False]), torch.tensor([False]), torch.tensor([True])])
    assert kept["preds"].tolist() == [[2, 2]] and kept["passes"].tolist() == [True] and kept["votes"].tolist() == [1]


def test_views_with_a_checker_return_both_selections(head):  # noqa: F811
    g = torch.Generator().manual_seed(5)
    square = {"inputs": torch.randint(1, 6, (BATCH, 16), generator=g), "labels": torch.randint(1, 6, (BATCH, 16), generator=g),
              "puzzle_identifiers": torch.zeros(BATCH, dtype=torch.int32)}
    plain = reason(head, head, square, TestTimeCompute(views=4))
    both = reason(head, head, square, TestTimeCompute(views=4, checker=lambda i, p: p[:, 0] == p[:, 0].max()))
    assert torch.equal(both["preds"], plain["preds"]) and torch.equal(both["votes"], plain["votes"])
    assert both["checked_preds"].shape == plain["preds"].shape and both["checked_passes"].dtype == torch.bool


def test_evaluate_reports_checked_beside_model_only(sudoku_run, capsys):  # noqa: F811
    flags = ["--device", "cpu", "--checkpoint", str(sudoku_run), "--forward-dtype", "float32", "--max-examples", "16"]
    assert evaluate.main([*flags, "--rollouts", "3", "--json"]) == 0
    plain = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert evaluate.main([*flags, "--rollouts", "3", "--json", "--checked"]) == 0
    both = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    for key in ("exact_accuracy", "accuracy", "count"):
        assert both[key] == plain[key]
    assert both["checked/exact_accuracy"] >= both["exact_accuracy"]
    assert {"checked/accuracy", "checked/blank_accuracy", "checked/exact_accuracy_ci95_low"} <= set(both)
    assert evaluate.main([*flags, "--checked"]) == 0
    printed = capsys.readouterr().out
    assert "checked/exact_accuracy" in printed and "model-only selection" in printed


def test_solve_py_checked_names_its_selection_and_arc_is_refused(sudoku_run, tmp_path, capsys):  # noqa: F811
    code = solve.main(["--device", "cpu", "--checkpoint", str(sudoku_run), "--sudoku", SUDOKU, "--out",
                       str(tmp_path / "out"), "--rollouts", "2", "--checked"])
    printed = capsys.readouterr().out
    assert code == exit_code(printed)
    assert ("checked selection (an answer that obeys the rules first)" in printed) == (code == 0)
    assert ("checked selection found no answer that obeys the rules: this is the Q head's choice" in printed) == \
        (code == 1)
    task = tmp_path / "task.json"
    task.write_text(json.dumps({"train": [{"input": [[1]], "output": [[2]]}], "test": [{"input": [[1]]}]}))
    assert solve.main(["--device", "cpu", "--checkpoint", str(sudoku_run), "--arc", str(task), "--checked"]) == 2
    err = capsys.readouterr().err
    assert "only Sudoku and mazes" in err and "Traceback" not in err


def test_the_page_solves_with_checked_selection(shipped):  # noqa: F811
    status, answer = call(shipped, "POST", "/api/solve", {"model": 1, "puzzle": MAZE_10,
                                                          "compute": {"checked": True, "rollouts": 2, "noise": 1.0}})
    assert status == 200 and answer["selection"] == "checked" and answer["compute"]["checked"] is True, answer
    status, answer = call(shipped, "POST", "/api/solve", {"model": 1, "puzzle": MAZE_10})
    assert status == 200 and answer["selection"] == "model" and answer["compute"]["checked"] is False
    status, answer = call(shipped, "POST", "/api/solve", {"model": 1, "puzzle": MAZE_10, "compute": {"checked": 1}})
    assert status == 400 and "checked=1 is not a bool" in answer["error"] and "--" not in answer["error"]


def test_the_command_lines_compute_flags_are_the_pages_defaults(shipped):  # noqa: F811
    """``solve.py --serve --checked --rollouts 2`` ticks the page's box and fills its fields; flags out of a model's
    range are refused (make_server asks defaults() of every model before serving)."""
    cpu = torch.device("cpu")
    offered = shipped.solver.models  # 0 Sudoku, 1 maze
    plain = [m.describe(cpu, Namespace())["compute"] for m in offered]
    flagged = [m.describe(cpu, Namespace(checked=True, rollouts=2))["compute"] for m in offered]
    assert not any(c["checked"] for c in plain) and all(c["checked"] for c in flagged)
    assert all(c["rollouts"] == 2 and c["noise"] == 1.0 for c in flagged)
    limit = offered[0].trained.cfg.arch["halt_max_steps"]
    with pytest.raises(TestTimeComputeError, match="--min-segments"):
        offered[0].describe(cpu, Namespace(min_segments=limit + 1))


def test_the_test_time_grid_agrees_with_evaluate_and_checked_is_never_worse(sudoku_run, tmp_path, capsys):  # noqa: F811
    from scripts import benchmark_test_time

    out, picture = tmp_path / "grid.json", tmp_path / "grid.png"
    assert benchmark_test_time.main(["--device", "cpu", "--checkpoint", str(sudoku_run), "--grid", "--segments",
                                     "1,2,3", "--rollouts", "1,3", "--noise", "1.0", "--batch-size", "16", "--json",
                                     str(out), "--picture", str(picture), "--forward-dtype", "float32"]) == 0
    table = json.loads(out.read_text())
    assert table["precision"] == "float32"
    rows = {(r["segments"], r["rollouts"]): r for r in table["grid"]}
    assert set(rows) == {(s, k) for s in (1, 2, 3) for k in (1, 3)} and rows[(3, 3)]["passes"] == 9
    assert all(r["checked"] >= r["model"] and r["count"] == 16 for r in rows.values())
    capsys.readouterr()
    for s, k in ((2, 1), (3, 3)):  # the grid's model-only cells are evaluate.py's numbers for the same compute
        assert evaluate.main(["--device", "cpu", "--checkpoint", str(sudoku_run), "--segments", str(s), "--rollouts",
                              str(k), "--noise", "1.0", "--batch-size", "16", "--json", "--checked",
                              "--forward-dtype", "float32"]) == 0
        metrics = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
        assert rows[(s, k)]["model"] == pytest.approx(metrics["exact_accuracy"])
        assert rows[(s, k)]["checked"] == pytest.approx(metrics["checked/exact_accuracy"])
        assert rows[(s, k)]["model_blank"] == pytest.approx(metrics["blank_accuracy"])
        assert rows[(s, k)]["checked_blank"] == pytest.approx(metrics["checked/blank_accuracy"])
    assert Image.open(picture).size == (880, 520)
