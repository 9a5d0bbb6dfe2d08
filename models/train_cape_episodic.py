"""Episodic CAPE training on MP-100 (or the synthetic stand-in), on CUDA, Apple Silicon (MPS) or CPU.

    python -m models.train_cape_episodic --data_root data/mp100 --split 1
    python -m models.train_cape_episodic --resume outputs/cape/last.pt ...   # same flags as the first run

Each step trains on ``--batch_size`` episodes (one category each, K supports and Q queries);
validation PCK@0.2 on the unseen val categories runs every epoch and keeps ``best.pt``; at the end
the best model is scored on the unseen test categories next to the copy-the-support baseline.
Outputs in ``--output_dir``: ``last.pt``, ``best.pt``, ``metrics.jsonl`` and TensorBoard logs in ``tb/``.
"""

from __future__ import annotations

import argparse
import math
import os
import shlex
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import utils  # noqa: F401  (sets the MPS fallback env before torch loads)
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader
from tqdm import tqdm

from models.cape import CapeConfig, CapeModel, cape_loss, load_backbone_weights, supervised_mask
from utils.run.checkpoint import CheckpointError, atomic_save, capture_rng_state, restore_rng_state, safe_load
from utils.device import DeviceError, bf16_support, configure_backends, describe, select_device
from utils.data.mp100 import (Augmentation, EpisodeDataset, EpisodeSampler, MP100FormatError, collate_episodes, load_mp100)
from utils.eval.pck import PCKAccumulator, copy_support_baseline, crop_to_original, evaluation_mask
from utils.distributed import Dist, any_rank, init_distributed
from utils.hardware_optimizer import resolve_hardware_profile
from utils.run.training import GracefulStop, MetricsLogger

MAX_NONFINITE_IN_A_ROW = 10


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    on_off = argparse.BooleanOptionalAction
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    g = p.add_argument_group("data")
    g.add_argument("--data_root", default="data/synthetic_cape", help="MP-100 folder with annotations/ and images/")
    g.add_argument("--split", type=int, default=1, choices=range(1, 6), help="MP-100 split (1..5)")
    g.add_argument("--image_size", type=int, default=256, help="crop side in pixels (a multiple of 32)")
    g.add_argument("--shots", type=int, default=1, help="K support images per episode")
    g.add_argument("--queries", type=int, default=4, help="Q query images per training episode")
    g.add_argument("--eval_queries", type=int, default=15, help="Q query images per evaluation episode (MP-100: 15)")
    g.add_argument("--val_episodes_per_category", type=int, default=20)
    g.add_argument("--test_episodes_per_category", type=int, default=200, help="MP-100 protocol: 200")
    g.add_argument("--eval_seed", type=int, default=0, help="seed of the fixed evaluation episodes")
    g.add_argument("--num_workers", type=int, default=None, help="DataLoader workers (default: hardware profile)")
    g = p.add_argument_group("model")
    g.add_argument("--backbone", default="resnet50", choices=["resnet18", "resnet50"])
    g.add_argument("--backbone_weights", default=None, help="torchvision-layout ResNet state dict to start from")
    g.add_argument("--hidden_dim", type=int, default=256)
    g.add_argument("--num_heads", type=int, default=8)
    g.add_argument("--num_decoder_layers", type=int, default=3)
    g.add_argument("--dropout", type=float, default=0.1)
    g = p.add_argument_group("optimisation")
    g.add_argument("--epochs", type=int, default=100)
    g.add_argument("--episodes_per_epoch", type=int, default=2000)
    g.add_argument("--batch_size", type=int, default=None, help="episodes per micro-step (default: hardware profile)")
    g.add_argument("--accumulation_steps", type=int, default=None, help="micro-steps per optimizer step (default: hardware profile)")
    g.add_argument("--lr", type=float, default=2e-4, help="peak AdamW learning rate")
    g.add_argument("--lr_warmup_steps", type=int, default=200)
    g.add_argument("--lr_min_ratio", type=float, default=0.05, help="final lr as a fraction of --lr (cosine decay)")
    g.add_argument("--weight_decay", type=float, default=1e-4)
    g.add_argument("--clip_max_norm", type=float, default=1.0, help="gradient-norm clip (0 disables)")
    g.add_argument("--heatmap_weight", type=float, default=0.2)
    g.add_argument("--seed", type=int, default=0)
    g = p.add_argument_group("hardware")
    g.add_argument("--device", default="auto", help="auto, cpu, mps, cuda or cuda:N")
    g.add_argument("--hardware", default="auto", choices=["auto", "gpu_24gb", "gpu_16gb", "gpu_low_mem", "apple_silicon", "cpu"])
    g.add_argument("--use_amp", action=on_off, default=True, help="mixed precision: bf16 where native, else fp16 + GradScaler on GPUs")
    g.add_argument("--cudnn_benchmark", action=on_off, default=True)
    g.add_argument("--cudnn_deterministic", action="store_true", help="deterministic algorithms (turns cudnn_benchmark off)")
    g = p.add_argument_group("run")
    g.add_argument("--output_dir", default="outputs/cape")
    g.add_argument("--resume", default=None, help="checkpoint file (or a folder holding last.pt) to continue from")
    g.add_argument("--log_interval", type=int, default=20, help="optimizer steps between train log points")
    args = p.parse_args(argv)
    for name in ("shots", "queries", "eval_queries", "epochs", "episodes_per_epoch", "batch_size", "accumulation_steps"):
        if getattr(args, name) is not None and getattr(args, name) < 1:
            p.error(f"--{name} must be at least 1, got {getattr(args, name)}")
    if args.image_size % 32:
        p.error(f"--image_size {args.image_size} must be a multiple of 32 (the backbone's stride)")
    if args.hidden_dim % args.num_heads or args.hidden_dim % 4:
        p.error(f"--hidden_dim {args.hidden_dim} must be divisible by --num_heads {args.num_heads} and by 4")
    return args


