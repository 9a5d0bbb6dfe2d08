"""Evaluate an HRM/TRM checkpoint on a dataset's test split, or score saved test outputs, and print the metrics.

    python evaluate.py --checkpoint checkpoints/sudoku-cpu/run/step_1200.pt
    python evaluate.py --checkpoint HRM-checkpoint-sudoku-extreme/checkpoint --data-path data/sudoku-extreme-full
    python evaluate.py --checkpoint checkpoints/arc/run/step_500.pt --save-outputs --submission submission.json
    python evaluate.py --outputs run/step_500_all_preds.0 run/step_500_all_preds.1 --data-path data/arc1-aug-1000 \
        --submission submission.json --report pass_at_k.json

Accepts our checkpoints (``step_<N>.pt``, which carry their settings) and the reference
repositories' released ones (a raw state dict named ``checkpoint`` or ``step_<N>`` next to
``all_config.yaml``). On ARC data the published scoring runs too (voting pass@K, utils/eval/arc.py);
``--outputs`` scores the reference's saved outputs files without a model.
"""

import utils  # noqa: F401  (sets PYTORCH_ENABLE_MPS_FALLBACK before torch is imported)

import argparse
import json
import logging
import sys
from pathlib import Path
from typing import Optional

from omegaconf import OmegaConf

from models import build_model, validate_arch
from models.checkpoints import load_model_weights
from utils.config import ConfigError, PretrainConfig, build_config, to_dict
from utils.data.puzzle_dataset import PuzzleDataset, load_metadata
from utils.device import select_device, select_dtype
from utils.distributed import Dist
from utils.eval.arc import ARC, score_outputs, write_results
from utils.eval.outputs import OutputsCollector
from utils.eval.puzzle import evaluate_puzzles
from utils.eval.stats import interval_keys
from utils.outputs import check_writable_dir, check_writable_file
from utils.run.checkpoint import safe_load
from utils.run.main import ArgumentParser, cli_main

log = logging.getLogger("evaluate")


def checkpoint_settings(path: Path, payload: dict) -> PretrainConfig:
    """The training settings stored in our checkpoint, or the reference's ``all_config.yaml`` beside it.

    Raises:
        ConfigError: neither exists, or they do not validate.
    """
    if isinstance(payload.get("config"), dict):
        raw = payload["config"]
    else:
        yaml_path = path.parent / "all_config.yaml"
        if not yaml_path.is_file():
            raise ConfigError(f"{path} carries no settings and there is no {yaml_path}; put the run's all_config.yaml next to it")
        try:
            raw = OmegaConf.to_container(OmegaConf.load(yaml_path), resolve=True)
        except Exception as e:  # a YAML parser error: name the file, not the parser's internals
            raise ConfigError(f"could not read {yaml_path}: {str(e).splitlines()[0]}") from None
    known = set(to_dict(PretrainConfig()))
    dropped = sorted(set(raw) - known)
    if dropped:
        log.info("ignoring settings this trainer does not use: %s", ", ".join(dropped))
    return build_config({k: v for k, v in raw.items() if k in known})


def parse_args(argv: Optional[list[str]]) -> argparse.Namespace:
    parser = ArgumentParser(description="Evaluate an HRM/TRM checkpoint (ours or the reference's) on a test split, or "
                                        "score saved test outputs (ARC: voting pass@K and submission.json).")
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--checkpoint", help="step_<N>.pt from pretrain.py, or a reference checkpoint file")
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
    return parser.parse_args(argv)


def save_outputs_dir(args: argparse.Namespace) -> Optional[Path]:
    """Where ``--save-outputs`` writes: DIR, or ``eval_<checkpoint name>`` next to the checkpoint; None when not asked."""
    if args.save_outputs is None or not args.checkpoint:
        return None
    if args.save_outputs:
        return Path(args.save_outputs)
    checkpoint = Path(args.checkpoint)
    return checkpoint.parent / f"eval_{checkpoint.stem}"


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


