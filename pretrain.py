"""Train HRM or TRM on a puzzle dataset (Sudoku, mazes, ARC) on CUDA, Apple Silicon or CPU.

    python pretrain.py --config-name=cfg_pretrain_cpu
    python pretrain.py --config-name=cfg_pretrain_apple_silicon lr=1e-4 arch.halt_max_steps=8
    torchrun --nproc-per-node 8 pretrain.py --config-name=cfg_pretrain data_path=data/sudoku-extreme-1k-aug-1000

The loop follows the reference HRM (docs/REFERENCE.md, HRM): the ACT carry persists across
optimizer steps, AdamATan2 trains the weights and sign-SGD the puzzle embedding, the lr warms up
linearly then follows a cosine, and every ``eval_interval`` epochs the model is evaluated on the
test split and checkpointed. Everything around the loop (settings, run directory, checkpoints,
metrics, the non-finite guard, graceful stop, errors) is the shared run lifecycle in utils/run/.
"""

import utils  # noqa: F401  (sets PYTORCH_ENABLE_MPS_FALLBACK before torch is imported)

import argparse
import contextlib
import dataclasses
import logging
import os
import shlex
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

import torch
import torch.distributed as dist
from omegaconf import OmegaConf
from tqdm import tqdm

from models import build_model, model_bytes, validate_arch
from models.checkpoints import load_model_weights, load_pretrained, reference_state_dict
from models.ema import EMAHelper
from models.act import Carry, InnerCarry
from models.layers import attention_backend
from models.sparse_embedding import SparseEmbeddingSignSGD
from utils.config import (RUN_CONTROL_KEYS, ConfigError, PretrainConfig, build_config, command_line_layer, merge_layers,
                          recipe_layers, to_dict, valid_keys)
from utils.data.builders import build_dataset
from utils.data.puzzle_dataset import DatasetError, PuzzleDataset, PuzzleDatasetMetadata, check_compatible
from utils.device import compile_decision, configure_backends, describe, memory_available, select_device, select_dtype
from utils.distributed import Dist, any_rank, main_decides
from utils.eval.arc import ARC
from utils.eval.outputs import OutputsCollector
from utils.eval.puzzle import evaluate_puzzles, reduce_metrics
from utils.hardware_optimizer import compile_model, resolve_hardware_profile
from utils.optimizer_utils import get_adam_atan2_optimizer
from utils.run.checkpoint import (CheckpointError, CheckpointWriteError, atomic_save, capture_rng_state, restore_rng_state,
                                  safe_load)
from utils.run.guard import NonFiniteGuard, check_training_step
from utils.run.main import ArgumentParser, run_main
from utils.run.metrics import MetricsWriter
from utils.run.plan import Decision, Plan
from utils.run.run_dir import RunDirectory, find_matching_run, open_run, settings_fingerprint
from utils.run.schedule import LRSchedule
from utils.run.stop import GracefulStop
from utils.viz.puzzles import EvalPictures, VisualizationError, detect_task

log = logging.getLogger("pretrain")


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = ArgumentParser(
        description="Train HRM or TRM on a puzzle dataset. Settings come from config/<NAME>.yaml and key=value "
                    "overrides, merged in the order: defaults, hardware profile, the YAML recipe, the command line.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="overrides (key=value; arch.key=value for the architecture; arch=<name> picks config/arch/<name>.yaml):\n  "
               + "\n  ".join(valid_keys())
               + "\n\nexamples:\n  python pretrain.py --config-name=cfg_pretrain_cpu epochs=2000 eval_interval=500\n"
                 "  python pretrain.py --config-name=cfg_pretrain_apple_silicon device=cpu forward_dtype=float32\n"
                 "  python pretrain.py --config-name=cfg_pretrain_cpu resume=auto      # continue the newest matching run",
    )
    parser.add_argument("--config-name", default="cfg_pretrain", help="config/<NAME>.yaml to load (default: cfg_pretrain)")
    parser.add_argument("overrides", nargs="*", metavar="key=value", help="config overrides, e.g. lr=1e-4 arch.hidden_size=256")
    return parser.parse_args(argv)


