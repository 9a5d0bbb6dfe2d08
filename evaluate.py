"""Evaluate an HRM/TRM checkpoint on a dataset's test split, or score saved test outputs, and print the metrics.

    python evaluate.py checkpoints/sudoku-cpu/run                      # the run's best checkpoint
    python evaluate.py --checkpoint checkpoints/sudoku-cpu/run/step_1200.pt --segments 32 --early-exit
    python evaluate.py --checkpoint hf://sapientinc/HRM-checkpoint-sudoku-extreme --data-path data/sudoku-extreme-full
    python evaluate.py --checkpoint HRM-checkpoint-sudoku-extreme/checkpoint --data-path data/sudoku-extreme-full
    python evaluate.py --checkpoint checkpoints/arc/run/step_500.pt --save-outputs --submission submission.json
    python evaluate.py --outputs run/step_500_all_preds.0 run/step_500_all_preds.1 --data-path data/arc1-aug-1000 \
        --submission submission.json --report pass_at_k.json

Accepts our checkpoints and the reference repositories' released ones (utils/eval/load.py), and spends
as much test-time compute as asked (utils/eval/reasoning.py: segments, early exit, rollouts, views, and with
``--checked`` the checked selection, reported beside the model's own). On ARC data the published scoring runs too (voting pass@K, utils/eval/arc.py);
``--outputs`` scores the reference's saved outputs files without a model.
"""

import utils  # noqa: F401  (sets the MPS fallback and the OpenMP wait before torch is imported)

import argparse
import json
import logging
from pathlib import Path
from typing import Optional

from utils.cli import ArgumentParser
from utils.config import ConfigError
from utils.eval.flags import add_budget_argument, add_test_time_arguments
from utils.outputs import announce_replacing, check_writable_dir, check_writable_file
# The rest (checkpoints, data, evaluation, pictures) is imported where it is used: --help is answered without it.

log = logging.getLogger("evaluate")


def parse_args(argv: Optional[list[str]]) -> argparse.Namespace:
    parser = ArgumentParser(description="Evaluate an HRM/TRM checkpoint (ours or the reference's) on a test split, or "
                                        "score saved test outputs (ARC: voting pass@K and submission.json).")
    parser.add_argument("run", nargs="?", metavar="RUN_DIR", help="a run directory: evaluate its best checkpoint "
                                                                  "(best.pt), or its newest one when it has none; "
                                                                  "or a folder of runs, such as checkpoints/<dataset>: "
                                                                  "its newest run")
    source = parser.add_mutually_exclusive_group()
    source.add_argument("--checkpoint", help="step_<N>.pt or best.pt from pretrain.py, a run directory, a reference "
                                             "checkpoint file, or hf://owner/repo[/file] on the Hugging Face Hub")
    source.add_argument("--outputs", nargs="+", metavar="FILE",
                        help="saved outputs (step_<N>_all_preds.<rank>, one file per rank) to score without a model")
    parser.add_argument("--data-path", help="dataset directory (default: the one the checkpoint was trained on; "
                                            "required with --outputs)")
    parser.add_argument("--device", default="auto", help="auto, cpu, mps, cuda or cuda:N (default: auto)")
    parser.add_argument("--forward-dtype", default="auto", help="auto, bfloat16 or float32 (default: auto)")
    parser.add_argument("--batch-size", type=int, default=None, help="eval batch size (default: the training global_batch_size)")
    parser.add_argument("--max-examples", type=int, default=None, help="stop after this many test examples")
    parser.add_argument("--save-outputs", nargs="?", const="", metavar="DIR",
                        help="also save the test outputs as the reference does (step_<N>_all_preds.0); "
                             "default DIR: a new eval_<checkpoint name> folder next to the checkpoint")
    parser.add_argument("--submission", metavar="PATH", help="ARC: write the ARC Prize submission.json here")
    parser.add_argument("--report", metavar="PATH", help="ARC: write {\"pass@1\": ..., \"pass@2\": ...} here as JSON")
    parser.add_argument("--json", action="store_true", help="print the metrics as one JSON object")
    add_test_time_arguments(parser)
    add_budget_argument(parser, None, "off by default and with 0; it is scored on its own line, after the "
                                      "model-only figures, each puzzle alone; --segments, --noise, --early-exit and "
                                      "--rollout-seed shape its rounds")
    args = parser.parse_args(argv)
    if args.run and (args.checkpoint or args.outputs):
        parser.error("give a run directory, --checkpoint or --outputs, not several")
    args.checkpoint = args.checkpoint or args.run
    if not (args.checkpoint or args.outputs):
        parser.error("give a run directory, --checkpoint CKPT or --outputs FILE...")
    return args


