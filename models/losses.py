"""Losses for the recursive reasoning models: stablemax/softmax cross-entropy and the ACT loss head.

Formulas follow the reference HRM (docs/REFERENCE.md, HRM). Stablemax is from Prieto et al.,
"Grokking at the Edge of Numerical Stability" (arXiv 2501.04697).
"""

from __future__ import annotations

from typing import Callable

import torch
import torch.nn.functional as F
from torch import nn

IGNORE_LABEL_ID = -100


def _stablemax_s(x: torch.Tensor, eps: float = 1e-30) -> torch.Tensor:
    """``s(x) = 1/(1-x)`` for ``x < 0`` and ``x + 1`` otherwise (positive, grows linearly)."""
    return torch.where(x < 0, 1 / (1 - x + eps), x + 1)


def log_stablemax(x: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """``log(s(x) / sum(s(x)))`` along ``dim``: the stablemax analogue of log-softmax."""
    s_x = _stablemax_s(x)
    return torch.log(s_x / s_x.sum(dim=dim, keepdim=True))


def stablemax_dtype(device: torch.device) -> torch.dtype:
    """float64 as in the reference, except on MPS, which has no float64 (see below)."""
    return torch.float32 if device.type == "mps" else torch.float64


def stablemax_cross_entropy(logits: torch.Tensor, labels: torch.Tensor, ignore_index: int = IGNORE_LABEL_ID) -> torch.Tensor:
    """Per-position stablemax cross-entropy.

    Args:
        logits: ``[..., V]`` any float dtype.
        labels: ``[...]`` int; positions equal to ``ignore_index`` get loss 0.

    Returns:
        ``[...]`` loss in the computation dtype: float64 as in the reference, except on MPS,
        which has no float64. There it is fp32: logits of magnitude ~1e3 then lose digits
        in ``s(x)`` (relative error ~1e-7 instead of ~1e-16), which is far below the noise
        of a training step and does not change the argmax metrics.
    """
    logprobs = log_stablemax(logits.to(stablemax_dtype(logits.device)), dim=-1)
    valid = labels != ignore_index
    safe_labels = torch.where(valid, labels, 0).to(torch.int64)
    picked = torch.gather(logprobs, index=safe_labels.unsqueeze(-1), dim=-1).squeeze(-1)
    return -torch.where(valid, picked, 0)


def softmax_cross_entropy(logits: torch.Tensor, labels: torch.Tensor, ignore_index: int = IGNORE_LABEL_ID) -> torch.Tensor:
    """Per-position softmax cross-entropy in fp32. Shapes as :func:`stablemax_cross_entropy`."""
    loss = F.cross_entropy(logits.to(torch.float32).flatten(0, -2), labels.to(torch.int64).flatten(),
                           ignore_index=ignore_index, reduction="none")
    return loss.view(labels.shape)


LOSSES: dict[str, Callable[..., torch.Tensor]] = {
    "stablemax_cross_entropy": stablemax_cross_entropy,
    "softmax_cross_entropy": softmax_cross_entropy,
}


class ACTLossHead(nn.Module):
    """Wraps an ACT model; one call runs one segment and returns the loss and summed metrics.

    Loss (summed over rows; the trainer divides by ``global_batch_size``):
    ``lm_loss + 0.5 * (q_halt_loss + q_continue_loss)``, where ``lm_loss`` is each row's
    mean cross-entropy over supervised positions, ``q_halt_loss`` is BCE-with-logits of
    ``q_halt`` against "the whole sequence is right", and ``q_continue_loss`` is BCE against
    the bootstrapped target (training only).

    Metrics are sums over rows that halted this segment (divide by ``count``):
    ``accuracy`` (per-row token accuracy), ``exact_accuracy`` (whole sequence right),
    ``blank_accuracy`` (per-row accuracy on the cells to fill in: supervised positions whose
    input differs from the label, e.g. Sudoku blanks), ``q_halt_accuracy``, ``steps``;
    the losses are sums over all rows (divide by the batch size).

    ``supervision_decay`` (attribute, default 1.0: the references' loss) weighs each row's losses by the segment it
    is at (:func:`supervision_weights`, CGAR); the trainer sets it from the setting of the same name.

    ``answer_labels`` (attribute, default None: the dataset's labels, the references') chooses each row's labels
    from the segment's detached logits and the batch, ``answer_labels(logits, data) -> labels``, before the loss
    and the metrics: ``maze_targets: min_loss`` sets :func:`models.maze_targets.min_loss_labels`.
    """

    def __init__(self, model: nn.Module, loss_type: str = "stablemax_cross_entropy"):
        super().__init__()
        if loss_type not in LOSSES:
            raise ValueError(f"loss_type={loss_type!r} is unknown: use one of {sorted(LOSSES)}")
        self.model = model
        self.loss_fn = LOSSES[loss_type]
        # CGAR's hierarchical supervision weighting (see supervision_weights); 1.0 is the references' uniform loss.
        self.supervision_decay = 1.0
        self.answer_labels: Callable | None = None

    def initial_carry(self, *args, **kwargs):
        return self.model.initial_carry(*args, **kwargs)

    def forward(self, carry, batch: dict[str, torch.Tensor]):
        """Returns ``(new_carry, loss, metrics, outputs, all_halted)``; ``outputs`` holds detached logits."""
        new_carry, outputs = self.model(carry=carry, batch=batch)
        logits, q_halt = outputs["logits"], outputs["q_halt_logits"]
        weights = None
        if self.supervision_decay != 1.0:
            weights = supervision_weights(new_carry.steps, self.supervision_decay, self.model.config.halt_max_steps)
        metrics, lm_loss, q_halt_loss = puzzle_metrics(logits, q_halt, self.scored_data(logits, new_carry.current_data),
                                                       new_carry.steps, new_carry.halted, self.loss_fn, weights)
        q_continue_loss = 0
        if "target_q_continue" in outputs:
            q_continue_loss = F.binary_cross_entropy_with_logits(
                outputs["q_continue_logits"], outputs["target_q_continue"], reduction="sum")
            metrics["q_continue_loss"] = q_continue_loss.detach()

        loss = lm_loss + 0.5 * (q_halt_loss + q_continue_loss)
        detached = {"logits": logits.detach(), "q_halt_logits": q_halt.detach()}
        return new_carry, loss, metrics, detached, new_carry.halted.all()

    def scored_data(self, logits: torch.Tensor, data: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """``data`` with the labels that answers ``logits`` [B, S, V] are scored against (see ``answer_labels``)."""
        if self.answer_labels is None:
            return data
        return {**data, "labels": self.answer_labels(logits.detach(), data)}


def supervision_weights(steps: torch.Tensor, decay: float, halt_max_steps: int) -> torch.Tensor:
    """CGAR's hierarchical supervision weighting: a row at its t-th ACT segment weighs ``decay^(t-1) / Z``.

    Qasim and Zhang, arXiv 2511.08653, Sec. 3.5: ``w_t = lambda^(t-1) / Z_lambda`` (lambda = 0.7 there), early
    segments weigh more because later ones carry smaller gradients. Here ``Z`` makes the weights average 1 over
    ``t = 1..halt_max_steps``, so the loss keeps the references' scale (AdamATan2's update ignores the scale anyway).

    Args:
        steps: int [B], the segment each row has just run (1-based, as the carry counts).
        decay: lambda, in (0, 1].
        halt_max_steps: the most segments a row runs.
    Returns:
        float32 [B] weights.
    """
    z = sum(decay ** t for t in range(halt_max_steps)) / halt_max_steps
    return torch.pow(torch.tensor(decay, dtype=torch.float32, device=steps.device), (steps - 1).float()) / z


def puzzle_metrics(logits: torch.Tensor, q_halt_logits: torch.Tensor, data: dict[str, torch.Tensor],
                   steps: torch.Tensor, halted: torch.Tensor, loss_fn: Callable = stablemax_cross_entropy,
                   row_weights: torch.Tensor | None = None) -> tuple[dict[str, torch.Tensor], torch.Tensor, torch.Tensor]:
    """The metric sums of :class:`ACTLossHead` (see its docstring) and the two losses, for answers ``logits``
    [B, S, V] with halting logits ``q_halt_logits`` [B] to ``data`` (``inputs``, ``labels`` [B, S]) after ``steps``
    [B] segments; only rows with ``halted`` [B] and a supervised position count in the metrics.

    Args:
        row_weights: float [B] that scale each row's two losses (:func:`supervision_weights`); None: all 1. The
            logged ``lm_loss`` and ``q_halt_loss`` metrics stay unweighted, so runs with and without compare.
    Returns:
        ``(metrics, lm_loss, q_halt_loss)``: 0-dim tensors; the metrics detached, the losses summed over rows.
    """
    labels, inputs = data["labels"], data["inputs"]
    with torch.no_grad():
        mask = labels != IGNORE_LABEL_ID
        counts = mask.sum(-1)
        divisor = counts.clamp_min(1)
        is_correct = mask & (logits.argmax(-1) == labels)
        seq_correct = is_correct.sum(-1) == counts
        blank = mask & (inputs != labels)
        blank_counts = blank.sum(-1)
        valid = halted & (counts > 0)
        metrics = {
            "count": valid.sum(),
            "accuracy": torch.where(valid, is_correct.sum(-1) / divisor, 0).sum(),
            "exact_accuracy": (valid & seq_correct).sum(),
            "blank_accuracy": torch.where(valid, (is_correct & blank).sum(-1) / blank_counts.clamp_min(1), 0).sum(),
            "q_halt_accuracy": (valid & ((q_halt_logits >= 0) == seq_correct)).sum(),
            "steps": torch.where(valid, steps, 0).sum(),
        }
    if row_weights is None:
        lm_loss = (loss_fn(logits, labels, ignore_index=IGNORE_LABEL_ID) / divisor.unsqueeze(-1)).sum()
        q_halt_loss = F.binary_cross_entropy_with_logits(q_halt_logits, seq_correct.to(q_halt_logits.dtype),
                                                         reduction="sum")
        metrics["lm_loss"], metrics["q_halt_loss"] = lm_loss.detach(), q_halt_loss.detach()
        return metrics, lm_loss, q_halt_loss
    lm_rows = (loss_fn(logits, labels, ignore_index=IGNORE_LABEL_ID) / divisor.unsqueeze(-1)).sum(-1)
    q_rows = F.binary_cross_entropy_with_logits(q_halt_logits, seq_correct.to(q_halt_logits.dtype), reduction="none")
    metrics["lm_loss"], metrics["q_halt_loss"] = lm_rows.detach().sum(), q_rows.detach().sum()
    return metrics, (lm_rows * row_weights).sum(), (q_rows * row_weights).sum()
