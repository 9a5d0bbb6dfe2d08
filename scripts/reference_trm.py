"""The reference TRM code (SamsungSAILMontreal/TinyRecursiveModels) on this machine, for side-by-side figures.

The reference is never part of this repository: ``--reference-dir`` names a checkout of it, and this
script imports its model (``models/recursive_reasoning/trm.py``), loss head (``models/losses.py``),
sparse puzzle-embedding optimizer and data loader (``puzzle_dataset.py``, which reads the project's
datasets: their files are byte-compatible). It needs the reference's Python dependencies
(``pip install pydantic argdantic einops``). Two commands:

- ``train``: the reference training loop as its ``pretrain.py`` ``train_batch`` runs it (ACT carry,
  loss / global_batch_size, the cosine schedule with warmup, sign-SGD for the puzzle embeddings and
  AdamATan2 for the rest), for a wall-clock budget, evaluating the held-out split every
  ``--eval-every`` minutes the way its ``evaluate`` does (every test batch runs until all its puzzles
  halt, i.e. ``halt_max_steps`` segments). The clock runs through evaluations, as the project's run
  time does. The curve goes to ``--out`` as JSON: minutes, step, blank-cell and exact accuracy.
- ``step-worker``: one model on a fixed Sudoku batch, timing training steps on request (stdin: a
  number of steps; stdout: their seconds); ``scripts/benchmark_step.py --reference-dir`` drives it, with the
  architecture in the project's recipe converted to the reference's keys.

What differs from the reference, and only where it cannot run on a CPU: the device is this machine's
instead of its hard-coded ``cuda``; AdamATan2 is the project's pure-PyTorch implementation of the same
algorithm (``utils/optimizer_utils.py``; the reference's ``adam-atan2`` is a CUDA extension); no
torch.distributed; its model is compiled only with ``--compile`` (its pretrain.py compiles unless
DISABLE_COMPILE is set).

    python scripts/reference_trm.py --reference-dir ../TinyRecursiveModels train \\
        --data-path data/sudoku-gen-hard-r1-3k-aug-100 --minutes 30 --out ref_curve.json
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
from utils.bench import SUDOKU, not_a_checkout, serve_steps, sudoku_batch  # noqa: E402
from utils.cli import ArgumentParser, non_negative_int, number_in, positive_int  # noqa: E402

sys.path.remove(str(REPO))  # the project leaves the path before load_reference: see there why

# torch and the project's optimizer are imported where they are used: they take seconds to load, and --help or a bad
# command line is answered before them.
if TYPE_CHECKING:
    import torch

BLANK = 1  # the Sudoku token of an empty cell (digit + 1; pad 0), in the reference builder's format
IGNORE_LABEL_ID = -100

# The settings of the reference runs (hidden 128, H3/L4, batch 64, lr 1e-3, its default 16-position
# puzzle prefix, 8 halting steps); the rest are the reference cfg_pretrain / arch/trm.yaml defaults.
REFERENCE_SETTINGS = dict(
    arch=dict(hidden_size=128, H_cycles=3, L_cycles=4, H_layers=0, L_layers=2, expansion=4, num_heads=8,
              mlp_t=True, pos_encodings="none", puzzle_emb_ndim=128, puzzle_emb_len=16, halt_max_steps=8,
              halt_exploration_prob=0.1, no_ACT_continue=True, forward_dtype="bfloat16"),
    global_batch_size=64, lr=1e-3, lr_min_ratio=1.0, lr_warmup_steps=100, epochs=100000, weight_decay=0.1,
    beta1=0.9, beta2=0.95, puzzle_emb_lr=1e-2, puzzle_emb_weight_decay=0.1, seed=0)


class ReferenceUnavailable(Exception):
    """The reference checkout cannot be used (the message says why and what to do)."""


def load_reference(reference_dir: str):
    """Import the reference's modules from ``reference_dir`` (a TinyRecursiveModels checkout: :func:`parse_args`
    checked it); returns a namespace of what the loops use.

    The project's AdamATan2 and lr schedule are imported first: the project has left ``sys.path``, and its ``utils``
    package, imported with this module, finds them. Then the reference directory comes first on the path, so that
    ``models`` is the reference's (a namespace package there, which a regular package of the same name anywhere on
    the path would win over).

    Raises:
        ReferenceUnavailable: a dependency of the reference code is missing.
    """
    from utils.optimizer_utils import AdamATan2
    from utils.run.schedule import LRSchedule

    root = Path(reference_dir).expanduser().resolve()
    sys.path.insert(0, str(root))
    try:
        from models.losses import ACTLossHead
        from models.recursive_reasoning.trm import TinyRecursiveReasoningModel_ACTV1
        from models.sparse_embedding import CastedSparseEmbeddingSignSGD_Distributed
        from puzzle_dataset import PuzzleDataset, PuzzleDatasetConfig
    except ImportError as e:
        raise ReferenceUnavailable(f"the reference code in {root} cannot be imported ({e}); install its dependencies: "
                                   "pip install pydantic argdantic einops") from None
    return argparse.Namespace(ACTLossHead=ACTLossHead, Model=TinyRecursiveReasoningModel_ACTV1,
                              SignSGD=CastedSparseEmbeddingSignSGD_Distributed, AdamATan2=AdamATan2,
                              LRSchedule=LRSchedule, PuzzleDataset=PuzzleDataset, PuzzleDatasetConfig=PuzzleDatasetConfig)


class ReferenceTrainer:
    """The reference model, loss head and optimizers, and its ``train_batch`` (``pretrain.py``).

    Args:
        ref: :func:`load_reference`'s namespace.
        settings: :data:`REFERENCE_SETTINGS`-shaped dict (``arch`` uses the reference's key names).
        shapes: ``seq_len``, ``vocab_size``, ``num_puzzle_identifiers`` of the data.
        total_steps: the schedule's length in optimizer updates.
    """

    def __init__(self, ref, settings: dict, shapes: dict, total_steps: int, compile: bool = False):
        import torch

        torch.manual_seed(settings["seed"])
        self.batch_size = settings["global_batch_size"]
        model = ref.Model(dict(**settings["arch"], batch_size=self.batch_size, causal=False, **shapes))
        self.head = ref.ACTLossHead(model, loss_type="stablemax_cross_entropy")
        self.forward = torch.compile(self.head) if compile else self.head
        self.optimizers, self.base_lrs = [], []
        if settings["arch"]["puzzle_emb_ndim"] > 0:
            self.optimizers.append(ref.SignSGD(model.puzzle_emb.buffers(), lr=0,
                                               weight_decay=settings["puzzle_emb_weight_decay"], world_size=1))
            self.base_lrs.append(settings["puzzle_emb_lr"])
        self.optimizers.append(ref.AdamATan2(self.head.parameters(), lr=0, weight_decay=settings["weight_decay"],
                                             betas=(settings["beta1"], settings["beta2"])))
        self.base_lrs.append(settings["lr"])
        self.schedules = [ref.LRSchedule(base_lr=lr, warmup_steps=round(settings["lr_warmup_steps"]),
                                         total_steps=total_steps, min_ratio=settings["lr_min_ratio"])
                          for lr in self.base_lrs]
        self.step_count, self.carry = 0, None
        self.params = sum(p.numel() for p in self.head.parameters())

    def train_batch(self, batch: dict[str, torch.Tensor]) -> None:
        """One optimizer update, as the reference's ``train_batch`` makes it (single process)."""
        self.head.train()
        self.step_count += 1
        if self.carry is None:
            self.carry = self.head.initial_carry(batch)
        self.carry, loss, _, _, _ = self.forward(carry=self.carry, batch=batch, return_keys=[])
        ((1 / self.batch_size) * loss).backward()
        for optim, schedule in zip(self.optimizers, self.schedules):
            for group in optim.param_groups:
                group["lr"] = schedule.lr(self.step_count)
            optim.step()
            optim.zero_grad()

    def evaluate(self, batches) -> dict[str, float]:
        """Blank-cell and exact accuracy over ``batches`` (the reference test loader's ``(set, batch, size)``
        triples), without autograd; each batch runs until all its puzzles halt, as the reference ``evaluate`` does.
        Padding rows (every label ignored) are left out."""
        import torch

        self.head.eval()
        blank_right = blank_total = exact = count = 0
        with torch.inference_mode():
            for _, batch, _ in batches:
                carry = self.head.initial_carry(batch)
                while True:
                    carry, _, _, preds, done = self.forward(carry=carry, batch=batch, return_keys=["preds"])
                    if done:
                        break
                labels, right = batch["labels"], preds["preds"] == batch["labels"]
                rows = (labels != IGNORE_LABEL_ID).any(-1)
                blank = batch["inputs"] == BLANK
                blank_right += (right & blank)[rows].sum().item()
                blank_total += blank[rows].sum().item()
                exact += (right | (labels == IGNORE_LABEL_ID)).all(-1)[rows].sum().item()
                count += rows.sum().item()
        return {"blank_accuracy": blank_right / max(blank_total, 1), "exact_accuracy": exact / max(count, 1),
                "puzzles": count}


def _value(text: str):
    """A ``--set`` value: JSON where it parses (numbers, true/false), else the text itself."""
    try:
        return json.loads(text)
    except ValueError:
        return text


def with_changes(changes: list[str]) -> dict:
    """:data:`REFERENCE_SETTINGS` with ``KEY=VALUE`` changes (``arch.KEY`` for the architecture).

    Raises:
        ValueError: a change without ``=`` or with a key the settings do not have (one line, naming it).
    """
    settings = json.loads(json.dumps(REFERENCE_SETTINGS))
    for item in changes:
        key, sep, value = item.partition("=")
        target = settings["arch"] if key.startswith("arch.") else settings
        if not sep or key.removeprefix("arch.") not in target or key == "arch":
            raise ValueError(f"--set {item}: give KEY=VALUE with a key of {', '.join(settings)} or "
                             f"arch.{{{', '.join(settings['arch'])}}}")
        target[key.removeprefix("arch.")] = _value(value)
    return settings


def train(ref, args) -> int:
    """The ``train`` command: a wall-clock budget of the reference loop, the curve to ``args.out``."""
    settings = args.settings

    def dataset(split: str):
        return ref.PuzzleDataset(ref.PuzzleDatasetConfig(
            seed=settings["seed"], dataset_paths=[args.data_path], global_batch_size=settings["global_batch_size"],
            test_set_mode=split == "test", epochs_per_iter=1, rank=0, num_replicas=1), split=split)

    start = time.perf_counter()
    train_set, test_set = dataset("train"), dataset("test")
    meta = train_set.metadata
    total_steps = int(settings["epochs"] * meta.total_groups * meta.mean_puzzle_examples / settings["global_batch_size"])
    trainer = ReferenceTrainer(ref, settings, dict(seq_len=meta.seq_len, vocab_size=meta.vocab_size,
                                                   num_puzzle_identifiers=meta.num_puzzle_identifiers),
                               total_steps, compile=args.compile)
    points, next_eval = [], args.eval_every
    print(f"reference TRM: {trainer.params:,} parameters, {json.dumps(settings)}", flush=True)
    while (time.perf_counter() - start) / 60 < args.minutes:
        for _, batch, _ in train_set:
            trainer.train_batch(batch)
            minutes = (time.perf_counter() - start) / 60
            if minutes >= next_eval or minutes >= args.minutes:
                points.append({"minutes": round(minutes, 2), "step": trainer.step_count, **trainer.evaluate(test_set)})
                print(json.dumps(points[-1]), flush=True)
                next_eval += args.eval_every
                if minutes >= args.minutes:
                    break
    result = {"reference_dir": str(args.reference_dir), "data_path": args.data_path, "settings": settings,
              "params": trainer.params, "compile": args.compile, "points": points}
    try:
        Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    except OSError as e:
        print(f"error: could not write --out {args.out} ({e.strerror or e}); the curve's points are printed above",
              file=sys.stderr)
        return 1
    print(f"curve written to {args.out}")
    return 0


def step_worker(ref, args) -> int:
    """The ``step-worker`` command: the reference step on one fixed Sudoku batch, timed on request."""
    settings = json.loads(json.dumps(REFERENCE_SETTINGS))
    settings["arch"] = dict(settings["arch"], **args.arch_changes)
    settings["global_batch_size"] = args.batch_size
    trainer = ReferenceTrainer(ref, settings, SUDOKU, total_steps=10**6, compile=args.compile)
    batch = sudoku_batch(args.batch_size)
    serve_steps(lambda: trainer.train_batch(batch), {"params": trainer.params}, args.warmup)
    return 0


def parse_args(argv: list[str] | None):
    """The command line (default: ``sys.argv``), every check that needs no torch made.

    Raises:
        SystemExit: 0 after ``--help``; 2 after one ``error:`` line for a bad command line.
    """
    summary, details = __doc__.split("\n\n", 1)
    parser = ArgumentParser(description=summary, epilog=details, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--reference-dir", required=True, help="a checkout of SamsungSAILMontreal/TinyRecursiveModels")
    parser.add_argument("--compile", action="store_true", help="torch.compile the reference loss head, as its pretrain.py does")
    commands = parser.add_subparsers(dest="command", required=True)
    tr = commands.add_parser("train", help="train for --minutes, evaluating every --eval-every minutes")
    tr.add_argument("--data-path", required=True, help="a dataset directory in the reference format (train/ and test/)")
    tr.add_argument("--minutes", type=number_in(0, 7 * 24 * 60, low_open=True), default=30.0, help="wall-clock budget, evaluations included (default: 30)")
    tr.add_argument("--eval-every", type=number_in(0, 7 * 24 * 60, low_open=True), default=3.0, help="minutes between evaluations (default: 3)")
    tr.add_argument("--out", required=True, help="where the curve (JSON) goes")
    tr.add_argument("--set", action="append", metavar="KEY=VALUE",
                    help=f"change a setting (arch.KEY for the architecture); defaults: {json.dumps(REFERENCE_SETTINGS)}")
    sw = commands.add_parser("step-worker", help="serve timed training steps on stdin/stdout")
    sw.add_argument("--arch", required=True, help="the architecture as JSON, in the reference's key names")
    sw.add_argument("--batch-size", type=positive_int, default=64)
    sw.add_argument("--warmup", type=non_negative_int, default=2, help="untimed steps first (default: 2)")
    args = parser.parse_args(argv)
    if args.command == "train":
        out = Path(args.out)
        if out.exists() or not out.parent.is_dir():
            parser.error(f"--out {out}: exists already or its folder is missing; give a new file in an existing folder")
        if not (Path(args.data_path) / "train" / "dataset.json").is_file():
            parser.error(f"--data-path {args.data_path}: no train/dataset.json there; build it with scripts/build_*_dataset.py")
        try:
            args.settings = with_changes(args.set or [])
        except ValueError as e:
            parser.error(str(e))
    else:
        try:
            args.arch_changes = json.loads(args.arch)
            if not isinstance(args.arch_changes, dict):
                raise ValueError("not an object")
        except ValueError as e:
            parser.error(f"--arch {args.arch!r}: give a JSON object of the reference's architecture keys ({e})")
    if problem := not_a_checkout(args.reference_dir):
        parser.error(problem)
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        ref = load_reference(args.reference_dir)
    except ReferenceUnavailable as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return train(ref, args) if args.command == "train" else step_worker(ref, args)


if __name__ == "__main__":
    sys.exit(main())
