"""The HRM/TRM trainer: train on a puzzle dataset (Sudoku, mazes, ARC) on CUDA, Apple Silicon or CPU.

    python pretrain.py --config-name=cfg_pretrain_cpu                       # the script calls main() here
    torchrun --nproc-per-node 8 pretrain.py --config-name=cfg_pretrain data_path=data/sudoku-extreme-1k-aug-1000
    puzzle_trainer.run(Launch("cfg_pretrain", {"lr": 1e-4}, arch="trm"))   # inside another program: ARC adaptation

The loop follows the reference HRM (docs/REFERENCE.md, HRM): the ACT carry persists across
optimizer steps, AdamATan2 trains the weights and sign-SGD the puzzle embedding, the lr warms up
linearly then follows a cosine, and every ``eval_interval`` epochs the model is evaluated on the
test split and checkpointed. Everything around the loop (settings, run directory, checkpoints,
metrics, the non-finite guard, graceful stop, errors) is the shared run lifecycle in utils/run/.
"""

import utils  # noqa: F401  (sets PYTORCH_ENABLE_MPS_FALLBACK before torch is imported)

import contextlib
import dataclasses
import json
import logging
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Optional

import torch
import torch.distributed as dist
from omegaconf import OmegaConf
from tqdm import tqdm

from models import build_model, model_bytes, validate_arch
from models.act import CarrySlot
from models.checkpoints import ModelWeights, load_pretrained, reference_state_dict
from models.ema import EMAHelper
from models.layers import attention_backend
from models.maze_targets import answer_labels_for
from models.sparse_embedding import SparseEmbeddingSignSGD
from utils.config import (RUN_CONTROL_KEYS, ConfigError, PretrainConfig, build_config, command_line_layer,
                          leaves, recipe_layers, to_dict)
from utils.data.builders import build_dataset
from utils.data.puzzle_dataset import DatasetError, PuzzleDataset, PuzzleDatasetMetadata, check_compatible
from utils.data.saved_outputs import OutputsCollector
from utils.device import compile_decision, configure_backends, memory_available, select_dtype
from utils.distributed import Dist, main_decides
from utils.eval.arc import ARC
from utils.eval.puzzle import evaluate_puzzles, reduce_metrics
from utils.eval.reasoning import SETTING_NAMES, TestTimeCompute, view_grid_side
from utils.hardware_optimizer import HRM_CONFIGS, compile_model, resolve_hardware_profile
from utils.optimizer_utils import get_adam_atan2_optimizer
from utils.run import points
from utils.run.checkpointer import Best, Checkpointer
from utils.run.estimate import LONG_RUN_HOURS, Estimate, StepPace, duration, matmul_rate, step_flops
from utils.run.guard import NonFiniteGuard
from utils.run.main import run_main
from utils.run.metrics import MetricsWindow, MetricsWriter
from utils.run.plan import Decision, Plan, layered_settings
from utils.run.run_dir import PLAN, run_location, settings_fingerprint
from utils.run.schedule import LRSchedule
from utils.run.session import RunSession, after_signals, open_session, restarted_resume, resume_command
from utils.run.stop import GracefulStop
from utils.run.train_state import Clock, Optimizers, RNGStates, TrainState, Value
from utils.train.command_line import build_parser
from utils.train.curriculum import DepthCurriculum, set_depth
from utils.viz.puzzles import EvalPictures, known_task

log = logging.getLogger("pretrain")


@dataclass(frozen=True)
class Launch:
    """A run as its caller asks for it, in typed settings.

    Attributes:
        config_name: the recipe, ``config/<config_name>.yaml``.
        settings: settings over the recipe, nested as the config is (``{"lr": 1e-4, "arch": {"hidden_size": 256}}``),
            typed values (numbers, bools, strings, lists).
        arch: the architecture file that replaces the recipe's, ``config/arch/<arch>.yaml`` (None keeps it).
        source: what the settings are called in the plan's record of where each setting came from.
        command: the ``pretrain.py`` arguments the run was started with, for the command that resumes it; empty for a
            run started by another program, whose command is rebuilt from the settings.
    """

    config_name: str = "cfg_pretrain"
    settings: dict[str, Any] = dataclasses.field(default_factory=dict)
    arch: Optional[str] = None
    source: str = "command line"
    command: tuple[str, ...] = ()

    def argv(self) -> list[str]:
        """The ``pretrain.py`` arguments that start this run."""
        if self.command:
            return list(self.command)
        overrides = [f"{key}={_override_text(value)}" for key, value in leaves(self.settings).items()]
        return [f"--config-name={self.config_name}", *([f"arch={self.arch}"] if self.arch else []), *overrides]


