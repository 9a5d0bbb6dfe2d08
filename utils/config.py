"""Typed training configs: YAML recipes under ``config/``, ``key=value`` overrides, and where each value came from.

Settings are merged in one order, each layer overriding the ones before it:

1. the defaults of :class:`PretrainConfig` (the reference ``cfg_pretrain`` values);
2. the hardware profile (``hardware=auto|<profile>``; memory-dependent knobs only, see
   :mod:`utils.hardware_optimizer`);
3. the YAML recipe: ``config/<name>.yaml`` with its Hydra-style ``defaults:`` list resolved (a plain
   name pulls in ``config/<name>.yaml``, ``{arch: hrm_v1}`` fills the ``arch`` group from
   ``config/arch/hrm_v1.yaml``, ``_self_`` marks where the file's own keys go), one layer per file;
4. the command line: ``key=value`` and ``arch.key=value``; ``arch=<name>`` swaps the recipe's
   architecture file for ``config/arch/<name>.yaml``, as Hydra does.

:func:`merge_layers` keeps, for every key, the layer that set it last, so a run can say which
layer each non-default value came from. The merged result is validated against
:class:`PretrainConfig`: an unknown key or a value of the wrong type or range is a
:class:`ConfigError` that names the key. ``arch.*`` keys are validated by the model registry
(:mod:`models`), since each architecture has its own.

Each field of :class:`PretrainConfig` carries its one-line meaning (:func:`setting`), and
``pretrain.py --help`` lists them with their types and defaults (:func:`describe_keys`).
"""

from __future__ import annotations

import copy
import dataclasses
import math
import numbers
import os
import re
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import ConfigKeyError, OmegaConfBaseException

from utils.errors import UserError

CONFIG_DIR = Path(__file__).resolve().parent.parent / "config"
Layer = tuple[str, dict]


class ConfigError(UserError):
    """A config file or override is missing, unknown, or of the wrong type or range."""


def setting(default: Any, meaning: str) -> Any:
    """A :class:`PretrainConfig` field and its one-line meaning, which ``pretrain.py --help`` shows
    (:func:`describe_keys`). A list or dict default is copied for each instance."""
    if isinstance(default, (list, dict)):
        return field(default_factory=lambda: copy.deepcopy(default), metadata={"help": meaning})
    return field(default=default, metadata={"help": meaning})


# The signals a run may take as a scheduler's early warning (Slurm and SGE send SIGUSR1 or SIGUSR2, LSF SIGUSR2, PBS
# SIGXCPU or SIGALRM by configuration); each would otherwise end the process without a checkpoint.
WARNING_SIGNALS = ("SIGUSR1", "SIGUSR2", "SIGHUP", "SIGALRM", "SIGXCPU")


