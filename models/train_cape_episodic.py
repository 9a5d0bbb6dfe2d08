"""Episodic CAPE training and evaluation on MP-100 (or the synthetic stand-in), on CUDA, Apple Silicon or CPU.

    python -m models.train_cape_episodic --recipe capeformer --data_root data/mp100 --split 1 --backbone_weights R50.pth
    python -m models.train_cape_episodic --resume auto ...            # continue the newest run of the same settings
    python -m models.train_cape_episodic --eval_only --resume RUN/best.pt --data_root data/mp100 --split 1 \\
        --eval_set test --shots 1 --predictions_out preds.jsonl

Each optimizer step trains on ``--batch_size`` episodes (one category each, K supports and Q queries), in
``--accumulation_steps`` micro-batches. Validation on the unseen val categories runs every ``--val_interval``
epochs with the papers' protocol (utils/eval/pck.py) and keeps ``best.pt``; at the end the best model is scored
on the unseen test categories next to the copy-the-support baseline, and ``pck_report.json`` is written.
Settings merge in one order: defaults, the hardware profile, ``--recipe`` (a paper's recipe), the command line.
Everything around the loop (run directory, checkpoints, metrics, the non-finite guard, graceful stop, errors)
is the shared run lifecycle in utils/run/.
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
import sys
import time
from pathlib import Path
from typing import Any, Callable

import utils  # noqa: F401  (sets the MPS fallback and the OpenMP wait before torch loads)
import torch
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader
from tqdm import tqdm

from models.cape import BACKBONES, MODELS, build_model, init_backbone_weights
from models.cape.checkpoint import load_trained, model_record
from models.cape.recipes import RECIPES, get_recipe, reference_epoch_queries
from utils.cli import ArgumentParser
from utils.config import WARNING_SIGNALS, ConfigError, check_number, warning_signal_name
from utils.data.cape.mp100 import (Augmentation, EpisodeDataset, EpisodeSampler, MP100Split, annotation_path,
                                   collate_episodes, crop_to_original, load_mp100, load_split)
from utils.device import bf16_support, configure_backends
from utils.distributed import Dist, main_decides
from utils.eval.pck import (EpisodeEvaluator, batch_pck, copy_support_baseline, evaluation_mask,
                            pck_field, protocol_episodes)
from utils.hardware_optimizer import resolve_hardware_profile
from utils.outputs import check_writable_file
from utils.run import points
from utils.checkpoint import safe_load
from utils.run.checkpointer import Best, Checkpointer
from utils.run.estimate import BACKWARD_PER_FORWARD, Estimate, StepPace, counted_flops, matmul_rate
from utils.run.guard import NonFiniteGuard
from utils.run.main import run_main
from utils.run.metrics import MetricsWindow, MetricsWriter
from utils.run.plan import Decision, Plan, layered_settings
from utils.run.run_dir import run_location, settings_fingerprint
from utils.run.schedule import LRSchedule
from utils.run.session import RunSession, after_signals, open_session, restarted_resume, resume_command
from utils.run.stop import GracefulStop, quiet_worker, start_workers
from utils.run.train_state import Clock, RNGStates, TrainState, Value
from utils.viz.pose import pose_grid

log = logging.getLogger("cape")

# Every flag's default. Flags left at None are filled by the hardware profile (batch, accumulation, workers) or by
# the model's own configuration (model widths; see models/cape/capeformer.py).
DEFAULTS = {
    "data_root": "data/synthetic_cape", "split": 1, "image_size": 256, "shots": 1, "queries": 4, "eval_queries": 15,
    "val_episodes_per_category": 100, "test_episodes_per_category": 200, "num_workers": None,
    "model": "capeformer", "backbone": None, "backbone_weights": None, "hidden_dim": None, "num_heads": None,
    "num_decoder_layers": None, "dropout": None, "drop_path_rate": None,
    "epochs": 100, "episodes_per_epoch": 2000, "batch_size": None, "accumulation_steps": None,
    "optimizer": "adamw", "lr": 2e-4, "weight_decay": 1e-4, "lr_schedule": "cosine", "lr_warmup_steps": 200,
    "lr_warmup_ratio": 0.001, "lr_min_ratio": 0.05, "lr_steps": [160, 180], "lr_gamma": 0.1, "clip_max_norm": 1.0,
    "heatmap_weight": 2.0, "aug_scale": 0.15, "aug_rotation": 15.0, "aug_rotation_prob": 0.6, "aug_colour": 0.2,
    "seed": 0, "val_interval": 1,
    "device": "auto", "hardware": "auto", "use_amp": True, "cudnn_benchmark": True, "cudnn_deterministic": False,
    "output_dir": None, "resume": None, "recipe": None, "logger": "tensorboard", "log_interval": 20,
    "keep_last_checkpoints": 2, "max_nonfinite_steps": 10, "warning_signal": "SIGUSR1", "on_warning": "checkpoint",
    "eval_only": False, "eval_set": "test", "predictions_out": None, "report_out": None,
}
# Settings that steer the run, not what it trains: left out of the fingerprint that finds "the same run".
RUN_CONTROL = ("num_workers", "device", "hardware", "output_dir", "resume", "warning_signal", "on_warning", "logger",
               "log_interval",
               "keep_last_checkpoints", "max_nonfinite_steps", "eval_only", "eval_set", "predictions_out", "report_out",
               "backbone_weights", "cudnn_benchmark")
# Finite ranges around the papers' recipes (Adam/AdamW lr 1e-5..2e-4, weight decay 1e-4..1e-2, clip 1, heatmap 2,
# augmentation 0.15 / 15 degrees / 0.6): wide enough for any sweep, narrow enough to catch a typo or an inf.
CAPE_FLOAT_RANGES = {"lr": (0, 1), "weight_decay": (0, 10), "clip_max_norm": (0, 1e4), "heatmap_weight": (0, 1e3),
                     "aug_scale": (0, 1), "aug_rotation": (0, 180), "aug_colour": (0, 1), "lr_warmup_ratio": (0, 1),
                     "lr_min_ratio": (0, 1), "lr_gamma": (0, 1), "aug_rotation_prob": (0, 1)}
MODEL_FLAGS = ("backbone", "hidden_dim", "num_heads", "num_decoder_layers", "dropout", "drop_path_rate")


def build_parser() -> ArgumentParser:
    on_off = argparse.BooleanOptionalAction
    p = ArgumentParser(prog="python -m models.train_cape_episodic", description=__doc__.split("\n\n")[0],
                       formatter_class=argparse.RawDescriptionHelpFormatter,
                       epilog="recipes (--recipe; flags given on the command line win):\n" + "\n".join(
                           f"  {r.name:<16} {r.source}; published mean PCK@0.2 {r.published_pck[0]} (1-shot) / "
                           f"{r.published_pck[1]} (5-shot)" for r in RECIPES.values())
                       + "\n\nsettings merge in the order: defaults, hardware profile, --recipe, command line")

    def add(group, flag, help, **kw):
        default = DEFAULTS[flag.lstrip("-")]
        shown = "" if default is None else f" (default: {default})"
        group.add_argument(flag, default=None, help=help + shown, **kw)

    g = p.add_argument_group("data")
    add(g, "--data_root", "MP-100 folder with annotations/ and images/")
    add(g, "--split", "MP-100 split (1..5)", type=int)
    add(g, "--image_size", "crop side in pixels (a multiple of 32)", type=int)
    add(g, "--shots", "K support images per episode (the papers: 1 or 5)", type=int)
    add(g, "--queries", "Q query images per training episode", type=int)
    add(g, "--eval_queries", "Q query images per evaluation episode (the protocol: 15)", type=int)
    add(g, "--val_episodes_per_category", "validation episodes per category (the protocol: 100; fewer keeps the "
                                          "first ones of the protocol's draw)", type=int)
    add(g, "--test_episodes_per_category", "test episodes per category (the protocol: 200; fewer keeps the first "
                                           "ones of the protocol's draw)", type=int)
    add(g, "--num_workers", "DataLoader workers (default: hardware profile)", type=int)
    g = p.add_argument_group("model")
    add(g, "--model", "model", choices=MODELS)
    add(g, "--backbone", "backbone (default: the model's)", choices=BACKBONES)
    add(g, "--backbone_weights", "ImageNet weights file (torchvision layout for ResNets, timm for SwinV2); without "
                                 "it the local torchvision/Hugging Face cache is used, else random weights")
    add(g, "--hidden_dim", "transformer width (default: the model's)", type=int)
    add(g, "--num_heads", "attention heads (default: the model's)", type=int)
    add(g, "--num_decoder_layers", "decoder layers (default: the model's)", type=int)
    add(g, "--dropout", "transformer dropout (default: the model's)", type=float)
    add(g, "--drop_path_rate", "SwinV2 stochastic depth (default: the model's)", type=float)
    g = p.add_argument_group("optimisation")
    add(g, "--epochs", "epochs", type=int)
    add(g, "--episodes_per_epoch", "episodes per epoch; 0: the reference's epoch (every training category "
                                   "contributes as many queries as the largest category has instances)", type=int)
    add(g, "--batch_size", "episodes per optimizer step (default: hardware profile, 16)", type=int)
    add(g, "--accumulation_steps", "micro-batches per optimizer step (default: hardware profile)", type=int)
    add(g, "--optimizer", "optimizer", choices=("adamw", "adam"))
    add(g, "--lr", "peak learning rate", type=float)
    add(g, "--weight_decay", "weight decay (AdamW: decoupled; Adam: L2)", type=float)
    add(g, "--lr_schedule", "after warmup: cosine decay to lr_min_ratio, or step decay at lr_steps", choices=("cosine", "step"))
    add(g, "--lr_warmup_steps", "optimizer steps of linear warmup", type=int)
    add(g, "--lr_warmup_ratio", "step schedule: the fraction of lr the first step gets (mmcv's warmup_ratio)", type=float)
    add(g, "--lr_min_ratio", "cosine schedule: the final lr as a fraction of --lr", type=float)
    add(g, "--lr_steps", "step schedule: epochs after which the lr is multiplied by --lr_gamma", type=int, nargs="+")
    add(g, "--lr_gamma", "step schedule: the decay factor", type=float)
    add(g, "--clip_max_norm", "gradient-norm clip (0 disables)", type=float)
    add(g, "--heatmap_weight", "weight of the similarity-heatmap loss (the papers: 2.0)", type=float)
    add(g, "--aug_scale", "random crop scale: clip(1 + s*n, 1 - s, 1 + s)", type=float)
    add(g, "--aug_rotation", "random rotation: clip(r*n, -2r, 2r) degrees", type=float)
    add(g, "--aug_rotation_prob", "probability that a crop is rotated", type=float)
    add(g, "--aug_colour", "brightness/contrast/saturation jitter (the papers: 0)", type=float)
    add(g, "--seed", "seed", type=int)
    add(g, "--val_interval", "epochs between validations", type=int)
    g = p.add_argument_group("hardware")
    add(g, "--device", "auto, cpu, mps, cuda or cuda:N")
    add(g, "--hardware", "hardware profile", choices=("auto", "gpu_24gb", "gpu_16gb", "gpu_low_mem", "apple_silicon", "cpu"))
    add(g, "--use_amp", "mixed precision: bf16 where native, else fp16 + GradScaler on GPUs", action=on_off)
    add(g, "--cudnn_benchmark", "cuDNN autotuning", action=on_off)
    add(g, "--cudnn_deterministic", "deterministic algorithms (turns cudnn_benchmark off)", action=on_off)
    g = p.add_argument_group("run")
    add(g, "--recipe", "a paper's recipe: optimiser, schedule, epochs, batch, image size, augmentation",
        choices=tuple(RECIPES))
    add(g, "--output_dir", "run directory (default: outputs/cape/<model>-split<N>-<K>shot-<time>)")
    add(g, "--resume", "auto (the newest run with the same settings), a run directory, or a checkpoint file; "
                       "with --eval_only, the checkpoint to evaluate")
    add(g, "--logger", "tensorboard, or wandb (TensorBoard plus Weights & Biases)", choices=("tensorboard", "wandb"))
    add(g, "--log_interval", "optimizer steps between train log points", type=int)
    add(g, "--keep_last_checkpoints", "step checkpoints kept (best.pt is kept apart); 0 keeps all", type=int)
    add(g, "--max_nonfinite_steps", "stop after this many non-finite steps in a row", type=int)
    add(g, "--warning_signal", "a scheduler's early warning before its SIGTERM (Slurm: --signal=USR1@90), one of "
                               f"{', '.join(WARNING_SIGNALS)}: a checkpoint after the current step, then "
                               "--on_warning; none: not taken")
    add(g, "--on_warning", "after --warning_signal's checkpoint: go on, or stop (exit 128 + the signal, for the "
                           "scheduler to requeue)", choices=("checkpoint", "stop"))
    g = p.add_argument_group("evaluation only")
    add(g, "--eval_only", "evaluate the checkpoint --resume names with the papers' protocol; no training",
        action=on_off)
    add(g, "--eval_set", "which unseen categories", choices=("val", "test"))
    add(g, "--predictions_out", "one JSON line per evaluated query (category_id, support_ids, query_id, pred, "
                                "PCK@0.2_percent)")
    add(g, "--report_out", "where pck_report.json goes (default: beside --predictions_out, else the current folder)")
    return p


# ---- settings ---------------------------------------------------------------------------------------

def resolve_settings(argv: list[str] | None, rank: Dist) -> tuple[argparse.Namespace, Plan, torch.device]:
    """Merge defaults, hardware profile, recipe and command line (utils/run/plan.layered_settings); validate; take
    the device decision.

    Raises:
        ConfigError, DeviceError, CapeModelError: a bad setting, in one line.
    """
    parsed = vars(build_parser().parse_args(argv))
    cli = {k: v for k, v in parsed.items() if v is not None}
    recipe_name = cli.get("recipe")
    recipe = [(f"recipe {recipe_name}", dict(get_recipe(recipe_name).flags))] if recipe_name else []

    def profile(merged: dict, device: torch.device):
        name, knobs, reason = resolve_hardware_profile(merged["hardware"], device)
        return name, {"batch_size": knobs["batch_size"] * knobs["accumulation_steps"],
                      "accumulation_steps": knobs["accumulation_steps"], "num_workers": knobs["num_workers"]}, reason

    merged, sources, _, device, decisions = layered_settings([("defaults", DEFAULTS)], [*recipe, ("command line", cli)],
                                                             rank, lambda merged: merged["device"], profile)
    merged["lr_steps"] = list(merged["lr_steps"])
    args = argparse.Namespace(**main_decides(merged, rank))
    check_settings(args)
    if args.cudnn_deterministic:
        args.cudnn_benchmark = False
    amp = amp_policy(device, args.use_amp)
    decisions.update({"precision": Decision(str(amp.dtype).removeprefix("torch.") if amp.dtype else "float32",
                                            amp.reason),
                      "processes": Decision(rank.world_size, "torchrun" if rank.world_size > 1 else "single process")})
    return args, Plan(vars(args), sources, decisions, defaults=DEFAULTS), device


def check_settings(args: argparse.Namespace) -> None:
    """Ranges of every flag, checked before anything is loaded.

    Raises:
        ConfigError: naming the flag, its value and the allowed range.
    """
    def need(ok: bool, flag: str, rule: str) -> None:
        if not ok:
            raise ConfigError(f"--{flag} {getattr(args, flag)!r} is out of range: {rule}")

    need(args.split in range(1, 6), "split", "MP-100 has splits 1..5")
    need(32 <= args.image_size <= 1024 and args.image_size % 32 == 0, "image_size", "a multiple of 32 in 32..1024")
    for flag, high in (("shots", 100), ("queries", 256), ("eval_queries", 256), ("epochs", 10**6),
                       ("batch_size", 4096), ("accumulation_steps", 4096), ("val_interval", 10**6),
                       ("log_interval", 10**9), ("max_nonfinite_steps", 10**9)):
        need(1 <= getattr(args, flag) <= high, flag, f"1..{high}")
    need(1 <= args.val_episodes_per_category <= 100, "val_episodes_per_category",
         "1..100 (the protocol draws 100; fewer keeps the first of each category)")
    need(1 <= args.test_episodes_per_category <= 200, "test_episodes_per_category",
         "1..200 (the protocol draws 200; fewer keeps the first of each category)")
    for flag in ("num_workers", "lr_warmup_steps", "episodes_per_epoch", "keep_last_checkpoints", "seed"):
        need(getattr(args, flag) >= 0, flag, "0 or more")
    need(args.batch_size % args.accumulation_steps == 0, "batch_size",
         f"must be divisible by --accumulation_steps {args.accumulation_steps} (episodes per micro-batch)")
    for flag, (low, high) in CAPE_FLOAT_RANGES.items():
        check_number(flag, getattr(args, flag), low, high, flag_style=True)
    need(all(s >= 0 for s in args.lr_steps), "lr_steps", "epochs, 0 or more")
    need(args.aug_scale < 1, "aug_scale", "below 1 (a crop scale of 1 - s must stay positive)")
    if args.eval_only and not args.resume:
        raise ConfigError("--eval_only needs --resume CHECKPOINT: the model to evaluate")
    args.warning_signal = warning_signal_name(args.warning_signal, "--warning_signal")


# ---- precision --------------------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class AmpPolicy:
    """Autocast dtype (None = fp32), whether fp16 gradients need a GradScaler, and why (for the run log)."""

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


# ---- the training state ------------------------------------------------------------------------------

class CapeTrainState(TrainState):
    """Everything that shapes the rest of a CAPE run (utils/run/train_state.py): the model, the optimizer and its
    lr schedule, the GradScaler (fp16), the guard's counters, the metrics window, the wall clock, the position in
    the episode stream (epoch, episodes done in it), the best validation PCK@0.2, and per process the RNG states.
    ``trained`` is the module the step runs (the DDP wrapper under torchrun)."""

    def __init__(self, model, trained, loss_fn, optimizer, scaler, schedule: LRSchedule, guard: NonFiniteGuard,
                 amp: AmpPolicy, clock: Clock, log_interval: int, rank: Dist):
        self.model, self.trained, self.loss_fn, self.optimizer, self.scaler = model, trained, loss_fn, optimizer, scaler
        self.schedule, self.guard, self.amp, self.clock = schedule, guard, amp, clock
        self.window, self.position, self.best = MetricsWindow(log_interval), Value({"epoch": 0, "episode": 0}), Best(pck_field())
        parts = {"model": model, "optimizer": optimizer, "guard": guard, "window": self.window, "clock": clock,
                 "position": self.position, "best": self.best}
        if scaler is not None:
            parts["scaler"] = scaler
        super().__init__(parts, {"rng": RNGStates()}, rank)


def build_state(args, device: torch.device, rank: Dist, clock: Clock, total_steps: int,
                steps_per_epoch: int) -> tuple[CapeTrainState, Decision]:
    """The model (seeded), its optimizer, lr schedule, GradScaler and guard, as one train state at step 0; and the
    backbone-weights decision for the plan."""
    torch.manual_seed(args.seed)
    overrides = {k: getattr(args, k) for k in MODEL_FLAGS if getattr(args, k) is not None}
    model, loss_fn = build_model(args.model, image_size=args.image_size, **overrides)
    weights = Decision(args.backbone_weights or "cache/random", init_backbone_weights(model.backbone, args.backbone_weights))
    model.to(device)
    if device.type != "mps":  # NHWC convs are faster with cuDNN and oneDNN; MPS support is patchy
        model.to(memory_format=torch.channels_last)
    trained = DDP(model, device_ids=[device.index] if device.type == "cuda" else None) if rank.world_size > 1 else model
    optimizer_class = torch.optim.Adam if args.optimizer == "adam" else torch.optim.AdamW
    optimizer = optimizer_class(model.parameters(), lr=args.lr, weight_decay=args.weight_decay)
    amp = amp_policy(device, args.use_amp)
    scaler = torch.amp.GradScaler(device.type) if amp.use_scaler else None
    schedule = LRSchedule(args.lr, args.lr_warmup_steps, total_steps, kind=args.lr_schedule,
                          min_ratio=args.lr_min_ratio, milestones=tuple(e * steps_per_epoch for e in args.lr_steps),
                          gamma=args.lr_gamma, warmup_ratio=args.lr_warmup_ratio)
    guard = NonFiniteGuard(args.max_nonfinite_steps, "a lower --lr, --clip_max_norm > 0, or --no-use_amp")
    state = CapeTrainState(model, trained, loss_fn, optimizer, scaler, schedule, guard, amp, clock, args.log_interval, rank)
    return state, weights


# ---- one step, one evaluation ------------------------------------------------------------------------

def to_device(batch: dict[str, torch.Tensor], device: torch.device) -> dict[str, torch.Tensor]:
    non_blocking = device.type == "cuda"  # pinned host memory only exists for CUDA
    return {k: v.to(device, non_blocking=non_blocking) for k, v in batch.items()}


def run_model(model, batch: dict[str, torch.Tensor], amp: AmpPolicy, device: torch.device) -> dict[str, torch.Tensor]:
    with torch.autocast(device.type, dtype=amp.dtype or torch.float32, enabled=amp.dtype is not None):
        return model(batch["support_image"], batch["support_keypoints"], batch["support_visible"],
                     batch["query_image"], batch["keypoint_mask"], batch["adjacency"])


def train_step(state: CapeTrainState, micro_batches: list[dict[str, torch.Tensor]], device: torch.device, args,
               rank: Dist = Dist()) -> dict[str, float]:
    """One optimizer update over ``micro_batches`` (gradient accumulation, one on the device at a time): forward and
    backward (under torchrun DDP averages the gradients across ranks in backward), clip, and the guarded update.

    Returns the mean loss parts, ``grad_norm``, and ``applied`` (1.0, or 0.0 when the guard undid the update).
    fp16 gradients are unscaled before clipping, so ``clip_max_norm`` applies to the true gradient; with a
    GradScaler, overflowing gradients are its business (it skips that update itself) and only the loss is checked.
    """
    state.optimizer.zero_grad(set_to_none=True)
    totals: dict[str, float] = {}
    losses = []
    for batch in micro_batches:
        batch = to_device(batch, device)
        loss, parts = state.loss_fn(run_model(state.trained, batch, state.amp, device), batch,
                                    heatmap_weight=args.heatmap_weight)
        scaled = loss / len(micro_batches)
        (state.scaler.scale(scaled) if state.scaler is not None else scaled).backward()
        losses.append(loss.detach())
        for k, v in {"loss": loss.detach(), **parts}.items():
            totals[k] = totals.get(k, 0.0) + float(v) / len(micro_batches)
    if state.scaler is not None:
        state.scaler.unscale_(state.optimizer)
    named = {n: p for n, p in state.model.named_parameters() if p.grad is not None}
    checked = {"loss": torch.stack(losses)}
    if state.scaler is None:
        checked.update({f"gradient of {n}": p.grad for n, p in named.items()})
    totals["grad_norm"] = float(torch.nn.utils.clip_grad_norm_(list(named.values()), args.clip_max_norm or float("inf")))
    state.step += 1
    for group in state.optimizer.param_groups:
        group["lr"] = state.schedule.lr(state.step)
    applied = state.guard.update(state.step, checked, [state.optimizer], lambda: apply_update(state), named, rank)
    return totals | {"applied": float(applied)}


def apply_update(state: CapeTrainState) -> None:
    """Step the optimizer (through the GradScaler, which skips an overflowing fp16 update itself)."""
    if state.scaler is not None:
        state.scaler.step(state.optimizer)
        state.scaler.update()
    else:
        state.optimizer.step()


@torch.no_grad()
def evaluate(model, split: MP100Split, loader: DataLoader, amp: AmpPolicy, device: torch.device, args,
             desc: str, step: int | None = None, stop: Callable[[], bool] = lambda: False
             ) -> tuple[EpisodeEvaluator, EpisodeEvaluator, tuple | None]:
    """Score the model (last decoder layer) and the copy-support baseline with the papers' protocol. ``desc``
    names the split (``val``, ``test``), and with ``step`` (the training step) the run's point that the first batch
    reaches (utils/run/points.py). The scoring ends early, after the batch where ``stop()`` is true (a signal that stops
    the run: the caller then scores nothing).

    Returns the two evaluators (``pck()`` is the split's number, a fraction) and the first batch with its
    predictions, for pictures.
    """
    was_training = model.training
    model.eval()
    ours, baseline = EpisodeEvaluator(split, args.shots), EpisodeEvaluator(split, args.shots)
    first = None
    for batch in tqdm(start_workers(loader), total=len(loader), desc=desc, leave=False, dynamic_ncols=True):
        # Scoring runs on the host in float64 (MPS has no float64); only the model runs on the device.
        pred = run_model(model, to_device(batch, device), amp, device)["refined"][-1].float().cpu()
        to_orig = batch["query_crop_to_orig"]
        ours.update_batch(batch, crop_to_original(pred, to_orig, args.image_size))
        copy = copy_support_baseline(batch["support_keypoints"], batch["support_visible"], pred.shape[1])
        baseline.update_batch(batch, crop_to_original(copy, to_orig, args.image_size))
        if first is None:
            first = (batch, pred)
            if step is not None:
                points.reach(desc, step)
        if stop():
            break
    model.train(was_training)
    return ours, baseline, first


def validate(state: CapeTrainState, split, loader, device, args, metrics: MetricsWriter, rank: Dist) -> bool:
    """Validation on rank 0 (the papers' protocol); every rank gets rank 0's verdict on whether it improved.

    Logs ``val/PCK@0.2_percent`` and ``val/copy_support_PCK@0.2_percent`` (percent), ``val/elapsed_s`` and the
    epoch, and the picture ``val/poses`` of the first batch (category names, per-query PCK in percent)."""
    pck = None
    if rank.is_main:
        ours, baseline, first = evaluate(state.model, split, loader, state.amp, device, args, "val", state.step)
        pck = 100 * ours.pck()
        metrics.log(state.step, {f"val/{pck_field()}": pck, f"val/copy_support_{pck_field()}": 100 * baseline.pck(),
                                 "val/elapsed_s": state.clock.elapsed_s(), "epoch": state.position.value["epoch"]})
        if first is not None:
            batch, pred = first
            query_pck = batch_pck(crop_to_original(pred, batch["query_crop_to_orig"], args.image_size),
                                  batch["query_keypoints_orig"], batch["query_bbox_size"],
                                  evaluation_mask(batch["query_visible"], batch["support_visible"], batch["keypoint_mask"]))
            names = {cid: category.name for cid, category in split.categories.items()}
            metrics.log_images(state.step, {"val/poses": pose_grid(batch, pred, category_names=names,
                                                                   query_pck=100 * query_pck)})
    improved = state.best.update(pck, state.step, rank)
    if rank.is_main:
        log.info("epoch %d: val PCK@0.2 %.2f%% (copy-support %.2f%%, %d queries)%s; %.0fs elapsed",
                 state.position.value["epoch"], pck, 100 * baseline.pck(), len(ours.records),
                 " new best" if improved else "", state.clock.elapsed_s())
    return improved


def test(state: CapeTrainState, split, device, args, metrics: MetricsWriter, run_path: Path,
         stopper: GracefulStop) -> bool:
    """The best validation checkpoint on the unseen test categories; writes ``pck_report.json`` to the run and logs
    ``test/PCK@0.2_percent`` and ``test/copy_support_PCK@0.2_percent`` (percent). False, with nothing written, when
    a signal cut it short."""
    best = run_path / "best.pt"
    if best.is_file():
        state.model.load_state_dict(safe_load(best, map_location=device)["model"])
    ours, baseline, _ = evaluate(state.model, split, eval_loader(split, "test", args, device), state.amp, device, args,
                                 "test", state.step, lambda: stopper.requested)
    if stopper.requested:
        return False
    metrics.log(state.step, {f"test/{pck_field()}": 100 * ours.pck(),
                             f"test/copy_support_{pck_field()}": 100 * baseline.pck()})
    ours.write_report(run_path / "pck_report.json")
    log.info("test (unseen categories, %d queries, %s): PCK@0.2 %.2f%%, copy-support baseline %.2f%%; %.0fs in all",
             len(ours.records), "best val checkpoint" if best.is_file() else "last weights", 100 * ours.pck(),
             100 * baseline.pck(), state.clock.elapsed_s())
    return True


def log_train_point(state: CapeTrainState, metrics: MetricsWriter, bar) -> None:
    """One ``train/*`` point: the window's mean loss parts, lr, undone steps, wall seconds of the run."""
    sums, n, _ = state.window.take()
    values = {f"train/{k}": v / n for k, v in sums.items()}
    values.update({"train/lr": state.schedule.lr(state.step), "train/nonfinite_steps": state.guard.total,
                   "train/elapsed_s": state.clock.elapsed_s(), "epoch": state.position.value["epoch"] + 1})
    metrics.log(state.step, values)
    bar.set_postfix(loss=f"{values['train/loss']:.4f}", lr=f"{values['train/lr']:.2e}")


# ---- data -------------------------------------------------------------------------------------------------

def make_loader(dataset: EpisodeDataset, batch_size: int, args, device: torch.device, seed: int) -> DataLoader:
    """Episodes in order; its own generator, so making an iterator never draws from the global RNG (which
    dropout uses): a run resumed mid-epoch then continues bitwise. Its workers leave SIGINT and SIGTERM to this
    process (utils/run/stop.py: iterate it through ``start_workers``)."""
    return DataLoader(dataset, batch_size=batch_size, shuffle=False, num_workers=args.num_workers,
                      collate_fn=collate_episodes, pin_memory=device.type == "cuda", drop_last=False,
                      generator=torch.Generator().manual_seed(seed), worker_init_fn=quiet_worker)


def eval_loader(split: MP100Split, subset: str, args, device: torch.device) -> DataLoader:
    per_category = args.val_episodes_per_category if subset == "val" else args.test_episodes_per_category
    episodes = protocol_episodes(split, args.shots, queries=args.eval_queries, first=per_category)
    dataset = EpisodeDataset(split, EpisodeSampler(split, args.shots, args.eval_queries), args.image_size, None,
                             fixed=episodes)
    return make_loader(dataset, max(1, args.batch_size // args.accumulation_steps), args, device, args.seed)


@dataclasses.dataclass
class CapeData:
    """The MP-100 splits of a run, the training episodes, and the schedule's length."""

    splits: dict[str, MP100Split]
    train: EpisodeDataset
    episodes: int
    steps_per_epoch: int
    micro: int
    bar: Any = None  # the progress bar of the epoch being served

    def epoch(self, state: CapeTrainState, args, device: torch.device, rank: Dist):
        """The rest of the current epoch as lists of ``accumulation_steps`` micro-batches, with a progress bar."""
        epoch, done = state.position.value["epoch"], state.position.value["episode"]
        self.train.set_epoch(epoch, start=done // rank.world_size)
        loader = make_loader(self.train, self.micro // rank.world_size, args, device, args.seed * 100003 + epoch)
        batches = []
        with tqdm(start_workers(loader), desc=f"epoch {epoch + 1}/{args.epochs}", dynamic_ncols=True,
                  disable=not rank.is_main,
                  initial=done // self.micro, total=self.steps_per_epoch * args.accumulation_steps) as self.bar:
            for batch in self.bar:
                batches.append(batch)
                if len(batches) == args.accumulation_steps:
                    yield batches
                    batches = []


def load_data(args, rank: Dist) -> CapeData:
    """Load MP-100 (or the synthetic stand-in) and size the epochs.

    Raises:
        MP100Error, ConfigError: a bad file or a batch that cannot be split over the processes.
    """
    splits = load_mp100(args.data_root, args.split)
    train_counts = {c: len(v) for c, v in splits["train"].instances.items() if len(v) >= args.shots + args.queries}
    episodes = args.episodes_per_epoch or max(1, reference_epoch_queries(train_counts) // args.queries)
    steps_per_epoch = max(1, episodes // args.batch_size)
    micro = args.batch_size // args.accumulation_steps  # episodes per micro-batch, over all ranks
    if micro % rank.world_size:
        raise ConfigError(f"--batch_size {args.batch_size} / --accumulation_steps {args.accumulation_steps} = {micro} "
                          f"episodes per micro-batch cannot be split over {rank.world_size} processes")
    train = EpisodeDataset(splits["train"], EpisodeSampler(splits["train"], args.shots, args.queries), args.image_size,
                           Augmentation(args.aug_scale, args.aug_rotation, args.aug_rotation_prob, args.aug_colour),
                           args.seed, num_episodes=steps_per_epoch * args.batch_size // rank.world_size,
                           rank=rank.rank, world_size=rank.world_size)
    return CapeData(splits, train, episodes, steps_per_epoch, micro)


# ---- evaluation only ---------------------------------------------------------------------------------------

def evaluate_only(args, plan: Plan, device: torch.device, rank: Dist, stopper: GracefulStop) -> int:
    """``--eval_only``: score the checkpoint ``--resume`` names on ``--eval_set`` with the papers' protocol;
    write the predictions file and ``pck_report.json``, print the per-category table. A signal cuts the scoring
    short: nothing is written, and the exit code is 128 + its number."""
    if rank.world_size > 1:
        raise ConfigError("--eval_only runs in one process; start it without torchrun")
    report = Path(args.report_out) if args.report_out else (
        Path(args.predictions_out).parent if args.predictions_out else Path(".")) / "pck_report.json"
    if args.predictions_out:
        check_writable_file(args.predictions_out, "--predictions_out")
    check_writable_file(report, "--report_out")
    model, architecture = load_trained(args.resume)
    model.to(device)
    args.model, args.image_size = architecture["model"], architecture["image_size"]
    split = load_split(annotation_path(args.data_root, args.split, args.eval_set), Path(args.data_root) / "images")
    amp = amp_policy(device, args.use_amp)
    plan.log()
    ours, baseline, _ = evaluate(model, split, eval_loader(split, args.eval_set, args, device), amp, device, args,
                                 args.eval_set, stop=lambda: stopper.requested)
    if stopper.requested:
        log.info("stopped by %s: the evaluation was cut short and nothing was written; exit code %d",
                 stopper.signal_name, stopper.exit_code)
        return stopper.exit_code
    print(ours.format_table())
    print(f"copy-the-support baseline: {100 * baseline.pck():.2f}%")
    if args.predictions_out:
        ours.write_predictions(args.predictions_out)
        log.info("predictions: %s (%d queries)", args.predictions_out, len(ours.records))
    ours.write_report(report)
    log.info("report: %s", report)
    return 0


# ---- training -----------------------------------------------------------------------------------------------

def session_for(argv: list[str] | None, args, plan: Plan, state: CapeTrainState, rank: Dist):
    """The run directory (utils/run/session.py): ``--output_dir``; the directory ``--resume`` names; with
    ``--resume auto``, the newest run under ``outputs/cape/`` with the same settings; else a new
    ``outputs/cape/<model>-split<N>-<K>shot-<time>``."""
    fingerprint = settings_fingerprint(plan.settings, RUN_CONTROL)
    weights = sum(p.numel() * p.element_size() for p in state.model.parameters())
    kept = args.keep_last_checkpoints
    copies = (kept + 2) if kept > 0 else args.epochs + 2  # the kept ones, the one being written, best.pt
    resume = restarted_resume(args.resume)
    return open_session(
        rank, trainer="cape", fingerprint=fingerprint, resume=resume,
        location=lambda: run_location(
            explicit=args.output_dir, resume=resume, parent=Path("outputs/cape"), trainer="cape",
            fingerprint=fingerprint, new_name=f"{args.model}-split{args.split}-{args.shots}shot-{time.strftime('%Y%m%d-%H%M%S')}"),
        resume_hint=lambda path: f"add --resume auto --output_dir {path}",
        command=lambda path: resume_command(["python", "-m", "models.train_cape_episodic"],
                                            sys.argv[1:] if argv is None else argv, ("--resume", "--output_dir"),
                                            ["--resume", "auto", "--output_dir", str(path)]),
        storage=lambda: (3 * weights, copies))


def identity(args, state: CapeTrainState, plan: Plan) -> dict:
    """What a checkpoint to resume must match (utils/run/checkpointer.py)."""
    return {"trainer": "cape", "architecture": model_record(args.model, state.model),
            "settings": {k: v for k, v in plan.settings.items() if k not in RUN_CONTROL}}


def report_start(args, plan: Plan, data: CapeData, state: CapeTrainState, session: RunSession, total_steps: int) -> None:
    """The start-up report (rank 0) and ``plan.yaml``."""
    plan.log()
    splits = data.splits
    log.info("data: %s split %d: %s", args.data_root, args.split, ", ".join(
        f"{s} {len(splits[s].categories)} categories / {sum(map(len, splits[s].instances.values()))} instances"
        for s in splits))
    log.info("model: %s, %.1fM parameters; %d episodes per epoch, %d optimizer steps", args.model,
             sum(p.numel() for p in state.model.parameters()) / 1e6, data.episodes, total_steps)
    log.info("run directory: %s (run %s)%s", session.run.path, session.run.run_id,
             f"; resumed from {session.resume_path} at step {state.step}" if session.resume_path else "")
    plan.save(session.run.path / "plan.yaml")


def report_length(args, data: CapeData, state: CapeTrainState, device: torch.device, total_steps: int,
                  processes: int) -> float:
    """Say how long the rest of the schedule will take on this device from its FLOPs (utils/run/estimate.py, as the
    puzzle trainer does; returned, in seconds). One episode's forward is counted on the run's model (eval mode, no
    gradients: nothing of the run moves; the episode is drawn from its own seed), and a step is ``batch_size``
    episodes over the processes, forward and backward (:data:`BACKWARD_PER_FORWARD`)."""
    episode = to_device(collate_episodes([data.train[0]]), device)
    state.model.eval()
    with torch.no_grad():
        forward = counted_flops(lambda: run_model(state.model, episode, state.amp, device))
    state.model.train()
    per_step = forward * (1 + BACKWARD_PER_FORWARD) * args.batch_size / processes
    estimate = Estimate(per_step, matmul_rate(device, state.amp.dtype or torch.float32), total_steps - state.step)
    log.info(estimate.told(device))
    return estimate.seconds


def train(argv: list[str] | None, rank: Dist, stopper: GracefulStop) -> int:
    """The whole run; returns 0 when the schedule (and the test) is done, ``stopper.exit_code`` when a signal stopped it."""
    clock = Clock()
    args, plan, device = resolve_settings(argv, rank)
    configure_backends(device, args.cudnn_benchmark, deterministic=args.cudnn_deterministic, warn_only=True,
                       compiling=False)  # this trainer does not compile
    if args.eval_only:
        return evaluate_only(args, plan, device, rank, stopper)
    data = load_data(args, rank)
    total_steps = args.epochs * data.steps_per_epoch
    state, plan.decisions["backbone weights"] = build_state(args, device, rank, clock, total_steps, data.steps_per_epoch)
    stopper.listen_for_warning(args.warning_signal, args.on_warning)
    with session_for(argv, args, plan, state, rank) as session:
        checkpointer = Checkpointer(session.run, rank, args.keep_last_checkpoints, identity(args, state, plan),
                                    lambda: {"args": vars(args)})
        if session.resume_path is not None:
            checkpointer.restore(state, session.resume_path)
        flop_seconds = 0.0
        if rank.is_main:
            report_start(args, plan, data, state, session, total_steps)
            flop_seconds = report_length(args, data, state, device, total_steps, rank.world_size)
        pace = StepPace(state.step, total_steps, device, False, flop_seconds, log.info if rank.is_main else None)
        val_loader = eval_loader(data.splits["val"], "val", args, device) if rank.is_main else None
        position = state.position.value
        with MetricsWriter(session.path, enabled=rank.is_main, resume_step=state.step if session.continuing else None,
                           logger=args.logger, run_id=session.run and session.run.run_id, project="cape",
                           config=vars(args)) as metrics:
            state.model.train()
            pace.begin()
            while position["epoch"] < args.epochs:
                for micro_batches in data.epoch(state, args, device, rank):
                    points.reach("train", state.step + 1)
                    state.window.add(train_step(state, micro_batches, device, args, rank), 1)
                    pace.step_done(state.step)
                    position["episode"] += args.batch_size
                    if state.window.due(state.step, total_steps):
                        log_train_point(state, metrics, data.bar)
                    if (code := after_signals(checkpointer, state, stopper, session, rank)) is not None:
                        return code
                position["epoch"], position["episode"] = position["epoch"] + 1, 0
                if position["epoch"] % args.val_interval == 0 or position["epoch"] == args.epochs:
                    if validate(state, data.splits["val"], val_loader, device, args, metrics, rank):
                        checkpointer.save_best(state, state.best)
                checkpointer.save(state)
                if (code := after_signals(checkpointer, state, stopper, session, rank)) is not None:
                    return code
            if rank.is_main and not test(state, data.splits["test"], device, args, metrics, session.path, stopper):
                log.info("stopped by %s during the test split; the training is done (checkpoint %s); exit code %d; "
                         "resume with: %s (it runs the test)", stopper.signal_name, session.run.checkpoints()[-1],
                         stopper.exit_code, session.resume_command)
                return stopper.exit_code
    return 0


def main(argv: list[str] | None = None) -> int:
    def body(rank: Dist, stopper: GracefulStop) -> int:
        with points.program_run():  # this trainer's own entry: its points go to the watchers
            return train(argv, rank, stopper)
    return run_main(body)


if __name__ == "__main__":
    sys.exit(main())
