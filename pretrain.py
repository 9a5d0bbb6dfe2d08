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
import logging
import math
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

import torch
import torch.distributed as dist
from omegaconf import OmegaConf
from tqdm import tqdm

from models.hrm.hrm_act_v1 import Carry, HierarchicalReasoningModel_ACTV1, InnerCarry, strip_reference_prefix
from models.layers import attention_backend
from models.losses import ACTLossHead
from models.sparse_embedding import SparseEmbeddingSignSGD
from utils.run.checkpoint import (CheckpointError, atomic_save, capture_rng_state, newest_valid_checkpoint, prune_checkpoints,
                              restore_rng_state, safe_load)
from utils.hardware_optimizer import compile_model, resolve_hardware_profile
from utils.config import ConfigError, PretrainConfig, load_config, to_dict, valid_keys
from utils.device import DeviceError, compile_decision, configure_backends, describe, select_device, select_dtype
from utils.optimizer_utils import get_adam_atan2_optimizer
from utils.distributed import Dist, any_rank, init_distributed
from utils.run.training import GracefulStop, MetricsLogger
from utils.data.puzzle_dataset import DatasetError, PuzzleDataset, PuzzleDatasetMetadata, load_metadata

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
        from utils.data.sudoku import main as build_sudoku

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
        with GracefulStop() as stopper:
            code = train(args, rank, stopper)
        if rank.world_size > 1:
            dist.barrier()  # leave together: a rank that exits while rank 0 still writes aborts in gloo's teardown
        return code
    except (ConfigError, DatasetError, DeviceError, CheckpointError, NonFiniteError) as e:
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


def train(args: argparse.Namespace, rank: Dist, stopper: GracefulStop) -> int:
    cfg = load_config(args.config_name, args.overrides)
    if rank.world_size > 1:  # every rank trains with rank 0's config
        box = [cfg]
        dist.broadcast_object_list(box, src=0)
        cfg = box[0]
    if rank.uses_nccl:
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
    configure_backends(device, cudnn_benchmark=not cfg.deterministic)
    if cfg.deterministic:
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")  # required by deterministic cuBLAS
        torch.use_deterministic_algorithms(True)

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

    run_dir = choose_run_dir(cfg)
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

    state = TrainState()
    resume_path = resolve_resume(cfg.resume, run_dir)
    if resume_path is not None:
        restore_training(resume_path, head, optimizers, train_loader, state, rank, device)
        if rank.is_main:
            log.info("resumed from %s at step %d", resume_path, state.step)

    sums: dict[str, torch.Tensor] = {}
    examples_since_log = 0
    t_log = time.perf_counter()
    bar = tqdm(total=total_steps, initial=state.step, desc="train", unit="step", disable=not rank.is_main, dynamic_ncols=True)
    head.train()
    total_iters = cfg.epochs // cfg.eval_interval
    for iteration in range(train_loader.state_dict()["iteration"], total_iters):
        for _set_name, batch, _effective in train_loader:
            if state.step >= total_steps:
                break
            batch = {k: v.to(device, non_blocking=device.type == "cuda") for k, v in batch.items()}
            if state.carry is None:
                state.carry = head.initial_carry(batch)
            state.carry, loss, metrics, _, _ = forward(state.carry, batch)
            (loss / cfg.global_batch_size).backward()
            finite = all_reduce_grads_and_check(head, loss, rank)
            state.step += 1
            if finite:
                state.nonfinite_in_a_row = 0
                for opt, base_lr in zip(optimizers, base_lrs):
                    for group in opt.param_groups:
                        group["lr"] = cosine_lr(state.step, base_lr, cfg.lr_warmup_steps, total_steps, cfg.lr_min_ratio)
                    opt.step()
            else:
                state.nonfinite_in_a_row += 1
                state.nonfinite_total += 1
                components = {k: float(v) for k, v in metrics.items() if k.endswith("loss")}
                if rank.is_main:
                    log.warning("step %d: non-finite loss or gradient (%s); skipped the update (%d in a row)",
                                state.step, components, state.nonfinite_in_a_row)
                if state.nonfinite_in_a_row >= cfg.max_nonfinite_steps:
                    raise NonFiniteError(
                        f"stopping at step {state.step}: {state.nonfinite_in_a_row} non-finite steps in a row "
                        f"(last loss components {components}). Try a lower lr (lr={cfg.lr} now), a longer "
                        "lr_warmup_steps, forward_dtype=float32, or check the dataset for bad labels; "
                        f"resume from the last good checkpoint in {run_dir}")
            for opt in optimizers:
                opt.zero_grad(set_to_none=True)

            for k, v in metrics.items():
                sums[k] = sums.get(k, 0) + v.detach().to(torch.float64)
            examples_since_log += cfg.global_batch_size
            bar.update(1)
            step = state.step
            if step % cfg.log_interval == 0 or step == total_steps:
                reduced = reduce_metrics(sums, rank)
                if rank.is_main and reduced:
                    count = max(reduced.pop("count"), 1.0)
                    n_steps = cfg.log_interval if step % cfg.log_interval == 0 else step % cfg.log_interval
                    point = {f"train/{k}": v / (cfg.global_batch_size * n_steps if k.endswith("loss") else count)
                             for k, v in reduced.items()}
                    elapsed = time.perf_counter() - t_log
                    point.update({"train/lr": cosine_lr(step, cfg.lr, cfg.lr_warmup_steps, total_steps, cfg.lr_min_ratio),
                                  "train/examples_per_s": examples_since_log / elapsed,
                                  "train/nonfinite_steps": state.nonfinite_total})
                    logger.log(step, point)
                    bar.set_postfix(loss=f"{point['train/lm_loss']:.3f}", acc=f"{point['train/accuracy']:.3f}",
                                    ex_s=f"{point['train/examples_per_s']:.0f}")
                sums, examples_since_log, t_log = {}, 0, time.perf_counter()
            if any_rank(stopper.requested, rank):
                path = save_checkpoint(run_dir, head, optimizers, train_loader, state, cfg, rank)
                bar.close()
                if rank.is_main:
                    log.info("stopped by %s after step %d; resume with: python pretrain.py --config-name=%s %s resume=%s",
                             stopper.signal_name or "a signal on another rank", state.step, args.config_name, " ".join(args.overrides), path or run_dir)
                return 0

        metrics = evaluate(forward, head, eval_loader, device, rank, cfg.eval_max_examples)
        if rank.is_main:
            logger.log(state.step, {f"eval/{k}": v for k, v in metrics.items()})
            tqdm.write(f"step {state.step} eval: " + ", ".join(f"{k}={v:.4f}" for k, v in metrics.items()))
        if cfg.checkpoint_every_eval or iteration == total_iters - 1:
            save_checkpoint(run_dir, head, optimizers, train_loader, state, cfg, rank)
    bar.close()
    if logger is not None:
        logger.close()
        log.info("done: %d steps; checkpoints and metrics.jsonl in %s", state.step, run_dir)
    return 0


