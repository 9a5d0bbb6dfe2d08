"""Evaluate an HRM checkpoint on a dataset's test split and print the metrics.

    python evaluate.py --checkpoint checkpoints/sudoku-cpu/run/step_1200.pt
    python evaluate.py --checkpoint HRM-checkpoint-sudoku-extreme/checkpoint --data-path data/sudoku-extreme-full

Accepts our checkpoints (``step_<N>.pt``, which carry their config) and the reference
HRM's released ones (a raw state dict named ``checkpoint`` next to ``all_config.yaml``).
"""

import utils  # noqa: F401  (sets PYTORCH_ENABLE_MPS_FALLBACK before torch is imported)

import argparse
import json
import logging
import sys
from pathlib import Path
from typing import Optional

from omegaconf import OmegaConf

from pretrain import build_model, evaluate, load_model_weights
from utils.run.checkpoint import CheckpointError, safe_load
from utils.distributed import Dist
from utils.config import ConfigError, PretrainConfig, valid_keys
from utils.device import DeviceError, select_device, select_dtype
from utils.data.puzzle_dataset import DatasetError, PuzzleDataset, load_metadata

log = logging.getLogger("evaluate")


def checkpoint_config(path: Path, payload: dict) -> dict:
    """The training config stored in our checkpoint, or the reference's ``all_config.yaml`` beside it."""
    if isinstance(payload.get("config"), dict):
        return payload["config"]
    yaml_path = path.parent / "all_config.yaml"
    if not yaml_path.is_file():
        raise ConfigError(f"{path} carries no config and there is no {yaml_path}; put the run's all_config.yaml next to it")
    raw = OmegaConf.to_container(OmegaConf.load(yaml_path), resolve=True)
    known = {k.split(".")[0] for k in valid_keys()}
    dropped = sorted(set(raw) - known)
    if dropped:
        log.info("ignoring reference config keys this trainer does not use: %s", ", ".join(dropped))
    return {k: v for k, v in raw.items() if k in known}


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(description="Evaluate an HRM checkpoint (ours or the reference's) on a test split.")
    parser.add_argument("--checkpoint", required=True, help="step_<N>.pt from pretrain.py, or a reference 'checkpoint' file")
    parser.add_argument("--data-path", help="dataset directory (default: the one the checkpoint was trained on)")
    parser.add_argument("--device", default="auto", help="auto, cpu, mps, cuda or cuda:N (default: auto)")
    parser.add_argument("--forward-dtype", default="auto", help="auto, bfloat16 or float32 (default: auto)")
    parser.add_argument("--batch-size", type=int, default=None, help="eval batch size (default: the training global_batch_size)")
    parser.add_argument("--max-examples", type=int, default=None, help="stop after this many test examples")
    parser.add_argument("--json", action="store_true", help="print the metrics as one JSON object")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s", datefmt="%H:%M:%S")

    try:
        path = Path(args.checkpoint)
        payload = safe_load(path)
        state = payload["model"] if isinstance(payload.get("model"), dict) else payload
        cfg_dict = checkpoint_config(path, payload)
        base = OmegaConf.structured(PretrainConfig)
        cfg: PretrainConfig = OmegaConf.to_object(OmegaConf.merge(base, cfg_dict))
        if args.data_path:
            cfg.data_path = args.data_path
        batch_size = args.batch_size or cfg.global_batch_size
        device = select_device(args.device).device
        dtype, _ = select_dtype(device, args.forward_dtype)
        metadata = load_metadata(cfg.data_path, "test")
        head = build_model(cfg, metadata, batch_size, dtype, device)
        load_model_weights(head, state, str(path))
        loader = PuzzleDataset(cfg.data_path, "test", batch_size, seed=cfg.seed)
        metrics = evaluate(head, head, loader, device, Dist(), args.max_examples)
    except (CheckpointError, ConfigError, DatasetError, DeviceError) as e:
        log.error("%s", e)
        return 2
    if args.json:
        print(json.dumps(metrics))
    else:
        print(f"{path} on {cfg.data_path} (test):")
        for k, v in metrics.items():
            print(f"  {k:>16}: {v:.4f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
