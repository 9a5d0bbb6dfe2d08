"""Pose Anything (GraphCape): CapeFormer with a graph decoder, so the skeleton informs the refinement.

Hirschorn and Avidan, "Pose Anything: A Graph-Based Approach for Category-Agnostic Pose Estimation", ECCV 2024
(arXiv 2311.17891), Sec. 3 (method: the graph transformer decoder); reference code ``orhir/PoseAnything``:
``models/models/utils/encoder_decoder.py`` (``GraphTransformerDecoderLayer``, ``GCNLayer``,
``adj_from_skeleton``), ``models/models/keypoint_heads/head.py`` (``PoseHead``), ``models/models/detectors/pam.py``
and the configs ``configs/1shots/graph_split*_config.py`` (SwinV2-T) and ``configs/1shot-swin/graph_*`` (SwinV2-S).

Everything but three things is CapeFormer's (:mod:`models.cape.capeformer`), as in the reference, which forks
CapeFormer's head and transformer:

- the first FFN layer of every decoder layer is a graph convolution over the keypoint skeleton
  (``graph_decoder="pre"``): :class:`GCNLayer` with the graph of :func:`gcn_adjacency`;
- the support-order embedding is disabled (zeros), and the decoder FFN is 768 wide;
- the backbone is SwinV2 (T or S) at stride 16 and the heatmaps use sigma 1.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from models.cape.backbone import CapeModelError
from models.cape.capeformer import CapeFormer, CapeFormerConfig


@dataclass
class PoseAnythingConfig(CapeFormerConfig):
    """Pose Anything's hyperparameters (``configs/1shots/graph_split1_config.py``, SwinV2-T). For SwinV2-S
    (``configs/1shot-swin/``): ``backbone="swinv2_small_window16_256"``, ``drop_path_rate=0.3``."""

    backbone: str = "swinv2_tiny_window16_256"
    drop_path_rate: float = 0.2
    ffn_dim: int = 768
    heatmap_sigma: int = 1
    support_order_embedding: bool = False


def gcn_adjacency(adjacency: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """The two-kernel graph of Pose Anything's ``adj_from_skeleton``.

    Kernel 0 is the identity on valid keypoints (the self-loop, with its own weights); kernel 1 is the
    symmetrised skeleton restricted to valid keypoints, each row divided by its degree (a keypoint without
    edges has a zero row: the reference's 0/0 -> ``nan_to_num`` -> 0; a category with an empty skeleton
    therefore falls back to the self-loop kernel alone).

    Args:
        adjacency: ``[B, N, N]`` bool skeleton edges (0-based, no self-loops; either direction suffices).
        valid: ``[B, N]`` bool, keypoints that take part (real and seen in every support).

    Returns:
        ``[B, 2, N, N]`` float32.
    """
    pair = (valid[:, :, None] & valid[:, None, :]).float()
    edges = (adjacency | adjacency.transpose(1, 2)).float() * pair
    neighbours = edges / edges.sum(-1, keepdim=True).clamp_min(1)  # a zero row stays zero
    return torch.stack((torch.diag_embed(valid.float()), neighbours), 1)


class GCNLayer(nn.Module):
    """Pose Anything's ``GCNLayer`` (kernel size 2): out[w] = ReLU(sum_k sum_v graph[k, v, w] (W_k x[v] + b_k)).

    With :func:`gcn_adjacency`, node w receives its own transform plus, from each skeleton neighbour v, that
    neighbour's transform divided by deg(v) (the row-normalised matrix is applied transposed, as the reference's
    ``einsum('bkcv,bkvw->bcw')``). The reference's 1x1 ``Conv1d(in, 2 * out)`` is the linear ``proj`` here
    (``conv.weight[:, :, 0]`` = ``proj.weight``); output channels [0, out) belong to kernel 0, [out, 2 out) to 1.

    Input x ``[M, N, in_features]``, graph ``[M, 2, N, N]``; output ``[M, N, out_features]``.
    """

    def __init__(self, in_features: int, out_features: int):
        super().__init__()
        self.out_features = out_features
        self.proj = nn.Linear(in_features, 2 * out_features)

    def forward(self, x: torch.Tensor, graph: torch.Tensor) -> torch.Tensor:
        per_kernel = self.proj(x).unflatten(-1, (2, self.out_features))             # [M, N, 2, C]
        return F.relu(torch.einsum("mkvw,mvkc->mwc", graph.to(per_kernel.dtype), per_kernel))


class PoseAnything(CapeFormer):
    """CapeFormer with :class:`GCNLayer` as each decoder layer's first FFN layer (see the module docstring).

    ``forward`` is :meth:`CapeFormer.forward`; ``adjacency`` ``[B, N, N]`` bool is required.
    """

    def __init__(self, cfg: PoseAnythingConfig):
        super().__init__(cfg, ffn_input=GCNLayer)

    def keypoint_graph(self, adjacency: torch.Tensor | None, valid: torch.Tensor) -> torch.Tensor:
        """:func:`gcn_adjacency` of the batch skeleton.

        Raises:
            CapeModelError: no adjacency was given.
        """
        if adjacency is None:
            raise CapeModelError("pose_anything needs the skeleton: pass adjacency [B, N, N] bool (batch['adjacency'] "
                             "from collate_episodes)")
        return gcn_adjacency(adjacency.bool(), valid)