def choose_run_dir(cfg: PretrainConfig) -> Path:
    """``checkpoint_path`` if set; else the directory being resumed; else a new timestamped one."""
    if cfg.checkpoint_path:
        return Path(cfg.checkpoint_path)
    if cfg.resume and cfg.resume != "auto":
        return Path(cfg.resume) if Path(cfg.resume).is_dir() else Path(cfg.resume).parent
    return Path("checkpoints") / (cfg.project_name or Path(cfg.data_path).name) / (
        cfg.run_name or time.strftime("hrm-%Y%m%d-%H%M%S"))


class NonFiniteError(RuntimeError):
    """Too many optimizer steps in a row had a NaN/inf loss or gradient."""


@dataclass
class TrainState:
    """What the loop carries between steps besides the model and optimizers."""

    step: int = 0
    carry: Any = None
    nonfinite_in_a_row: int = 0
    nonfinite_total: int = 0


def all_reduce_grads_and_check(head: ACTLossHead, loss: torch.Tensor, rank: Dist) -> bool:
    """Sum gradients over ranks; return whether the loss and every gradient are finite on all ranks."""
    grads = [p.grad for p in head.model.parameters() if p.grad is not None]
    if rank.world_size > 1:
        for g in grads:
            dist.all_reduce(g)
    emb_grad = head.model.puzzle_emb.local_weights.grad if head.model.config.puzzle_emb_ndim > 0 else None
    checks = [loss.detach().reshape(1).float()]
    if grads:
        checks.append(torch.stack(torch._foreach_norm(grads)).float())
    if emb_grad is not None:
        checks.append(emb_grad.norm().reshape(1).float())
    bad = (~torch.isfinite(torch.cat(checks))).any().to(torch.int32).reshape(1)
    if rank.world_size > 1:
        dist.all_reduce(bad, op=dist.ReduceOp.MAX)
    return not bool(bad.item())