def print_metrics(title: str, metrics: dict[str, float], as_json: bool) -> None:
    """Print ``metrics`` one per line, a proportion with its interval fields as
    ``exact_accuracy: 0.8125 (95% CI 0.57-0.93, n=16)`` (n: ``ARC/tasks`` for ``ARC/`` keys, else ``count``);
    with ``as_json``, the flat dict as one JSON object."""
    if as_json:
        print(json.dumps(metrics))
        return
    print(title)
    interval_fields = {name for k in metrics for name in interval_keys(k) if name in metrics}
    for k, v in metrics.items():
        if k in interval_fields:
            continue
        low, high = interval_keys(k)
        if low in metrics and high in metrics:
            n = metrics.get("ARC/tasks" if k.startswith("ARC/") else "count", float("nan"))
            print(f"  {k:>16}: {v:.4f} (95% CI {metrics[low]:.2f}-{metrics[high]:.2f}, n={n:.0f})")
        else:
            print(f"  {k:>16}: {v:.4f}")


def score_saved_outputs(args: argparse.Namespace) -> int:
    if not args.data_path:
        raise ConfigError("--outputs needs --data-path: the ARC dataset the outputs were evaluated on")
    metrics = score_outputs(args.outputs, args.data_path, args.submission, args.report)
    print_metrics(f"{len(args.outputs)} outputs file(s) on {args.data_path}:", metrics, args.json)
    return 0


def run(args: argparse.Namespace) -> int:
    check_output_paths(args)
    if args.outputs:
        return score_saved_outputs(args)
    for flag in ("batch_size", "max_examples"):
        if getattr(args, flag) is not None and getattr(args, flag) < 1:
            raise ConfigError(f"--{flag.replace('_', '-')}={getattr(args, flag)} must be at least 1")
    path = Path(args.checkpoint)
    payload = safe_load(path)
    if not isinstance(payload, dict):
        raise ConfigError(f"{path} holds a {type(payload).__name__}, not a checkpoint (a dict)")
    state = payload["model"] if isinstance(payload.get("model"), dict) else payload
    cfg = checkpoint_settings(path, payload)
    data_path = args.data_path or (cfg.data_paths_test or cfg.data_paths or [cfg.data_path])[0]
    batch_size = args.batch_size or cfg.global_batch_size
    device = select_device(args.device).device
    dtype, _ = select_dtype(device, args.forward_dtype)
    metadata = load_metadata(data_path, "test")
    # The puzzle-embedding table was sized by the training data; the checkpoint knows its size.
    table = next((v for k, v in state.items() if k.endswith("puzzle_emb.weights")), None)
    head = build_model(validate_arch(cfg.arch), batch_size=batch_size, seq_len=metadata.seq_len,
                       vocab_size=metadata.vocab_size, dtype=dtype, device=device,
                       num_puzzle_identifiers=metadata.num_puzzle_identifiers if table is None else table.shape[0])
    load_model_weights(head, state, str(path))
    loader = PuzzleDataset(data_path, "test", batch_size, seed=cfg.seed)
    arc = ARC(data_path) if (Path(data_path) / "test_puzzles.json").is_file() else None
    collector = OutputsCollector() if args.save_outputs is not None else None
    consumers = [c for c in (arc, collector) if c is not None]
    metrics = evaluate_puzzles(head, head, loader, device, Dist(), args.max_examples, consumers=consumers)
    if arc is not None:
        arc_metrics, submission = arc.score()
        metrics.update(arc_metrics)
        write_results(arc_metrics, submission, args.submission, args.report)
    elif args.submission or args.report:
        raise ConfigError(f"--submission and --report score ARC, but {data_path} is not an ARC dataset (no test_puzzles.json)")
    if collector is not None:
        where = save_outputs_dir(args)
        step = int(payload.get("step", 0)) if isinstance(payload.get("step"), int) else 0
        log.info("saved outputs: %s", collector.save(where, step, 0))
    print_metrics(f"{path} on {data_path} (test):", metrics, args.json)
    return 0


def main(argv: Optional[list[str]] = None) -> int:
    args = parse_args(argv)
    return cli_main(lambda: run(args))


if __name__ == "__main__":
    sys.exit(main())