def _override_text(value: Any) -> str:
    """``value`` as a ``key=value`` override writes it (OmegaConf's grammar: ``true``, ``null``, ``[a,b]``)."""
    if isinstance(value, (list, tuple)):
        return "[" + ",".join(_override_text(v) for v in value) + "]"
    return "null" if value is None else str(value).lower() if isinstance(value, bool) else str(value)


def parse_args(argv: list[str]) -> Launch:
    """``pretrain.py``'s command line as a :class:`Launch`.

    Raises:
        ConfigError: an override that is not ``key=value`` or does not parse (see ``command_line_layer``).
    """
    args = build_parser().parse_args(argv)
    layer, groups = command_line_layer(args.overrides)
    return Launch(args.config_name, OmegaConf.to_container(layer), groups.get("arch"),
                  command=(f"--config-name={args.config_name}", *args.overrides))


def main(argv: Optional[list[str]] = None) -> int:
    """``python pretrain.py``: train as the command line (default: ``sys.argv``) says; the exit code."""
    argv = sys.argv[1:] if argv is None else argv
    return _run_main(lambda: parse_args(argv), own_program=True)


def run(launch: Launch) -> int:
    """Train as ``launch`` says, inside the calling program (the ARC adaptation of ``solve.py`` and the page); the
    exit code. Its points go to no watcher (utils/run/points.py): they watch the calling program."""
    return _run_main(lambda: launch, own_program=False)


def _run_main(launch: Callable[[], Launch], own_program: bool) -> int:
    """:func:`train` under the shared main wrapper, the launch read inside it (so a bad override is one line); with
    ``own_program``, as the program's own run (:func:`utils.run.points.program_run`)."""
    def body(rank: Dist, stopper: GracefulStop) -> int:
        with points.program_run() if own_program else contextlib.nullcontext():
            return train(launch(), rank, stopper)
    return run_main(body)


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


def resolve_setup(launch: Launch, rank: Dist) -> Setup:
    """Merge the settings (defaults, hardware profile, recipe, command line), validate them, and take the
    device, precision and compile decisions. Rank 0's settings are shared with every rank.

    Raises:
        ConfigError, DeviceError: a bad setting, named in one line.
    """
    asked = OmegaConf.create(launch.settings)
    groups = {"arch": launch.arch} if launch.arch else {}
    defaults = ("defaults", to_dict(PretrainConfig()))

    def profile(merged: dict, device: torch.device):
        hardware = build_config(merged).hardware
        if not hardware:
            return None
        name, knobs, reason = resolve_hardware_profile(hardware, device)
        return name, {"global_batch_size": knobs["global_batch_size"]}, reason

    def device_setting(merged: dict) -> str:
        """The device asked for, once every setting the hardware profile leaves alone is checked: the evaluations'
        test-time compute too, so that a bad eval_* setting is refused before the device is touched."""
        cfg = build_config(merged)
        eval_compute(cfg).check(validate_arch(cfg.arch)["halt_max_steps"], SETTING_NAMES)
        return cfg.device

    merged, sources, labels, device, decisions = layered_settings(
        [defaults], [*recipe_layers(launch.config_name, groups=groups), (launch.source, asked)], rank,
        device_setting, profile)
    cfg = main_decides(build_config(merged), rank)
    choose_data_paths(cfg, sources, labels)
    arch = validate_arch(cfg.arch)
    if cfg.freeze_weights and not arch.get("puzzle_emb_ndim"):
        raise ConfigError("freeze_weights=true trains only the puzzle embedding, but arch.puzzle_emb_ndim is 0: "
                          "nothing would train")
    if cfg.global_batch_size % rank.world_size:
        raise ConfigError(f"global_batch_size {cfg.global_batch_size} is not divisible by the {rank.world_size} processes")
    DepthCurriculum(cfg.depth_curriculum, (1, 1), 1)  # a bad stage is refused now, not after the data is built
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


# ---- the training state -----------------------------------------------------------------------------------