@dataclass
class PretrainConfig:
    """Everything ``pretrain.py`` reads. Defaults are the reference ``cfg_pretrain`` (``sapientinc/HRM`` config/)."""

    arch: dict[str, Any] = setting(
        {"name": "hrm_v1"}, "the architecture (a registry name, see models/__init__.py), its loss and its own keys: "
        "arch=<name> picks config/arch/<name>.yaml, arch.key=value sets one key")
    data_path: str = setting(
        "data/arc-aug-1000", "the training dataset (HRM's spelling, one dataset); where data_paths is set too, "
        "the later layer wins")
    data_paths: list[str] = setting(
        [], "the training datasets (TRM's spelling, several); puzzle identifiers stay unique across them")
    data_paths_test: list[str] = setting([], "the test datasets; empty: the test splits of the training data")
    dataset_builder: Optional[dict[str, Any]] = setting(
        None, "how to build data_path when it is missing (scripts/build_sudoku_dataset.py flags without the dashes); "
        "used at the recipe's own data_path only, unless build_data=true")
    build_data: bool = setting(False, "build a missing dataset with dataset_builder at any data_path")

    global_batch_size: int = setting(768, "examples per optimizer step, summed over all processes")
    epochs: int = setting(100000, "passes over the training set: the length of the run")
    eval_interval: int = setting(10000, "epochs between evaluations; must divide epochs")
    checkpoint_every_eval: bool = setting(True, "save a checkpoint after every evaluation (else only at the end)")
    min_eval_interval: int = setting(0, "the first evaluation is after this many eval intervals (TRM)")
    eval_max_examples: Optional[int] = setting(None, "test examples per evaluation; null: the whole test split")
    first_eval_step: int = setting(
        0, "a first, quick look after this many optimizer steps: first_eval_examples test examples, the live weights, "
        "logged as first_eval/* (best.pt and the evaluations above are untouched); 0: none")
    first_eval_examples: int = setting(64, "test examples of the first_eval_step look (whole batches)")
    evaluators: Optional[list[dict[str, Any]]] = setting(
        None, "evaluators run on the test outputs ([{name: arc@ARC}], or by name: evaluators=[ARC]); "
        "null: the ARC evaluator for ARC datasets, none otherwise")
    eval_save_outputs: list[str] = setting(
        [], "test outputs saved per evaluation as step_<N>_all_preds.<rank> (the reference's files): any of inputs, "
        "labels, puzzle_identifiers, preds, q_halt_logits, and segments, segment_preds, segment_q_halt (every ACT "
        "segment's answer)")
    eval_halt_max_steps: Optional[int] = setting(
        None, "ACT segments per test puzzle (more than training used is allowed); null: arch.halt_max_steps, as the "
        "references evaluate")
    eval_early_exit: bool = setting(False, "a test puzzle stops at the first segment where its Q head says halt")
    eval_min_segments: int = setting(1, "with eval_early_exit, the fewest segments a test puzzle runs")
    eval_rollouts: int = setting(1, "answers per test puzzle (the first from the initial state, the others from it "
                                    "plus eval_noise), the one with the highest q_halt kept")
    eval_noise: float = setting(0.0, "std of the noise on the initial latent state of rollouts 2..eval_rollouts")
    eval_views: int = setting(1, "dihedral views per test puzzle (1..8, square grids without puzzle identifiers: "
                                 "Sudoku, mazes), each answered and mapped back; the answer most views agree on is kept")
    best_metric: str = setting("auto", "the evaluation metric that picks best.pt (higher is better); auto: ARC/pass@2 "
                                       "with the ARC evaluator, else exact_accuracy")

    lr: float = setting(1e-4, "the peak learning rate of the model's weights (AdamATan2), reached after warmup")
    lr_min_ratio: float = setting(1.0, "the cosine schedule's floor, a fraction of lr (1: constant after warmup)")
    lr_warmup_steps: int = setting(2000, "optimizer steps of linear warmup from 0 to lr")
    beta1: float = setting(0.9, "Adam's first-moment decay")
    beta2: float = setting(0.95, "Adam's second-moment decay")
    weight_decay: float = setting(0.1, "decoupled weight decay of the model's weights")
    puzzle_emb_weight_decay: float = setting(0.1, "decoupled weight decay of the puzzle embedding (sign-SGD)")
    puzzle_emb_lr: float = setting(1e-2, "the peak learning rate of the puzzle embedding (sign-SGD)")
    optimizer_backend: str = setting(
        "auto", "auto | native (the adam-atan2 CUDA kernel) | torch (pure-PyTorch AdamATan2) | adamw (plain AdamW)")
    depth_curriculum: list[Any] = setting(
        [], "train shallow first (CGAR, arXiv 2511.08653): [[until, H_cycles, L_cycles], ...], each stage ending at "
        "that fraction of the steps, the architecture's depth after the last, e.g. [[0.3,1,2],[0.6,2,4]]; [] (the "
        "references): full depth throughout")
    supervision_decay: float = setting(
        1.0, "weigh a row's loss at its t-th ACT segment by supervision_decay^(t-1), normalised to mean 1 (CGAR's "
        "hierarchical supervision weighting, 0.7 in the paper); 1.0 (the references): uniform")
    maze_targets: str = setting(
        "label", "label (the references): train on the dataset's marked answer | min_loss: on mazes, on whichever "
        "shortest S-G path the model's output is nearest (least loss; Nandwani et al., ICLR 2021), and score "
        "exact_accuracy as 'a shortest path'")
    ema: bool = setting(False, "evaluate and save an exponential moving average of the weights (TRM)")
    ema_rate: float = setting(0.999, "the weight the EMA keeps at each step")
    load_checkpoint: Optional[str] = setting(
        None, "start from these weights: ours, a reference HRM/TRM checkpoint, or hf://owner/repo[/path/in/repo]")
    freeze_weights: bool = setting(False, "train only the puzzle embedding (fine-tuning to new puzzles)")

    seed: int = setting(0, "seeds the initial weights and the data order")
    project_name: Optional[str] = setting(
        None, "the run's parent folder checkpoints/<project_name> (null: the dataset's folder name) and W&B project")
    run_name: Optional[str] = setting(None, "the run's folder name; null: <arch>-<date>-<time>")
    checkpoint_path: Optional[str] = setting(None, "the run directory; null: checkpoints/<project_name>/<run_name>")
    logger: str = setting("tensorboard", "tensorboard | wandb (TensorBoard plus Weights & Biases)")
    log_interval: int = setting(10, "optimizer steps between metrics.jsonl/TensorBoard points")
    keep_last_checkpoints: int = setting(3, "step_<N>.pt files kept in the run directory; 0 keeps all")
    resume: Optional[str] = setting(
        None, "continue a run: auto (the newest matching run), a run directory (its newest valid checkpoint), "
        "or a step_<N>.pt")
    warning_signal: Optional[str] = setting(
        "SIGUSR1", f"a scheduler's early warning before its SIGTERM (Slurm: --signal=USR1@90), one of "
        f"{', '.join(WARNING_SIGNALS)}: a checkpoint after the current step, then on_warning; null: not taken")
    on_warning: str = setting("checkpoint", "after warning_signal's checkpoint: checkpoint (go on) | stop (exit 128 + "
                                            "the signal, for the scheduler to requeue)")
    max_nonfinite_steps: int = setting(10, "stop after this many NaN/inf steps in a row")
    deterministic: bool = setting(
        False, "torch.use_deterministic_algorithms: bitwise-reproducible runs and resumes (slower); on CUDA only with "
               "compile=false (compiled CUDA kernels are not promised bitwise; README, Resuming and failures)")

    device: str = setting("auto", "auto | cpu | mps | cuda | cuda:N")
    hardware: Optional[str] = setting(
        None, "a hardware profile (auto, gpu_24gb, gpu_16gb, gpu_low_mem, apple_silicon, cpu) that fills "
        "global_batch_size where the recipe and the command line leave it unset; null: off")
    forward_dtype: str = setting("auto", "auto | bfloat16 | float32")
    compile: Any = setting("auto", "torch.compile: auto (CUDA; CPU with a working C++ toolchain; never MPS) | true | false")