def save_outputs_dir(args: argparse.Namespace) -> Optional[Path]:
    """Where ``--save-outputs`` writes: DIR, or ``eval_<checkpoint name>`` next to the checkpoint; None when not asked."""
    if args.save_outputs is None or not args.checkpoint:
        return None
    if args.save_outputs:
        return Path(args.save_outputs)
    checkpoint = Path(args.checkpoint.removeprefix("hf://").replace("/", "_") if args.checkpoint.startswith("hf://")
                      else args.checkpoint)
    return checkpoint / "eval_outputs" if checkpoint.is_dir() else checkpoint.parent / f"eval_{checkpoint.stem}"


def check_output_paths(args: argparse.Namespace) -> None:
    """Refuse an output path that cannot be written before anything is loaded or evaluated.

    Raises:
        OutputPathError: naming the flag, the path and the reason.
    """
    where = save_outputs_dir(args)
    if where is not None:
        check_writable_dir(where, "--save-outputs")
    for flag in ("submission", "report"):
        if getattr(args, flag):
            check_writable_file(getattr(args, flag), f"--{flag}")
            announce_replacing(getattr(args, flag), f"--{flag}")


def print_metrics(title: str, metrics: dict[str, float], as_json: bool) -> None:
    """Print ``metrics`` one per line, a proportion with its interval fields as
    ``exact_accuracy: 0.8125 (95% CI 0.57-0.93, n=16)`` (n: ``ARC/tasks`` for ``ARC/`` keys, else ``count``) and a
    rating band's accuracy as ``exact_accuracy[rating 16-31]: 0.8125 (95% CI 0.57-0.93, n=16)`` (n: that band's
    count); with ``as_json``, the flat dict as one JSON object."""
    from utils.eval.puzzle import parse_band_key
    from utils.eval.stats import interval_keys

    if as_json:
        print(json.dumps(metrics))
        return
    print(title)
    bands = {k: parse_band_key(k) for k in metrics if parse_band_key(k)}
    hidden = {name for k in metrics for name in interval_keys(k) if name in metrics} | {n for _, n in bands.values()}
    width = max([16] + [len(bands.get(k, (k,))[0]) for k in metrics if k not in hidden])  # the labels line up
    for k, v in metrics.items():
        if k in hidden:
            continue
        label, n_key = bands.get(k, (k, "ARC/tasks" if k.startswith("ARC/") else "count"))
        low, high = interval_keys(k)
        if low in metrics and high in metrics:
            n = metrics.get(n_key, float("nan"))
            print(f"  {label:>{width}}: {v:.4f} (95% CI {metrics[low]:.2f}-{metrics[high]:.2f}, n={n:.0f})")
        else:
            print(f"  {label:>{width}}: {v:.4f}")


def score_saved_outputs(args: argparse.Namespace) -> int:
    from utils.eval.arc import score_outputs

    if not args.data_path:
        raise ConfigError("--outputs needs --data-path: the ARC dataset the outputs were evaluated on")
    metrics = score_outputs(args.outputs, args.data_path, args.submission, args.report)
    print_metrics(f"{len(args.outputs)} outputs file(s) on {args.data_path}:", metrics, args.json)
    return 0


