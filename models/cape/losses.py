"""CAPE training loss of CapeFormer and Pose Anything: heatmap MSE on the similarity map plus L1 on the
proposal and on every decoder layer.

Reference: ``TwoStageHead.get_loss`` and ``heatmap_loss`` (``flyinglynx/CapeFormer``,
``capeformer/models/keypoint_heads/two_stage_head.py``; ``PoseHead`` in ``orhir/PoseAnything`` is the same).
Per query sample m (every query of an episode is one sample) and keypoint n, with weight
w[m, n] = (query keypoint visible and its Gaussian on the heatmap) x (support token used) and
Z[m] = max(1, sum_n w[m, n]):

- heatmap: the target is the query's MSRA Gaussian heatmap (image / 4 grid, the model's sigma), resized
  bilinearly to the similarity map and divided by its maximum (+1e-10); per keypoint the mean over cells of
  (sigmoid(similarity) - target)^2; ``heatmap_loss`` = mean over m of sum_n w * mse / Z, times ``heatmap_weight``
  (2.0 in both papers' configs);
- ``proposal_loss``: mean over m of sum_n w * (|dx| + |dy|) / Z for the global soft-argmax (``initial``);
- ``l1_loss_layer{l}``: the same for decoder layer l (``refined[l]``).

The total is their sum (mmcv adds every entry whose name contains "loss"); coordinates are normalised, as the
reference's ``target / 256``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from models.cape.capeformer import HEATMAP_STRIDE, msra_heatmaps


def capeformer_loss(outputs: dict[str, torch.Tensor], batch: dict[str, torch.Tensor], heatmap_sigma: int,
                    heatmap_weight: float = 2.0) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """The reference loss (see the module docstring), in float32.

    Args:
        outputs: a :class:`~models.cape.capeformer.CapeFormer` forward's dict (``similarity`` ``[B, Q, N, h, w]``,
            ``initial`` ``[B, Q, N, 2]``, ``refined`` ``[L, B, Q, N, 2]``, ``support_mask`` ``[B, N]``).
        batch: ``query_keypoints`` ``[B, Q, N, 2]`` normalised, ``query_visible`` ``[B, Q, N]`` bool and
            ``query_image`` ``[B, Q, 3, S, S]`` (its side S sets the heatmap grid, S / 4), as
            :func:`utils.data.cape.mp100.collate_episodes` makes them.
        heatmap_sigma: the model's ``cfg.heatmap_sigma``. heatmap_weight: the heatmap term's weight.

    Returns:
        (total scalar, detached parts ``heatmap_loss`` (weighted), ``proposal_loss``, ``l1_loss_layer{l}``). A batch
        with no supervised keypoint gives 0, still connected to the graph.
    """
    gt = batch["query_keypoints"].float()
    target, on_map = msra_heatmaps(gt, batch["query_visible"].bool(), batch["query_image"].shape[-1] // HEATMAP_STRIDE,
                                   heatmap_sigma)
    weight = (on_map & outputs["support_mask"][:, None]).float().flatten(0, 1)         # [M, N]
    norm = weight.sum(-1).clamp_min(1)

    similarity = outputs["similarity"].float().flatten(0, 1)                          # [M, N, h, w]
    target = F.interpolate(target.flatten(0, 1), size=similarity.shape[-2:], mode="bilinear", align_corners=False)
    target = target / (target.amax((-2, -1), keepdim=True) + 1e-10)
    mse = ((similarity.sigmoid() - target) ** 2).mean((-2, -1))
    heatmap = ((mse * weight).sum(-1) / norm).mean()

    gt = gt.flatten(0, 1)

    def l1(points: torch.Tensor) -> torch.Tensor:
        return (((points.float().flatten(0, 1) - gt).abs().sum(-1) * weight).sum(-1) / norm).mean()

    parts = {"heatmap_loss": heatmap_weight * heatmap, "proposal_loss": l1(outputs["initial"])}
    parts.update({f"l1_loss_layer{i}": l1(layer) for i, layer in enumerate(outputs["refined"])})
    total = sum(parts.values())
    return total, {k: v.detach() for k, v in parts.items()}