# Keys that only steer the run (where it writes, how it logs, whether it resumes), not what it trains:
# left out of the settings fingerprint that identifies "the same run" (utils/run/run_dir.py).
RUN_CONTROL_KEYS = ("resume", "warning_signal", "on_warning", "checkpoint_path", "run_name", "project_name", "logger", "log_interval",
                    "keep_last_checkpoints", "max_nonfinite_steps", "device", "hardware", "compile", "build_data",
                    "eval_max_examples", "first_eval_step", "first_eval_examples", "evaluators", "eval_save_outputs",
                    "eval_halt_max_steps", "eval_early_exit", "eval_min_segments", "eval_rollouts", "eval_noise",
                    "eval_views", "best_metric")
EVALUATORS = {"arc@ARC": "ARC", "ARC": "ARC", "arc": "ARC"}  # TRM's names, and ours
# Every float setting: (low, high, whether high itself is excluded). The published recipes (HRM: lr 1e-4 and 7e-5,
# puzzle_emb_lr 1e-2 and 7e-5, weight_decay 0.1 to 1.0; TRM: lr 1e-4, weight_decay 1.0, ema_rate 0.999) sit well inside.
FLOAT_RANGES = {
    "lr": (0, 1, False),  # 10^4 x the published 1e-4: each AdamW step moves a weight by about lr
    "puzzle_emb_lr": (0, 1, False),  # 100 x the published 1e-2: each sign-SGD step moves an entry by exactly lr
    "weight_decay": (0, 10, False),  # 10 x the largest published (1.0); lr * weight_decay < 1: see check_ranges
    "puzzle_emb_weight_decay": (0, 10, False),  # as weight_decay, for the puzzle-embedding optimizer
    "beta1": (0, 1, True),  # Adam's moment decay: at 1 the moment never moves and bias correction divides by 0
    "beta2": (0, 1, True),  # as beta1, for the second moment
    "lr_min_ratio": (0, 1, False),  # the cosine schedule's floor, a fraction of lr
    "ema_rate": (0, 1, False),  # a convex weight: 0 copies the weights, 1 keeps the first ones
    "supervision_decay": (0.01, 1, False),  # 1 is uniform; below 0.01 the later segments get no signal at all
    "eval_noise": (0, 100, False),  # in units of the initial state's entries (std 1): 100 drowns it
}
# The keys of the saved test outputs (utils/data/saved_outputs.py), the reference's and every segment's answers.
SAVE_OUTPUT_KEYS = ("inputs", "labels", "puzzle_identifiers", "preds", "q_halt_logits", "segments", "segment_preds",
                    "segment_q_halt")


