"""The resolved plan of a run: its settings, where each came from, and every runtime decision, taken once.

A trainer resolves its plan before anything heavy happens (config layers, device, precision,
compile, hardware profile, world size), logs it, writes it to ``<run_dir>/plan.yaml``, and from
then on reads only the plan. Nothing later asks the machine again.
"""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Optional

import torch
from omegaconf import OmegaConf

from utils.config import Layer, leaves, merge_layers
from utils.device import describe, select_device
from utils.distributed import Dist
from utils.threads import threads_and_reason

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Decision:
    """One runtime choice (e.g. the device) and the sentence that says why."""

    value: Any
    reason: str


@dataclass
class Plan:
    """What a run will do: ``settings`` (plain, JSON-able), ``sources`` (dotted key -> the layer that set
    it), ``decisions`` (name -> :class:`Decision`), and ``defaults`` (with ``baseline_layers``) to tell which
    settings were changed."""

    settings: dict[str, Any]
    sources: dict[str, str]
    decisions: dict[str, Decision] = field(default_factory=dict)
    defaults: dict[str, Any] = field(default_factory=dict)
    baseline_layers: tuple[str, ...] = ("defaults",)

    def changed(self) -> dict[str, tuple[Any, str]]:
        """Settings that differ from the defaults: ``{dotted key: (value, layer)}``. Values set only by a
        baseline layer (e.g. an architecture's own file) count as defaults."""
        base = leaves(self.defaults)
        out = {}
        for key, value in leaves(self.settings).items():
            layer = self.sources.get(key, "defaults")
            if (key not in base or base[key] != value) and not layer.startswith(self.baseline_layers):
                out[key] = (value, layer)
        return out

    def log(self) -> None:
        """Log the decisions, then each changed setting with the layer it came from."""
        for name, d in self.decisions.items():
            log.info("%s: %s (%s)", name, d.value, d.reason)
        by_layer: dict[str, list[str]] = {}
        for key, (value, layer) in self.changed().items():
            by_layer.setdefault(layer, []).append(f"{key}={value}")
        for layer, items in by_layer.items():
            log.info("settings from %s: %s", layer, ", ".join(items))

    def save(self, path: Path) -> None:
        """Write the plan as YAML (settings, the layer of each changed setting, decisions)."""
        doc = {"settings": self.settings,
               "changed": {k: {"value": v, "from": layer} for k, (v, layer) in self.changed().items()},
               "decisions": {k: dataclasses.asdict(d) | {"value": str(d.value)} for k, d in self.decisions.items()}}
        path.write_text(OmegaConf.to_yaml(OmegaConf.create(doc)), encoding="utf-8")


def layered_settings(base: list[Layer], top: list[Layer], rank: Dist, device_setting: Callable[[dict], str],
                     profile: Callable[[dict, torch.device], Optional[tuple[str, dict, str]]]
                     ) -> tuple[dict, dict[str, str], list[str], torch.device, dict[str, Decision]]:
    """Merge settings in the one order both trainers use: ``base`` layers (defaults), the hardware profile, ``top``
    layers (recipe, command line), each overriding the ones before it.

    The profile depends on the device, and the device on the settings, so this takes two passes: ``base + top``
    merged tell the device (``device_setting``; under torchrun with NCCL, this rank's GPU), then ``profile``
    gives ``(name, knobs, reason)`` for it (or None for no profile), and its knobs are merged in their place.

    Returns:
        ``(merged, sources, layer labels in order, device, decisions)``, the decisions holding the device and the
        hardware profile, each with its reason.

    Raises:
        ConfigError, DeviceError: a bad setting or device, in one line.
    """
    prelim, _ = merge_layers(base + top)
    choice = select_device(f"cuda:{rank.local_rank}" if rank.uses_nccl else device_setting(prelim),
                           deterministic=bool(prelim.get("deterministic") or prelim.get("cudnn_deterministic")))
    decisions = {"device": Decision(f"{choice.device} - {describe(choice.device)}", choice.reason),
                 "threads": Decision(*threads_and_reason())}
    found = profile(prelim, choice.device)
    middle = []
    if found is not None:
        name, knobs, reason = found
        middle = [(f"hardware profile {name}", knobs)]
        decisions["hardware profile"] = Decision(name, reason)
    layers = base + middle + top
    merged, sources = merge_layers(layers)
    return merged, sources, [label for label, _ in layers], choice.device, decisions
