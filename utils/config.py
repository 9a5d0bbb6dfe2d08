"""Typed training configs: YAML files under ``config/`` plus ``key=value`` overrides.

A config file may start with a Hydra-style ``defaults:`` list: a plain name pulls in
``config/<name>.yaml`` (inheritance), and ``{arch: hrm_v1}`` fills the ``arch`` group from
``config/arch/hrm_v1.yaml``; ``_self_`` marks where the file's own keys are merged. The
result is validated against :class:`PretrainConfig`, so an unknown key or a value of the
wrong type is an error that names the key and lists the valid ones.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import ConfigKeyError, OmegaConfBaseException

CONFIG_DIR = Path(__file__).resolve().parent.parent / "config"


class ConfigError(ValueError):
    """A config file or override is missing, unknown, or of the wrong type."""


@dataclass
class LossConfig:
    name: str = "losses@ACTLossHead"
    loss_type: str = "stablemax_cross_entropy"


@dataclass
class ArchConfig:
    """HRM architecture keys (reference names). Dataset-dependent sizes are filled in by the trainer."""

    name: str = "hrm.hrm_act_v1@HierarchicalReasoningModel_ACTV1"
    loss: LossConfig = field(default_factory=LossConfig)
    halt_exploration_prob: float = 0.1
    halt_max_steps: int = 16
    H_cycles: int = 2
    L_cycles: int = 2
    H_layers: int = 4
    L_layers: int = 4
    hidden_size: int = 512
    num_heads: int = 8
    expansion: float = 4.0
    puzzle_emb_ndim: int = 512
    pos_encodings: str = "rope"
    rms_norm_eps: float = 1e-5
    rope_theta: float = 10000.0


@dataclass
class PretrainConfig:
    """Everything ``pretrain.py`` reads. Defaults are the reference ``cfg_pretrain``."""

    arch: ArchConfig = field(default_factory=ArchConfig)
    data_path: str = "data/arc-aug-1000"
    # Builder options for a dataset generated on first use when data_path is missing
    # (a dict of scripts/build_sudoku_dataset.py flags without the dashes); null: never build.
    dataset_builder: Optional[dict[str, Any]] = None

    global_batch_size: int = 768
    epochs: int = 100000
    eval_interval: int = 10000
    checkpoint_every_eval: bool = True
    eval_max_examples: Optional[int] = None  # null: the whole test split

    lr: float = 1e-4
    lr_min_ratio: float = 1.0
    lr_warmup_steps: int = 2000
    beta1: float = 0.9
    beta2: float = 0.95
    weight_decay: float = 0.1
    puzzle_emb_weight_decay: float = 0.1
    puzzle_emb_lr: float = 1e-2
    optimizer_backend: str = "auto"  # auto | native | torch | adamw

    seed: int = 0
    project_name: Optional[str] = None
    run_name: Optional[str] = None
    checkpoint_path: Optional[str] = None
    log_interval: int = 10  # optimizer steps between metrics.jsonl/TensorBoard points
    keep_last_checkpoints: int = 3  # 0 keeps all
    resume: Optional[str] = None  # a step_<N>.pt, a run directory (its newest valid checkpoint), or auto
    max_nonfinite_steps: int = 10  # stop after this many NaN/inf steps in a row
    deterministic: bool = False  # torch.use_deterministic_algorithms: bitwise-reproducible runs (slower)

    device: str = "auto"
    # A hardware profile (auto, gpu_24gb, gpu_16gb, gpu_low_mem, apple_silicon, cpu) sets
    # global_batch_size and compile for the machine; key=value overrides still win. null: off.
    hardware: Optional[str] = None
    forward_dtype: str = "auto"  # auto | bfloat16 | float32
    compile: bool = True


def _load_yaml(path: Path) -> DictConfig:
    if not path.is_file():
        raise ConfigError(f"config file {path} not found")
    try:
        cfg = OmegaConf.load(path)
    except Exception as e:  # yaml.YAMLError and friends: report the file, not a parser traceback
        raise ConfigError(f"could not parse {path}: {e}") from e
    if not isinstance(cfg, DictConfig):
        raise ConfigError(f"{path} must hold a mapping of keys to values")
    return cfg


def compose(name: str, config_dir: Path = CONFIG_DIR, _seen: tuple[str, ...] = ()) -> DictConfig:
    """Load ``config_dir/<name>.yaml`` with its ``defaults:`` list resolved (unvalidated)."""
    if name in _seen:
        raise ConfigError(f"config {name!r} includes itself through defaults: {' -> '.join(_seen + (name,))}")
    available = sorted(p.stem for p in config_dir.glob("*.yaml"))
    path = config_dir / f"{name}.yaml"
    if not path.is_file():
        raise ConfigError(f"--config-name={name}: no {path}; available configs: {', '.join(available)}")
    own = _load_yaml(path)
    defaults = own.pop("defaults", ["_self_"])
    merged = OmegaConf.create({})
    self_merged = False
    for entry in defaults:
        if entry == "_self_":
            merged = OmegaConf.merge(merged, own)
            self_merged = True
        elif isinstance(entry, str):
            merged = OmegaConf.merge(merged, compose(entry, config_dir, _seen + (name,)))
        elif isinstance(entry, DictConfig) and len(entry) == 1:
            group, option = next(iter(entry.items()))
            merged = OmegaConf.merge(merged, {group: _load_yaml(config_dir / group / f"{option}.yaml")})
        else:
            raise ConfigError(f"{path}: defaults entries must be a config name, {{group: option}} or _self_, got {entry}")
    if not self_merged:
        merged = OmegaConf.merge(merged, own)
    return merged


def valid_keys(node: Any = None, prefix: str = "") -> list[str]:
    """Dotted names of every settable key, e.g. ``lr``, ``arch.hidden_size``."""
    node = PretrainConfig() if node is None else node
    keys = []
    for f in dataclasses.fields(node):
        value = getattr(node, f.name)
        if dataclasses.is_dataclass(value):
            keys.extend(valid_keys(value, f"{prefix}{f.name}."))
        else:
            keys.append(prefix + f.name)
    return keys


def load_config(name: str, overrides: list[str] = (), config_dir: Path = CONFIG_DIR) -> PretrainConfig:
    """Compose ``name``, apply ``key=value`` overrides and validate against :class:`PretrainConfig`.

    Raises:
        ConfigError: a missing file, a malformed override, an unknown key (the message lists
            the valid keys) or a value of the wrong type.
    """
    cfg = compose(name, config_dir)
    for item in overrides:
        if "=" not in item or item.startswith("="):
            raise ConfigError(f"override {item!r} is not key=value (e.g. lr=1e-4 or arch.hidden_size=256)")
    try:
        cfg = OmegaConf.merge(cfg, OmegaConf.from_dotlist(list(overrides)))
    except OmegaConfBaseException as e:
        raise ConfigError(f"bad override: {e}") from e
    schema = OmegaConf.structured(PretrainConfig)
    try:
        typed = OmegaConf.merge(schema, cfg)
        OmegaConf.resolve(typed)
        return OmegaConf.to_object(typed)
    except OmegaConfBaseException as e:
        key = getattr(e, "full_key", None) or "?"
        msg = str(e).splitlines()[0]
        if isinstance(e, ConfigKeyError):
            raise ConfigError(f"unknown config key {key!r}; valid keys: {', '.join(valid_keys())}") from e
        raise ConfigError(f"config key {key!r}: {msg}") from e


def to_dict(cfg: PretrainConfig) -> dict[str, Any]:
    """A plain dict (for checkpoints, logs and the saved ``all_config.yaml``)."""
    return OmegaConf.to_container(OmegaConf.structured(cfg), resolve=True)
