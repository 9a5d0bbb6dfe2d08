"""The training state: everything that shapes the rest of a run, saved and restored as one object.

A :class:`TrainState` holds the step and named *parts*, each of which saves itself with
``state_dict()`` / ``load_state_dict()`` (the torchtitan ``Stateful`` protocol; TRM's ``TrainState`` is the
same idea for weights only). Parts come in two kinds:

- **shared** parts are the same on every process of a torchrun job (model, optimizers, EMA, the sampler
  position, the guard's counters, the metrics window, the wall clock): rank 0 saves them;
- **per-process** parts differ per rank (the ACT carry, the RNG states): every rank's are gathered to rank 0
  and saved as the list ``ranks``, and each rank takes its own back on resume.

The checkpoint holds ``{"step": N, <part>: part.state_dict(), ..., "ranks": [{<part>: ...}, ...]}``; the
checkpointer (utils/run/checkpointer.py) adds what the trainer exports beside it (the reference-format
weights, the settings).
"""

from __future__ import annotations

import logging
import random
import time
from typing import Any, Optional, Protocol

import numpy as np
import torch
import torch.distributed as dist

from utils.distributed import Dist
from utils.checkpoint import CheckpointError

log = logging.getLogger(__name__)


class Stateful(Protocol):
    def state_dict(self) -> Any: ...

    def load_state_dict(self, state: Any) -> None: ...


class Clock:
    """Wall seconds of a whole run (settings, data, compilation, steps, evaluations), across resumes.

    ``started`` is this process's ``time.perf_counter()`` when the trainer began; a resume adds the seconds
    the run had before.
    """

    def __init__(self, started: Optional[float] = None):
        self.before = 0.0
        self.started = time.perf_counter() if started is None else started

    def elapsed_s(self) -> float:
        return self.before + time.perf_counter() - self.started

    def state_dict(self) -> dict:
        return {"elapsed_s": self.elapsed_s()}

    def load_state_dict(self, state: dict) -> None:
        self.before = float(state["elapsed_s"])


class RNGStates:
    """Every RNG that affects a run (Python, NumPy, torch CPU and CUDA), as tensors and ints, so a checkpoint
    stays loadable with ``weights_only=True``."""

    def state_dict(self) -> dict[str, Any]:
        py_version, py_state, py_gauss = random.getstate()
        np_name, np_keys, np_pos, np_has_gauss, np_gauss = np.random.get_state()
        state = {
            "python": {"version": py_version, "state": torch.tensor(py_state, dtype=torch.int64), "gauss": py_gauss},
            "numpy": {"name": np_name, "keys": torch.from_numpy(np_keys.astype(np.int64)), "pos": int(np_pos),
                      "has_gauss": int(np_has_gauss), "gauss": float(np_gauss)},
            "torch": torch.get_rng_state(),
        }
        if torch.cuda.is_available() and torch.cuda.is_initialized():
            state["cuda"] = torch.cuda.get_rng_state_all()
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        py = state["python"]
        random.setstate((py["version"], tuple(py["state"].tolist()), py["gauss"]))
        n = state["numpy"]
        np.random.set_state((n["name"], n["keys"].cpu().numpy().astype(np.uint32), n["pos"], n["has_gauss"],
                             n["gauss"]))
        torch.set_rng_state(state["torch"].cpu())
        if "cuda" in state and torch.cuda.is_available():
            torch.cuda.set_rng_state_all([s.cpu() for s in state["cuda"]])


class Value:
    """A plain value as a part (a counter, a best score): ``value`` is saved as it is."""

    def __init__(self, value: Any):
        self.value = value

    def state_dict(self) -> Any:
        return self.value

    def load_state_dict(self, state: Any) -> None:
        self.value = state


class TrainState:
    """The step and the parts of a run (see the module docstring).

    Args:
        parts: name -> shared part.
        per_process: name -> this process's own part.
        rank: this process in the job.
    """

    def __init__(self, parts: dict[str, Stateful], per_process: dict[str, Stateful], rank: Dist):
        reserved = {"step", "ranks"} & (set(parts) | set(per_process))
        if reserved:
            raise ValueError(f"part names {sorted(reserved)} are reserved")
        self.step = 0
        self.parts, self.per_process, self.rank = parts, per_process, rank

    def state_dict(self) -> Optional[dict[str, Any]]:
        """The whole state on rank 0 (None on the other ranks). Under torchrun every rank must call it: the
        per-process parts are gathered."""
        mine = {name: part.state_dict() for name, part in self.per_process.items()}
        gathered = [mine]
        if self.rank.world_size > 1:
            gathered = [None] * self.rank.world_size
            dist.gather_object(mine, gathered if self.rank.is_main else None, dst=0)
        if not self.rank.is_main:
            return None
        return {"step": self.step, **{name: part.state_dict() for name, part in self.parts.items()}, "ranks": gathered}

    def load_state_dict(self, state: dict[str, Any], source: str) -> None:
        """Put every part back as ``state`` (from :meth:`state_dict`, on any rank) holds it.

        A checkpoint written by another number of processes restores the shared parts; the per-process
        parts (ACT carry, RNG states) then start fresh, with a warning.

        Raises:
            CheckpointError: ``state`` lacks a part this run has (a weights-only file, or other settings).
        """
        missing = [name for name in ("step", *self.parts, "ranks") if name not in state]
        if missing:
            raise CheckpointError(f"{source} cannot be resumed from: it lacks {', '.join(missing)} (a weights-only "
                                  "checkpoint? start from its weights with load_checkpoint= instead)")
        for name, part in self.parts.items():
            part.load_state_dict(state[name])
        self.step = int(state["step"])
        ranks = state["ranks"]
        if len(ranks) != self.rank.world_size:
            log.warning("%s was written by %d processes, this run has %d: the ACT carry and RNG states start fresh",
                        source, len(ranks), self.rank.world_size)
            return
        for name, part in self.per_process.items():
            part.load_state_dict(ranks[self.rank.rank][name])


class Optimizers:
    """A list of optimizers as one part (their ``state_dict()`` in order)."""

    def __init__(self, optimizers: list[torch.optim.Optimizer]):
        self.optimizers = optimizers

    def state_dict(self) -> list[dict]:
        return [opt.state_dict() for opt in self.optimizers]

    def load_state_dict(self, states: list[dict]) -> None:
        """Raises:
            CheckpointError: another number of optimizers (e.g. ``freeze_weights`` differs)."""
        if len(states) != len(self.optimizers):
            raise CheckpointError(f"the checkpoint holds {len(states)} optimizer states, this run has "
                                  f"{len(self.optimizers)}")
        for opt, state in zip(self.optimizers, states):
            opt.load_state_dict(state)