def run(args: argparse.Namespace) -> int:
    from utils.data.puzzle_dataset import PuzzleDataset, load_metadata
    from utils.data.saved_outputs import OutputsCollector
    from utils.device import select_device
    from utils.distributed import Dist
    from utils.solve.precision import precision_line, solving_dtype
    from utils.eval.arc import ARC, write_results
    from utils.eval.load import load_trained, resolve_checkpoint
    from utils.eval.puzzle import evaluate_puzzles
    from utils.eval.reasoning import check_test_time_flags, test_time_compute
    from utils.viz.puzzles import known_task

    check_output_paths(args)
    if args.outputs:
        return score_saved_outputs(args)
    for flag in ("batch_size", "max_examples"):
        if getattr(args, flag) is not None and getattr(args, flag) < 1:
            raise ConfigError(f"--{flag.replace('_', '-')}={getattr(args, flag)} must be at least 1")
    if args.budget == 0:  # as in solve.py: 0 is the fixed compute of the flags (or the run's own), no anytime line
        args.budget = None
    if args.budget is not None:
        from utils.solve.anytime import check_budget_s

        check_budget_s(args.budget)
    check_test_time_flags(args)  # before the checkpoint loads; again below, against its run
    resolved = resolve_checkpoint(args.checkpoint)  # the inputs are there, before the device is chosen
    if args.data_path is not None:
        load_metadata(args.data_path, "test")
    device = select_device(args.device).device
    dtype, why = solving_dtype(device, args.forward_dtype)
    log.info(precision_line(device, dtype, why))
    trained = load_trained(args.checkpoint, device, dtype, args.batch_size or 1, args.data_path, resolved=resolved)
    if trained.note:
        log.info("evaluating %s", trained.note)
    path, cfg = trained.path, trained.cfg
    data_path = args.data_path or (cfg.data_paths_test or cfg.data_paths or [cfg.data_path])[0]
    batch_size = args.batch_size or cfg.global_batch_size
    if args.max_examples is not None and args.batch_size is None:
        batch_size = min(batch_size, args.max_examples)  # whole batches: --max-examples 2 must not answer 64
    head = trained.head
    loader = PuzzleDataset(data_path, "test", batch_size, seed=cfg.seed)
    arc = ARC(data_path) if (Path(data_path) / "test_puzzles.json").is_file() else None
    if arc is None and (args.submission or args.report):
        raise ConfigError(f"--submission and --report score ARC, but {data_path} is not an ARC dataset (no "
                          "test_puzzles.json)")
    task = anytime_task(args, loader.metadata, data_path) if args.budget is not None else None  # before any work
    collector = OutputsCollector() if args.save_outputs is not None else None
    consumers = [c for c in (arc, collector) if c is not None]
    ttc = test_time_compute(args, cfg, task=known_task(loader.metadata) if args.checked else None)
    if not ttc.plain:
        log.info("test-time compute: %s", ttc)
    metrics = evaluate_puzzles(head, head, loader, device, Dist(), args.max_examples, consumers=consumers, ttc=ttc)
    if arc is not None:
        arc_metrics, submission = arc.score()
        metrics.update(arc_metrics)
        write_results(arc_metrics, submission, args.submission, args.report)
    if collector is not None:
        where = save_outputs_dir(args)
        log.info("saved outputs: %s", collector.save(where, trained.step, 0, keep_existing=True))
    selection = ("; checked/*: checked selection, an answer that obeys the rules beats the Q head's choice (not the "
                 "references' protocol); the rest: model-only selection" if args.checked else "")
    print_metrics(f"{path} on {data_path} (test){selection}:", metrics, args.json)
    if args.budget is not None:
        report_anytime(args, trained, task, PuzzleDataset(data_path, "test", batch_size, seed=cfg.seed), ttc, device)
    return 0


def anytime_task(args: argparse.Namespace, metadata, data_path: str) -> str:
    """The task of the test puzzles, which ``--budget`` checks answers of.

    Raises:
        ConfigError: they are not Sudoku or mazes, the puzzles whose answers have rules to check.
    """
    from utils.viz.puzzles import known_task

    task = known_task(metadata)
    if task not in ("sudoku", "maze"):
        raise ConfigError(f"--budget checks answers against the puzzle's rules, which only Sudoku and mazes have; "
                          f"{data_path} holds {task or 'puzzles of an unknown kind'}: drop --budget")
    return task


def report_anytime(args: argparse.Namespace, trained, task: str, loader, ttc, device) -> None:
    """Score ``--budget``'s protocol (utils/solve/anytime.py) on ``loader``'s test puzzles and print its own line
    (with ``--json``, its own JSON object): never merged into the model-only figures."""
    import dataclasses

    from utils.solve.anytime import anytime_line, evaluate_anytime

    rounds = dataclasses.replace(ttc, rollouts=1, views=1, checker=None)
    metrics = evaluate_anytime(trained, task, loader, args.budget, rounds, device, args.max_examples)
    print(json.dumps(metrics) if args.json else anytime_line(metrics, args.budget), flush=True)


def main(argv: Optional[list[str]] = None) -> int:
    args = parse_args(argv)
    from utils.run.main import cli_main

    return cli_main(lambda: run(args))


if __name__ == "__main__":
    from utils.run.main import exit_skipping_teardown

    exit_skipping_teardown(main())  # torch's teardown is a quarter of a short solve: skipped once all is written
