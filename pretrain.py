"""HRM pretraining on puzzle datasets (Sudoku, mazes, ARC) on CUDA, Apple Silicon or CPU.

    python pretrain.py --config-name=cfg_pretrain_cpu
    python pretrain.py --config-name=cfg_pretrain_apple_silicon lr=1e-4 arch.halt_max_steps=8
    torchrun --nproc-per-node 8 pretrain.py --config-name=cfg_pretrain data_path=data/sudoku-extreme-1k-aug-1000

The loop follows the reference HRM (REFERENCE.md §1): the ACT carry persists across
optimizer steps, AdamATan2 trains the weights and sign-SGD the puzzle embedding, the lr
warms up linearly then follows a cosine, and every ``eval_interval`` epochs the model is
evaluated on the test split and checkpointed.
"""

import utils  # noqa: F401  (sets PYTORCH_ENABLE_MPS_FALLBACK before torch is imported)

import argparse
import json
import logging
import math
import os
import sys
import time
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any, Optional

import torch
import torch.distributed as dist
from omegaconf import OmegaConf
from torch.utils.tensorboard import SummaryWriter
from tqdm import tqdm

from models.hrm.hrm_act_v1 import HierarchicalReasoningModel_ACTV1, strip_reference_prefix
from models.layers import attention_backend
from models.losses import ACTLossHead
from models.sparse_embedding import SparseEmbeddingSignSGD
from utils.checkpoint import atomic_save, prune_checkpoints
from utils.hardware_optimizer import compile_model, resolve_hardware_profile
from utils.config import ConfigError, PretrainConfig, load_config, to_dict, valid_keys
from utils.device import DeviceError, compile_decision, configure_backends, describe, select_device, select_dtype
from utils.optimizer_utils import get_adam_atan2_optimizer
from utils.puzzle_dataset import DatasetError, PuzzleDataset, PuzzleDatasetMetadata, load_metadata

log = logging.getLogger("pretrain")

# Keys of a saved model state dict, as the reference writes them from a compiled ACTLossHead.
REFERENCE_KEY_PREFIX = "_orig_mod.model."


def cosine_lr(step: int, base_lr: float, warmup_steps: int, total_steps: int, min_ratio: float) -> float:
    """Linear warmup over ``warmup_steps``, then a half cosine from ``base_lr`` to ``base_lr*min_ratio``.

    ``step`` counts optimizer steps from 1. Matches the reference schedule; with the default
    ``min_ratio`` of 1.0 the lr stays constant after warmup.
    """
    if step < warmup_steps:
        return base_lr * step / max(1, warmup_steps)
    progress = (step - warmup_steps) / max(1, total_steps - warmup_steps)
    return base_lr * (min_ratio + max(0.0, (1 - min_ratio) * 0.5 * (1.0 + math.cos(math.pi * progress))))


@dataclass
class Dist:
    """This process's place in a ``torchrun`` job (rank 0 of 1 when run plainly)."""

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def init_distributed() -> Dist:
    """Join the torchrun job if there is one: NCCL when every rank has a GPU, gloo otherwise."""
    if "LOCAL_RANK" not in os.environ or int(os.environ.get("WORLD_SIZE", "1")) == 1:
        return Dist()
    local_rank = int(os.environ["LOCAL_RANK"])
    backend = "nccl" if torch.cuda.is_available() and torch.cuda.device_count() > local_rank else "gloo"
    if backend == "nccl":
        torch.cuda.set_device(local_rank)
    # A timeout turns a crashed peer into an error on the survivors instead of a hang.
    dist.init_process_group(backend=backend, timeout=timedelta(minutes=int(os.environ.get("HRM_DIST_TIMEOUT_MIN", "10"))))
    return Dist(dist.get_rank(), dist.get_world_size(), local_rank)