def resolve_resume(resume: Optional[str], run_dir: Path) -> Optional[Path]:
    """The checkpoint file ``resume`` names: a file, a run directory (its newest valid one), or ``auto``.

    ``auto`` means the newest valid checkpoint in this run's directory, or a fresh start if there is none.

    Raises:
        CheckpointError: the file or directory does not exist or holds no valid checkpoint.
    """
    if not resume:
        return None
    target = run_dir if resume == "auto" else Path(resume)
    if target.is_file():
        return target
    found = newest_valid_checkpoint(target)
    if found is None:
        if resume == "auto":
            return None
        raise CheckpointError(f"resume={resume}: no valid step_<N>.pt checkpoint there")
    return found[0]


def save_checkpoint(run_dir: Path, head: ACTLossHead, optimizers: list[torch.optim.Optimizer], loader: PuzzleDataset,
                    state: TrainState, cfg: PretrainConfig, rank: Dist) -> Optional[Path]:
    """Write ``run_dir/step_<N>.pt`` atomically (rank 0) with everything needed to resume exactly.

    Holds the model in reference key format, both optimizer states, the step, the config, the
    sampler position, and per rank the ACT carry and RNG states. A failed write is logged and
    the previous checkpoint stays intact; returns None then.
    """
    carry = state.carry
    per_rank = {
        "rng": capture_rng_state(),
        "carry": None if carry is None else {
            "z_H": carry.inner_carry.z_H.cpu(), "z_L": carry.inner_carry.z_L.cpu(), "steps": carry.steps.cpu(),
            "halted": carry.halted.cpu(), "current_data": {k: v.cpu() for k, v in carry.current_data.items()},
        },
    }
    gathered = [None] * rank.world_size
    if rank.world_size > 1:
        dist.gather_object(per_rank, gathered if rank.is_main else None, dst=0)
    else:
        gathered = [per_rank]
    if not rank.is_main:
        return None
    try:
        path = atomic_save({
            "model": reference_state_dict(head),
            "optimizers": [opt.state_dict() for opt in optimizers],
            "step": state.step,
            "nonfinite_total": state.nonfinite_total,
            "config": to_dict(cfg),
            "train_loader": loader.state_dict(),
            "ranks": gathered,
        }, run_dir / f"step_{state.step}.pt")
    except CheckpointError as e:
        log.error("%s", e)
        return None
    prune_checkpoints(run_dir, cfg.keep_last_checkpoints)
    log.info("checkpoint: %s", path)
    return path


def restore_training(path: Path, head: ACTLossHead, optimizers: list[torch.optim.Optimizer], loader: PuzzleDataset,
                     state: TrainState, rank: Dist, device: torch.device) -> None:
    """Load a :func:`save_checkpoint` file into the live objects so the run continues exactly.

    Raises:
        CheckpointError: the file is corrupt, unsafe, or lacks resume state (e.g. a bare weights file).
        ConfigError: it comes from a different architecture.
    """
    payload = safe_load(path)
    missing = {"model", "optimizers", "step", "train_loader", "ranks"} - set(payload)
    if missing:
        raise CheckpointError(f"{path} cannot be resumed from: it lacks {sorted(missing)} (a weights-only checkpoint?)")
    load_model_weights(head, payload["model"], str(path))
    if len(payload["optimizers"]) != len(optimizers):
        raise ConfigError(f"{path} holds {len(payload['optimizers'])} optimizer states, this run has {len(optimizers)}")
    for opt, opt_state in zip(optimizers, payload["optimizers"]):
        opt.load_state_dict(opt_state)
    loader.load_state_dict(payload["train_loader"])
    state.step = int(payload["step"])
    state.nonfinite_total = int(payload.get("nonfinite_total", 0))
    ranks = payload["ranks"]
    if len(ranks) != rank.world_size:
        log.warning("%s was written by %d processes, this run has %d: the ACT carry and RNG states start fresh",
                    path, len(ranks), rank.world_size)
        return
    mine = ranks[rank.rank]
    restore_rng_state(mine["rng"])
    saved = mine["carry"]
    if saved is not None:
        state.carry = Carry(
            inner_carry=InnerCarry(saved["z_H"].to(device), saved["z_L"].to(device)),
            steps=saved["steps"].to(device), halted=saved["halted"].to(device),
            current_data={k: v.to(device) for k, v in saved["current_data"].items()},
        )


if __name__ == "__main__":
    sys.exit(main())