@dataclass(frozen=True)
class AmpPolicy:
    """Autocast dtype (None = fp32), whether fp16 gradients need a GradScaler, and why (for the startup log)."""

    dtype: torch.dtype | None
    use_scaler: bool
    reason: str


def amp_policy(device: torch.device, use_amp: bool) -> AmpPolicy:
    """bf16 autocast where the device runs bf16 natively; else fp16 autocast with a GradScaler on CUDA/MPS; else off."""
    if not use_amp:
        return AmpPolicy(None, False, "off (--no-use_amp)")
    if not torch.amp.is_autocast_available(device.type):
        return AmpPolicy(None, False, f"off: this torch has no autocast for {device.type}")
    ok, why = bf16_support(device)
    if ok:
        return AmpPolicy(torch.bfloat16, False, f"bf16 autocast ({why})")
    if device.type in ("cuda", "mps"):
        return AmpPolicy(torch.float16, True, f"fp16 autocast with GradScaler (no native bf16: {why})")
    return AmpPolicy(None, False, f"off: {why}, and fp16 on a CPU is slower than fp32")


def apply_hardware_profile(args: argparse.Namespace, device: torch.device) -> str:
    """Fill batch_size, accumulation_steps and num_workers the user did not set, from the hardware profile."""
    name, knobs, reason = resolve_hardware_profile(args.hardware, device)
    for key in ("batch_size", "accumulation_steps", "num_workers"):
        if getattr(args, key) is None:
            setattr(args, key, int(knobs[key]))
    return (f"hardware profile: {name} ({reason}): batch_size={args.batch_size} "
            f"accumulation_steps={args.accumulation_steps} num_workers={args.num_workers}")


def lr_lambda(step: int, warmup: int, total: int, min_ratio: float) -> float:
    """Linear warmup to 1 over ``warmup`` steps, then cosine decay to ``min_ratio`` at ``total``."""
    if step < warmup:
        return (step + 1) / warmup
    progress = min(1.0, (step - warmup) / max(1, total - warmup))
    return min_ratio + (1 - min_ratio) * 0.5 * (1 + math.cos(math.pi * progress))


