"""Reproduce a published number: the data, training and evaluation commands of each row of the Tasks table in
docs/reproducing.md, and a dry run that checks them without training.

    python scripts/reproduce.py --list                                   # the rows, their numbers and GPU budgets
    python scripts/reproduce.py sudoku-extreme-trm-mlp                   # the row's three commands
    python scripts/reproduce.py sudoku-extreme-trm-mlp --dry-run         # check them; time a few steps here
    python scripts/reproduce.py all --dry-run --timed-steps 0            # check every row, no timing

The dry run trains nothing and downloads nothing. It parses the data and evaluation commands with the builders' and
``evaluate.py``'s own parsers; loads the training settings as ``pretrain.py`` does (the recipe, its overrides, the
architecture, the test-time compute, the device, precision and compile decisions: utils/run/plan.py), checks that
the global batch divides over the row's ``torchrun`` processes, and runs the trainer's data checks (the test split,
the evaluators, the best metric) on a tiny stand-in dataset of the real one's kind and shapes. It prints the
published number and its source, the GPU budget, the schedule's optimizer steps, the model's parameters, and the
time this machine would take: from FLOPs, and from a few timed training steps (``--timed-steps``).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import importlib
import io
import shlex
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))  # run as a script: make the repo root importable

import numpy as np  # noqa: E402

from utils.cli import ArgumentParser  # noqa: E402
from utils.data.common import write_one_example_split  # noqa: E402
from utils.data.sizes import PUBLISHED  # noqa: E402
from utils.errors import UserError  # noqa: E402
from utils.run.main import cli_main  # noqa: E402

# torch, the models and the trainer are imported by the dry run's functions: --list and --help need none of them
# (about 3 s on a 2-core CPU).

RUN_ROOT = "checkpoints/reproduce"  # each row trains into RUN_ROOT/<row>, which its evaluation reads
TIMED_STEP_S = 2.0  # the timed steps run at the batch this machine does in about this long (scaled to the real one)
# The median of this many steps is as steady as that of more, and they take a few minutes at TIMED_STEP_S each.
MAX_TIMED_STEPS = 100
TIMING_IDENTIFIERS = 4096  # puzzle-embedding rows built for timing: a step reads only its batch's rows
CONCEPT_ARC_REPO = "https://github.com/SamsungSAILMontreal/TinyRecursiveModels"
CONCEPT_ARC = "data/raw/TinyRecursiveModels/kaggle/combined/arc-agi_concept_challenges.json"  # TRM's ConceptARC
FETCH_CONCEPT_ARC = ("git", "clone", "--depth", "1", CONCEPT_ARC_REPO, "data/raw/TinyRecursiveModels")
HRM_PAPER = "Wang et al., Hierarchical Reasoning Model, arXiv 2506.21734, Figure 1"
TRM_PAPER = "Jolicoeur-Martineau, Less is More: Recursive Reasoning with Tiny Networks, arXiv 2510.04871"
# The data flags of each builder script, parsed by its own main() with the build swapped for a recorder.
BUILDERS = {"scripts/build_sudoku_dataset.py": ("utils.data.sudoku.build", "build_dataset"),
            "scripts/build_maze_dataset.py": ("utils.data.maze", "build_maze_dataset"),
            "scripts/build_arc_dataset.py": ("scripts.build_arc_dataset", "build_arc_dataset")}


class RecipeError(UserError):
    """A published recipe that would not run as written here: a flag, a setting or a check it fails."""


@dataclass(frozen=True)
class DataSize:
    """A dataset as its build writes it: ``kind`` (sudoku, maze, arc-agi-1, arc-agi-2), ``seq_len`` and
    ``vocab_size`` (tokens), the training split's ``groups`` and mean examples per puzzle (which with the epochs and
    the batch give the optimizer steps), and its puzzle identifiers (the puzzle-embedding rows)."""

    kind: str
    seq_len: int
    vocab_size: int
    groups: int
    mean_examples: float
    identifiers: int


def published(kind: str, data_path: str) -> DataSize:
    """The :class:`DataSize` of a published dataset as its build here writes it (utils/data/sizes.py, ``PUBLISHED``:
    the same counts the trainers' run-length estimates use)."""
    size = PUBLISHED[data_path]
    return DataSize(kind, size.seq_len, size.vocab_size, size.total_groups, size.mean_puzzle_examples,
                    size.num_puzzle_identifiers)


SUDOKU_1K = published("sudoku", "data/sudoku-extreme-1k-aug-1000")
MAZE_1K = published("maze", "data/maze-30x30-hard-1k")
ARC1_CONCEPT = published("arc-agi-1", "data/arc1concept-aug-1000")
ARC2 = published("arc-agi-2", "data/arc-2-aug-1000")
ARC2_CONCEPT = published("arc-agi-2", "data/arc2concept-aug-1000")


@dataclass(frozen=True)
class Recipe:
    """One published number and the commands that reproduce it.

    ``data`` are the commands that build the dataset (argv, a builder script or ``git``); ``config`` and
    ``overrides`` are ``pretrain.py``'s, run under ``torchrun --nproc-per-node gpus`` where ``gpus`` > 1, into
    ``RUN_ROOT/<name>``; ``evaluate`` are ``evaluate.py``'s flags after the run directory."""

    name: str
    title: str
    expected: str
    source: str
    gpus: int
    budget: str
    data: tuple[tuple[str, ...], ...]
    config: str
    overrides: tuple[str, ...]
    size: DataSize
    evaluate: tuple[str, ...] = ()

    @property
    def run_dir(self) -> str:
        return f"{RUN_ROOT}/{self.name}"

    def train_argv(self) -> list[str]:
        """``pretrain.py``'s arguments."""
        return [f"--config-name={self.config}", *self.overrides, f"checkpoint_path={self.run_dir}"]

    def evaluate_argv(self) -> list[str]:
        """``evaluate.py``'s arguments: the run directory (its best checkpoint) and ``evaluate``."""
        return [self.run_dir, *self.evaluate]

    def commands(self) -> list[tuple[str, str]]:
        """``(step, shell command)`` in order: data, training, evaluation."""
        steps = [("data", _shell(("python", *argv) if argv[0].endswith(".py") else argv)) for argv in self.data]
        launcher = ("torchrun", "--nproc-per-node", str(self.gpus)) if self.gpus > 1 else ("python",)
        steps.append(("train", _shell((*launcher, "pretrain.py", *self.train_argv()))))
        steps.append(("evaluate", _shell(("python", "evaluate.py", *self.evaluate_argv()))))
        return steps


def _shell(argv: tuple[str, ...]) -> str:
    return " ".join(shlex.quote(a) for a in argv)


def _build(script: str, output: str, *flags: str) -> tuple[str, ...]:
    return (script, "--output-dir", output, *flags)


SUDOKU_DATA = (_build("scripts/build_sudoku_dataset.py", "data/sudoku-extreme-1k-aug-1000", "--subsample-size", "1000",
                      "--num-aug", "1000"),)
# HRM's 8-GPU Sudoku and Maze commands (sapientinc/HRM README), whose settings are cfg_pretrain_maze's.
HRM_PUZZLE_SETTINGS = ("epochs=20000", "eval_interval=2000", "lr=1e-4", "puzzle_emb_lr=1e-4", "weight_decay=1.0",
                       "puzzle_emb_weight_decay=1.0")

RECIPES = {r.name: r for r in (
    Recipe("sudoku-extreme-hrm", "HRM on Sudoku-Extreme 1k", "55.0% exact accuracy on the Sudoku-Extreme test set",
           f"{HRM_PAPER}", 8, "8 GPUs, about 10 min (sapientinc/HRM README; its laptop recipe, "
           "cfg_pretrain_apple_silicon, about 10 h on one RTX 4070 laptop GPU)",
           SUDOKU_DATA, "cfg_pretrain", ("data_path=data/sudoku-extreme-1k-aug-1000", *HRM_PUZZLE_SETTINGS), SUDOKU_1K),
    Recipe("sudoku-extreme-trm-mlp", "TRM-MLP on Sudoku-Extreme 1k", "87.4% exact accuracy on the Sudoku-Extreme "
           "test set", f"{TRM_PAPER}, Table 4; TRM README pretrain_mlp_t_sudoku: around 87% (+- 2%)", 1,
           "1 L40S GPU, < 36 h (TRM README)", SUDOKU_DATA, "cfg_pretrain_trm_sudoku_mlp", (), SUDOKU_1K),
    Recipe("sudoku-extreme-trm-att", "TRM (attention) on Sudoku-Extreme 1k", "74.7% exact accuracy on the "
           "Sudoku-Extreme test set", f"{TRM_PAPER}, Table 4; TRM README pretrain_att_sudoku: around 75% (+- 2%)", 1,
           "1 L40S GPU, < 36 h (TRM README)", SUDOKU_DATA, "cfg_pretrain_trm_sudoku_att", (), SUDOKU_1K),
    Recipe("maze-hard-hrm", "HRM on Maze-Hard 30x30", "74.5% exact accuracy on the Maze-Hard test set", HRM_PAPER, 8,
           "8 GPUs, about 1 h (sapientinc/HRM README)",
           (_build("scripts/build_maze_dataset.py", "data/maze-30x30-hard-1k"),), "cfg_pretrain_maze", (), MAZE_1K),
    Recipe("maze-hard-trm", "TRM (attention) on Maze-Hard 30x30", "85.3% exact accuracy on the Maze-Hard test set",
           f"{TRM_PAPER}, Table 4; TRM README pretrain_att_maze30x30 (data: 1000 examples, 8 augments)", 4,
           "4 L40S GPUs, < 24 h (TRM README)",
           (_build("scripts/build_maze_dataset.py", "data/maze-30x30-hard-1k-aug", "--aug"),), "cfg_pretrain_trm_maze",
           ("data_paths=[data/maze-30x30-hard-1k-aug]",), MAZE_1K),
    Recipe("arc-agi-1-hrm", "HRM on ARC-AGI-1", "40.3% pass@2 on the ARC-AGI-1 evaluation tasks", HRM_PAPER, 8,
           "8 GPUs, about 24 h (sapientinc/HRM README)",
           (FETCH_CONCEPT_ARC, _build("scripts/build_arc_dataset.py", "data/arc-aug-1000", "--dataset", "arc-agi-1",
                                      "--extra-train", CONCEPT_ARC)),
           "cfg_pretrain", ("data_path=data/arc-aug-1000",), ARC1_CONCEPT),
    Recipe("arc-agi-1-trm", "TRM (attention) on ARC-AGI-1", "44.6% pass@2 on the ARC-AGI-1 evaluation tasks",
           f"{TRM_PAPER}, Table 5; TRM README pretrain_att_arc1concept_4", 4, "4 H100 GPUs, about 3 days (TRM README)",
           (FETCH_CONCEPT_ARC, _build("scripts/build_arc_dataset.py", "data/arc1concept-aug-1000", "--dataset",
                                      "arc-agi-1", "--extra-train", CONCEPT_ARC)),
           "cfg_pretrain_trm_arc1", (), ARC1_CONCEPT),
    Recipe("arc-agi-2-hrm", "HRM on ARC-AGI-2", "5.0% pass@2 on the ARC-AGI-2 evaluation tasks", HRM_PAPER, 8,
           "8 GPUs, about 24 h (sapientinc/HRM README: a checkpoint after 8 h is often sufficient)",
           (_build("scripts/build_arc_dataset.py", "data/arc-2-aug-1000", "--dataset", "arc-agi-2"),),
           "cfg_pretrain_arc2", (), ARC2),
    Recipe("arc-agi-2-trm", "TRM (attention) on ARC-AGI-2", "7.8% pass@2 on the ARC-AGI-2 evaluation tasks",
           f"{TRM_PAPER}, Table 5; TRM README pretrain_att_arc2concept_4", 4, "4 H100 GPUs, about 3 days (TRM README)",
           (FETCH_CONCEPT_ARC, _build("scripts/build_arc_dataset.py", "data/arc2concept-aug-1000", "--dataset",
                                      "arc-agi-2", "--extra-train", CONCEPT_ARC)),
           "cfg_pretrain_trm_arc2", (), ARC2_CONCEPT),
)}


# ---- the dry run -------------------------------------------------------------------------------------------------

@contextlib.contextmanager
def _quiet() -> Iterator[io.StringIO]:
    """Capture stdout and stderr (progress bars, a parser's error line) into one buffer."""
    buffer = io.StringIO()
    with contextlib.redirect_stdout(buffer), contextlib.redirect_stderr(buffer):
        yield buffer


def _parses(recipe: Recipe, step: str, parse: Callable[[], object]) -> object:
    """``parse()``'s result; a parser's exit becomes a RecipeError naming the row, the step and argparse's line."""
    with _quiet() as said:
        try:
            return parse()
        except SystemExit as e:
            if e.code == 0:
                raise RecipeError(f"{recipe.name}: the {step} command asks for help instead of running") from None
    lines = [line.removeprefix("error: ") for line in said.getvalue().splitlines() if line.startswith("error:")]
    raise RecipeError(f"{recipe.name}: the {step} command does not parse: {lines[-1] if lines else said.getvalue()}")


def check_data_command(recipe: Recipe, argv: tuple[str, ...]) -> None:
    """Parse a data command with its builder script's own ``main``, the build itself swapped out (a command that is
    not a builder, e.g. ``git clone``, is not checked).

    Raises:
        RecipeError: a flag the builder does not take or a bad value.
    """
    if argv[0] not in BUILDERS:
        return
    module_name, function = BUILDERS[argv[0]]
    module = importlib.import_module(module_name)
    real = getattr(module, function)
    setattr(module, function, lambda *args, **kwargs: None)
    try:
        _parses(recipe, "data", lambda: module.main(list(argv[1:])))
    finally:
        setattr(module, function, real)


def _stand_in(size: DataSize, root: Path) -> Path:
    """A tiny dataset of ``size``'s kind and shapes under ``root`` (written once per kind): 8 random one-example
    puzzles per split for Sudoku and mazes; for ARC, one training and one evaluation task of one cell written by the
    ARC builder (utils/data/arc.py), with the files its evaluator reads."""
    path = root / size.kind
    if path.exists():
        return path
    with _quiet():
        if size.kind.startswith("arc"):
            from utils.data.arc import Subset, parse_task, write_subsets

            task = {"train": [{"input": [[1]], "output": [[2]]}], "test": [{"input": [[3]], "output": [[4]]}]}
            subsets = [Subset(name, [parse_task(f"{name}0", task, "stand-in")], "stand-in", name == "evaluation")
                       for name in ("training", "evaluation")]
            write_subsets(path, subsets, num_aug=0, seed=0, source={"stand-in": size.kind})
        else:
            rng = np.random.default_rng(0)
            for split in ("train", "test"):
                tokens = rng.integers(1, size.vocab_size, (8, size.seq_len), dtype=np.uint8)
                write_one_example_split(path / split, tokens, tokens, 1, size.vocab_size)
            (path / "identifiers.json").write_text('["<blank>"]')
    return path


@dataclass
class Checked:
    """What the dry run found: the trainer's setup, the schedule's steps, the parameters."""

    setup: object
    steps: int
    parameters: int


def check_training(recipe: Recipe, stand_ins: Path) -> Checked:
    """The checks ``pretrain.py`` makes before its first step, without training: the settings (recipe, overrides,
    architecture, test-time compute, device, precision, compile), the global batch over ``recipe.gpus`` processes,
    and the data checks on a stand-in of the dataset's kind; then the real schedule's steps and the parameters.

    Raises:
        RecipeError: naming the row and the trainer's one-line reason.
    """
    from utils.distributed import Dist
    from utils.train import puzzle_trainer  # the trainer's imports (evaluation, pictures): a dry run's, not --list's

    args = _parses(recipe, "train", lambda: puzzle_trainer.parse_args(recipe.train_argv()))
    try:
        setup = puzzle_trainer.resolve_setup(args, Dist())
        cfg = setup.cfg
        if cfg.global_batch_size % recipe.gpus:  # pretrain.py refuses it under torchrun, once the processes exist
            raise RecipeError(f"global_batch_size {cfg.global_batch_size} is not divisible by the {recipe.gpus} "
                              "processes")
        cfg.data_paths, cfg.data_paths_test = [str(_stand_in(recipe.size, stand_ins))], []
        cfg.data_path = cfg.data_paths[0]
        with _quiet():
            data = puzzle_trainer.load_data(setup, Dist())
        metadata = dataclasses.replace(data.train.metadata, seq_len=recipe.size.seq_len,
                                       vocab_size=recipe.size.vocab_size,
                                       num_puzzle_identifiers=recipe.size.identifiers)
        parameters = sum(p.numel() for p in puzzle_trainer.meta_model(setup, metadata).model.parameters())
    except UserError as e:
        raise RecipeError(f"{recipe.name}: {e}") from None
    # The trainer's schedule (utils/train/puzzle_trainer.py, load_data) on the real dataset's sizes.
    steps = int(cfg.epochs * recipe.size.groups * recipe.size.mean_examples / cfg.global_batch_size)
    return Checked(setup, steps, parameters)


def time_steps(setup, size: DataSize, batch_size: int, steps: int) -> tuple[float, float, int]:
    """Time ``steps`` training steps (forward and backward of one ACT segment, after one untimed step) of the run's
    model on this machine, at the batch this machine does in about ``TIMED_STEP_S`` seconds (at most ``batch_size``).

    Returns:
        ``(seconds per step at batch_size, FLOP estimate of one step at batch_size in seconds, the timed batch)``;
        a timed step is scaled to ``batch_size`` in proportion to the examples.
    """
    import torch

    from models import build_model
    from utils.run.estimate import Estimate, matmul_rate, step_flops, synchronize

    device, dtype = setup.device, setup.dtype
    identifiers = min(size.identifiers, TIMING_IDENTIFIERS)

    def model(batch: int, where) -> torch.nn.Module:
        return build_model(setup.arch, batch_size=batch, seq_len=size.seq_len, vocab_size=size.vocab_size,
                           num_puzzle_identifiers=identifiers, dtype=dtype, device=where)

    rate = matmul_rate(device, dtype)
    per_example = step_flops(model(1, "meta"), 1, size.seq_len)
    flop_seconds = Estimate(per_example * batch_size, rate, 1).seconds
    timed = max(1, min(batch_size, int(TIMED_STEP_S / Estimate(per_example, rate, 1).seconds)))
    head = model(timed, device)
    head.train()
    generator = torch.Generator().manual_seed(0)
    tokens = torch.randint(1, size.vocab_size, (timed, size.seq_len), generator=generator, dtype=torch.int32)
    batch = {"inputs": tokens.to(device), "labels": tokens.to(device),
             "puzzle_identifiers": torch.randint(0, identifiers, (timed,), generator=generator,
                                                 dtype=torch.int32).to(device)}
    took = []
    for _ in range(steps + 1):
        synchronize(device)
        start = time.perf_counter()
        _, loss, *_ = head(head.initial_carry(batch), batch)
        loss.backward()
        synchronize(device)
        took.append(time.perf_counter() - start)
        head.zero_grad(set_to_none=True)
    return statistics.median(took[1:]) * batch_size / timed, flop_seconds, timed


def dry_run(recipe: Recipe, timed_steps: int, stand_ins: Path) -> None:
    """Check every command of ``recipe`` without training and print what a run would take (see the module
    docstring).

    Raises:
        RecipeError: the first check it fails, in one line naming the row.
    """
    from utils.run.estimate import duration

    for argv in recipe.data:
        check_data_command(recipe, argv)
    checked = check_training(recipe, stand_ins)
    _parses(recipe, "evaluate", lambda: importlib.import_module("evaluate").parse_args(recipe.evaluate_argv()))
    setup, cfg = checked.setup, checked.setup.cfg
    print(f"{recipe.name}: {recipe.title}")
    print(f"  expected: {recipe.expected} ({recipe.source})")
    print(f"  GPU budget: {recipe.budget}; the training runs on {recipe.gpus} GPU(s)")
    for step, command in recipe.commands():
        print(f"  {step}: {command}")
    print(f"  checked: the data and evaluate flags parse; the settings load and validate ({recipe.config}, "
          f"{len(recipe.overrides)} override(s)); global_batch_size {cfg.global_batch_size} divides over "
          f"{recipe.gpus} process(es); the trainer's data checks pass on a stand-in {recipe.size.kind} dataset")
    print(f"  schedule: {checked.steps:,} optimizer steps ({cfg.epochs} epochs x {recipe.size.groups} groups x "
          f"{recipe.size.mean_examples:g} example(s) per puzzle / batch {cfg.global_batch_size}); "
          f"{checked.parameters:,} parameters")
    if timed_steps < 1:
        print("  time on this machine: not measured (--timed-steps 0)")
        return
    per_step, flop_step, batch = time_steps(setup, recipe.size, cfg.global_batch_size, timed_steps)
    print(f"  time on this machine ({setup.plan.decisions['device'].value}, {str(setup.dtype).removeprefix('torch.')}, "
          f"one process at the global batch {cfg.global_batch_size}, eager, evaluations not counted): "
          f"{duration(per_step * checked.steps)} from {timed_steps} timed step(s) at batch {batch} "
          f"({per_step:.3g} s per step); {duration(flop_step * checked.steps)} from FLOPs")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = ArgumentParser(
        prog="reproduce.py", description=__doc__.split("\n\n")[0],
        epilog="rows: " + ", ".join(RECIPES) + "\n\n" + __doc__.split("\n\n", 1)[1],
        formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("row", nargs="?", help="a row of the Tasks table (see --list), or all (with --dry-run)")
    parser.add_argument("--list", action="store_true", help="list the rows with their published numbers")
    parser.add_argument("--dry-run", action="store_true", help="check the row's commands without training")
    parser.add_argument("--timed-steps", type=int, default=2, metavar="K",
                        help="training steps the dry run times on this machine, after one untimed step (default 2; "
                             f"0: no timing; at most {MAX_TIMED_STEPS}, about {TIMED_STEP_S:g} s each)")
    args = parser.parse_args(argv)
    if not args.list and args.row is None:
        parser.error("name a row (see --list), or give --list")
    if not 0 <= args.timed_steps <= MAX_TIMED_STEPS:
        parser.error(f"--timed-steps must be 0 to {MAX_TIMED_STEPS} (each timed step takes about {TIMED_STEP_S:g} s, "
                     f"and the median of {MAX_TIMED_STEPS} is as steady as that of more), got {args.timed_steps}")
    return args


def run(args: argparse.Namespace) -> int:
    if args.list:
        for recipe in RECIPES.values():
            print(f"{recipe.name:24} {recipe.expected}; {recipe.gpus} GPU(s): {recipe.budget}")
        return 0
    if args.row == "all" and args.dry_run:
        recipes = list(RECIPES.values())
    elif args.row in RECIPES:
        recipes = [RECIPES[args.row]]
    else:
        raise RecipeError(f"no row {args.row!r}: use one of {', '.join(RECIPES)}"
                          + (", or all with --dry-run" if args.row == "all" or args.dry_run else ""))
    if not args.dry_run:
        recipe = recipes[0]
        print(f"# {recipe.title}: {recipe.expected} ({recipe.source}); {recipe.budget}")
        for _, command in recipe.commands():
            print(command)
        return 0
    with tempfile.TemporaryDirectory(prefix="reproduce-") as stand_ins:
        for recipe in recipes:
            dry_run(recipe, args.timed_steps, Path(stand_ins))
    return 0


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    return cli_main(lambda: run(args))


if __name__ == "__main__":
    sys.exit(main())
