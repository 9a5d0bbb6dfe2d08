"""CAPE training losses (CapeFormer recipe): heatmap MSE plus L1 on the initial and every refined stage.

Only keypoints that are real (not padding), visible in the query and seen by at least one
support (so they have a prototype) are supervised.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from models.cape.model import cell_centres


def supervised_mask(query_visible: torch.Tensor, support_visible: torch.Tensor, keypoint_mask: torch.Tensor) -> torch.Tensor:
    """[B, Q, N] bool: query-visible, support-seen (in any shot), non-padding keypoints.

    Args: query_visible [B, Q, N] bool, support_visible [B, K, N] bool, keypoint_mask [B, N] bool.
    """
    return query_visible & support_visible.any(1, keepdim=True) & keypoint_mask[:, None]


def gaussian_target(points: torch.Tensor, h: int, w: int, sigma: float) -> torch.Tensor:
    """Unnormalised Gaussians (peak 1) centred on normalised points [..., 2] -> [..., h, w]; ``sigma`` in cells."""
    centres = cell_centres(h, w, points.device)
    scale = torch.tensor([w, h], device=points.device, dtype=torch.float32)
    dist2 = (((points.float()[..., None, :] - centres) * scale) ** 2).sum(-1)
    return torch.exp(-dist2 / (2 * sigma ** 2)).unflatten(-1, (h, w))


def cape_loss(outputs: dict[str, torch.Tensor], query_keypoints: torch.Tensor, mask: torch.Tensor,
              heatmap_weight: float = 0.2, heatmap_sigma: float = 1.0) -> tuple[torch.Tensor, dict[str, float]]:
    """Total loss ``heatmap_weight * heatmap + L1(initial) + sum_l L1(refined_l)``.

    ``heatmap`` is, per supervised keypoint, the sum over cells of (sigmoid(logit) - target)^2 with a
    peak-1 Gaussian target of std ``heatmap_sigma`` cells (a per-keypoint sum, so its scale does not
    depend on the map size), averaged over keypoints. Each L1 is the mean absolute error of x and y in
    normalised coordinates over supervised keypoints.

    Args:
        outputs: :class:`~models.cape.model.CapeModel` outputs (``heatmap_logits`` [B, Q, N, h, w],
            ``initial`` [B, Q, N, 2], ``refined`` [L, B, Q, N, 2]).
        query_keypoints: [B, Q, N, 2] normalised ground truth. mask: [B, Q, N] bool (see :func:`supervised_mask`).

    Returns:
        (scalar float32 loss, dict of detached scalar components: ``heatmap``, ``l1_initial``, ``l1_refined`` (last layer)).
        With no supervised keypoint the loss is 0 (still connected to the graph).
    """
    count = mask.sum().clamp_min(1)
    m = mask.float()
    logits = outputs["heatmap_logits"].float()
    target = gaussian_target(query_keypoints, *logits.shape[-2:], heatmap_sigma)
    hm = ((torch.sigmoid(logits) - target) ** 2).sum((-2, -1))
    heatmap = (hm * m).sum() / count

    def l1(pred: torch.Tensor) -> torch.Tensor:
        return (F.l1_loss(pred.float(), query_keypoints.float(), reduction="none").mean(-1) * m).sum() / count

    l1_initial = l1(outputs["initial"])
    l1_refined = [l1(p) for p in outputs["refined"]]
    total = heatmap_weight * heatmap + l1_initial + sum(l1_refined)
    parts = {"heatmap": heatmap.detach(), "l1_initial": l1_initial.detach(), "l1_refined": l1_refined[-1].detach()}
    return total, parts