class PuzzleTrainState(TrainState):
    """Everything that shapes the rest of an HRM/TRM run (utils/run/train_state.py): the weights, the AdamATan2
    (``dense``) and sign-SGD (``sparse``) optimizers with their lr schedules, the EMA, the sampler position, the
    guard's counters, the metrics window, the wall clock, the evaluations done, and per process the ACT carry and
    the RNG states, and the best evaluation so far. ``forward`` is the (possibly compiled) loss head that ``head``
    is. ``curriculum`` says the depth of each step; ``step_flops`` maps each depth it uses to the FLOPs of one
    optimizer step there, summed over the processes (on rank 0, which alone logs them; empty on the others)."""

    def __init__(self, head, forward, dense: list, sparse: list, schedules: dict, ema: Optional[EMAHelper],
                 loader: PuzzleDataset, guard: NonFiniteGuard, clock: Clock, best: Best, cfg: PretrainConfig,
                 rank: Dist, device: torch.device, curriculum: DepthCurriculum, step_flops: dict):
        self.head, self.forward, self.dense, self.sparse, self.schedules, self.ema = head, forward, dense, sparse, schedules, ema
        self.curriculum, self.step_flops = curriculum, step_flops
        self.loader, self.guard, self.clock, self.best = loader, guard, clock, best
        self.window, self.slot, self.iterations_done = MetricsWindow(cfg.log_interval), CarrySlot(device), Value(0)
        parts = {"live_model": ModelWeights(head), "optimizers": Optimizers(dense + sparse), "train_loader": loader,
                 "guard": guard, "window": self.window, "clock": clock, "iterations_done": self.iterations_done,
                 "best": best}
        if ema is not None:
            parts["ema"] = ema
        super().__init__(parts, {"carry": self.slot, "rng": RNGStates()}, rank)

    def train_flops(self, step: int) -> float:
        """Training FLOPs of the run's first ``step`` optimizer steps, summed over the processes."""
        return self.curriculum.flops_through(step, self.step_flops.__getitem__)


def build_state(setup: Setup, data: "PuzzleData", rank: Dist, clock: Clock, weights: Optional[str]) -> PuzzleTrainState:
    """The model (seeded alike on every rank, optionally from the weights of ``weights``), its optimizers, the EMA
    and the guard, as one train state at step 0."""
    cfg, metadata = setup.cfg, data.train.metadata
    torch.manual_seed(cfg.seed)  # identical initial weights on every rank
    head = build_model(setup.arch, batch_size=setup.local_batch_size, seq_len=metadata.seq_len,
                       vocab_size=metadata.vocab_size, num_puzzle_identifiers=metadata.num_puzzle_identifiers,
                       dtype=setup.dtype, device=setup.device)
    if weights:
        note = load_pretrained(head, weights)
        if rank.is_main:
            log.info("starting from the weights of %s%s", weights, f"; {note}" if note else "")
    if rank.world_size > 1:
        for tensor in list(head.model.parameters()) + list(head.model.buffers()):
            dist.broadcast(tensor.data, src=0)
    torch.manual_seed(cfg.seed + rank.rank)
    base = LRSchedule(cfg.lr, cfg.lr_warmup_steps, data.total_steps, min_ratio=cfg.lr_min_ratio)
    dense, sparse, schedules = [], [], {}
    if cfg.freeze_weights:
        head.model.requires_grad_(False)
    else:
        dense.append(get_adam_atan2_optimizer(head.model.parameters(), lr=0.0, betas=(cfg.beta1, cfg.beta2),
                                              weight_decay=cfg.weight_decay, backend=cfg.optimizer_backend))
        schedules[dense[0]] = base
    if head.model.config.puzzle_emb_ndim > 0:
        sparse.append(SparseEmbeddingSignSGD([head.model.puzzle_emb], lr=0.0, weight_decay=cfg.puzzle_emb_weight_decay))
        schedules[sparse[0]] = dataclasses.replace(base, base_lr=cfg.puzzle_emb_lr)
    ema = EMAHelper(head, cfg.ema_rate) if cfg.ema and not cfg.freeze_weights else None
    head.supervision_decay = cfg.supervision_decay
    head.answer_labels = answer_labels_for(cfg.maze_targets, head.loss_fn, metadata.vocab_size)
    curriculum = DepthCurriculum(cfg.depth_curriculum, (head.model.config.H_cycles, head.model.config.L_cycles),
                                 data.total_steps)
    forward = compile_model(head) if setup.compile else head
    guard = NonFiniteGuard(cfg.max_nonfinite_steps, f"a lower lr (lr={cfg.lr} now), a longer lr_warmup_steps or "
                                                     "forward_dtype=float32, or check the dataset for bad labels")
    setup.plan.decisions["optimizer"] = Decision(
        (f"{type(dense[0]).__module__}.{type(dense[0]).__name__}" if dense else "none (freeze_weights=true)")
        + "; puzzle embedding: sign-SGD", f"optimizer_backend={cfg.optimizer_backend}")
    if cfg.ema:
        setup.plan.decisions["EMA"] = Decision(f"ema_rate={cfg.ema_rate}" if ema else "off",
                                               "evaluation and checkpoints use the EMA weights" if ema
                                               else "freeze_weights=true leaves nothing to average")
    return PuzzleTrainState(head, forward, dense, sparse, schedules, ema, data.train, guard, clock,
                            Best(data.headline), cfg, rank, setup.device, curriculum,
                            depth_flops(setup, data.train.metadata, curriculum, rank.world_size) if rank.is_main else {})


# (architecture as JSON, batch, seq_len, vocab_size, identifiers, dtype), (H_cycles, L_cycles) -> one process's
# optimizer step FLOPs. Tracing takes about half a second, so a program that trains several times (the page's ARC
# adaptation, the tests) traces each model once.
_TRACED_STEP_FLOPS: dict[tuple[tuple, tuple[int, int]], int] = {}


