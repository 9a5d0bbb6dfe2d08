"""Model weights in the reference repositories' key format, both ways.

The reference HRM and TRM save ``model.state_dict()`` of a ``torch.compile``d ``ACTLossHead``, so
every key reads ``_orig_mod.model.inner.*`` (``model.inner.*`` when compile was off). Our
checkpoints store the weights under the same keys, so each side loads the other's.
"""

from __future__ import annotations

from typing import Optional

import torch

from utils.checkpoint import CheckpointError, safe_load

REFERENCE_KEY_PREFIX = "_orig_mod.model."
REFERENCE_PREFIXES = ("_orig_mod.", "model.")


def strip_reference_prefix(state_dict: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Map a reference checkpoint's keys (``_orig_mod.model.inner.*``) to a bare model's (``inner.*``)."""
    out = {}
    for key, value in state_dict.items():
        for prefix in REFERENCE_PREFIXES:
            if key.startswith(prefix):
                key = key[len(prefix):]
        out[key] = value
    return out


def reference_state_dict(head: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The model weights of an ACT loss head under the reference's key names (``_orig_mod.model.inner.*``)."""
    return {REFERENCE_KEY_PREFIX + k: v for k, v in head.model.state_dict().items()}


def load_model_weights(head: torch.nn.Module, state: dict[str, torch.Tensor], source: str) -> None:
    """Load weights saved by us or by the reference HRM/TRM into ``head.model``.

    Raises:
        CheckpointError: the checkpoint comes from a different architecture (missing or unexpected keys,
            or a shape mismatch), with the first differences named.
    """
    if not isinstance(state, dict) or not all(isinstance(v, torch.Tensor) for v in state.values()):
        raise CheckpointError(f"checkpoint {source} does not hold model weights (a dict of tensors)")
    state = strip_reference_prefix(state)
    own = head.model.state_dict()
    missing = sorted(set(own) - set(state))
    unexpected = sorted(set(state) - set(own))
    mismatched = [f"{k}: checkpoint {tuple(state[k].shape)} vs model {tuple(own[k].shape)}"
                  for k in own if k in state and state[k].shape != own[k].shape]
    if missing or unexpected or mismatched:
        raise CheckpointError(
            f"checkpoint {source} does not fit this architecture: missing {missing[:3]}, unexpected {unexpected[:3]}, "
            f"shape mismatches {mismatched[:3]}; use the arch.* settings the checkpoint was trained with")
    head.model.load_state_dict(state)


PUZZLE_EMBEDDING_KEY = "inner.puzzle_emb.weights"


def load_pretrained(head: torch.nn.Module, path: str) -> Optional[str]:
    """Start ``head`` from the weights in ``path`` (``load_checkpoint=``): a ``step_<N>.pt`` of ours, a bare state
    dict of the reference HRM (``checkpoint``) or TRM (``step_<N>``), keys with or without ``_orig_mod.model.``.
    ``path`` may name a file on the Hugging Face Hub (``hf://owner/repo[/path/in/repo]``, see :mod:`utils.hub`).

    When the checkpoint's puzzle-embedding table has another number of rows (fine-tuning on other puzzles),
    every row starts as the mean of its rows, as TRM's ``load_checkpoint`` does (``pretrain.py``). Unlike
    ``resume=``, nothing else (optimizer states, step, sampler) is taken over.

    Returns:
        A sentence about the resized table, or None.

    Raises:
        CheckpointError: the file does not load or cannot be fetched, or its weights do not fit this architecture.
    """
    from utils.hub import resolve_checkpoint  # only Hub users need huggingface_hub at import

    payload = safe_load(resolve_checkpoint(path))
    state = payload["model"] if isinstance(payload, dict) and isinstance(payload.get("model"), dict) else payload
    if not isinstance(state, dict):
        raise CheckpointError(f"load_checkpoint={path} holds a {type(state).__name__}, not model weights")
    state = strip_reference_prefix(state)
    note = None
    own = head.model.state_dict()
    if PUZZLE_EMBEDDING_KEY in state and PUZZLE_EMBEDDING_KEY in own \
            and state[PUZZLE_EMBEDDING_KEY].shape != own[PUZZLE_EMBEDDING_KEY].shape:
        found, expected = tuple(state[PUZZLE_EMBEDDING_KEY].shape), own[PUZZLE_EMBEDDING_KEY].shape
        state[PUZZLE_EMBEDDING_KEY] = state[PUZZLE_EMBEDDING_KEY].mean(dim=0, keepdim=True).expand(expected).contiguous()
        note = (f"the puzzle embedding of {path} has shape {found}, this dataset needs {tuple(expected)}: "
                "every row starts as the mean of the checkpoint's rows (as TRM's load_checkpoint does)")
    load_model_weights(head, state, str(path))
    return note


class ModelWeights:
    """A loss head's weights in the reference key format, as a part of the train state
    (utils/run/train_state.py)."""

    def __init__(self, head: torch.nn.Module):
        self.head = head

    def state_dict(self) -> dict[str, torch.Tensor]:
        return reference_state_dict(self.head)

    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        """Raises:
            CheckpointError: the weights do not fit this architecture."""
        load_model_weights(self.head, state, "being resumed")
