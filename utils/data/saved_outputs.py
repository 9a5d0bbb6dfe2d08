"""Saved evaluation outputs: the reference's ``step_<N>_all_preds.<rank>`` files.

TRM/HRM ``pretrain.py`` ``evaluate()``: with ``eval_save_outputs=[inputs,labels,puzzle_identifiers,
preds,q_halt_logits]``, every rank collects those keys from each test batch (``batch`` first, then
the model's ``preds``), moves them to the CPU, concatenates them along the batch axis and writes
``torch.save(dict)`` to ``<checkpoint_path>/step_<step>_all_preds.<rank>``. Padding rows of the last
batch are kept (their puzzle identifier is the blank id, 0). Typical contents:

    inputs              int32   [N, seq_len]   input tokens
    labels              int32   [N, seq_len]   label tokens, ignored positions = -100
    puzzle_identifiers  int32   [N]
    preds               int64   [N, seq_len]   argmax tokens
    q_halt_logits       float32 [N]

and, when the evaluation keeps every ACT segment's answer (utils/eval/reasoning.py, ``keep_segments``):

    segments            int32   [N]            segments the kept answer used
    segment_preds       int64   [N, T, seq_len] the answer after each segment
    segment_q_halt      float32 [N, T]         q_halt after each segment

The files hold tensors only, so they load with ``torch.load(weights_only=True)``; this module
refuses anything that needs more.
"""

from __future__ import annotations

import os
import pickle
import re
from pathlib import Path

import torch

from utils.config import SAVE_OUTPUT_KEYS
from utils.errors import UserError
from utils.outputs import unused_name, write_atomically

SAVE_KEYS = SAVE_OUTPUT_KEYS
FILE_PATTERN = re.compile(r"step_(\d+)_all_preds(?:-\d+)?\.(\d+)")  # -N: a copy kept beside a file already there


class OutputsError(UserError):
    """A saved outputs file is missing, unsafe, malformed, or does not match the others."""


def outputs_filename(step: int, rank: int) -> str:
    """The reference's file name for one evaluation and rank: ``step_<step>_all_preds.<rank>``."""
    return f"step_{step}_all_preds.{rank}"


class OutputsCollector:
    """Collects the reference's saved outputs over one evaluation and writes this rank's file.

    Usage: ``update_batch(batch, preds)`` per test batch (CPU or device tensors, padding rows included),
    then ``save(directory, step, rank)``.
    """

    def __init__(self, keys: tuple[str, ...] = SAVE_KEYS):
        self.keys = tuple(keys)
        self._parts: dict[str, list[torch.Tensor]] = {}

    def update_batch(self, batch: dict[str, torch.Tensor], preds: dict[str, torch.Tensor]) -> None:
        """Keep this batch's tensors for the wanted keys (``batch`` before ``preds``, as the reference)."""
        for collection in (batch, preds):
            for key, value in collection.items():
                if key in self.keys:
                    self._parts.setdefault(key, []).append(value.detach().cpu())

    def save(self, directory: str | os.PathLike, step: int, rank: int, keep_existing: bool = False) -> Path | None:
        """Write ``<directory>/step_<step>_all_preds.<rank>`` atomically and start over; None when nothing was collected.
        With ``keep_existing`` (a folder the command does not own), a file of that name already there is kept and
        this one is ``step_<step>_all_preds-<N>.<rank>`` (:func:`utils.outputs.unused_stem`).

        Raises:
            OutputsError: the collected keys have different numbers of rows.
            OutputWriteError: the write failed (full disk, ...); no partial file is left.
        """
        if not self._parts:
            return None
        outputs = {key: torch.cat(parts, dim=0) for key, parts in self._parts.items()}
        rows = {key: len(value) for key, value in outputs.items()}
        if len(set(rows.values())) > 1:
            raise OutputsError(f"collected outputs disagree on the number of rows: {rows}; "
                               "update_batch() must get the same rows for every key")
        name = outputs_filename(step, rank)
        if keep_existing:
            name = unused_name(directory, name)
        path = write_atomically(Path(directory) / name, lambda f: torch.save(outputs, f), "saved outputs")
        self._parts = {}
        return path


