"""PCK@0.2 for CAPE, as used on MP-100 (POMNet, CapeFormer; see REFERENCE.md section 4).

A keypoint is correct when ``||pred - gt||_2 / max(bbox_w, bbox_h) < thr`` (thr = 0.2), all in the
query's original image pixels. Only keypoints visible in the query **and in every support** count.
Each query's PCK is the fraction of its counted keypoints that are correct; the score is the mean
over queries (queries with no counted keypoint are left out), reported in percent.
"""

from __future__ import annotations

import torch


def evaluation_mask(query_visible: torch.Tensor, support_visible: torch.Tensor, keypoint_mask: torch.Tensor) -> torch.Tensor:
    """Which keypoints PCK counts: visible in the query and in every support, and not padding.

    Args:
        query_visible: [B, Q, N] bool. support_visible: [B, K, N] bool. keypoint_mask: [B, N] bool (False on padding).

    Returns:
        [B, Q, N] bool.
    """
    return query_visible & support_visible.all(1, keepdim=True) & keypoint_mask[:, None]


def pck_per_query(pred: torch.Tensor, gt: torch.Tensor, bbox_size: torch.Tensor, mask: torch.Tensor,
                  thr: float = 0.2) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-query PCK.

    Args:
        pred, gt: [..., N, 2] keypoints in original image pixels.
        bbox_size: [...] max(bbox w, bbox h) of each query, in the same pixels.
        mask: [..., N] bool, the keypoints to count (see :func:`evaluation_mask`).
        thr: the threshold as a fraction of ``bbox_size``.

    Returns:
        (pck [...] float64 fraction correct among counted keypoints, 0 where none counted;
         counted [...] int64 number of counted keypoints).

    Raises:
        ValueError: shapes disagree, or a counted keypoint has a non-positive bbox size.
    """
    if pred.shape != gt.shape or pred.shape[:-1] != mask.shape or bbox_size.shape != mask.shape[:-1]:
        raise ValueError(f"pck: shapes disagree: pred {tuple(pred.shape)}, gt {tuple(gt.shape)}, "
                         f"mask {tuple(mask.shape)}, bbox_size {tuple(bbox_size.shape)}; expected [..., N, 2], [..., N, 2], [..., N], [...]")
    counted = mask.sum(-1)
    if bool(((bbox_size <= 0) & (counted > 0)).any()):
        raise ValueError("pck: a query with counted keypoints has bbox size <= 0; check its bbox")
    dist = torch.linalg.vector_norm(pred.double() - gt.double(), dim=-1) / bbox_size.double().clamp_min(1e-12)[..., None]
    correct = ((dist < thr) & mask).sum(-1)
    return correct.double() / counted.clamp_min(1).double(), counted


class PCKAccumulator:
    """Accumulates per-query PCK over evaluation batches; :meth:`value` is the mean over queries, in percent."""

    def __init__(self, thr: float = 0.2):
        self.thr = thr
        self.total = 0.0
        self.queries = 0

    def update(self, pred: torch.Tensor, gt: torch.Tensor, bbox_size: torch.Tensor, mask: torch.Tensor) -> None:
        """Add a batch (shapes as in :func:`pck_per_query`)."""
        pck, counted = pck_per_query(pred.cpu(), gt.cpu(), bbox_size.cpu(), mask.cpu(), self.thr)
        has = counted > 0
        self.total += float(pck[has].sum())
        self.queries += int(has.sum())

    def value(self) -> float:
        """Mean per-query PCK in percent (NaN before any query was counted)."""
        return 100.0 * self.total / self.queries if self.queries else float("nan")


def crop_to_original(points: torch.Tensor, crop_to_orig: torch.Tensor, image_size: int) -> torch.Tensor:
    """Map normalised crop coordinates [..., N, 2] to original pixels with per-image affines [..., 2, 3]."""
    pix = points.double() * image_size
    a = crop_to_orig.double()
    return pix @ a[..., :2].transpose(-1, -2) + a[..., None, :, 2]


def copy_support_baseline(support_keypoints: torch.Tensor, support_visible: torch.Tensor, num_queries: int) -> torch.Tensor:
    """The "copy the support keypoints" floor: every query gets the mean of the supports' keypoints.

    Args:
        support_keypoints: [B, K, N, 2] normalised crop coordinates. support_visible: [B, K, N] bool.

    Returns:
        [B, Q, N, 2] normalised crop coordinates (the mean over visible shots; 0.5 where no shot sees the keypoint).
    """
    w = support_visible.to(support_keypoints.dtype)[..., None]
    mean = (support_keypoints * w).sum(1) / w.sum(1).clamp_min(1)
    mean = torch.where(w.sum(1) > 0, mean, torch.full_like(mean, 0.5))
    return mean[:, None].expand(-1, num_queries, -1, -1)