def ensure_dataset(cfg: PretrainConfig, rank: Dist) -> None:
    """Build the config's default dataset when ``data_path`` is missing, or explain how to get one."""
    if Path(cfg.data_path, "train", "dataset.json").is_file():
        return
    if cfg.dataset_builder is None:
        raise DatasetError(
            f"data_path '{cfg.data_path}' has no dataset: build one with "
            f"python scripts/build_sudoku_dataset.py --generate --output-dir {cfg.data_path} "
            "(or --source-dir DIR for a local Sudoku-Extreme copy), or set data_path=...")
    if rank.is_main:
        from scripts.build_sudoku_dataset import main as build_sudoku

        argv = ["--output-dir", cfg.data_path]
        for key, value in cfg.dataset_builder.items():
            flag = "--" + key.replace("_", "-")
            if value is True:
                argv.append(flag)
            elif value is not False and value is not None:
                argv += [flag, str(value)]
        log.info("data_path %s is missing: building it with scripts/build_sudoku_dataset.py %s", cfg.data_path, " ".join(argv))
        build_sudoku(argv)
    if rank.world_size > 1:
        dist.barrier()


def build_model(cfg: PretrainConfig, metadata: PuzzleDatasetMetadata, local_batch_size: int, dtype: torch.dtype,
                device: torch.device) -> ACTLossHead:
    """HRM wrapped in its ACT loss head, created directly on ``device``."""
    arch = to_dict(cfg)["arch"]
    loss_type = arch.pop("loss")["loss_type"]
    arch.pop("name")
    arch.update(batch_size=local_batch_size, seq_len=metadata.seq_len, vocab_size=metadata.vocab_size,
                num_puzzle_identifiers=metadata.num_puzzle_identifiers, forward_dtype=str(dtype).removeprefix("torch."),
                causal=False)
    # Created on the device: the sparse embedding's gradient buffer must be a leaf there.
    with torch.device(device):
        model = HierarchicalReasoningModel_ACTV1(arch)
    return ACTLossHead(model, loss_type=loss_type)


def reference_state_dict(head: ACTLossHead) -> dict[str, torch.Tensor]:
    """The model weights under the reference's key names (``_orig_mod.model.inner.*``)."""
    return {REFERENCE_KEY_PREFIX + k: v for k, v in head.model.state_dict().items()}


def load_model_weights(head: ACTLossHead, state: dict[str, torch.Tensor], source: str) -> None:
    """Load weights saved by us or by the reference HRM into ``head``.

    Raises:
        ConfigError: the checkpoint comes from a different architecture (missing or
            unexpected keys, or a shape mismatch), with the first differences named.
    """
    state = strip_reference_prefix(state)
    own = head.model.state_dict()
    missing = sorted(set(own) - set(state))
    unexpected = sorted(set(state) - set(own))
    mismatched = [f"{k}: checkpoint {tuple(state[k].shape)} vs model {tuple(own[k].shape)}"
                  for k in own if k in state and state[k].shape != own[k].shape]
    if missing or unexpected or mismatched:
        raise ConfigError(
            f"checkpoint {source} does not fit this architecture: missing {missing[:3]}, unexpected {unexpected[:3]}, "
            f"shape mismatches {mismatched[:3]}; use the arch.* settings the checkpoint was trained with")
    head.model.load_state_dict(state)


@torch.no_grad()
def evaluate(forward, head: ACTLossHead, loader: PuzzleDataset, device: torch.device, rank: Dist,
             max_examples: Optional[int] = None, progress: bool = True) -> dict[str, float]:
    """Run every test batch for exactly ``halt_max_steps`` segments; return metrics averaged per puzzle.

    Returns ``{metric: value}`` with ``accuracy``, ``exact_accuracy``, ``blank_accuracy``,
    ``q_halt_accuracy``, ``steps`` and the losses, each divided by the number of real
    (non-padding) examples; ``count`` is that number.
    """
    head.eval()
    sums: dict[str, torch.Tensor] = {}
    seen = 0
    bar = tqdm(desc="eval", unit="ex", disable=not (progress and rank.is_main), leave=False)
    for _set_name, batch, effective in loader:
        batch = {k: v.to(device) for k, v in batch.items()}
        carry = head.initial_carry(batch)
        while True:
            carry, _, metrics, _, all_halted = forward(carry, batch)
            if all_halted:
                break
        for k, v in metrics.items():
            sums[k] = sums.get(k, 0) + v.to(torch.float64)
        seen += effective
        bar.update(effective)
        if max_examples is not None and seen >= max_examples:
            break
    bar.close()
    head.train()
    reduced = reduce_metrics(sums, rank)
    if reduced is None:
        return {}
    count = max(reduced.pop("count"), 1.0)
    out = {k: v / count for k, v in reduced.items()}
    out["count"] = count
    return out


