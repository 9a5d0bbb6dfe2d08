"""Maze answers as one of many: of all shortest S-G paths, the target is the one the model is nearest to.

A maze with cycles can have many shortest paths, and the rules accept any of them (utils/data/user_puzzles.py
``maze_problems``). A dataset marks one (``--ties first``: :func:`utils.data.maze.mark_first_path`), and a model
trained on that one answer is penalised for a right answer that is another shortest path. Nandwani et al., "Neural
Learning of One-of-Many Solutions for Combinatorial Problems in Structured Output Spaces" (ICLR 2021, Sec. 3,
"MinLoss") train instead on the solution with the least loss under the model's current output; this module does so
for mazes, exactly: the loss of an answer is a constant plus, for each cell of its path, the cell's loss as path
less its loss as open, so the least-loss shortest path is a least-cost path through the layers of the shortest-path
graph (breadth-first distances from S and G), found by dynamic programming over those layers and traced back from G.

The setting ``maze_targets: min_loss`` (utils/config.py) turns it on for a run's loss and evaluation, where it
makes ``exact_accuracy`` "the answer is a shortest path", as the rules score it.
"""

from __future__ import annotations

from typing import Callable

import torch
import torch.nn.functional as F

from models.losses import IGNORE_LABEL_ID
from utils.config import ConfigError
from utils.data.maze import GOAL, OPEN, PATH, START, VOCAB_SIZE, WALL

# Up, left, down, right: the order utils.data.maze.mark_first_path prefers, used here to break exact ties.
MOVES = ((-1, 0), (0, -1), (1, 0), (0, 1))


def _neighbour(x: torch.Tensor, dr: int, dc: int, fill) -> torch.Tensor:
    """``x`` [B, n, n] shifted so that position (r, c) holds ``x[:, r + dr, c + dc]``; ``fill`` off the grid."""
    n = x.shape[-1]
    padded = F.pad(x, (1, 1, 1, 1), value=fill)
    return padded[:, 1 + dr:1 + dr + n, 1 + dc:1 + dc + n]


def bfs_distances(passable: torch.Tensor, source: torch.Tensor) -> torch.Tensor:
    """Moves from ``source`` to every cell over ``passable`` ones (4-neighbour moves); -1 where unreachable.

    Args:
        passable, source: bool [B, n, n]; ``source`` one cell a row (or none: every distance -1).
    Returns:
        int32 [B, n, n].
    """
    dist = torch.where(source, 0, -1).to(torch.int32)
    frontier, k = source, 0
    while bool(frontier.any()):
        k += 1
        grown = torch.zeros_like(frontier)
        for dr, dc in MOVES:
            grown = grown | _neighbour(frontier, dr, dc, False)
        frontier = grown & passable & (dist < 0)
        dist = torch.where(frontier, k, dist)
    return dist