def depth_flops(setup: Setup, metadata: PuzzleDatasetMetadata, curriculum: DepthCurriculum,
                world_size: int) -> dict[tuple[int, int], int]:
    """FLOPs of one optimizer step (all processes) at each depth the run trains at, traced on the ``meta`` device
    (once a process for each model: :data:`_TRACED_STEP_FLOPS`)."""
    model = (json.dumps(setup.arch, sort_keys=True, default=repr), setup.local_batch_size, metadata.seq_len,
             metadata.vocab_size, metadata.num_puzzle_identifiers, setup.dtype)
    flops, meta = {}, None
    for *_, depth in curriculum.segments():
        if (model, depth) not in _TRACED_STEP_FLOPS:
            meta = meta_model(setup, metadata) if meta is None else meta  # one model, set to each depth in turn
            set_depth(meta.model, depth)
            _TRACED_STEP_FLOPS[model, depth] = step_flops(meta, setup.local_batch_size, metadata.seq_len)
        flops[depth] = _TRACED_STEP_FLOPS[model, depth] * world_size
    return flops


def export(state: PuzzleTrainState, setup: Setup, data: "PuzzleData") -> dict[str, Any]:
    """What a checkpoint holds beside the state: ``model``, the weights in the reference format (the EMA weights
    with EMA on, as the reference saves them), ``config``, the settings, and ``data``, the sizes the model was
    built for (``seq_len``, ``vocab_size``; for evaluate.py and solve.py)."""
    metadata = data.train.metadata
    record = {"config": setup.plan.settings, "data": {"seq_len": metadata.seq_len, "vocab_size": metadata.vocab_size}}
    if state.ema is None:
        return {"model": reference_state_dict(state.head), **record}
    with state.ema.swapped():
        return {"model": {k: v.clone() for k, v in reference_state_dict(state.head).items()}, **record}


def meta_model(setup: Setup, metadata: PuzzleDatasetMetadata):
    """The run's model on the ``meta`` device: shapes without memory, to size and time the run before it starts."""
    return build_model(setup.arch, batch_size=setup.local_batch_size, seq_len=metadata.seq_len,
                       vocab_size=metadata.vocab_size, num_puzzle_identifiers=metadata.num_puzzle_identifiers,
                       dtype=setup.dtype, device="meta")


def check_memory(setup: Setup, metadata: PuzzleDatasetMetadata) -> int:
    """Refuse sizes the device cannot hold (weights, gradients, two optimizer moments and the guard's copy of
    weights and moments); returns the bytes one checkpoint needs, about (twice the weights with EMA on).

    Raises:
        ConfigError: the model cannot fit, with the sizes.
    """
    meta = meta_model(setup, metadata)
    params = sum(p.numel() * 4 for p in meta.model.parameters())
    checkpoint = model_bytes(meta) + 2 * params + (params if setup.cfg.ema else 0)
    need = model_bytes(meta) + 6 * params
    available = memory_available(setup.device)
    if need > available:
        raise ConfigError(f"this architecture needs about {need / 2**30:.1f} GiB for its weights, gradients, optimizer "
                          f"state and the guard's copy, but {setup.device} has {available / 2**30:.1f} GiB available; "
                          "use a smaller arch.hidden_size or fewer layers")
    return checkpoint


# ---- one step, one evaluation -----------------------------------------------------------------------------

def train_step(state: PuzzleTrainState, batch: dict[str, torch.Tensor], cfg: PretrainConfig,
               rank: Dist) -> dict[str, torch.Tensor]:
    """One ACT segment and one optimizer update (the reference's ``train_batch``); returns the step's metric sums."""
    if state.slot.carry is None:
        state.slot.carry = state.head.initial_carry(batch)
    set_depth(state.head.model, state.curriculum.depth(state.step))
    state.slot.carry, loss, metrics, _, _ = state.forward(state.slot.carry, batch)
    (loss / cfg.global_batch_size).backward()
    state.step += 1
    all_reduce_gradients(state.head, rank)
    for opt, schedule in state.schedules.items():
        for group in opt.param_groups:
            group["lr"] = schedule.lr(state.step)
    params = dict(state.head.model.named_parameters()) if state.dense else {}
    checked = {"loss": loss.detach().reshape(1), **{f"gradient of {n}": p.grad for n, p in params.items()
                                                    if p.grad is not None}}
    if state.sparse and state.head.model.puzzle_emb.local_weights.grad is not None:
        checked["gradient of the puzzle embedding"] = state.head.model.puzzle_emb.local_weights.grad
    state.guard.update(state.step, checked, state.dense, lambda: [opt.step() for opt in state.dense], params, rank,
                       then=lambda: [opt.step() for opt in state.sparse], carry=state.slot.carry)
    for opt in state.dense + state.sparse:
        opt.zero_grad(set_to_none=True)
    if state.ema is not None:  # every batch, as the reference does
        state.ema.update()
    return metrics