def to_device(batch: dict[str, torch.Tensor], device: torch.device) -> dict[str, torch.Tensor]:
    non_blocking = device.type == "cuda"  # pinned host memory only exists for CUDA
    return {k: v.to(device, non_blocking=non_blocking) for k, v in batch.items()}


def run_model(model: CapeModel, batch: dict[str, torch.Tensor], amp: AmpPolicy, device: torch.device) -> dict[str, torch.Tensor]:
    with torch.autocast(device.type, dtype=amp.dtype or torch.float32, enabled=amp.dtype is not None):
        return model(batch["support_image"], batch["support_keypoints"], batch["support_visible"],
                     batch["query_image"], batch["keypoint_mask"])


def train_step(model: CapeModel, optimizer: torch.optim.Optimizer, scaler: torch.amp.GradScaler | None,
               micro_batches: list[dict[str, torch.Tensor]], amp: AmpPolicy, device: torch.device,
               clip_max_norm: float, heatmap_weight: float, rank: Dist = Dist()) -> dict[str, float] | None:
    """One optimizer step over ``micro_batches`` (host tensors from :func:`collate_episodes`; gradient
    accumulation, one micro-batch on the device at a time). Returns the mean loss parts, or None when
    the loss or the gradient norm was not finite (the step is skipped, weights untouched).

    fp16 gradients are unscaled before clipping, so ``clip_max_norm`` applies to the true gradient.
    Under torchrun ``model`` is the DDP wrapper: gradients are averaged across ranks in backward.
    """
    optimizer.zero_grad(set_to_none=True)
    totals: dict[str, float] = {}
    for batch in micro_batches:
        batch = to_device(batch, device)
        out = run_model(model, batch, amp, device)
        mask = supervised_mask(batch["query_visible"], batch["support_visible"], batch["keypoint_mask"])
        loss, parts = cape_loss(out, batch["query_keypoints"], mask, heatmap_weight)
        if any_rank(not torch.isfinite(loss).item(), rank):  # every rank skips, or DDP's all-reduce would hang
            optimizer.zero_grad(set_to_none=True)
            return None
        scaled = loss / len(micro_batches)
        (scaler.scale(scaled) if scaler is not None else scaled).backward()
        for k, v in {"loss": loss.detach(), **parts}.items():
            totals[k] = totals.get(k, 0.0) + float(v) / len(micro_batches)
    if scaler is not None:
        scaler.unscale_(optimizer)
    params = [p for p in model.parameters() if p.grad is not None]
    grad_norm = torch.nn.utils.clip_grad_norm_(params, clip_max_norm if clip_max_norm > 0 else float("inf"))
    if scaler is not None:
        scaler.step(optimizer)  # skips the update itself when fp16 gradients overflowed
        scaler.update()
    elif not torch.isfinite(grad_norm):
        optimizer.zero_grad(set_to_none=True)
        return None
    else:
        optimizer.step()
    totals["grad_norm"] = float(grad_norm)
    return totals


@torch.no_grad()
def evaluate(model: CapeModel, loader: DataLoader, amp: AmpPolicy, device: torch.device, image_size: int,
             desc: str) -> dict[str, float]:
    """PCK@0.2 of the model (last decoder layer) and of the copy-support baseline over a fixed episode set.

    Returns ``PCK@0.2`` and ``copy_support_PCK@0.2`` in percent (mean over queries, see utils/eval/pck.py) and ``queries``.
    """
    model.eval()
    acc, base = PCKAccumulator(0.2), PCKAccumulator(0.2)
    for batch in tqdm(loader, desc=desc, leave=False, dynamic_ncols=True):
        # Scoring runs on the host in float64 (MPS has no float64); only the model runs on the device.
        pred = run_model(model, to_device(batch, device), amp, device)["refined"][-1].float().cpu()
        mask = evaluation_mask(batch["query_visible"], batch["support_visible"], batch["keypoint_mask"])
        gt, size, to_orig = batch["query_keypoints_orig"], batch["query_bbox_size"], batch["query_crop_to_orig"]
        acc.update(crop_to_original(pred, to_orig, image_size), gt, size, mask)
        copy = copy_support_baseline(batch["support_keypoints"], batch["support_visible"], pred.shape[1])
        base.update(crop_to_original(copy, to_orig, image_size), gt, size, mask)
    model.train()
    return {"PCK@0.2": acc.value(), "copy_support_PCK@0.2": base.value(), "queries": acc.queries}