def shortest_path_graph(inputs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """The cells on some shortest S-G path of each maze, with their distances from S.

    Args:
        inputs: int [B, n*n] maze tokens (utils/data/maze.py: 1 wall, 2 open, 3 S, 4 G).
    Returns:
        ``(from_s, on_graph, length, solvable)``: int32 [B, n, n] moves from S (-1 unreachable); bool [B, n, n],
        the cells (S and G among them) whose distances from S and from G add up to the S-G distance; int [B], that
        distance (0 where G is unreachable or missing); bool [B], rows with one S and one G that connect. A maze
        has one shortest path exactly when ``on_graph`` holds ``length + 1`` cells.
    """
    batch, cells = inputs.shape
    n = int(round(cells ** 0.5))
    grid = inputs.view(batch, n, n)
    passable, start, goal = grid != WALL, grid == START, grid == GOAL
    from_s, from_g = bfs_distances(passable, start), bfs_distances(passable, goal)
    length = torch.where(goal, from_s, 0).sum((1, 2))
    solvable = (start.sum((1, 2)) == 1) & (goal.sum((1, 2)) == 1) & (length > 0)
    on_graph = (from_s >= 0) & (from_g >= 0) & (from_s + from_g == length.view(-1, 1, 1)) & solvable.view(-1, 1, 1)
    return from_s, on_graph, length, solvable


def least_cost_paths(inputs: torch.Tensor, costs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """For each maze, the shortest S-G path whose cells' ``costs`` sum least (S and G not counted).

    Args:
        inputs: int [B, n*n] maze tokens (utils/data/maze.py: 1 wall, 2 open, 3 S, 4 G).
        costs: float [B, n*n], a cost for each cell on the path.
    Returns:
        ``(path, solvable)``: bool [B, n*n], the chosen path's cells between S and G; bool [B], rows with one S and
        one G that connect (other rows have no path marked). Exact ties go to the path whose cells, traced back from
        G, come first in :data:`MOVES`.
    """
    from_s, on_graph, length, solvable = shortest_path_graph(inputs)
    longest = int(length.max())
    best = _layer_costs(from_s, on_graph, costs.view(from_s.shape).float(), longest)
    goal = inputs.view(from_s.shape) == GOAL
    return _trace_back(from_s, on_graph, best, goal, length, solvable, longest), solvable


def _layer_costs(from_s: torch.Tensor, on_dag: torch.Tensor, costs: torch.Tensor, longest: int) -> torch.Tensor:
    """float32 [B, n, n]: the least cost of a shortest-path prefix from S to each cell of the shortest-path graph
    (that cell's cost included; S itself 0, cells off the graph +inf), layer by layer of distance from S."""
    inf = torch.tensor(float("inf"), device=costs.device)
    best = torch.where(on_dag & (from_s == 0), 0.0, inf)
    for k in range(1, longest):
        prefix = _neighbour(best, *MOVES[0], float("inf"))
        for dr, dc in MOVES[1:]:
            prefix = torch.minimum(prefix, _neighbour(best, dr, dc, float("inf")))
        best = torch.where(on_dag & (from_s == k), costs + prefix, best)
    return best


def _trace_back(from_s: torch.Tensor, on_dag: torch.Tensor, best: torch.Tensor, goal: torch.Tensor,
                length: torch.Tensor, solvable: torch.Tensor, longest: int) -> torch.Tensor:
    """bool [B, n*n]: from G, step to the cheapest neighbour one layer nearer S until S; the cells stepped on
    (``longest``: the largest of ``length``)."""
    batch, n, _ = best.shape
    flat_best = best.view(batch, -1)
    flat_layer = torch.where(on_dag, from_s, -1).view(batch, -1)
    rows = torch.arange(batch, device=best.device)
    current = goal.view(batch, -1).float().argmax(1)
    path = torch.zeros(batch, n * n, dtype=torch.bool, device=best.device)
    offsets = torch.tensor([dr * n + dc for dr, dc in MOVES], device=best.device)
    for k in range(longest - 1, 0, -1):
        active = solvable & (length > k)
        r, c = current // n, current % n
        choices = []
        for dr, dc in MOVES:
            inside = (r + dr >= 0) & (r + dr < n) & (c + dc >= 0) & (c + dc < n)
            index = torch.where(inside, current + dr * n + dc, current)
            fits = inside & (flat_layer[rows, index] == k)
            choices.append(torch.where(fits, flat_best[rows, index], float("inf")))
        step = torch.stack(choices, 1).argmin(1)  # the first of equal costs: MOVES' order
        current = torch.where(active, current + offsets[step], current)
        path[rows, current] |= active  # inactive rows stay at G or S, never marked: no boolean index (a host sync)
    return path


def min_loss_labels(loss_fn: Callable) -> Callable[[torch.Tensor, dict], torch.Tensor]:
    """The labels function of ``maze_targets: min_loss`` for a loss head whose per-token loss is ``loss_fn``
    (``loss_fn(logits [B, S, V], labels [B, S], ignore_index=...)`` -> float [B, S]).

    The returned ``labels(logits, data)`` takes detached ``logits`` [B, S, V] and the batch ``data`` (``inputs``,
    ``labels`` int [B, S]) and returns int [B, S]: ``data["labels"]`` with, on each row that is a solvable maze with
    labels, its open cells relabelled: ``PATH`` on the least-loss shortest path, ``OPEN`` elsewhere (the wall, S and
    G labels kept). Rows that are not (padding rows, whose labels are all ignored) keep their labels.
    """

    @torch.compiler.disable  # data-dependent loops: run eagerly between the compiled forward and the loss
    def labels(logits: torch.Tensor, data: dict[str, torch.Tensor]) -> torch.Tensor:
        inputs, old = data["inputs"], data["labels"]
        as_path, as_open = (loss_fn(logits, torch.full_like(old, token), ignore_index=-1) for token in (PATH, OPEN))
        path, solvable = least_cost_paths(inputs, (as_path - as_open).float())
        relabel = (solvable & (old != IGNORE_LABEL_ID).all(1)).unsqueeze(1) & (inputs == OPEN)
        return torch.where(relabel, torch.where(path, PATH, OPEN).to(old.dtype), old)

    return labels



def answer_labels_for(maze_targets: str, loss_fn: Callable, vocab_size: int) -> Callable | None:
    """The loss head's ``answer_labels`` for the setting ``maze_targets``: None for ``label`` (the dataset's
    answers), :func:`min_loss_labels` for ``min_loss``.

    Raises:
        ConfigError: ``min_loss`` on data whose vocabulary is not the maze's (``vocab_size`` other than 6).
    """
    if maze_targets == "label":
        return None
    if vocab_size != VOCAB_SIZE:
        raise ConfigError(f"maze_targets=min_loss chooses among a maze's shortest paths, but this data has "
                          f"{vocab_size} tokens, not the maze's {VOCAB_SIZE}: use maze_targets=label")
    return min_loss_labels(loss_fn)