def all_reduce_gradients(head, rank: Dist) -> None:
    """Sum the dense gradients over the processes of a torchrun job (the puzzle embedding's sparse gradient is
    gathered by its optimizer)."""
    if rank.world_size > 1:
        for p in head.model.parameters():
            if p.grad is not None:
                dist.all_reduce(p.grad)


def evaluate(state: PuzzleTrainState, data: "PuzzleData", cfg: PretrainConfig, device: torch.device, rank: Dist,
             run_path: Path, metrics: MetricsWriter) -> dict[str, float]:
    """Score the test split (with the EMA weights when on), run the evaluators, save outputs and pictures, log."""
    for evaluator in data.evaluators:
        evaluator.begin_eval()
    collector = OutputsCollector(tuple(cfg.eval_save_outputs)) if cfg.eval_save_outputs else None
    pictures = EvalPictures(data.task) if rank.is_main and data.task else None
    consumers = [*data.evaluators, *(c for c in (collector, pictures) if c is not None),
                 *points.first_batch_consumers("eval", state.step)]
    set_depth(state.head.model, state.curriculum.full)  # evaluations run the architecture's depth
    with state.ema.swapped() if state.ema is not None else contextlib.nullcontext():
        results = evaluate_puzzles(state.forward, state.head, data.test, device, rank, cfg.eval_max_examples,
                                   consumers=consumers, ttc=eval_compute(cfg))
    state.head.train()
    for evaluator in data.evaluators:
        save_path = run_path / f"evaluator_{type(evaluator).__name__}_step_{state.step}" if rank.is_main else None
        results.update(evaluator.result(save_path, rank.rank, rank.world_size) or {})
    if collector is not None:
        collector.save(run_path, state.step, rank.rank)
    if rank.is_main:
        elapsed = state.clock.elapsed_s()
        metrics.log(state.step, {f"eval/{k}": v for k, v in results.items()}
                    | {"eval/elapsed_s": elapsed, "eval/train_pflop": state.train_flops(state.step) / 1e15})
        if pictures is not None:
            metrics.log_images(state.step, pictures.images(state.step))
        tqdm.write(f"step {state.step} eval ({elapsed:.0f} s into the run): "
                   + ", ".join(f"{k}={v:.4f}" for k, v in results.items()))
    return results


def first_look(state: PuzzleTrainState, data: "PuzzleData", cfg: PretrainConfig, device: torch.device, rank: Dist,
               metrics: MetricsWriter, pace: StepPace, iteration: int) -> None:
    """The quick evaluation ``first_eval_step`` asks for, so that a run shows learning within minutes: the first
    ``first_eval_examples`` test examples under the run's test-time compute, with the live weights (an EMA this early
    is still mostly the initial weights); logged as ``first_eval/*`` and printed with when the first full evaluation
    comes. The test split's position is put back, and nothing else of the run moves (best.pt, the EMA, the carry, the
    training batches): the evaluations report what they would without it."""
    position = data.test.state_dict()
    set_depth(state.head.model, state.curriculum.full)
    # Eager: compiling the evaluation's graph now would cost about as long as the first step's compilation.
    results = evaluate_puzzles(state.head, state.head, data.test, device, rank, cfg.first_eval_examples,
                               ttc=eval_compute(cfg))
    state.head.train()
    data.test.load_state_dict(position)
    if not rank.is_main:
        return
    metrics.log(state.step, {f"first_eval/{k}": v for k, v in results.items()})
    then = next_evaluation_step(state, data, cfg, iteration)
    pace_note = f", in about {duration((then - state.step) * pace.per_step)} at this pace" if pace.per_step else ""
    tqdm.write(f"step {state.step} first look ({state.clock.elapsed_s():.0f} s into the run; {results['count']:.0f} of "
               f"{data.test.num_examples} test examples, live weights): exact_accuracy={results['exact_accuracy']:.4f}, "
               f"accuracy={results['accuracy']:.4f}, blank_accuracy={results['blank_accuracy']:.4f}; the first full "
               f"evaluation comes after step {then}{pace_note}")


def next_evaluation_step(state: PuzzleTrainState, data: "PuzzleData", cfg: PretrainConfig, iteration: int) -> int:
    """The step after which the next full evaluation comes: the end of the first evaluating interval from
    ``iteration`` on, the rest of this one counted in batches, any later ones at the schedule's mean length."""
    sampler = data.train.state_dict()
    left = len(data.train) - sampler["batch"] if sampler["iteration"] == iteration else 0
    later = max(cfg.min_eval_interval - iteration, 0) * data.total_steps / data.total_iters
    return min(data.total_steps, state.step + left + round(later))