def resume_command(checkpoint: Path) -> str:
    argv = sys.argv[1:]
    kept, skip = [], False
    for a in argv:  # drop an earlier --resume so the line stays copy-pastable
        if skip:
            skip = False
            continue
        if a == "--resume":
            skip = True
            continue
        if not a.startswith("--resume="):
            kept.append(a)
    return shlex.join([sys.executable, "-m", "models.train_cape_episodic", *kept, "--resume", str(checkpoint)])


def save_checkpoint(path: Path, model, optimizer, scaler, scheduler, state: dict, args, cfg: CapeConfig) -> None:
    atomic_save({
        "model": model.state_dict(), "optimizer": optimizer.state_dict(), "scheduler": scheduler.state_dict(),
        "scaler": scaler.state_dict() if scaler is not None else None,
        "rng": capture_rng_state(),
        "model_config": asdict(cfg), "args": {k: v for k, v in vars(args).items()}, **state,
    }, path)


def make_loader(dataset: EpisodeDataset, batch_size: int, num_workers: int, device: torch.device) -> DataLoader:
    return DataLoader(dataset, batch_size=batch_size, shuffle=False, num_workers=num_workers,
                      collate_fn=collate_episodes, pin_memory=device.type == "cuda", drop_last=False)


def load_resume_state(path: Path, model, optimizer, scheduler, scaler, cfg: CapeConfig, device: torch.device) -> dict:
    """Restore a ``last.pt``/``best.pt`` written by this trainer; returns its progress state.

    Raises:
        CheckpointError: the file is missing, corrupt or unsafe, was written by another model configuration, or lacks keys.
    """
    ckpt = safe_load(path, map_location=device)
    try:
        if ckpt["model_config"] != asdict(cfg):
            raise CheckpointError(f"{path} holds a model {ckpt['model_config']}, but the flags build {asdict(cfg)}; "
                                  "pass the same model flags as the run that wrote it")
        model.load_state_dict(ckpt["model"])
        optimizer.load_state_dict(ckpt["optimizer"])
        scheduler.load_state_dict(ckpt["scheduler"])
        if scaler is not None and ckpt["scaler"] is not None:
            scaler.load_state_dict(ckpt["scaler"])
        restore_rng_state(ckpt["rng"])
        return {k: ckpt[k] for k in ("epoch", "episode", "step", "best_val_pck")}
    except KeyError as e:
        raise CheckpointError(f"{path} lacks {e}; it was not written by models.train_cape_episodic") from e


