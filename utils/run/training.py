"""Pieces both trainers share: metrics logging and graceful stop on SIGINT/SIGTERM."""

from __future__ import annotations

import json
import signal
from pathlib import Path
from typing import Optional

from tqdm import tqdm


class MetricsLogger:
    """Appends one JSON object per log point to ``<run_dir>/metrics.jsonl`` and mirrors scalars to TensorBoard.

    Use as a context manager, or call :meth:`close`. With ``enabled=False`` (ranks other than 0
    under torchrun) it writes nothing.
    """

    def __init__(self, run_dir: str | Path, tensorboard_subdir: str = "tensorboard", enabled: bool = True):
        self.enabled = enabled
        if not enabled:
            return
        from torch.utils.tensorboard import SummaryWriter  # slow import: only once a run starts

        run_dir = Path(run_dir)
        run_dir.mkdir(parents=True, exist_ok=True)
        self.jsonl = open(run_dir / "metrics.jsonl", "a", encoding="utf-8")
        self.tb = SummaryWriter(log_dir=str(run_dir / tensorboard_subdir))

    def log(self, step: int, values: dict[str, float]) -> None:
        """Write ``{"step": step, **values}`` as one line and each value as a TensorBoard scalar."""
        if not self.enabled:
            return
        self.jsonl.write(json.dumps({"step": step, **values}) + "\n")
        self.jsonl.flush()
        for k, v in values.items():
            self.tb.add_scalar(k, v, step)

    def close(self) -> None:
        if not self.enabled:
            return
        self.jsonl.close()
        self.tb.close()

    def __enter__(self) -> "MetricsLogger":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class GracefulStop:
    """Within ``with``, the first SIGINT/SIGTERM asks the loop to stop after the current step.

    The loop checks :attr:`requested`, writes a checkpoint and exits cleanly; a second
    Ctrl-C interrupts at once. The previous handlers come back on exit.
    """

    def __init__(self):
        self.signal_name: Optional[str] = None
        self._previous: dict = {}

    @property
    def requested(self) -> bool:
        return self.signal_name is not None

    def __enter__(self) -> "GracefulStop":
        for sig in (signal.SIGINT, signal.SIGTERM):
            self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def __exit__(self, *exc) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)

    def _handle(self, signum, _frame):
        if self.requested and signum == signal.SIGINT:
            raise KeyboardInterrupt
        self.signal_name = signal.Signals(signum).name
        tqdm.write(f"{self.signal_name} received: finishing this step, then checkpointing (Ctrl-C again to abort)")
