"""Evaluate an HRM/TRM checkpoint on a dataset's test split and print the metrics.

    python evaluate.py --checkpoint checkpoints/sudoku-cpu/run/step_1200.pt
    python evaluate.py --checkpoint HRM-checkpoint-sudoku-extreme/checkpoint --data-path data/sudoku-extreme-full

Accepts our checkpoints (``step_<N>.pt``, which carry their settings) and the reference
repositories' released ones (a raw state dict named ``checkpoint`` or ``step_<N>`` next to
``all_config.yaml``).
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
from utils.eval.puzzle import evaluate_puzzles
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
    parser = ArgumentParser(description="Evaluate an HRM/TRM checkpoint (ours or the reference's) on a test split.")
    parser.add_argument("--checkpoint", required=True, help="step_<N>.pt from pretrain.py, or a reference checkpoint file")
    parser.add_argument("--data-path", help="dataset directory (default: the one the checkpoint was trained on)")
    parser.add_argument("--device", default="auto", help="auto, cpu, mps, cuda or cuda:N (default: auto)")
    parser.add_argument("--forward-dtype", default="auto", help="auto, bfloat16 or float32 (default: auto)")
    parser.add_argument("--batch-size", type=int, default=None, help="eval batch size (default: the training global_batch_size)")
    parser.add_argument("--max-examples", type=int, default=None, help="stop after this many test examples")
    parser.add_argument("--json", action="store_true", help="print the metrics as one JSON object")
    return parser.parse_args(argv)


def run(args: argparse.Namespace) -> int:
    for flag in ("batch_size", "max_examples"):
        if getattr(args, flag) is not None and getattr(args, flag) < 1:
            raise ConfigError(f"--{flag.replace('_', '-')}={getattr(args, flag)} must be at least 1")
    path = Path(args.checkpoint)
    payload = safe_load(path)
    if not isinstance(payload, dict):
        raise ConfigError(f"{path} holds a {type(payload).__name__}, not a checkpoint (a dict)")
    state = payload["model"] if isinstance(payload.get("model"), dict) else payload
    cfg = checkpoint_settings(path, payload)
    data_path = args.data_path or cfg.data_path
    batch_size = args.batch_size or cfg.global_batch_size
    device = select_device(args.device).device
    dtype, _ = select_dtype(device, args.forward_dtype)
    metadata = load_metadata(data_path, "test")
    # The puzzle-embedding table was sized by the training split; the checkpoint knows its size.
    table = next((v for k, v in state.items() if k.endswith("puzzle_emb.weights")), None)
    head = build_model(validate_arch(cfg.arch), batch_size=batch_size, seq_len=metadata.seq_len,
                       vocab_size=metadata.vocab_size, dtype=dtype, device=device,
                       num_puzzle_identifiers=metadata.num_puzzle_identifiers if table is None else table.shape[0])
    load_model_weights(head, state, str(path))
    loader = PuzzleDataset(data_path, "test", batch_size, seed=cfg.seed)
    metrics = evaluate_puzzles(head, head, loader, device, Dist(), args.max_examples)
    if args.json:
        print(json.dumps(metrics))
    else:
        print(f"{path} on {data_path} (test):")
        for k, v in metrics.items():
            print(f"  {k:>16}: {v:.4f}")
    return 0


def main(argv: Optional[list[str]] = None) -> int:
    args = parse_args(argv)
    return cli_main(lambda: run(args))


if __name__ == "__main__":
    sys.exit(main())