def eval_compute(cfg: PretrainConfig) -> TestTimeCompute:
    """The test-time compute of the evaluations (``eval_halt_max_steps``, ``eval_early_exit``, ...)."""
    keep = any(k.startswith("segment") for k in cfg.eval_save_outputs)
    return TestTimeCompute.of_run(cfg, keep)


def log_train_point(state: PuzzleTrainState, cfg: PretrainConfig, rank: Dist, metrics: MetricsWriter, bar) -> None:
    """One ``train/*`` point from the window: losses per example, accuracies per halted puzzle, lr, throughput, wall
    seconds since the run started (``train/elapsed_s``, as ``eval/elapsed_s`` at each evaluation), undone steps."""
    sums, n_steps, examples_per_s = state.window.take()
    reduced = reduce_metrics(sums, rank)
    if not reduced:
        return
    count = max(reduced.pop("count", 0.0), 1.0)
    point = {f"train/{k}": v / (cfg.global_batch_size * n_steps if k.endswith("loss") else count)
             for k, v in reduced.items()}
    lr = next(iter(state.schedules.values())).lr(state.step) if state.schedules else 0.0
    point.update({"train/lr": lr, "train/examples_per_s": examples_per_s, "train/elapsed_s": state.clock.elapsed_s(),
                  "train/nonfinite_steps": state.guard.total, "train/pflop": state.train_flops(state.step) / 1e15})
    metrics.log(state.step, point)
    bar.set_postfix(loss=f"{point.get('train/lm_loss', float('nan')):.3f}",
                    acc=f"{point.get('train/accuracy', float('nan')):.3f}", ex_s=f"{examples_per_s:.0f}")


# ---- the run ------------------------------------------------------------------------------------------------

@dataclass
class PuzzleData:
    """The training and test data of a run, its evaluators, and the schedule's length."""

    train: PuzzleDataset
    test: PuzzleDataset
    evaluators: list
    total_steps: int
    total_iters: int
    task: Optional[str]
    headline: str  # the evaluation metric that picks best.pt

    def iteration(self, iteration: int, state: PuzzleTrainState, device: torch.device):
        """The training batches of ``iteration`` still to run, on ``device``: none when the sampler has moved past
        it (a run stopped after the iteration's last step and resumed), and none past the last step."""
        if self.train.state_dict()["iteration"] != iteration:
            return
        for _set_name, batch, _effective in self.train:
            if state.step >= self.total_steps:
                return
            yield {k: v.to(device, non_blocking=device.type == "cuda") for k, v in batch.items()}


def load_data(setup: Setup, rank: Dist) -> PuzzleData:
    """Open (building where allowed) the training and test data and check they agree.

    Raises:
        DatasetError, ConfigError: a missing or inconsistent dataset, or a schedule without a step.
    """
    cfg = setup.cfg
    prepare_data(cfg, setup.plan.sources, rank)
    test_paths = cfg.data_paths_test or cfg.data_paths
    train = PuzzleDataset(cfg.data_paths, "train", cfg.global_batch_size, seed=cfg.seed, rank=rank.rank,
                          world_size=rank.world_size, epochs_per_iter=cfg.eval_interval)
    test = PuzzleDataset(test_paths, "test", cfg.global_batch_size, seed=cfg.seed, rank=rank.rank,
                         world_size=rank.world_size)
    metadata = train.metadata
    check_compatible(metadata, test.metadata, f"{cfg.data_paths} and {test_paths}")
    if cfg.eval_views > 1:  # refused now, not at the first evaluation
        view_grid_side(metadata.seq_len, metadata.num_puzzle_identifiers > 1)
    total_steps = schedule_steps(cfg, metadata)
    if total_steps < 1:
        raise ConfigError(f"the run has no optimizer steps: {metadata.total_groups} groups x {cfg.epochs} epochs "
                          f"< global_batch_size {cfg.global_batch_size}; raise epochs or lower global_batch_size")
    evaluators = make_evaluators(cfg, test_paths)
    return PuzzleData(train, test, evaluators, total_steps, cfg.epochs // cfg.eval_interval, known_task(test.metadata),
                      headline_metric(cfg, evaluators))


def schedule_steps(cfg: PretrainConfig, metadata: PuzzleDatasetMetadata) -> int:
    """The schedule's optimizer steps on a training split described by ``metadata``: epochs x groups x mean examples
    per puzzle / global batch (an epoch draws one puzzle of each group, as the references' loaders do)."""
    return int(cfg.epochs * metadata.total_groups * metadata.mean_puzzle_examples / cfg.global_batch_size)