def dataset_builder_parts(spec: Any) -> tuple[str, dict[str, Any]]:
    """A ``dataset_builder`` mapping split into the kind of data it builds (its ``kind``, ``sudoku`` when it names
    none) and the builder's options (every other key; ``spec`` itself is left as it is)."""
    return spec.get("kind", "sudoku"), {key: value for key, value in spec.items() if key != "kind"}


def _load_yaml(path: Path) -> DictConfig:
    if not path.is_file():
        raise ConfigError(f"config file {path} not found")
    try:
        cfg = OmegaConf.load(path)
    except Exception as e:  # yaml.YAMLError and friends: report the file, not a parser traceback
        raise ConfigError(f"could not parse {path}: {str(e).splitlines()[0]}") from None
    if not isinstance(cfg, DictConfig):
        raise ConfigError(f"{path} must hold a mapping of keys to values")
    return cfg


def _label(path: Path) -> str:
    try:
        return str(path.relative_to(CONFIG_DIR.parent))
    except ValueError:
        return str(path)


def recipe_layers(name: str, config_dir: Path = CONFIG_DIR, groups: dict[str, str] | None = None,
                  _seen: tuple[str, ...] = ()) -> list[tuple[str, DictConfig]]:
    """The files of recipe ``name`` in merge order, each as ``(label, content)``.

    Args:
        groups: config-group choices that replace the recipe's own, e.g. ``{"arch": "trm"}``.

    Raises:
        ConfigError: a missing file or group option (the available ones are listed), a cycle, or a bad
            ``defaults`` entry.
    """
    groups = groups or {}
    if name in _seen:
        raise ConfigError(f"config {name!r} includes itself through defaults: {' -> '.join(_seen + (name,))}")
    path = config_dir / f"{name}.yaml"
    if not path.is_file():
        available = sorted(p.stem for p in config_dir.glob("*.yaml"))
        raise ConfigError(f"--config-name={name}: no {_label(path)}; available configs: {', '.join(available)}")
    own = _load_yaml(path)
    defaults = own.pop("defaults", ["_self_"])
    layers: list[tuple[str, DictConfig]] = []
    self_added = False
    for entry in defaults:
        if entry == "_self_":
            layers.append((_label(path), own))
            self_added = True
        elif isinstance(entry, str):
            layers += recipe_layers(entry, config_dir, groups, _seen + (name,))
        elif isinstance(entry, DictConfig) and len(entry) == 1:
            group, option = next(iter(entry.items()))
            option = groups.get(group, option)
            group_file = config_dir / group / f"{option}.yaml"
            if not group_file.is_file():
                available = sorted(p.stem for p in (config_dir / group).glob("*.yaml"))
                raise ConfigError(f"{group}={option}: no {_label(group_file)}; available: {', '.join(available)}")
            layers.append((_label(group_file), OmegaConf.create({group: _load_yaml(group_file)})))
        else:
            raise ConfigError(f"{path}: defaults entries must be a config name, {{group: option}} or _self_, got {entry}")
    if not self_added:
        layers.append((_label(path), own))
    return layers