def reduce_metrics(sums: dict[str, torch.Tensor], rank: Dist) -> Optional[dict[str, float]]:
    """Sum metric tensors across ranks onto rank 0; other ranks get None."""
    if not sums:
        return {}
    keys = sorted(sums)
    stacked = torch.stack([torch.as_tensor(sums[k], dtype=torch.float64) for k in keys])
    if rank.world_size > 1:
        dist.reduce(stacked, dst=0)
    if not rank.is_main:
        return None
    return dict(zip(keys, stacked.cpu().tolist()))


class MetricsLogger:
    """``metrics.jsonl`` (one JSON object per log point) plus TensorBoard, both under the run directory."""

    def __init__(self, run_dir: Path):
        run_dir.mkdir(parents=True, exist_ok=True)
        self.jsonl = open(run_dir / "metrics.jsonl", "a", encoding="utf-8")
        self.tb = SummaryWriter(log_dir=str(run_dir / "tensorboard"))

    def log(self, step: int, metrics: dict[str, float]) -> None:
        self.jsonl.write(json.dumps({"step": step, **metrics}) + "\n")
        self.jsonl.flush()
        for k, v in metrics.items():
            self.tb.add_scalar(k, v, step)

    def close(self) -> None:
        self.jsonl.close()
        self.tb.close()


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description="Train HRM on a puzzle dataset. Settings come from config/<NAME>.yaml and key=value overrides.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="overrides (key=value, arch.key=value):\n  " + "\n  ".join(valid_keys())
        + "\n\nexamples:\n  python pretrain.py --config-name=cfg_pretrain_cpu epochs=2000 eval_interval=500\n"
          "  python pretrain.py --config-name=cfg_pretrain_apple_silicon device=cpu forward_dtype=float32",
    )
    parser.add_argument("--config-name", default="cfg_pretrain", help="config/<NAME>.yaml to load (default: cfg_pretrain)")
    parser.add_argument("overrides", nargs="*", metavar="key=value", help="config overrides, e.g. lr=1e-4 arch.hidden_size=256")
    return parser.parse_args(argv)