def train(args: argparse.Namespace, rank: Dist) -> int:
    """The whole run: setup, epochs of episodic training with validation, then the test. Returns the exit code.

    Raises:
        DeviceError, MP100FormatError, CheckpointError: bad --device, data or checkpoint (main prints them).
    """
    device = select_device(f"cuda:{rank.local_rank}" if rank.uses_nccl else args.device).device
    say = print if rank.is_main else (lambda *a, **k: None)  # only rank 0 talks, logs and writes
    hardware_note = apply_hardware_profile(args, device)
    if args.cudnn_deterministic:
        args.cudnn_benchmark = False
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")  # cuBLAS needs it for determinism
        torch.use_deterministic_algorithms(True, warn_only=True)  # warn_only: some upsampling backwards have no deterministic kernel
        torch.backends.cudnn.deterministic = True
    configure_backends(device, cudnn_benchmark=args.cudnn_benchmark)
    torch.manual_seed(args.seed)
    amp = amp_policy(device, args.use_amp)
    say(f"device: {device} ({describe(device)})")
    say(f"AMP: {amp.reason}; cudnn.benchmark: {'on' if device.type == 'cuda' and args.cudnn_benchmark else 'off'}"
          f"{'; deterministic algorithms' if args.cudnn_deterministic else ''}")
    say(hardware_note)

    splits = load_mp100(args.data_root, args.split)
    samplers = {s: EpisodeSampler(splits[s], args.shots, args.queries if s == "train" else args.eval_queries) for s in splits}
    say(f"data: {args.data_root} split {args.split}: " + ", ".join(
        f"{s} {len(samplers[s].category_ids)} categories / {sum(len(splits[s].instances[c]) for c in samplers[s].category_ids)} instances"
        for s in splits))

    cfg = CapeConfig(args.backbone, args.hidden_dim, args.num_heads, args.num_decoder_layers, 4 * args.hidden_dim, args.dropout)
    model = CapeModel(cfg)
    if args.backbone_weights:
        load_backbone_weights(model.backbone, args.backbone_weights)
        say(f"backbone weights: {args.backbone_weights}")
    model.to(device)
    if device.type != "mps":  # NHWC convs are faster with cuDNN and oneDNN; MPS support is patchy
        model.to(memory_format=torch.channels_last)
    say(f"model: {args.backbone}, {sum(p.numel() for p in model.parameters()) / 1e6:.1f}M parameters")

    trained = model
    if rank.world_size > 1:
        trained = DDP(model, device_ids=[device.index] if device.type == "cuda" else None)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=args.weight_decay)
    episodes_per_step = args.batch_size * args.accumulation_steps
    steps_per_epoch = max(1, args.episodes_per_epoch // episodes_per_step)
    total_steps = args.epochs * steps_per_epoch
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda s: lr_lambda(s, args.lr_warmup_steps, total_steps, args.lr_min_ratio))
    scaler = torch.amp.GradScaler(device.type) if amp.use_scaler else None

    output_dir = Path(args.output_dir)
    if not args.resume and (output_dir / "last.pt").exists():
        raise CheckpointError(f"{output_dir} already holds a run; continue it with --resume {output_dir / 'last.pt'} "
                              "or pass another --output_dir")
    output_dir.mkdir(parents=True, exist_ok=True)
    state = {"epoch": 0, "episode": 0, "step": 0, "best_val_pck": -1.0}
    if args.resume:
        path = Path(args.resume) / "last.pt" if Path(args.resume).is_dir() else Path(args.resume)
        state = load_resume_state(path, model, optimizer, scheduler, scaler, cfg, device)
        say(f"resumed from {path}: epoch {state['epoch']}, episode {state['episode']}, step {state['step']}")

    def checkpoint(name: str) -> Path:
        path = output_dir / name
        if rank.is_main:
            save_checkpoint(path, model, optimizer, scaler, scheduler, state, args, cfg)
        if rank.world_size > 1:
            dist.barrier()  # the others may read it next (best.pt before the test)
        return path

    train_ds = EpisodeDataset(splits["train"], samplers["train"], args.image_size, Augmentation(), args.seed,
                              num_episodes=steps_per_epoch * episodes_per_step, rank=rank.rank, world_size=rank.world_size)
    eval_loaders = {
        s: make_loader(EpisodeDataset(splits[s], samplers[s], args.image_size, None,
                                      fixed=samplers[s].fixed_episodes(n, args.eval_seed)), args.batch_size, args.num_workers, device)
        for s, n in (("val", args.val_episodes_per_category), ("test", args.test_episodes_per_category))}
    nonfinite_in_a_row = skipped_total = 0
    t_start = time.time()
    model.train()
    with MetricsLogger(output_dir, tensorboard_subdir="tb", enabled=rank.is_main) as metrics, GracefulStop() as stop:
        for epoch in range(state["epoch"], args.epochs):
            state["epoch"] = epoch
            train_ds.set_epoch(epoch, start=state["episode"])
            micro, window = [], {}
            bar = tqdm(make_loader(train_ds, args.batch_size, args.num_workers, device), desc=f"epoch {epoch + 1}/{args.epochs}",
                       dynamic_ncols=True, initial=state["episode"] // args.batch_size, total=steps_per_epoch * args.accumulation_steps,
                       disable=not rank.is_main)
            for batch in bar:
                micro.append(batch)
                if len(micro) < args.accumulation_steps:
                    continue
                parts = train_step(trained, optimizer, scaler, micro, amp, device, args.clip_max_norm, args.heatmap_weight, rank)
                micro = []
                state["episode"] += episodes_per_step
                if parts is None:
                    nonfinite_in_a_row += 1
                    skipped_total += 1
                    tqdm.write(f"step {state['step']}: non-finite loss or gradient, step skipped "
                               f"({nonfinite_in_a_row} in a row, {skipped_total} in all)")
                    if nonfinite_in_a_row >= MAX_NONFINITE_IN_A_ROW:
                        say(f"error: {MAX_NONFINITE_IN_A_ROW} non-finite steps in a row; training diverged. "
                              "Lower --lr, keep --clip_max_norm > 0, or try --no-use_amp", file=sys.stderr)
                        return 1
                    continue
                nonfinite_in_a_row = 0
                scheduler.step()
                state["step"] += 1
                for k, v in parts.items():
                    window[k] = window.get(k, 0.0) + v
                window["n"] = window.get("n", 0) + 1
                if state["step"] % args.log_interval == 0:
                    n = window.pop("n")
                    values = {f"train/{k}": v / n for k, v in window.items()}
                    values.update({"train/lr": scheduler.get_last_lr()[0], "train/skipped_steps": skipped_total, "epoch": epoch})
                    metrics.log(state["step"], values)
                    bar.set_postfix(loss=f"{values['train/loss']:.4f}", lr=f"{values['train/lr']:.2e}")
                    window = {}
                if any_rank(stop.requested, rank):
                    path = checkpoint("last.pt")
                    say(f"stopped at step {state['step']}; checkpoint {path}\nresume with: {resume_command(path)}")
                    return 0
            bar.close()

            val = evaluate(model, eval_loaders["val"], amp, device, args.image_size, "val")
            state["epoch"], state["episode"] = epoch + 1, 0
            improved = val["PCK@0.2"] > state["best_val_pck"]
            if improved:
                state["best_val_pck"] = val["PCK@0.2"]
            metrics.log(state["step"], {"val/PCK@0.2": val["PCK@0.2"], "val/copy_support_PCK@0.2": val["copy_support_PCK@0.2"],
                                        "epoch": epoch + 1})
            checkpoint("last.pt")
            if improved:
                checkpoint("best.pt")
            say(f"epoch {epoch + 1}: val PCK@0.2 {val['PCK@0.2']:.2f} (copy-support {val['copy_support_PCK@0.2']:.2f}, "
                  f"{val['queries']} queries){' new best' if improved else ''}; {time.time() - t_start:.0f}s elapsed")
            if any_rank(stop.requested, rank):
                say(f"stopped after epoch {epoch + 1}\nresume with: {resume_command(output_dir / 'last.pt')}")
                return 0

        best = output_dir / "best.pt"
        if best.is_file():
            model.load_state_dict(safe_load(best, map_location=device)["model"])
        test = evaluate(model, eval_loaders["test"], amp, device, args.image_size, "test")
        metrics.log(state["step"], {"test/PCK@0.2": test["PCK@0.2"], "test/copy_support_PCK@0.2": test["copy_support_PCK@0.2"]})
    say(f"test (unseen categories, {test['queries']} queries, best val checkpoint): PCK@0.2 {test['PCK@0.2']:.2f}, "
          f"copy-support baseline {test['copy_support_PCK@0.2']:.2f}; {time.time() - t_start:.0f}s in all")
    return 0


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    rank = init_distributed()
    try:
        code = train(args, rank)
        if rank.world_size > 1:
            dist.barrier()  # leave together: a rank that exits while rank 0 still writes aborts in gloo's teardown
        return code
    except (DeviceError, MP100FormatError, CheckpointError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    finally:
        if rank.world_size > 1 and dist.is_initialized():
            dist.destroy_process_group()


if __name__ == "__main__":
    sys.exit(main())