def headline_metric(cfg: PretrainConfig, evaluators: list) -> str:
    """The metric that picks ``best.pt``: ``best_metric``, or with ``auto`` ARC/pass@2 when the ARC evaluator runs,
    else exact_accuracy.

    Raises:
        ConfigError: ``best_metric`` names no metric the evaluations report.
    """
    reported = ["exact_accuracy", "accuracy", "blank_accuracy", "q_halt_accuracy"]
    reported += [f"ARC/pass@{k}" for e in evaluators for k in e.pass_ks]
    if cfg.best_metric == "auto":
        return "ARC/pass@2" if evaluators else "exact_accuracy"
    if cfg.best_metric not in reported:
        raise ConfigError(f"best_metric={cfg.best_metric!r} is not reported by these evaluations; use auto or one of "
                          f"{', '.join(reported)}")
    return cfg.best_metric


def session_for(launch: Launch, setup: Setup, data: PuzzleData, rank: Dist):
    """The run directory of this command (utils/run/session.py): ``checkpoint_path``; the directory of ``resume``;
    with ``resume=auto``, the newest run under ``checkpoints/<project>/`` with the same settings; else a new
    ``checkpoints/<project>/<run_name or arch-time>``."""
    cfg = setup.cfg
    fingerprint = settings_fingerprint(setup.plan.settings, RUN_CONTROL_KEYS)
    resume = restarted_resume(cfg.resume)
    kept = cfg.keep_last_checkpoints
    copies = (min(kept, data.total_iters) + 1) if kept > 0 else data.total_iters + 1
    checkpoint_bytes = check_memory(setup, data.train.metadata)
    return open_session(
        rank, trainer="pretrain", fingerprint=fingerprint, resume=resume,
        location=lambda: run_location(
            explicit=cfg.checkpoint_path, resume=resume, parent=default_run_parent(cfg), trainer="pretrain",
            fingerprint=fingerprint, new_name=cfg.run_name or f"{setup.arch['name']}-{time.strftime('%Y%m%d-%H%M%S')}",
            named=bool(cfg.run_name)),
        resume_hint=lambda path: f"rerun with resume=auto checkpoint_path={path}" if cfg.checkpoint_path
        else f"rerun with resume={path}",
        command=lambda path: resume_command(["python", "pretrain.py"], launch.argv(),
                                            ("resume", "checkpoint_path"), ["resume=auto", f"checkpoint_path={path}"]),
        storage=lambda: (checkpoint_bytes, copies))


def default_run_parent(cfg: PretrainConfig) -> Path:
    return Path("checkpoints") / (cfg.project_name or Path(cfg.data_path).name)


def report_start(setup: Setup, data: PuzzleData, state: PuzzleTrainState, session: RunSession) -> float:
    """The start-up report (rank 0): the plan, the sizes, the run directory, the length from FLOPs (returned, in
    seconds); ``plan.yaml`` and ``all_config.yaml``."""
    cfg, run = setup.cfg, session.run
    setup.plan.log()
    n_params = sum(p.numel() for p in state.head.model.parameters())
    metadata = data.train.metadata
    log.info("parameters: %s; data: %s (%d train groups, seq_len %d, vocab %d); evaluators: %s; %d optimizer steps",
             f"{n_params:,}", ", ".join(cfg.data_paths), metadata.total_groups, metadata.seq_len, metadata.vocab_size,
             ", ".join(type(e).__name__ for e in data.evaluators) or "none", data.total_steps)
    log.info("run directory: %s (run %s)%s", run.path, run.run_id,
             f"; resumed from {session.resume_path} at step {state.step}" if session.resume_path else "")
    if not evaluates_after(data.total_iters - 1, cfg):
        log.warning("this run will not evaluate: its first evaluation would come after min_eval_interval=%d of its %d "
                    "evaluation intervals (epochs / eval_interval); lower min_eval_interval or add epochs",
                    cfg.min_eval_interval, data.total_iters)
    seconds = report_length(setup, data, state)
    setup.plan.save(run.path / PLAN)
    OmegaConf.save(setup.plan.settings, run.path / "all_config.yaml")
    return seconds


def evaluates_after(iteration: int, cfg: PretrainConfig) -> bool:
    """Whether the run evaluates at the end of evaluation interval ``iteration`` (0-based): from interval
    ``min_eval_interval`` on, as the reference TRM's pretrain.py."""
    return iteration >= cfg.min_eval_interval


