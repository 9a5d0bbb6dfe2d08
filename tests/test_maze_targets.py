"""``maze_targets: min_loss`` on device=cpu: the least-cost shortest path against an independent search over every
shortest path; scoring against the chosen labels is exactly the rules' verdict (utils/data/user_puzzles.py
``maze_problems``); rows that are not solvable mazes keep their labels; the setting is refused on other data; and a
run trained with it scores its held-out mazes, and evaluate.py scores its checkpoint, the same way.
"""

from __future__ import annotations

import functools
import json
from collections import deque

import numpy as np
import pytest
import torch

import evaluate
import pretrain
from models.losses import IGNORE_LABEL_ID, stablemax_cross_entropy
from models.maze_targets import answer_labels_for, least_cost_paths, min_loss_labels
from tests.test_bad_inputs import assert_one_line, exit_code
from utils.config import ConfigError
from utils.data.maze import GOAL, OPEN, PATH, START, VOCAB_SIZE, WALL, build_maze_dataset, generate_framed_maze
from utils.data.user_puzzles import maze_problems
from utils.eval.load import load_trained

MOVES = ((-1, 0), (0, -1), (1, 0), (0, 1))


def distances(maze: np.ndarray, source: tuple[int, int]) -> np.ndarray:
    """Breadth-first moves from ``source`` over the non-wall cells of ``maze`` [n, n]; -1 unreachable."""
    n = len(maze)
    dist = np.full((n, n), -1)
    dist[source] = 0
    queue = deque([source])
    while queue:
        r, c = queue.popleft()
        for dr, dc in MOVES:
            rr, cc = r + dr, c + dc
            if 0 <= rr < n and 0 <= cc < n and maze[rr, cc] != WALL and dist[rr, cc] < 0:
                dist[rr, cc] = dist[r, c] + 1
                queue.append((rr, cc))
    return dist


def least_cost_by_search(maze: np.ndarray, cost: np.ndarray) -> float:
    """The least sum of ``cost`` over the cells between S and G of any shortest S-G path, by a memoised search over
    every shortest path (each step one move nearer G and one further from S)."""
    n = len(maze)
    start, goal = (tuple(int(v) for v in np.argwhere(maze == token)[0]) for token in (START, GOAL))
    from_s, from_g = distances(maze, start), distances(maze, goal)

    @functools.lru_cache(maxsize=None)
    def rest(cell: tuple[int, int]) -> float:
        if cell == goal:
            return 0.0
        options = [rest((cell[0] + dr, cell[1] + dc)) + (0.0 if (cell[0] + dr, cell[1] + dc) == goal
                                                          else float(cost[cell[0] + dr, cell[1] + dc]))
                   for dr, dc in MOVES
                   if 0 <= cell[0] + dr < n and 0 <= cell[1] + dc < n
                   and from_s[cell[0] + dr, cell[1] + dc] == from_s[cell] + 1
                   and from_g[cell[0] + dr, cell[1] + dc] == from_g[cell] - 1]
        return min(options)

    return rest(start)


def random_mazes(count: int, seed: int, side: int | None = None) -> list[np.ndarray]:
    """Mazes of ``side`` (None: sides 5..16) with their shortest paths' ties kept: random walls and lattice mazes
    with cycles."""
    rng = np.random.default_rng(seed)
    return [generate_framed_maze(rng, side or int(rng.integers(5, 17)), layout=("random", "lattice")[i % 2],
                                 cycle_prob=1.0, ties="first")[0] for i in range(count)]


def test_the_least_cost_path_is_a_shortest_path_of_the_least_cost_any_search_finds():
    """On 60 mazes with several shortest paths and random costs, the path chosen is a shortest S-G path and its cost
    is the least found by searching every shortest path."""
    rng = np.random.default_rng(1)
    for maze in random_mazes(60, seed=0):
        cost = rng.normal(size=maze.shape).astype(np.float32)
        path, solvable = least_cost_paths(torch.from_numpy(maze.reshape(1, -1).astype(np.int64)),
                                          torch.from_numpy(cost.reshape(1, -1)))
        chosen = path[0].numpy().reshape(maze.shape)
        assert bool(solvable[0])
        assert maze_problems(np.where(chosen, PATH, maze).ravel(), maze.ravel()) == []
        assert cost[chosen].sum() == pytest.approx(least_cost_by_search(maze, cost), abs=1e-4)


def shortest_path_count(maze: np.ndarray) -> int:
    """The number of shortest S-G paths, counted breadth-first from S in order of distance."""
    start, goal = (tuple(int(v) for v in np.argwhere(maze == token)[0]) for token in (START, GOAL))
    dist = distances(maze, start)
    ways = np.zeros(maze.shape, dtype=object)
    ways[start] = 1
    for cell in sorted(map(tuple, np.argwhere(dist > 0)), key=lambda c: dist[c]):
        ways[cell] = sum(ways[cell[0] + dr, cell[1] + dc] for dr, dc in MOVES
                         if 0 <= cell[0] + dr < len(maze) and 0 <= cell[1] + dc < len(maze)
                         and dist[cell[0] + dr, cell[1] + dc] == dist[cell] - 1)
    return int(ways[goal])