def command_line_layer(overrides: list[str]) -> tuple[DictConfig, dict[str, str]]:
    """``key=value`` overrides as one layer, and the config-group choices among them (``arch=trm``).

    Raises:
        ConfigError: an item that is not ``key=value``, that OmegaConf cannot parse, or ``data_paths=[]`` (which
            names no dataset; left to the recipe's ``data_path`` it would train on a path the user never gave).
    """
    groups, dotlist = {}, []
    for item in overrides:
        if "=" not in item or item.startswith("="):
            raise ConfigError(f"override {item!r} is not key=value (e.g. lr=1e-4 or arch.hidden_size=256)")
        key, value = item.split("=", 1)
        if key == "arch" and re.fullmatch(r"[A-Za-z0-9_\-]+", value):
            groups["arch"] = value
        else:
            dotlist.append(item)
    try:
        layer = OmegaConf.from_dotlist(dotlist)
    except OmegaConfBaseException as e:
        raise ConfigError(f"bad override: {str(e).splitlines()[0]}") from None
    if layer.get("data_paths") == []:
        raise ConfigError("data_paths=[] names no dataset: give data_paths=[DIR] (or data_path=DIR)")
    return layer, groups


def leaves(node: Any, prefix: str = "") -> dict[str, Any]:
    """``{"a.b": value}`` for every leaf of nested dicts (an empty dict counts as a leaf)."""
    if isinstance(node, dict) and node:
        out: dict[str, Any] = {}
        for k, v in node.items():
            out.update(leaves(v, f"{prefix}{k}."))
        return out
    return {prefix[:-1]: node}


def merge_layers(layers: list[Layer]) -> tuple[dict, dict[str, str]]:
    """Merge nested dicts in order (later wins) and record which layer set each leaf.

    Returns:
        ``(merged, sources)``: the merged nested dict (interpolations kept as text), and
        ``{dotted key: label of the last layer that set it}``.

    Raises:
        ConfigError: two layers disagree on whether a key is a mapping or a value, or a layer leaves a value ``???``
            (to be given) and no later layer gives it.
    """
    merged = OmegaConf.create({})
    sources: dict[str, str] = {}
    # OmegaConf reads ``???`` as "missing", and a merge keeps the value under it: a value a recipe leaves to the
    # command line would silently be the default (load_checkpoint null: training from scratch).
    unset: dict[str, str] = {}
    for label, content in layers:
        try:
            merged = OmegaConf.merge(merged, content)
        except OmegaConfBaseException as e:
            raise ConfigError(f"{label}: {str(e).splitlines()[0]}") from None
        plain = OmegaConf.to_container(content, resolve=False) if isinstance(content, DictConfig) else content
        for key, value in leaves(plain).items():
            sources[key] = label
            if value == "???":
                unset[key] = label
            else:
                unset.pop(key, None)
    if unset:
        key, label = next(iter(unset.items()))
        if label == "command line":
            raise ConfigError(f"{key}=??? on the command line is OmegaConf's 'missing', not a value: give {key}=VALUE")
        raise ConfigError(f"{label} leaves {key} to the command line (???): give {key}=VALUE")
    return OmegaConf.to_container(merged, resolve=False), sources


