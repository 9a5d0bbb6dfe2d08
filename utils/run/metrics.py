"""One metrics writer for both trainers: ``metrics.jsonl``, TensorBoard, and optionally Weights & Biases.

Layout inside the run directory (the same for ``pretrain.py`` and the CAPE trainer):

    metrics.jsonl     one JSON object per log point: {"step": N, "train/...": ..., "eval/...": ...}
    tensorboard/      TensorBoard event files (scalars and pictures)
    pictures/         the same pictures as PNG files, <tag with / as _>_step_<N>.png, to open without TensorBoard

After a resume from step S, lines and events after S (written by the interrupted process after
its last checkpoint) are dropped, so the log continues from S without duplicate steps.

``logger="wandb"`` also sends everything to Weights & Biases. It works offline
(``WANDB_MODE=offline``), and without the ``wandb`` package the run says so in one line and goes
on with the local logs: wandb is never a hard dependency.
"""

from __future__ import annotations

import json
import logging
import os
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image

from utils.outputs import write_atomically

log = logging.getLogger(__name__)


def read_points(path: Path) -> list[dict[str, Any]]:
    """The points of a ``metrics.jsonl``, in file order; a blank line, or one cut off by a kill, is skipped."""
    points = []
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            points.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return points


def _truncate_after(path: Path, step: int) -> int:
    """Drop the lines of a metrics.jsonl with ``"step" > step``; returns how many were dropped."""
    if not path.is_file():
        return 0
    kept, dropped = [], 0
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            point_step = json.loads(line).get("step", 0)
        except json.JSONDecodeError:  # a line cut off by a kill: drop it
            dropped += 1
            continue
        if point_step > step:
            dropped += 1
        else:
            kept.append(line)
    if dropped:
        fd, tmp = tempfile.mkstemp(prefix=".metrics.jsonl.", suffix=".tmp", dir=path.parent)
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write("".join(line + "\n" for line in kept))
        os.replace(tmp, path)
    return dropped


class MetricsWriter:
    """Writes scalars (and pictures) of one run; a disabled writer (ranks other than 0) does nothing.

    Args:
        run_dir: the run directory.
        enabled: False on every torchrun rank but 0.
        resume_step: the step a resumed run continues from (None for a fresh run): later points are dropped.
        logger: ``"tensorboard"`` (always on) or ``"wandb"`` (TensorBoard plus Weights & Biases).
        run_id: the run's id (the W&B run id, so a resumed run continues the same W&B run).
        project: the W&B project name.
        config: the settings to record with the W&B run.
    """

    def __init__(self, run_dir: str | Path, enabled: bool = True, resume_step: int | None = None,
                 logger: str = "tensorboard", run_id: str | None = None, project: str | None = None,
                 config: dict[str, Any] | None = None):
        self.enabled = enabled
        self.wandb = None
        if not enabled:
            return
        from torch.utils.tensorboard import SummaryWriter  # slow import: only once a run starts

        run_dir = Path(run_dir)
        run_dir.mkdir(parents=True, exist_ok=True)
        self.pictures = run_dir / "pictures"
        if resume_step is not None:
            dropped = _truncate_after(run_dir / "metrics.jsonl", resume_step)
            if dropped:
                log.info("metrics.jsonl: dropped %d point(s) logged after step %d by the interrupted run", dropped, resume_step)
        self.jsonl = open(run_dir / "metrics.jsonl", "a", encoding="utf-8")
        self.tb = SummaryWriter(log_dir=str(run_dir / "tensorboard"),
                                purge_step=None if resume_step is None else resume_step + 1)
        if logger == "wandb":
            self.wandb = _start_wandb(run_dir, run_id, project, config)

    def log(self, step: int, values: dict[str, float]) -> None:
        """Write ``{"step": step, **values}`` as one line and each value as a scalar."""
        if not self.enabled:
            return
        self.jsonl.write(json.dumps({"step": step, **values}) + "\n")
        self.jsonl.flush()
        for k, v in values.items():
            self.tb.add_scalar(k, v, step)
        if self.wandb is not None:
            self.wandb.log(dict(values), step=step)

    def log_images(self, step: int, images: dict[str, Any]) -> None:
        """Send pictures (PIL images or ``[H, W, 3]`` uint8 arrays) to TensorBoard (and W&B), and write each as
        ``pictures/<tag>_step_<step>.png`` (``/`` in the tag becomes ``_``), whole or not at all.

        Raises:
            OutputWriteError: a picture could not be written (full disk); the message names the path and bytes.
        """
        if not self.enabled:
            return
        self.pictures.mkdir(exist_ok=True)
        for tag, image in images.items():
            array = np.asarray(image.convert("RGB") if hasattr(image, "convert") else image)
            write_atomically(self.pictures / f"{tag.replace('/', '_')}_step_{step}.png",
                             lambda f: Image.fromarray(array).save(f, format="PNG"), "picture")
            self.tb.add_image(tag, array, step, dataformats="HWC")
            if self.wandb is not None:
                import wandb

                self.wandb.log({tag: wandb.Image(array)}, step=step)
        self.tb.flush()

    def close(self) -> None:
        if not self.enabled:
            return
        self.jsonl.close()
        self.tb.close()
        if self.wandb is not None:
            self.wandb.finish()

    def __enter__(self) -> "MetricsWriter":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _start_wandb(run_dir: Path, run_id: str | None, project: str | None, config: dict[str, Any] | None):
    """``wandb.init`` for this run, or None (with one line) when the package is missing."""
    try:
        import wandb
    except ImportError:
        log.warning("logger=wandb: the wandb package is not installed (pip install wandb); "
                    "logging to metrics.jsonl and TensorBoard only")
        return None
    return wandb.init(project=project or "recursive-reasoning", name=run_dir.name, id=run_id, resume="allow",
                      dir=str(run_dir), config=config or {})


class MetricsWindow:
    """The per-step training metrics summed since the last log point, a part of the train state: a run resumed
    mid-window logs the same means at the next point as the uninterrupted run (the sums are saved).

    Values are added as given (0-dim tensors stay on their device, so adding costs no host sync).
    ``examples_per_s`` counts from this process's first step in the window (timing is not carried over).

    Args:
        interval: optimizer steps between log points (``log_interval``).
    """

    def __init__(self, interval: int):
        self.interval = interval
        self._reset()

    def _reset(self) -> None:
        self.sums: dict[str, Any] = {}
        self.steps = 0
        self._examples, self._since = 0, time.perf_counter()

    def add(self, values: dict[str, Any], examples: int) -> None:
        """Add one optimizer step's ``values`` (name -> number or 0-dim tensor) covering ``examples`` examples."""
        for k, v in values.items():
            self.sums[k] = self.sums.get(k, 0) + v
        self.steps += 1
        self._examples += examples

    def due(self, step: int, last_step: int) -> bool:
        """Whether update ``step`` ends a window (every ``interval`` steps, and at the last step)."""
        return self.steps > 0 and (step % self.interval == 0 or step == last_step)

    def take(self) -> tuple[dict[str, Any], int, float]:
        """``(sums, steps, examples_per_s)`` of the window, which starts again empty."""
        out = (self.sums, self.steps, self._examples / max(time.perf_counter() - self._since, 1e-9))
        self._reset()
        return out

    def state_dict(self) -> dict:
        return {"sums": {k: v.detach().cpu() if hasattr(v, "detach") else v for k, v in self.sums.items()},
                "steps": self.steps}

    def load_state_dict(self, state: dict) -> None:
        self._reset()
        self.sums, self.steps = dict(state["sums"]), int(state["steps"])