def test_the_benchmark_splits_a_held_out_set_into_mazes_of_one_and_of_several_shortest_paths(tmp_path):
    """scripts/benchmark_maze_sizes.py --held-out: each maze lands in the group its number of shortest paths, counted
    independently, says."""
    from scripts.benchmark_maze_sizes import held_out_sets

    data = build_maze_dataset(tmp_path / "data", generate=True, size=10, min_size=6, layout="mixed", ties="first",
                              train_size=8, test_size=40, seed=4)
    groups = held_out_sets(str(data))
    assert sum(len(mazes) for mazes in groups.values()) == 40 and {side for _, side in groups} == {10}
    assert len(groups) == 2  # both kinds among 40 mixed mazes
    for (name, _), mazes in groups.items():
        counts = [shortest_path_count(maze.reshape(10, 10)) for maze in mazes]
        assert all((n > 1) == ("several" in name) for n in counts), (name, counts)


def test_scoring_against_the_min_loss_labels_is_the_rules_verdict():
    """For answers that are the dataset's path, another shortest path, that path less a cell, or plus a cell off it,
    an answer is exact against the min_loss labels exactly when the rules take it as a shortest path."""
    labels_of = min_loss_labels(stablemax_cross_entropy)
    rng = np.random.default_rng(2)
    answers, mazes = [], []
    for maze in random_mazes(24, seed=3, side=12):
        other, _ = least_cost_paths(torch.from_numpy(maze.reshape(1, -1).astype(np.int64)),
                                    torch.from_numpy(rng.normal(size=(1, maze.size)).astype(np.float32)))
        other = np.where(other[0].numpy().reshape(maze.shape), PATH, maze)
        broken, extra = other.copy(), other.copy()
        broken[tuple(np.argwhere(other == PATH)[len(np.argwhere(other == PATH)) // 2])] = OPEN
        extra[tuple(np.argwhere(other == OPEN)[0])] = PATH
        for answer in (other, broken, extra):
            answers.append(answer.ravel())
            mazes.append(maze.ravel())
    inputs = torch.from_numpy(np.stack(mazes).astype(np.int32))
    given = torch.from_numpy(np.stack(answers).astype(np.int64))
    logits = torch.nn.functional.one_hot(given, VOCAB_SIZE).float() * 8
    labels = labels_of(logits, {"inputs": inputs, "labels": inputs.clone()})
    exact = (labels == given).all(1).numpy()
    assert exact.tolist() == [not maze_problems(a, m) for a, m in zip(answers, mazes)]
    assert exact.sum() >= 24  # every "other" answer is a shortest path


def test_rows_that_are_not_solvable_mazes_keep_their_labels():
    """A padding row (labels all ignored) and a maze whose S and G do not connect keep their labels as given."""
    maze = np.full((5, 5), WALL, np.int32)
    maze[1, 1], maze[3, 3], maze[1, 2] = START, GOAL, OPEN
    padding = np.full(25, IGNORE_LABEL_ID)
    inputs = torch.from_numpy(np.stack([maze.ravel(), maze.ravel()]))
    labels = torch.from_numpy(np.stack([maze.ravel(), padding]).astype(np.int32))
    logits = torch.randn(2, 25, VOCAB_SIZE)
    assert torch.equal(min_loss_labels(stablemax_cross_entropy)(logits, {"inputs": inputs, "labels": labels}), labels)


def test_min_loss_is_refused_on_data_that_is_not_mazes():
    with pytest.raises(ConfigError, match="maze_targets=min_loss .* 11 tokens"):
        answer_labels_for("min_loss", stablemax_cross_entropy, 11)
    assert answer_labels_for("label", stablemax_cross_entropy, 11) is None


def test_a_run_with_min_loss_scores_any_shortest_path_and_evaluate_reads_the_setting(tmp_path, capsys):
    """A tiny grid TRM trained with maze_targets=min_loss writes held-out exact accuracy; the checkpoint's head, as
    evaluate.py loads it, scores against the min_loss labels."""
    from tests.test_maze_sizes import GRID_TRM

    data = build_maze_dataset(tmp_path / "data", generate=True, size=8, min_size=6, layout="mixed", ties="first",
                              train_size=32, test_size=8, seed=0)
    run = tmp_path / "run"
    assert pretrain.main(["--config-name=cfg_pretrain_trm_maze_grid_cpu", f"data_paths=[{data}]",
                          "dataset_builder=null", f"checkpoint_path={run}", "maze_targets=min_loss", *GRID_TRM]) == 0
    points = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert any("eval/exact_accuracy" in p for p in points)
    trained = load_trained(str(run), torch.device("cpu"), torch.float32, 8)
    assert trained.head.answer_labels is not None
    assert evaluate.main(["--checkpoint", str(run), "--device", "cpu", "--forward-dtype", "float32"]) == 0

def test_min_loss_is_refused_before_a_recipe_builds_other_data(tmp_path, capsys, monkeypatch):
    """A Sudoku recipe with maze_targets=min_loss: one line, exit 2, before its dataset is built."""
    monkeypatch.chdir(tmp_path)
    code = exit_code(lambda: pretrain.main(["--config-name=cfg_pretrain_trm_cpu", "maze_targets=min_loss"]))
    assert_one_line(capsys, code, "maze_targets=min_loss")
    assert not list(tmp_path.iterdir())
