"""Evaluation of a recursive reasoning model (HRM or TRM) on a puzzle test split.

Every test batch runs for exactly ``halt_max_steps`` ACT segments, as in the reference
(``sapientinc/HRM`` pretrain.py ``evaluate``), or as a test-time compute policy says (utils/eval/reasoning.py);
metrics are summed over real (non-padding) examples
on every rank, reduced onto rank 0 and divided by their count. On a dataset whose test puzzles are rated
(utils/data/puzzle_dataset.py's ratings file: Sudoku, generated or from Sudoku-Extreme's CSVs) exact accuracy is
also counted per rating band, so easy and hard puzzles can be told apart. Consumers (the ARC evaluator, the
saved-outputs collector, the pictures) see every finished batch through the reference's seam,
``update_batch(batch, preds)``, so the loop knows nothing about what they do.
"""

from __future__ import annotations

from typing import Callable, Optional, Sequence

import torch
import torch.distributed as dist
from tqdm import tqdm

from models.losses import puzzle_metrics
from utils.data.puzzle_dataset import NO_BAND, RATING_BAND_KEY, PuzzleDataset, band_name
from utils.distributed import Dist
from utils.eval.reasoning import CHECKED, TestTimeCompute, reason
from utils.eval.stats import with_interval


BAND_METRIC = "exact_accuracy"  # the metric counted per rating band
CHECKED_METRIC = "checked/"  # the prefix of the checked selection's metrics (utils/eval/reasoning.py)
CHECKED_KEYS = ("accuracy", "exact_accuracy", "blank_accuracy")  # what is reported of the checked selection


def band_keys(band: int) -> tuple[str, str]:
    """The metric names of a rating band (:func:`utils.data.puzzle_dataset.rating_bands`):
    ``(exact_accuracy/rating_<name>, count/rating_<name>)``, e.g. ``exact_accuracy/rating_16-31``."""
    return f"{BAND_METRIC}/rating_{band_name(band)}", f"count/rating_{band_name(band)}"


def parse_band_key(key: str) -> tuple[str, str] | None:
    """For a per-band accuracy name: ``(exact_accuracy[rating <name>], the name of its count)``, as reports print
    it; None for any other name."""
    metric, sep, band = key.partition("/rating_")
    if not sep or metric != BAND_METRIC:
        return None
    return f"{metric}[rating {band}]", f"count/rating_{band}"


def _add_band_sums(sums: dict, bands: torch.Tensor, answer: dict, batch: dict, loss_fn: Callable) -> None:
    """Add each band's example count and exact answers in this batch to ``sums`` (rows of ``bands`` [B] = NO_BAND
    count in none); the counts are :func:`puzzle_metrics`' own, restricted to the band's rows."""
    for band in torch.unique(bands).tolist():
        if band == NO_BAND:
            continue
        metrics, _, _ = puzzle_metrics(answer["logits"], answer["q_halt_logits"], batch, answer["segments"],
                                       bands == band, loss_fn)
        accuracy, count = band_keys(band)
        sums[accuracy] = sums[accuracy] + metrics[BAND_METRIC].to(torch.float64)
        sums[count] = sums[count] + metrics["count"].to(torch.float64)


def _band_results(reduced: dict[str, float], bands: Sequence[int]) -> dict[str, float]:
    """Pop each band's sums from ``reduced``; return, for the bands with examples, the accuracy with its 95%
    interval and the count."""
    out: dict[str, float] = {}
    for band in bands:
        accuracy, count = band_keys(band)
        right, n = reduced.pop(accuracy), reduced.pop(count)
        if n:
            out = with_interval(out | {accuracy: right / n}, accuracy, n) | {count: n}
    return out


def reduce_metrics(sums: dict[str, torch.Tensor], rank: Dist) -> Optional[dict[str, float]]:
    """Sum metric tensors across ranks onto rank 0 (float64); other ranks get None."""
    if not sums:
        return {}
    keys = sorted(sums)
    stacked = torch.stack([torch.as_tensor(sums[k], dtype=torch.float64).cpu() for k in keys])
    if rank.world_size > 1:
        dist.reduce(stacked, dst=0)
    if not rank.is_main:
        return None
    return dict(zip(keys, stacked.tolist()))