def valid_keys(node: Any = None, prefix: str = "") -> list[str]:
    """Dotted names of every settable top-level key (``arch.*`` keys are listed per architecture)."""
    node = PretrainConfig() if node is None else node
    keys = []
    for f in dataclasses.fields(node):
        keys.append(prefix + f.name + (".*" if f.name == "arch" else ""))
    return keys


def describe_keys() -> list[str]:
    """``key  type  default  meaning`` for every setting of :class:`PretrainConfig`, in aligned columns under a
    header line (``pretrain.py --help``). ``arch.*`` is one line: its keys are the architecture's own
    (``config/arch/*.yaml``), and its default is the architecture's name."""
    hints = typing.get_type_hints(PretrainConfig)
    rows = [("key", "type", "default", "meaning")]
    for f, key in zip(dataclasses.fields(PretrainConfig), valid_keys()):
        default = f.default_factory() if f.default is dataclasses.MISSING else f.default
        shown = default["name"] if f.name == "arch" else _shown(default)
        rows.append((key, _type_name(hints[f.name]), shown, f.metadata["help"]))
    widths = [max(len(row[i]) for row in rows) for i in range(3)]
    return ["  ".join(cell.ljust(width) for cell, width in zip(row, widths)) + "  " + row[3] for row in rows]


def _type_name(hint: Any) -> str:
    """A type as the help shows it: ``int``, ``list[str]``, ``mapping``, ``str|null``."""
    args = typing.get_args(hint)
    if type(None) in args:
        return _type_name(next(a for a in args if a is not type(None))) + "|null"
    if typing.get_origin(hint) is list:
        return f"list[{_type_name(args[0])}]"
    if typing.get_origin(hint) is dict:
        return "mapping"
    return "any" if hint is Any else hint.__name__


def _shown(value: Any) -> str:
    """A default as it is typed on the command line (``null``, ``true``, ``[]``)."""
    if value is None or isinstance(value, bool):
        return {None: "null", True: "true", False: "false"}[value]
    if isinstance(value, list):
        return "[" + ",".join(_shown(v) for v in value) + "]"
    return str(value)


def build_config(merged: dict) -> PretrainConfig:
    """Validate a merged settings dict against :class:`PretrainConfig` (names, types, ranges).

    Raises:
        ConfigError: an unknown key (the valid ones are listed), an unknown evaluator, a value of the wrong type,
            or out of range.
    """
    schema = OmegaConf.structured(PretrainConfig)
    if "evaluators" in merged:
        merged = {**merged, "evaluators": named_evaluators(merged["evaluators"])}
    try:
        typed = OmegaConf.merge(schema, merged)
        OmegaConf.resolve(typed)
        cfg = OmegaConf.to_object(typed)
    except OmegaConfBaseException as e:
        key = getattr(e, "full_key", None) or "?"
        msg = str(e).splitlines()[0]
        if isinstance(e, ConfigKeyError):
            raise ConfigError(f"unknown config key {key!r}; valid keys: {', '.join(valid_keys())}") from None
        raise ConfigError(f"config key {key!r}: {msg}") from None
    check_ranges(cfg)
    return cfg