def main(argv: Optional[list[str]] = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    return run_main(lambda rank, stopper: train(args, rank, stopper))


# ---- the plan: every setting and runtime decision, taken once -------------------------------------

@dataclass
class Setup:
    """The resolved plan as the loop reads it."""

    cfg: PretrainConfig
    arch: dict[str, Any]
    plan: Plan
    device: torch.device
    dtype: torch.dtype
    compile: bool
    local_batch_size: int


def resolve_setup(args: argparse.Namespace, rank: Dist) -> Setup:
    """Merge the settings (defaults, hardware profile, recipe, command line), validate them, and take the
    device, precision and compile decisions. Rank 0's settings are shared with every rank.

    Raises:
        ConfigError, DeviceError: a bad setting, named in one line.
    """
    cli, groups = command_line_layer(args.overrides)
    recipe = recipe_layers(args.config_name, groups=groups)
    defaults = ("defaults", to_dict(PretrainConfig()))
    merged, _ = merge_layers([defaults, *recipe, ("command line", cli)])
    cfg = build_config(merged)
    device_choice = select_device(f"cuda:{rank.local_rank}" if rank.uses_nccl else cfg.device)
    device = device_choice.device
    decisions = {"device": Decision(f"{device} - {describe(device)}", device_choice.reason)}
    profile = []
    if cfg.hardware:
        name, knobs, reason = resolve_hardware_profile(cfg.hardware, device)
        profile = [(f"hardware profile {name}", {"global_batch_size": knobs["global_batch_size"]})]
        decisions["hardware profile"] = Decision(name, reason)
    layers = [defaults, *profile, *recipe, ("command line", cli)]
    merged, sources = merge_layers(layers)
    cfg = main_decides(build_config(merged), rank)
    choose_data_paths(cfg, sources, [label for label, _ in layers])
    arch = validate_arch(cfg.arch)
    if cfg.freeze_weights and not arch.get("puzzle_emb_ndim"):
        raise ConfigError("freeze_weights=true trains only the puzzle embedding, but arch.puzzle_emb_ndim is 0: "
                          "nothing would train")
    if cfg.global_batch_size % rank.world_size:
        raise ConfigError(f"global_batch_size {cfg.global_batch_size} is not divisible by the {rank.world_size} processes")
    dtype, dtype_reason = select_dtype(device, cfg.forward_dtype)
    use_compile, compile_reason = compile_decision(device, cfg.compile)
    attention, attention_reason = attention_backend(device, dtype)
    decisions.update({"precision": Decision(str(dtype).removeprefix("torch."), dtype_reason),
                      "torch.compile": Decision("on" if use_compile else "off", compile_reason),
                      "attention": Decision(attention, attention_reason),
                      "processes": Decision(rank.world_size, "torchrun" if rank.world_size > 1 else "single process")})
    plan = Plan(to_dict(cfg) | {"arch": arch}, sources, decisions, defaults=to_dict(PretrainConfig()),
                baseline_layers=("defaults", "config/arch/"))
    return Setup(cfg, arch, plan, device, dtype, use_compile, cfg.global_batch_size // rank.world_size)


def choose_data_paths(cfg: PretrainConfig, sources: dict[str, str], layer_order: list[str]) -> None:
    """Settle the training data: ``data_path`` (HRM's spelling for one dataset) or ``data_paths`` (TRM's list),
    whichever a later layer set; then ``data_paths`` holds the list and ``data_path`` its first entry.

    Raises:
        ConfigError: one layer sets both.
    """
    where = {key: layer_order.index(sources.get(key, "defaults")) for key in ("data_path", "data_paths")}
    if cfg.data_paths and where["data_path"] == where["data_paths"] and where["data_path"] > 0:
        raise ConfigError(f"{sources['data_path']} sets both data_path and data_paths: keep one "
                          "(data_path=DIR for one dataset, data_paths=[DIR1,DIR2] for several)")
    if not cfg.data_paths or where["data_path"] > where["data_paths"]:
        cfg.data_paths = [cfg.data_path]
    cfg.data_path = cfg.data_paths[0]


# ---- data --------------------------------------------------------------------------------------------

def prepare_data(cfg: PretrainConfig, sources: dict[str, str], rank: Dist) -> None:
    """Make sure every training and test dataset exists, building the recipe's own dataset where allowed.

    A dataset is built when ``data_path`` is missing and the recipe describes one (``dataset_builder``),
    but only at the recipe's own ``data_path``, or anywhere with ``build_data=true``: a mistyped path on
    the command line is an error, not a new dataset.

    Raises:
        DatasetError: no dataset there (with how to build one).
        ConfigError: ``dataset_builder`` holds a flag the builder does not know.
    """
    for path in map(Path, dict.fromkeys(cfg.data_paths + cfg.data_paths_test)):
        if (path / "train" / "dataset.json").is_file() or (path / "test" / "dataset.json").is_file():
            continue
        typed = "command line" in (sources.get("data_path"), sources.get("data_paths"))
        buildable = cfg.dataset_builder is not None and path == Path(cfg.data_path)
        if not buildable or (typed and not cfg.build_data):
            hint = ("add build_data=true to build the recipe's dataset there" if buildable
                    else f"build one with python scripts/build_sudoku_dataset.py --generate --output-dir {path}")
            raise DatasetError(f"data_path '{path}' holds no dataset (no {path / 'train' / 'dataset.json'}): "
                               f"check the path, or {hint}")
        if rank.is_main:
            log.info("data_path %s is missing: building it (dataset_builder: %s)", path, cfg.dataset_builder)
            build_dataset(path, cfg.dataset_builder)
        if rank.world_size > 1:
            dist.barrier()


def make_evaluators(cfg: PretrainConfig, test_paths: list[str]) -> list:
    """The evaluators that score test outputs: those of ``evaluators``, or with ``evaluators`` unset, the ARC
    evaluator when the test data is ARC (it has ``test_puzzles.json``), as TRM's ARC recipes configure it.

    Raises:
        ConfigError: an evaluator's options are unknown, or the ARC evaluator gets several test datasets.
    """
    specs = cfg.evaluators
    if specs is None:
        specs = [{"name": "ARC"}] if (Path(test_paths[0]) / "test_puzzles.json").is_file() else []
    evaluators = []
    for spec in specs:
        if len(test_paths) > 1:
            raise ConfigError(f"the {spec['name']} evaluator scores one test dataset, got data_paths_test={test_paths}")
        options = {k: v for k, v in spec.items() if k != "name"}
        try:
            evaluators.append(ARC(test_paths[0], **options))
        except TypeError as e:
            raise ConfigError(f"evaluators: {spec}: {e}") from None
    return evaluators


# ---- the run directory and resuming --------------------------------------------------------------------

def default_run_parent(cfg: PretrainConfig) -> Path:
    return Path("checkpoints") / (cfg.project_name or Path(cfg.data_path).name)


def run_location(cfg: PretrainConfig, setup: Setup) -> Path:
    """Where the run lives, in order: ``checkpoint_path``; the directory of ``resume=<file or dir>``; with
    ``resume=auto`` and no ``run_name``, the newest run under ``checkpoints/<project>/`` started with the same
    settings; else ``checkpoints/<project>/<run_name or arch-timestamp>``."""
    if cfg.checkpoint_path:
        return Path(cfg.checkpoint_path)
    if cfg.resume and cfg.resume != "auto":
        return Path(cfg.resume) if Path(cfg.resume).is_dir() else Path(cfg.resume).parent
    parent = default_run_parent(cfg)
    fingerprint = settings_fingerprint(setup.plan.settings, RUN_CONTROL_KEYS)
    found = find_matching_run(parent, "pretrain", fingerprint) if cfg.resume == "auto" and not cfg.run_name else None
    return found or parent / (cfg.run_name or f"{setup.arch['name']}-{time.strftime('%Y%m%d-%H%M%S')}")


def resume_command(args: argparse.Namespace, run_path: Path) -> str:
    kept = [o for o in args.overrides if not o.startswith(("resume=", "checkpoint_path="))]
    return shlex.join(["python", "pretrain.py", f"--config-name={args.config_name}", *kept, "resume=auto",
                       f"checkpoint_path={run_path}"])


# ---- training state and checkpoints --------------------------------------------------------------------

@dataclass
class TrainState:
    """What the loop carries between steps besides the model and optimizers.

    ``elapsed_before`` is the wall time (s) the run had trained before this process (restored from the
    checkpoint on resume), and ``started`` this process's ``time.perf_counter()`` when ``train`` began.
    """

    step: int = 0
    carry: Any = None
    elapsed_before: float = 0.0
    started: float = dataclasses.field(default_factory=time.perf_counter)

    def elapsed_s(self) -> float:
        """Wall seconds of the whole run so far: settings, data, model, compilation, steps, evaluations."""
        return self.elapsed_before + time.perf_counter() - self.started


def save_checkpoint(run: Optional[RunDirectory], head, optimizers, ema: Optional[EMAHelper], loader: PuzzleDataset,
                    state: TrainState, guard: NonFiniteGuard, setup: Setup, rank: Dist) -> Optional[Path]:
    """Write ``step_<N>.pt`` atomically (rank 0) with everything needed to resume exactly, then prune.

    ``model`` holds the weights in the reference key format; with EMA on these are the EMA weights, as the
    reference saves them, and ``live_model`` and ``ema`` hold what a resume needs besides. Also: both
    optimizer states, the step, the settings, the sampler position, and per rank the ACT carry and RNG
    states. Returns the path on rank 0.

    Raises:
        CheckpointWriteError: the write failed (the previous checkpoint is intact).
    """
    carry = state.carry
    per_rank = {
        "rng": capture_rng_state(),
        "carry": None if carry is None else {
            "z_H": carry.inner_carry.z_H.cpu(), "z_L": carry.inner_carry.z_L.cpu(), "steps": carry.steps.cpu(),
            "halted": carry.halted.cpu(), "current_data": {k: v.cpu() for k, v in carry.current_data.items()},
        },
    }
    gathered = [per_rank]
    if rank.world_size > 1:
        gathered = [None] * rank.world_size
        dist.gather_object(per_rank, gathered if rank.is_main else None, dst=0)
    if not rank.is_main:
        return None
    payload = {"optimizers": [opt.state_dict() for opt in optimizers], "step": state.step, "nonfinite_total": guard.total,
               "elapsed_s": state.elapsed_s(),
               "config": setup.plan.settings, "run_id": run.run_id, "train_loader": loader.state_dict(), "ranks": gathered}
    if ema is None:
        payload["model"] = reference_state_dict(head)
    else:
        payload["live_model"] = reference_state_dict(head)
        payload["ema"] = ema.state_dict()
        with ema.swapped():
            payload["model"] = {k: v.clone() for k, v in reference_state_dict(head).items()}
    path = atomic_save(payload, run.claim_checkpoint(f"step_{state.step}.pt"))
    run.prune(setup.cfg.keep_last_checkpoints)
    log.info("checkpoint: %s", path)
    return path


def restore_training(path: Path, head, optimizers, ema: Optional[EMAHelper], loader: PuzzleDataset, state: TrainState,
                     guard: NonFiniteGuard, rank: Dist, device: torch.device) -> None:
    """Load a :func:`save_checkpoint` file into the live objects so the run continues exactly.

    Raises:
        CheckpointError: the file is corrupt, unsafe, or lacks resume state (e.g. a bare weights file),
            or comes from a different architecture, or its EMA setting differs.
    """
    payload = safe_load(path)
    missing = {"model", "optimizers", "step", "train_loader", "ranks"} - set(payload)
    if missing:
        raise CheckpointError(f"{path} cannot be resumed from: it lacks {sorted(missing)} (a weights-only checkpoint? "
                              "start from weights with load_checkpoint= instead)")
    if (ema is None) != ("ema" not in payload):
        raise CheckpointError(f"{path} was written with ema={'ema' in payload}; resume with the same ema setting")
    load_model_weights(head, payload.get("live_model", payload["model"]), str(path))
    if ema is not None:
        ema.load_state_dict({k: v.to(device) for k, v in payload["ema"].items()})
    if len(payload["optimizers"]) != len(optimizers):
        raise CheckpointError(f"{path} holds {len(payload['optimizers'])} optimizer states, this run has {len(optimizers)}")
    for opt, opt_state in zip(optimizers, payload["optimizers"]):
        opt.load_state_dict(opt_state)
    loader.load_state_dict(payload["train_loader"])
    state.step = int(payload["step"])
    state.elapsed_before = float(payload.get("elapsed_s", 0.0))
    guard.total = int(payload.get("nonfinite_total", 0))
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


def check_memory(setup: Setup, metadata: PuzzleDatasetMetadata) -> int:
    """Build the model on the meta device and refuse sizes the device cannot hold (weights, gradients and two
    optimizer moments); returns the bytes one checkpoint needs, about.

    Raises:
        ConfigError: the model cannot fit, with the sizes.
    """
    meta = build_model(setup.arch, batch_size=setup.local_batch_size, seq_len=metadata.seq_len,
                       vocab_size=metadata.vocab_size, num_puzzle_identifiers=metadata.num_puzzle_identifiers,
                       dtype=setup.dtype, device="meta")
    params = sum(p.numel() * 4 for p in meta.model.parameters())
    checkpoint = model_bytes(meta) + 2 * params
    need = checkpoint + params
    available = memory_available(setup.device)
    if need > available:
        raise ConfigError(f"this architecture needs about {need / 2**30:.1f} GiB for its weights, gradients and optimizer "
                          f"state, but {setup.device} has {available / 2**30:.1f} GiB available; use a smaller "
                          "arch.hidden_size or fewer layers")
    return checkpoint


# ---- the loop ---------------------------------------------------------------------------------------------

def train(args: argparse.Namespace, rank: Dist, stopper: GracefulStop) -> int:
    started = time.perf_counter()  # eval/elapsed_s counts from here: wall time as a user waits for it
    setup = resolve_setup(args, rank)
    cfg, device = setup.cfg, setup.device
    configure_backends(device, cudnn_benchmark=not cfg.deterministic)
    if cfg.deterministic:
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")  # required by deterministic cuBLAS
        torch.use_deterministic_algorithms(True)

    prepare_data(cfg, setup.plan.sources, rank)
    test_paths = cfg.data_paths_test or cfg.data_paths
    train_loader = PuzzleDataset(cfg.data_paths, "train", cfg.global_batch_size, seed=cfg.seed, rank=rank.rank,
                                 world_size=rank.world_size, epochs_per_iter=cfg.eval_interval)
    eval_loader = PuzzleDataset(test_paths, "test", cfg.global_batch_size, seed=cfg.seed, rank=rank.rank,
                                world_size=rank.world_size)
    metadata = train_loader.metadata
    check_compatible(metadata, eval_loader.metadata, f"{cfg.data_paths} and {test_paths}")
    evaluators = make_evaluators(cfg, test_paths)
    total_steps = int(cfg.epochs * metadata.total_groups * metadata.mean_puzzle_examples / cfg.global_batch_size)
    if total_steps < 1:
        raise ConfigError(f"the run has no optimizer steps: {metadata.total_groups} groups x {cfg.epochs} epochs "
                          f"< global_batch_size {cfg.global_batch_size}; raise epochs or lower global_batch_size")
    checkpoint_bytes = check_memory(setup, metadata) * (2 if cfg.ema else 1)

    run, resume_path = None, None
    if rank.is_main:
        path = run_location(cfg, setup)
        hint = f"rerun with resume=auto checkpoint_path={path}" if cfg.checkpoint_path else f"rerun with resume={path}"
        run, resume_path = open_run(path, trainer="pretrain", resume=cfg.resume, resume_hint=hint,
                                    fingerprint=settings_fingerprint(setup.plan.settings, RUN_CONTROL_KEYS))
        run.check_storage(checkpoint_bytes)
    run_path, resume_path = main_decides((None if run is None else run.path, resume_path), rank)
    command = resume_command(args, run_path)

    torch.manual_seed(cfg.seed)  # identical initial weights on every rank
    head = build_model(setup.arch, batch_size=setup.local_batch_size, seq_len=metadata.seq_len,
                       vocab_size=metadata.vocab_size, num_puzzle_identifiers=metadata.num_puzzle_identifiers,
                       dtype=setup.dtype, device=device)
    if cfg.load_checkpoint and resume_path is None:
        note = load_pretrained(head, cfg.load_checkpoint)
        if rank.is_main:
            log.info("starting from the weights of %s%s", cfg.load_checkpoint, f"; {note}" if note else "")
    if rank.world_size > 1:
        for tensor in list(head.model.parameters()) + list(head.model.buffers()):
            dist.broadcast(tensor.data, src=0)
    torch.manual_seed(cfg.seed + rank.rank)

    optimizers: list[torch.optim.Optimizer] = []
    schedules = []
    base = LRSchedule(cfg.lr, cfg.lr_warmup_steps, total_steps, min_ratio=cfg.lr_min_ratio)
    if cfg.freeze_weights:
        head.model.requires_grad_(False)
        adam_name = "none (freeze_weights=true)"
    else:
        adam = get_adam_atan2_optimizer(head.model.parameters(), lr=0.0, betas=(cfg.beta1, cfg.beta2),
                                        weight_decay=cfg.weight_decay, backend=cfg.optimizer_backend)
        optimizers.append(adam)
        schedules.append(base)
        adam_name = f"{type(adam).__module__}.{type(adam).__name__}"
    if head.model.config.puzzle_emb_ndim > 0:
        optimizers.append(SparseEmbeddingSignSGD([head.model.puzzle_emb], lr=0.0, weight_decay=cfg.puzzle_emb_weight_decay))
        schedules.append(dataclasses.replace(base, base_lr=cfg.puzzle_emb_lr))
    ema = EMAHelper(head, cfg.ema_rate) if cfg.ema and not cfg.freeze_weights else None
    forward = compile_model(head) if setup.compile else head
    setup.plan.decisions["optimizer"] = Decision(f"{adam_name}; puzzle embedding: sign-SGD",
                                                 f"optimizer_backend={cfg.optimizer_backend}")
    if cfg.ema:
        setup.plan.decisions["EMA"] = Decision(f"ema_rate={cfg.ema_rate}" if ema else "off",
                                               "evaluation and checkpoints use the EMA weights" if ema
                                               else "freeze_weights=true leaves nothing to average")

    guard = NonFiniteGuard(cfg.max_nonfinite_steps, f"a lower lr (lr={cfg.lr} now), a longer lr_warmup_steps or "
                                                     "forward_dtype=float32, or check the dataset for bad labels")
    state = TrainState(started=started)
    if resume_path is not None:
        restore_training(resume_path, head, optimizers, ema, train_loader, state, guard, rank, device)
    if rank.is_main:
        setup.plan.log()
        n_params = sum(p.numel() for p in head.model.parameters())
        log.info("parameters: %s; data: %s (%d train groups, seq_len %d, vocab %d); evaluators: %s; %d optimizer steps",
                 f"{n_params:,}", ", ".join(cfg.data_paths), metadata.total_groups, metadata.seq_len,
                 metadata.vocab_size, ", ".join(type(e).__name__ for e in evaluators) or "none", total_steps)
        log.info("run directory: %s (run %s)%s", run.path, run.run_id,
                 f"; resumed from {resume_path} at step {state.step}" if resume_path else "")
        setup.plan.save(run.path / "plan.yaml")
        OmegaConf.save(setup.plan.settings, run.path / "all_config.yaml")
    metrics_out = MetricsWriter(run_path, enabled=rank.is_main, resume_step=state.step if resume_path else None,
                                logger=cfg.logger, run_id=run.run_id if run else None, project=cfg.project_name,
                                config=setup.plan.settings)
    task = puzzle_task(eval_loader.metadata)

    def checkpoint() -> Optional[Path]:
        try:
            return save_checkpoint(run, head, optimizers, ema, train_loader, state, guard, setup, rank)
        except CheckpointWriteError as e:
            last = run.checkpoints()[-1] if run and run.checkpoints() else None
            raise CheckpointWriteError(f"{e}; " + (f"resume with: {command}" if last else "no checkpoint of this run exists yet"))

    def evaluate() -> None:
        for evaluator in evaluators:
            evaluator.begin_eval()
        collector = OutputsCollector(tuple(cfg.eval_save_outputs)) if cfg.eval_save_outputs else None
        pictures = EvalPictures(task) if rank.is_main and task else None
        consumers = [*evaluators, *(c for c in (collector, pictures) if c is not None)]
        with ema.swapped() if ema is not None else contextlib.nullcontext():
            results = evaluate_puzzles(forward, head, eval_loader, device, rank, cfg.eval_max_examples, consumers=consumers)
        for evaluator in evaluators:
            save_path = run_path / f"evaluator_{type(evaluator).__name__}_step_{state.step}" if rank.is_main else None
            results.update(evaluator.result(save_path, rank.rank, rank.world_size) or {})
        if collector is not None:
            collector.save(run_path, state.step, rank.rank)
        if rank.is_main:
            elapsed = state.elapsed_s()
            metrics_out.log(state.step, {f"eval/{k}": v for k, v in results.items()} | {"eval/elapsed_s": elapsed})
            if pictures is not None:
                metrics_out.log_images(state.step, pictures.images())
            tqdm.write(f"step {state.step} eval ({elapsed:.0f} s into the run): "
                       + ", ".join(f"{k}={v:.4f}" for k, v in results.items()))

    sums: dict[str, torch.Tensor] = {}
    examples_since_log, t_log = 0, time.perf_counter()
    bar = tqdm(total=total_steps, initial=state.step, desc="train", unit="step", disable=not rank.is_main, dynamic_ncols=True)
    head.train()
    total_iters = cfg.epochs // cfg.eval_interval
    try:
        for iteration in range(train_loader.state_dict()["iteration"], total_iters):
            for _set_name, batch, _effective in train_loader:
                if state.step >= total_steps:
                    break
                batch = {k: v.to(device, non_blocking=device.type == "cuda") for k, v in batch.items()}
                if state.carry is None:
                    state.carry = head.initial_carry(batch)
                state.carry, loss, metrics, _, _ = forward(state.carry, batch)
                (loss / cfg.global_batch_size).backward()
                state.step += 1
                culprits = check_training_step(gradients_and_loss(head, loss, rank), state.carry, rank, state.step)
                if guard.step(state.step, culprits, rank):
                    for opt, schedule in zip(optimizers, schedules):
                        for group in opt.param_groups:
                            group["lr"] = schedule.lr(state.step)
                        opt.step()
                for opt in optimizers:
                    opt.zero_grad(set_to_none=True)
                if ema is not None:  # every batch, as the reference does
                    ema.update()

                for k, v in metrics.items():
                    sums[k] = sums.get(k, 0) + v.detach().to(torch.float64)
                examples_since_log += cfg.global_batch_size
                bar.update(1)
                if state.step % cfg.log_interval == 0 or state.step == total_steps:
                    n_steps = (state.step - 1) % cfg.log_interval + 1
                    log_train_point(metrics_out, reduce_metrics(sums, rank), state.step, n_steps, cfg, base,
                                    examples_since_log / (time.perf_counter() - t_log), state.elapsed_s(), guard, bar)
                    sums, examples_since_log, t_log = {}, 0, time.perf_counter()
                if any_rank(stopper.requested, rank):
                    path = checkpoint()
                    if rank.is_main:
                        log.info("stopped by %s after step %d (checkpoint %s); resume with: %s",
                                 stopper.signal_name or "a signal on another rank", state.step, path, command)
                    return 0

            if iteration >= cfg.min_eval_interval:
                evaluate()
                if cfg.checkpoint_every_eval:
                    checkpoint()
            if iteration == total_iters - 1 and not (cfg.checkpoint_every_eval and iteration >= cfg.min_eval_interval):
                checkpoint()
    finally:
        bar.close()
        metrics_out.close()
    if rank.is_main:
        log.info("done: %d steps; checkpoints and metrics.jsonl in %s", state.step, run.path)
    return 0


def puzzle_task(metadata: PuzzleDatasetMetadata) -> Optional[str]:
    """The task to draw evaluation pictures of (sudoku, maze, arc), or None for data the pictures do not know."""
    try:
        return detect_task(metadata)
    except VisualizationError:
        return None


def gradients_and_loss(head, loss: torch.Tensor, rank: Dist) -> dict[str, torch.Tensor]:
    """All-reduce (sum) the gradients across ranks; return the loss and every gradient by name, for the guard."""
    named = {"loss": loss.detach().reshape(1)}
    for name, p in head.model.named_parameters():
        if p.grad is not None:
            if rank.world_size > 1:
                dist.all_reduce(p.grad)
            named[f"gradient of {name}"] = p.grad
    if head.model.config.puzzle_emb_ndim > 0 and head.model.puzzle_emb.local_weights.grad is not None:
        named["gradient of the puzzle embedding"] = head.model.puzzle_emb.local_weights.grad
    return named


def log_train_point(out: MetricsWriter, reduced: Optional[dict[str, float]], step: int, n_steps: int,
                    cfg: PretrainConfig, schedule: LRSchedule, examples_per_s: float, elapsed_s: float, guard: NonFiniteGuard,
                    bar) -> None:
    """One ``train/*`` point: losses per example, accuracies per halted puzzle, lr, throughput, wall seconds since the
    run started (``train/elapsed_s``, as ``eval/elapsed_s`` at each evaluation), skipped steps."""
    if not reduced:
        return
    count = max(reduced.pop("count", 0.0), 1.0)
    point = {f"train/{k}": v / (cfg.global_batch_size * n_steps if k.endswith("loss") else count)
             for k, v in reduced.items()}
    point.update({"train/lr": schedule.lr(step), "train/examples_per_s": examples_per_s, "train/elapsed_s": elapsed_s,
                  "train/nonfinite_steps": guard.total})
    out.log(step, point)
    bar.set_postfix(loss=f"{point.get('train/lm_loss', float('nan')):.3f}",
                    acc=f"{point.get('train/accuracy', float('nan')):.3f}", ex_s=f"{examples_per_s:.0f}")


if __name__ == "__main__":
    sys.exit(main())