@torch.no_grad()
def evaluate_puzzles(forward: Callable, head: torch.nn.Module, loader: PuzzleDataset, device: torch.device, rank: Dist,
                     max_examples: Optional[int] = None, progress: bool = True, consumers: Sequence = (),
                     ttc: TestTimeCompute = TestTimeCompute()) -> dict[str, float]:
    """Answer every test batch under ``ttc`` (by default exactly ``halt_max_steps`` segments, as the reference);
    return metrics averaged per example (rank 0).

    Args:
        forward: the (possibly compiled) loss head to call; ``head`` is the module it wraps.
        max_examples: stop after about this many examples (whole batches); None for the whole split.
        consumers: objects with ``update_batch(batch, preds)``, called with this rank's CPU tensors of each
            finished batch (padding rows included): ``batch`` holds ``inputs``, ``labels``,
            ``puzzle_identifiers``; ``preds`` holds ``preds`` (argmax tokens, int64 [B, S]) and
            ``q_halt_logits`` (fp32 [B]), and with ``ttc.keep_segments`` ``segment_preds`` [B, T, S] and
            ``segment_q_halt`` [B, T].
        ttc: the test-time compute policy (utils/eval/reasoning.py).

    Returns:
        ``{metric: value}`` with ``accuracy``, ``exact_accuracy``, ``blank_accuracy``, ``q_halt_accuracy``,
        ``steps`` (mean segments used) and the losses, each divided by the number of real examples, and
        ``count``, that number; after ``exact_accuracy``, its 95% Wilson interval over ``count`` examples
        (``exact_accuracy_ci95_low`` / ``_high``, :func:`utils.eval.stats.wilson_interval`; it takes the
        examples as independent, which augmented copies of one puzzle are not). When the test puzzles are rated
        (``loader.rating_bands``), then for each band with examples, easiest first: ``exact_accuracy/rating_<band>``
        (e.g. ``exact_accuracy/rating_16-31``, :func:`band_keys`), its interval, and ``count/rating_<band>``.
        With checked selection (``ttc.checker``), also ``checked/accuracy``, ``checked/exact_accuracy`` (with its
        interval) and ``checked/blank_accuracy`` of the checked answers, from the same passes; the consumers see
        the model-only answers, the references' protocol.
        An empty dict on ranks other than 0.
    """
    head.eval()
    bands = getattr(loader, "rating_bands", [])
    # Every band of the split, on every rank, so that the ranks reduce the same keys.
    sums: dict[str, torch.Tensor] = {key: torch.zeros((), dtype=torch.float64, device=device)
                                     for band in bands for key in band_keys(band)}
    seen = 0
    total = loader.num_examples  # with a total, the bar shows the time left
    if max_examples is not None:  # whole batches, up to the first that reaches max_examples
        total = min(total, -(-max_examples // loader.global_batch_size) * loader.global_batch_size)
    bar = tqdm(total=total, desc="eval", unit="ex", disable=not (progress and rank.is_main), leave=False)
    for _set_name, batch, effective in loader:
        batch = {k: v.to(device) for k, v in batch.items()}
        row_bands = batch.pop(RATING_BAND_KEY, None)
        answer = reason(forward, head, batch, ttc)
        every_row = torch.ones_like(answer["segments"], dtype=torch.bool)
        scored = head.scored_data(answer["logits"], batch)
        metrics, _, _ = puzzle_metrics(answer["logits"], answer["q_halt_logits"], scored, answer["segments"],
                                       every_row, head.loss_fn)
        if CHECKED + "preds" in answer:  # checked selection, scored beside the model's own
            checked, _, _ = puzzle_metrics(answer[CHECKED + "logits"], answer[CHECKED + "q_halt_logits"],
                                           head.scored_data(answer[CHECKED + "logits"], batch),
                                           answer[CHECKED + "segments"], every_row, head.loss_fn)
            metrics |= {f"{CHECKED_METRIC}{k}": checked[k] for k in CHECKED_KEYS}
        if row_bands is not None:
            _add_band_sums(sums, row_bands, answer, scored, head.loss_fn)
        if consumers:
            preds = {k: v.cpu() for k, v in answer.items() if k != "logits" and not k.startswith(CHECKED)}
            cpu_batch = {k: v.cpu() for k, v in batch.items()}
            for consumer in consumers:
                consumer.update_batch(cpu_batch, preds)
        for k, v in metrics.items():
            sums[k] = sums.get(k, 0) + v.to(torch.float64)
        seen += effective
        bar.update(effective)
        if max_examples is not None and seen >= max_examples:
            break
    bar.close()
    head.train()
    reduced = reduce_metrics(sums, rank)
    if reduced is None:
        return {}
    by_band = _band_results(reduced, bands)
    count = max(reduced.pop("count", 0.0), 1.0)
    out = {k: v / count for k, v in reduced.items()}
    out["count"] = count
    for key in ("exact_accuracy", CHECKED_METRIC + "exact_accuracy"):
        out = with_interval(out, key, count) if key in out else out
    return out | by_band