def recipe_config(name: str, overrides: list[str] = ()) -> PretrainConfig:
    """The validated settings of ``config/<name>.yaml`` with ``key=value`` overrides: defaults, the recipe's
    layers, the command line (no hardware profile: that needs a device, see pretrain.py).

    Raises:
        ConfigError: a missing recipe, a bad override, an unknown key or a bad value.
    """
    cli, groups = command_line_layer(list(overrides))
    merged, _ = merge_layers([("defaults", to_dict(PretrainConfig())), *recipe_layers(name, groups=groups),
                              ("command line", cli)])
    return build_config(merged)


def named_evaluators(evaluators: Any) -> Any:
    """``evaluators`` with each plain name (``evaluators=[ARC]``, as typed on the command line) written as the
    ``{name: ARC}`` entry of TRM's YAML; null is returned as it is.

    Raises:
        ConfigError: a single name instead of a list, or an entry that names no evaluator of ``EVALUATORS``.
    """
    if isinstance(evaluators, str):
        raise ConfigError(f"evaluators={evaluators} is not a list: write evaluators=[{evaluators}]")
    if not isinstance(evaluators, list):
        return evaluators
    entries = [{"name": e} if isinstance(e, str) else e for e in evaluators]
    for entry in entries:
        name = entry.get("name", entry) if isinstance(entry, dict) else entry
        if not (isinstance(name, str) and name in EVALUATORS):
            raise ConfigError(f"evaluators: unknown evaluator {name!r}; use one of {', '.join(EVALUATORS)}")
    return entries


def check_number(key: str, value: Any, low: float, high: float, *, high_open: bool = False,
                 flag_style: bool = False) -> None:
    """Refuse a setting that is not a finite number in ``[low, high]`` (``[low, high)`` with ``high_open``).

    Args:
        key: the setting's name, shown as ``key=value`` (a config key), or as ``--key value`` with ``flag_style``
            (a command-line flag).

    Raises:
        ConfigError: ``value`` is not a number (a bool is not one), is inf or NaN, or lies outside the range.
    """
    ok = (isinstance(value, numbers.Real) and not isinstance(value, bool) and math.isfinite(value)
          and low <= value and (value < high if high_open else value <= high))
    if not ok:
        shown = f"--{key} {value!r}" if flag_style else f"{key}={value!r}"
        interval = f"[{low:g}, {high:g}{')' if high_open else ']'}"
        raise ConfigError(f"{shown} is out of range: must be a finite number in {interval}")


def warning_signal_name(value: Optional[str], key: str) -> Optional[str]:
    """A scheduler's early-warning signal as its full name (``USR1`` and ``sigusr1`` are ``SIGUSR1``), or None for
    ``null``/``none``.

    Raises:
        ConfigError: a signal that is not one of :data:`WARNING_SIGNALS` (SIGINT and SIGTERM already stop a run).
    """
    if value is None or str(value).lower() in ("none", "null", ""):
        return None
    name = str(value).upper()
    name = name if name.startswith("SIG") else f"SIG{name}"
    if name not in WARNING_SIGNALS:
        raise ConfigError(f"{key}={value!r} is out of range: use one of {', '.join(WARNING_SIGNALS)}, or null (SIGINT "
                          "and SIGTERM already stop a run with a checkpoint)")
    return name


def _require(ok: bool, key: str, value: Any, rule: str) -> None:
    if not ok:
        raise ConfigError(f"{key}={value!r} is out of range: {rule}")