def main(argv: Optional[list[str]] = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    rank = init_distributed()
    logging.basicConfig(level=logging.INFO if rank.is_main else logging.WARNING,
                        format="%(asctime)s %(levelname)s %(message)s", datefmt="%H:%M:%S")
    try:
        return train(args, rank)
    except (ConfigError, DatasetError, DeviceError) as e:
        log.error("%s", e)
        return 2
    finally:
        if rank.world_size > 1 and dist.is_initialized():
            dist.destroy_process_group()


def apply_hardware_profile(cfg: PretrainConfig, device: torch.device, explicit: set[str], rank: Dist) -> None:
    """Set the memory-dependent knobs from ``cfg.hardware``; keys given as overrides keep their value."""
    try:
        name, knobs, reason = resolve_hardware_profile(cfg.hardware, device)
    except ValueError as e:
        raise ConfigError(str(e)) from e
    applied = {k: knobs[k] for k in ("global_batch_size", "compile") if k not in explicit}
    for key, value in applied.items():
        setattr(cfg, key, value)
    if rank.is_main:
        log.info("hardware profile %s (%s): %s", name, reason, ", ".join(f"{k}={v}" for k, v in applied.items()) or "nothing changed")


def train(args: argparse.Namespace, rank: Dist) -> int:
    cfg = load_config(args.config_name, args.overrides)
    if rank.world_size > 1:  # every rank trains with rank 0's config
        box = [cfg]
        dist.broadcast_object_list(box, src=0)
        cfg = box[0]
    if rank.world_size > 1 and dist.get_backend() == "nccl":
        device_choice = select_device(f"cuda:{rank.local_rank}")
    else:
        device_choice = select_device(cfg.device)
    device = device_choice.device
    if cfg.hardware:
        apply_hardware_profile(cfg, device, explicit={o.split("=", 1)[0] for o in args.overrides}, rank=rank)
    if cfg.epochs % cfg.eval_interval:
        raise ConfigError(f"epochs ({cfg.epochs}) must be a multiple of eval_interval ({cfg.eval_interval})")
    if cfg.global_batch_size % rank.world_size:
        raise ConfigError(f"global_batch_size {cfg.global_batch_size} is not divisible by the {rank.world_size} processes")
    local_batch_size = cfg.global_batch_size // rank.world_size
    dtype, dtype_reason = select_dtype(device, cfg.forward_dtype)
    configure_backends(device)
    torch.manual_seed(cfg.seed + rank.rank)

    ensure_dataset(cfg, rank)
    metadata = load_metadata(cfg.data_path, "train")
    train_loader = PuzzleDataset(cfg.data_path, "train", cfg.global_batch_size, seed=cfg.seed, rank=rank.rank,
                                 world_size=rank.world_size, epochs_per_iter=cfg.eval_interval)
    eval_loader = PuzzleDataset(cfg.data_path, "test", cfg.global_batch_size, seed=cfg.seed, rank=rank.rank,
                                world_size=rank.world_size)
    total_steps = int(cfg.epochs * metadata.total_groups * metadata.mean_puzzle_examples / cfg.global_batch_size)
    if total_steps < 1:
        raise ConfigError(f"the run has no optimizer steps: {metadata.total_groups} groups x {cfg.epochs} epochs "
                          f"< global_batch_size {cfg.global_batch_size}; raise epochs or lower global_batch_size")

    torch.manual_seed(cfg.seed)  # identical initial weights on every rank
    head = build_model(cfg, metadata, local_batch_size, dtype, device)
    if rank.world_size > 1:
        for tensor in list(head.model.parameters()) + list(head.model.buffers()):
            dist.broadcast(tensor.data, src=0)
    torch.manual_seed(cfg.seed + rank.rank)

    adam = get_adam_atan2_optimizer(head.model.parameters(), lr=0.0, betas=(cfg.beta1, cfg.beta2),
                                    weight_decay=cfg.weight_decay, backend=cfg.optimizer_backend)
    optimizers: list[torch.optim.Optimizer] = [adam]
    base_lrs = [cfg.lr]
    if cfg.arch.puzzle_emb_ndim > 0:
        optimizers.append(SparseEmbeddingSignSGD([head.model.puzzle_emb], lr=0.0, weight_decay=cfg.puzzle_emb_weight_decay))
        base_lrs.append(cfg.puzzle_emb_lr)

    use_compile, compile_reason = compile_decision(device, cfg.compile)
    forward = compile_model(head, device=device) if use_compile else head

    run_dir = Path(cfg.checkpoint_path or Path("checkpoints") / (cfg.project_name or Path(cfg.data_path).name)
                   / (cfg.run_name or time.strftime("hrm-%Y%m%d-%H%M%S")))
    n_params = sum(p.numel() for p in head.model.parameters())
    attn, attn_reason = attention_backend(device, dtype)
    if rank.is_main:
        log.info("device: %s (%s) - %s", device, device_choice.reason, describe(device))
        log.info("precision: %s (%s)", str(dtype).removeprefix("torch."), dtype_reason)
        log.info("optimizer: %s; puzzle embedding: sign-SGD", type(adam).__module__ + "." + type(adam).__name__)
        log.info("attention: %s - %s", attn, attn_reason)
        log.info("torch.compile: %s (%s)", "on" if use_compile else "off", compile_reason)
        log.info("parameters: %s; data: %s (%d train groups, seq_len %d, vocab %d); processes: %d",
                 f"{n_params:,}", cfg.data_path, metadata.total_groups, metadata.seq_len, metadata.vocab_size, rank.world_size)
        log.info("run directory: %s; %d optimizer steps", run_dir, total_steps)
        run_dir.mkdir(parents=True, exist_ok=True)
        OmegaConf.save(to_dict(cfg), run_dir / "all_config.yaml")
    logger = MetricsLogger(run_dir) if rank.is_main else None

    step = 0
    carry = None
    sums: dict[str, torch.Tensor] = {}
    examples_since_log = 0
    t_log = time.perf_counter()
    bar = tqdm(total=total_steps, desc="train", unit="step", disable=not rank.is_main, dynamic_ncols=True)
    head.train()
    for iteration in range(cfg.epochs // cfg.eval_interval):
        for _set_name, batch, _effective in train_loader:
            if step >= total_steps:
                break
            batch = {k: v.to(device, non_blocking=device.type == "cuda") for k, v in batch.items()}
            if carry is None:
                carry = head.initial_carry(batch)
            carry, loss, metrics, _, _ = forward(carry, batch)
            (loss / cfg.global_batch_size).backward()
            if rank.world_size > 1:
                for p in head.model.parameters():
                    if p.grad is not None:
                        dist.all_reduce(p.grad)
            step += 1
            lr_now = 0.0
            for opt, base_lr in zip(optimizers, base_lrs):
                lr_now = cosine_lr(step, base_lr, cfg.lr_warmup_steps, total_steps, cfg.lr_min_ratio)
                for group in opt.param_groups:
                    group["lr"] = lr_now
                opt.step()
                opt.zero_grad(set_to_none=True)

            for k, v in metrics.items():
                sums[k] = sums.get(k, 0) + v.detach().to(torch.float64)
            examples_since_log += local_batch_size * rank.world_size
            bar.update(1)
            if step % cfg.log_interval == 0 or step == total_steps:
                reduced = reduce_metrics(sums, rank)
                if rank.is_main and reduced:
                    count = max(reduced.pop("count"), 1.0)
                    n_steps = cfg.log_interval if step % cfg.log_interval == 0 else step % cfg.log_interval
                    point = {f"train/{k}": v / (cfg.global_batch_size * n_steps if k.endswith("loss") else count)
                             for k, v in reduced.items()}
                    elapsed = time.perf_counter() - t_log
                    point.update({"train/lr": cosine_lr(step, cfg.lr, cfg.lr_warmup_steps, total_steps, cfg.lr_min_ratio),
                                  "train/examples_per_s": examples_since_log / elapsed})
                    logger.log(step, point)
                    bar.set_postfix(loss=f"{point['train/lm_loss']:.3f}", acc=f"{point['train/accuracy']:.3f}",
                                    ex_s=f"{point['train/examples_per_s']:.0f}")
                sums, examples_since_log, t_log = {}, 0, time.perf_counter()

        metrics = evaluate(forward, head, eval_loader, device, rank, cfg.eval_max_examples)
        if rank.is_main:
            logger.log(step, {f"eval/{k}": v for k, v in metrics.items()})
            tqdm.write(f"step {step} eval: " + ", ".join(f"{k}={v:.4f}" for k, v in metrics.items()))
            if cfg.checkpoint_every_eval or iteration == cfg.epochs // cfg.eval_interval - 1:
                save_checkpoint(run_dir, step, head, optimizers, cfg)
    bar.close()
    if logger is not None:
        logger.close()
        log.info("done: %d steps; checkpoints and metrics.jsonl in %s", step, run_dir)
    return 0


def save_checkpoint(run_dir: Path, step: int, head: ACTLossHead, optimizers: list[torch.optim.Optimizer],
                    cfg: PretrainConfig, keep_last: int = 3) -> Path:
    """Write ``run_dir/step_<step>.pt`` atomically: reference-format model weights plus both optimizer states."""
    path = atomic_save({
        "model": reference_state_dict(head),
        "optimizers": [opt.state_dict() for opt in optimizers],
        "step": step,
        "config": to_dict(cfg),
    }, run_dir / f"step_{step}.pt")
    prune_checkpoints(run_dir, keep_last)
    log.info("checkpoint: %s", path)
    return path


if __name__ == "__main__":
    sys.exit(main())