def report_length(setup: Setup, data: PuzzleData, state: PuzzleTrainState) -> float:
    """Say how long the rest of the schedule will take on this device from its FLOPs (utils/run/estimate.py; returned,
    in seconds) and, when a CPU would need more than a few hours, name the recipes made for a CPU (the ones
    ``python -m utils.hardware_optimizer`` recommends). The steps are timed once they run (:class:`StepPace`)."""
    steps, processes = data.total_steps - state.step, setup.cfg.global_batch_size // setup.local_batch_size
    per_step = (state.train_flops(data.total_steps) - state.train_flops(state.step)) / max(steps, 1) / processes
    estimate = Estimate(per_step, matmul_rate(setup.device, setup.dtype), steps)
    log.info(estimate.told(setup.device))
    if setup.device.type == "cpu" and estimate.seconds > LONG_RUN_HOURS * 3600:
        if any("_cpu" in Path(layer).stem for layer in setup.plan.sources.values()):  # a long recipe made for a CPU
            log.info("this CPU recipe takes about %s here: a stop (Ctrl-C, SIGTERM) keeps a checkpoint, and the same "
                     "command with resume=auto continues it", duration(estimate.seconds))
        else:
            log.warning("this recipe would take about %s on this CPU; the recipes made for a CPU: python pretrain.py "
                        "--config-name=%s (HRM) or --config-name=cfg_pretrain_trm_cpu (TRM)",
                        duration(estimate.seconds), HRM_CONFIGS["cpu"])
    return estimate.seconds


def train(launch: Launch, rank: Dist, stopper: GracefulStop) -> int:
    """The whole run; returns 0 when the schedule is done, ``stopper.exit_code`` when a signal stopped it."""
    clock = Clock()  # eval/elapsed_s counts from here: wall time as a user waits for it
    setup = resolve_setup(launch, rank)
    cfg, device = setup.cfg, setup.device
    configure_backends(device, cudnn_benchmark=True, deterministic=cfg.deterministic, compiling=setup.compile)
    # A data build has no step to finish: a stop ends it at once (its workers with it; nothing half-built is published).
    with stopper.at_once(during="the data preparation (a dataset is published only once built whole)"):
        data = load_data(setup, rank)
    stopper.listen_for_warning(cfg.warning_signal, cfg.on_warning)
    with session_for(launch, setup, data, rank) as session:
        state = build_state(setup, data, rank, clock, None if session.resume_path else cfg.load_checkpoint)
        checkpointer = Checkpointer(session.run, rank, cfg.keep_last_checkpoints, identity(setup),
                                    lambda: export(state, setup, data))
        if session.resume_path is not None:
            checkpointer.restore(state, session.resume_path)
        flop_seconds = report_start(setup, data, state, session) if rank.is_main else 0.0
        pace = StepPace(state.step, data.total_steps, device, setup.compile, flop_seconds,
                        log.info if rank.is_main else None)
        with MetricsWriter(session.path, enabled=rank.is_main, resume_step=state.step if session.continuing else None,
                           logger=cfg.logger, run_id=session.run and session.run.run_id, project=cfg.project_name,
                           config=setup.plan.settings) as metrics, \
                tqdm(total=data.total_steps, initial=state.step, desc="train", unit="step", disable=not rank.is_main,
                     dynamic_ncols=True) as bar:
            state.head.train()
            first_step = state.step
            pace.begin()
            for iteration in range(state.iterations_done.value, data.total_iters):
                for batch in data.iteration(iteration, state, device):
                    with stopper.at_once(state.step == first_step):  # compiling: minutes, nothing to save
                        points.reach("train", state.step + 1)
                        state.window.add(train_step(state, batch, cfg, rank), cfg.global_batch_size)
                    bar.update(1)
                    pace.step_done(state.step)
                    if state.window.due(state.step, data.total_steps):
                        log_train_point(state, cfg, rank, metrics, bar)
                    if state.step == cfg.first_eval_step:
                        first_look(state, data, cfg, device, rank, metrics, pace, iteration)
                    if (code := after_signals(checkpointer, state, stopper, session, rank)) is not None:
                        return code
                evaluated, improved = evaluates_after(iteration, cfg), False
                if evaluated:
                    results = evaluate(state, data, cfg, device, rank, session.path, metrics)
                    improved = state.best.update(results.get(data.headline), state.step, rank)
                state.iterations_done.value = iteration + 1
                if (evaluated and cfg.checkpoint_every_eval) or iteration == data.total_iters - 1:
                    checkpointer.save(state)
                if improved:
                    checkpointer.save_best(state, state.best)
                if (code := after_signals(checkpointer, state, stopper, session, rank)) is not None:
                    return code
    if rank.is_main:
        log.info("done: %d steps; checkpoints and metrics.jsonl in %s", state.step, session.path)
    return 0


def identity(setup: Setup) -> dict[str, Any]:
    """What a checkpoint to resume must match (utils/run/checkpointer.py)."""
    return {"trainer": "pretrain", "architecture": setup.arch,
            "settings": {k: v for k, v in setup.plan.settings.items() if k not in RUN_CONTROL_KEYS}}


if __name__ == "__main__":
    sys.exit(main())