def check_ranges(cfg: PretrainConfig) -> None:
    """Values the trainer could not run with, found before anything is loaded or built.

    Raises:
        ConfigError: naming the key, its value and the allowed range.
    """
    for key in ("global_batch_size", "epochs", "eval_interval", "log_interval", "max_nonfinite_steps"):
        _require(getattr(cfg, key) >= 1, key, getattr(cfg, key), "must be at least 1")
    for key in ("lr_warmup_steps", "keep_last_checkpoints", "seed"):
        _require(getattr(cfg, key) >= 0, key, getattr(cfg, key), "must be 0 or more")
    for key, (low, high, high_open) in FLOAT_RANGES.items():
        check_number(key, getattr(cfg, key), low, high, high_open=high_open)
    for lr_key, decay_key in (("lr", "weight_decay"), ("puzzle_emb_lr", "puzzle_emb_weight_decay")):
        product = getattr(cfg, lr_key) * getattr(cfg, decay_key)
        _require(product < 1, decay_key, getattr(cfg, decay_key),
                 f"{lr_key} * {decay_key} = {product:g} must be below 1: decoupled decay multiplies every weight "
                 f"by 1 - {lr_key} * {decay_key} each step, so this would zero them or flip their sign; lower either")
    _require(cfg.epochs % cfg.eval_interval == 0, "eval_interval", cfg.eval_interval,
             f"must divide epochs ({cfg.epochs}): evaluation runs every eval_interval epochs")
    _require(cfg.eval_max_examples is None or cfg.eval_max_examples >= 1, "eval_max_examples", cfg.eval_max_examples,
             "must be at least 1, or null for the whole test split")
    _require(cfg.optimizer_backend in ("auto", "native", "torch", "adamw"), "optimizer_backend", cfg.optimizer_backend,
             "use auto, native, torch or adamw")
    _require(cfg.logger in ("tensorboard", "wandb"), "logger", cfg.logger, "use tensorboard or wandb")
    _require(cfg.maze_targets in ("label", "min_loss"), "maze_targets", cfg.maze_targets, "use label or min_loss")
    builds = dataset_builder_parts(cfg.dataset_builder)[0] if cfg.dataset_builder else None  # None: checked on loading
    if cfg.maze_targets == "min_loss" and builds not in (None, "maze"):
        raise ConfigError(f"maze_targets=min_loss chooses among a maze's shortest paths, but this recipe builds "
                          f"{builds} data: use maze_targets=label")
    cfg.warning_signal = warning_signal_name(cfg.warning_signal, "warning_signal")
    _require(cfg.on_warning in ("checkpoint", "stop"), "on_warning", cfg.on_warning, "use checkpoint or stop")
    _require(str(cfg.compile).lower() in ("auto", "true", "false"), "compile", cfg.compile, "use auto, true or false")
    cfg.compile = {"auto": "auto", "true": True, "false": False}[str(cfg.compile).lower()]
    _require(bool(cfg.data_path), "data_path", cfg.data_path, "must name a dataset directory")
    for key in ("data_paths", "data_paths_test"):
        _require(all(isinstance(p, str) and p for p in getattr(cfg, key)), key, getattr(cfg, key),
                 "must be a list of dataset directories")
    _require(cfg.min_eval_interval >= 0, "min_eval_interval", cfg.min_eval_interval, "must be 0 or more")
    _require(cfg.first_eval_step >= 0, "first_eval_step", cfg.first_eval_step, "must be 0 (none) or more")
    _require(cfg.first_eval_examples >= 1, "first_eval_examples", cfg.first_eval_examples, "must be at least 1")
    bad = [k for k in cfg.eval_save_outputs if k not in SAVE_OUTPUT_KEYS]
    _require(not bad, "eval_save_outputs", cfg.eval_save_outputs, f"use any of {', '.join(SAVE_OUTPUT_KEYS)}")
    for key in ("project_name", "run_name"):
        value = getattr(cfg, key)
        _require(value is None or (value and os.sep not in value and value not in (".", "..")), key, value,
                 "must be a plain folder name (no path separators)")
    if not isinstance(cfg.arch, dict) or not isinstance(cfg.arch.get("name"), str):
        raise ConfigError("arch must be a mapping with a name (e.g. arch=hrm_v1 or arch=trm)")


def to_dict(cfg: PretrainConfig) -> dict[str, Any]:
    """A plain dict (for checkpoints, logs and the saved ``all_config.yaml``)."""
    return OmegaConf.to_container(OmegaConf.structured(cfg), resolve=True)