def _load_one(path: Path) -> dict[str, torch.Tensor]:
    if not path.is_file():
        raise OutputsError(f"outputs file {path} not found; it is written at each evaluation when "
                           "eval_save_outputs is set (step_<N>_all_preds.<rank> in the run directory)")
    try:
        outputs = torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as e:
        unsafe = re.search(r"Unsupported global: GLOBAL (\S+)", str(e))
        if unsafe:
            raise OutputsError(f"{path} holds a {unsafe.group(1)} object, not only tensors; "
                               "refusing to run pickled code to load it") from None
        raise OutputsError(f"{path} is not a readable torch.save file of tensors; evaluate again to rewrite it") from None
    except Exception as e:  # torch.load reports damage as many types (RuntimeError, EOFError, zip errors, ...)
        raise OutputsError(f"{path} is not a readable torch.save file ({type(e).__name__}); "
                           "it may be truncated: evaluate again to rewrite it") from None
    if not (isinstance(outputs, dict) and outputs
            and all(isinstance(k, str) and isinstance(v, torch.Tensor) for k, v in outputs.items())):
        raise OutputsError(f"{path} must hold a non-empty dict of name -> tensor, as written by evaluate()")
    rows = {key: (value.shape[0] if value.dim() else None) for key, value in outputs.items()}
    if None in rows.values() or len(set(rows.values())) > 1:
        raise OutputsError(f"{path}: tensors must share their first (row) dimension, got {rows}")
    return outputs


def _ordered(files: list[Path]) -> list[Path]:
    """Rank files of one evaluation in rank order (the order the reference gathers them); others as given."""
    parsed = [FILE_PATTERN.fullmatch(p.name) for p in files]
    if not all(parsed):
        return files
    steps = {m.group(1) for m in parsed}
    if len(steps) > 1:
        raise OutputsError(f"outputs files come from different evaluations (steps {', '.join(sorted(steps))}); "
                           "pass the rank files of one step")
    ranks = [int(m.group(2)) for m in parsed]
    if len(set(ranks)) != len(ranks):
        raise OutputsError(f"the same rank file is given twice: {', '.join(map(str, files))}")
    return [p for _, p in sorted(zip(ranks, files))]


def load_outputs(files) -> dict[str, torch.Tensor]:
    """Load saved outputs files (one per rank) and concatenate them row-wise, rank 0 first.

    Args:
        files: paths (str or PathLike), or one path.
    Returns:
        {key: CPU tensor [N_total, ...]}.
    Raises:
        OutputsError: a missing, unreadable or unsafe file (one that needs pickled code), a malformed
            one, or files that disagree on keys, dtypes or shapes, or come from different steps.
    """
    if isinstance(files, (str, os.PathLike)):
        files = [files]
    files = _ordered([Path(f) for f in files])
    if not files:
        raise OutputsError("no outputs files given")
    loaded = [_load_one(p) for p in files]
    first = loaded[0]
    for path, outputs in zip(files[1:], loaded[1:]):
        if set(outputs) != set(first):
            raise OutputsError(f"{path} holds {sorted(outputs)} but {files[0]} holds {sorted(first)}; "
                               "pass files of the same evaluation")
        for key, value in outputs.items():
            if value.dtype != first[key].dtype or value.shape[1:] != first[key].shape[1:]:
                raise OutputsError(f"{path}: '{key}' is {value.dtype} {list(value.shape)} but {files[0]} has "
                                   f"{first[key].dtype} {list(first[key].shape)}; pass files of the same evaluation")
    return {key: torch.cat([outputs[key] for outputs in loaded], dim=0) for key in first}
