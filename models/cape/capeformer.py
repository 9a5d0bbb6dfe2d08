"""CapeFormer: a two-stage transformer for category-agnostic pose estimation.

Shi et al., "Matching is not Enough: A Two-Stage Framework for Category-Agnostic Pose Estimation", CVPR 2023,
Sec. 3 (method); reference code ``flyinglynx/CapeFormer``: ``capeformer/models/detectors/detr_two_stage.py``
(``TransformerPoseTwoStage``), ``capeformer/models/keypoint_heads/two_stage_head.py`` (``TwoStageHead``),
``capeformer/models/utils/two_stage_support_refine_transformer.py`` (encoder, ``ProposalGenerator``, decoder)
and ``capeformer/models/utils/positional_encoding.py``; settings from ``configs/mp100/capeformer/*``. Where
the code and the paper's prose differ, this module follows the code, which produced the published numbers.

An episode has K support images and Q query images of one category with N keypoints; every query is one
sample (M = B * Q samples per batch), as in the reference where each sample is a query with its own supports.

1. **Backbone**, shared by supports and queries: a ``[C, h, w]`` map per image (ResNet-50 ``layer4``: 2048 x 8 x 8).
   All images of a batch go through one call. The reference calls it once per shot and once for the queries,
   each call a batch of 16 samples; here an episode's supports can be a single image (one episode of several
   queries, as the CPU quickstart trains), and BatchNorm statistics of one image differ from the queries'.
   Only training-mode BatchNorm sees the difference; evaluation is unaffected.
2. **Support keypoint tokens** (paper: support keypoint features): each shot's map is resized bilinearly to
   the heatmap grid (image / 4, 64 x 64) and pooled with the keypoint's Gaussian target heatmap (mmpose
   "MSRA" encoding, sigma 2) normalised to sum 1; shots are averaged; a keypoint counts only when it is real
   and visible (with its Gaussian on the grid) in every shot; a linear ``query_proj`` maps C -> D.
3. **Encoder** (paper: transformer encoder refining query features and support keypoints jointly): 3 post-norm
   layers of self-attention over the concatenation [query map tokens (``input_proj``, 1x1 conv C -> D);
   support keypoint tokens]. The positional embedding (sine over the map; over the keypoint index for support
   tokens, normalised by the reference's ``max_kpt_num`` = 100) is added to the stream *at every layer*,
   value included (a deliberate change from DETR noted in the reference code).
4. **Similarity-aware proposals** (paper: first stage, matching): projected support tokens, re-weighted by a
   "dynamic pattern attention" ``(1 + tanh(MLP(f))) * f``, are dotted with the projected query map; its
   softmax over the map gives (a) a global soft-argmax, supervised by L1 (``initial``), and (b) the proposal
   fed to the decoder: the same soft-argmax restricted to the 3 x 3 cells around the arg-max (``proposals``).
5. **Decoder** (paper: second stage, proposal refinement): 3 post-norm layers of self-attention among support
   tokens, cross-attention to the encoded query map with positional embeddings *concatenated* to content
   (queries ``[tgt; pos]``, keys ``[memory; pos]``, 2D-wide attention, a linear "choker" back to D) and an FFN
   of 2048. Each layer's positions come from the current keypoint estimates through a sine embedding and a
   2-layer MLP; a per-layer MLP predicts an offset in inverse-sigmoid space.

Coordinates are normalised crop coordinates, (x, y) in [0, 1] (crop pixel = coordinate * image side), as in
``utils/data/cape/mp100.py``; feature cell j spans [j, j + 1) / w, its centre (j + 0.5) / w.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable

import torch
import torch.nn.functional as F
from torch import nn

from models.cape.backbone import CapeModelError, build_backbone

MAX_KEYPOINTS = 100  # max_kpt_num in every reference config; the support-order embedding is normalised by it
HEATMAP_STRIDE = 4   # data_cfg heatmap_size 64 for image_size 256


@dataclass
class CapeFormerConfig:
    """CapeFormer hyperparameters; the defaults are the reference's MP-100 configs.

    ``backbone`` is one of :data:`models.cape.backbone.BACKBONES`; ``backbone_stride`` (8, 16 or 32) applies to
    ResNets; ``image_size``, ``drop_path_rate`` and ``backbone_kwargs`` (extra ``timm.create_model`` arguments)
    to SwinV2, whose input size is fixed. ``heatmap_sigma`` is the Gaussian std in heatmap cells (image / 4)
    used to pool support tokens and as the similarity-map target (an integer: mmpose's window arithmetic).
    ``support_order_embedding``: add the sine embedding of the keypoint index to support tokens (CapeFormer's
    ``support_embedding_type="fixed"``; Pose Anything disables it).
    """

    backbone: str = "resnet50"
    backbone_stride: int = 32
    image_size: int = 256
    drop_path_rate: float = 0.0
    backbone_kwargs: dict = field(default_factory=dict)
    hidden_dim: int = 256
    num_heads: int = 8
    num_encoder_layers: int = 3
    num_decoder_layers: int = 3
    ffn_dim: int = 2048
    dropout: float = 0.1
    similarity_proj_dim: int = 256
    dynamic_proj_dim: int = 128
    heatmap_sigma: int = 2
    support_order_embedding: bool = True

    def __post_init__(self):
        if min(self.hidden_dim, self.num_heads, self.num_encoder_layers, self.ffn_dim) < 1 or not 0 <= self.dropout < 1:
            raise CapeModelError(f"hidden_dim ({self.hidden_dim}), num_heads ({self.num_heads}), num_encoder_layers "
                                 f"({self.num_encoder_layers}) and ffn_dim ({self.ffn_dim}) must be >= 1 and dropout "
                                 f"({self.dropout}) in [0, 1)")
        if self.hidden_dim % 4 or (2 * self.hidden_dim) % self.num_heads or self.hidden_dim % self.num_heads:
            raise CapeModelError(f"hidden_dim {self.hidden_dim} must be divisible by 4 (sine embedding) and by "
                             f"num_heads {self.num_heads}")
        if self.num_decoder_layers < 1:
            raise CapeModelError(f"num_decoder_layers must be at least 1, got {self.num_decoder_layers}")
        if not isinstance(self.heatmap_sigma, int) or self.heatmap_sigma < 1:
            raise CapeModelError(f"heatmap_sigma must be a positive integer (heatmap cells), "
                                 f"got {self.heatmap_sigma!r}")


# ----------------------------------------------------------------------------------------------------------
# Shared pieces (CapeFormer, Pose Anything and the CPU-sized configuration all use these, and only these).
# ----------------------------------------------------------------------------------------------------------

def sine_embedding(coords: torch.Tensor, num_feats: int, temperature: float = 10000.0) -> torch.Tensor:
    """DETR sine embedding of points, as ``SinePositionalEncoding.forward_coordinates`` (CapeFormer).

    Args:
        coords: ``[..., 2]`` (x, y), normally in [0, 1]; multiplied by 2*pi.
        num_feats: features per axis (the embedding has ``2 * num_feats``).

    Returns:
        ``[..., 2 * num_feats]`` float32: the y features, then the x features; per axis, pairs
        (sin(a_i), cos(a_i)) with a_i = 2*pi * c / temperature^(2i / num_feats).
    """
    dim_t = temperature ** (2 * (torch.arange(num_feats, device=coords.device) // 2) / num_feats)
    angles = coords.float()[..., None] * (2 * math.pi) / dim_t  # [..., 2, num_feats]
    paired = torch.stack((angles[..., 0::2].sin(), angles[..., 1::2].cos()), -1).flatten(-2)
    return torch.cat((paired[..., 1, :], paired[..., 0, :]), -1)


def grid_embedding(h: int, w: int, num_feats: int, device: torch.device) -> torch.Tensor:
    """Sine embedding of an h x w map, row-major ``[h*w, 2 * num_feats]`` float32.

    ``SinePositionalEncoding(normalize=True)`` over an all-valid mask: cell (i, j) sits at
    ((j + 1) / (w + 1e-6), (i + 1) / (h + 1e-6)) before the 2*pi scale.
    """
    ys = (torch.arange(h, device=device, dtype=torch.float32) + 1) / (h + 1e-6)
    xs = (torch.arange(w, device=device, dtype=torch.float32) + 1) / (w + 1e-6)
    return sine_embedding(torch.stack(torch.meshgrid(xs, ys, indexing="xy"), -1).reshape(-1, 2), num_feats)


def support_order_embedding(n: int, num_feats: int, device: torch.device) -> torch.Tensor:
    """Sine embedding of keypoint indices ``[n, 2 * num_feats]`` float32: CapeFormer's fixed support embedding,
    the positional encoding of a 1 x ``MAX_KEYPOINTS`` mask, so keypoint j sits at ((j + 1) / (100 + 1e-6),
    1 / (1 + 1e-6)) whatever the batch's padding.
    """
    xs = (torch.arange(n, device=device, dtype=torch.float32) + 1) / (MAX_KEYPOINTS + 1e-6)
    return sine_embedding(torch.stack((xs, torch.full_like(xs, 1 / (1 + 1e-6))), -1), num_feats)


def msra_heatmaps(points: torch.Tensor, visible: torch.Tensor, size: int,
                  sigma: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Gaussian target heatmaps with mmpose's "MSRA" encoding (``TopDownGenerateTargetFewShot``, CapeFormer
    ``capeformer/datasets/pipelines/top_down_transform.py``).

    The centre is rounded to a cell, mu = int(point * size + 0.5) (truncation, as Python's ``int``); the
    peak-1 Gaussian exp(-d^2 / (2 sigma^2)) is drawn on integer cells within 3 sigma of mu (a square window)
    and clipped to the map. A keypoint whose window lies wholly off the map gets weight 0 and an empty map.

    Args:
        points: ``[..., 2]`` normalised (x, y). visible: ``[...]`` bool. size: map side in cells (image / 4).
        sigma: std in cells (positive integer).

    Returns:
        (heatmaps ``[..., size, size]`` float32, weight ``[...]`` bool = visible and on the map).
    """
    mu = torch.trunc(points.float() * size + 0.5)                       # [..., 2], integer-valued
    radius = 3 * sigma
    weight = visible & ((mu - radius) < size).all(-1) & ((mu + radius + 1) >= 0).all(-1)
    cells = torch.arange(size, device=points.device, dtype=torch.float32)
    dx, dy = cells - mu[..., 0:1], cells - mu[..., 1:2]                 # [..., size]
    d2 = dy[..., :, None] ** 2 + dx[..., None, :] ** 2
    window = (dy.abs() <= radius)[..., :, None] & (dx.abs() <= radius)[..., None, :]
    heat = torch.exp(-d2 / (2 * sigma ** 2)) * (window & weight[..., None, None])
    return heat, weight


def _bilinear_matrix(out_size: int, in_size: int, device: torch.device) -> torch.Tensor:
    """``[out_size, in_size]``: 1D linear resizing with ``align_corners=False`` as a matrix (rows sum to 1)."""
    eye = torch.eye(in_size, device=device, dtype=torch.float32)[:, None]
    return F.interpolate(eye, size=out_size, mode="linear", align_corners=False)[:, 0].T


def pool_support_features(features: torch.Tensor, heatmaps: torch.Tensor) -> torch.Tensor:
    """Heatmap-weighted average of a feature map per keypoint (CapeFormer ``TwoStageHead.forward``).

    The reference resizes the map bilinearly (``align_corners=False``) to the heatmap grid and sums it under
    the heatmap normalised to sum 1 (+1e-8). Resizing is linear and separable, so the same number comes from
    pulling the weights back to the map's grid through the two 1D resize matrices; that avoids the
    ``[M, C, 64, 64]`` upsampled copy (32 MB per ResNet-50 image).

    Args:
        features: ``[M, C, h, w]``. heatmaps: ``[M, N, H, W]`` (non-negative; an all-zero map pools to zeros).

    Returns:
        ``[M, N, C]`` in the dtype of ``features``.
    """
    (h, w), (hh, ww) = features.shape[-2:], heatmaps.shape[-2:]
    weights = heatmaps.float() / (heatmaps.float().sum((-2, -1), keepdim=True) + 1e-8)
    rows, cols = _bilinear_matrix(hh, h, features.device), _bilinear_matrix(ww, w, features.device)
    pulled = torch.einsum("mnyx,yi,xj->mnij", weights, rows, cols).flatten(2)   # [M, N, h*w]
    return pulled.to(features.dtype) @ features.flatten(2).transpose(1, 2)


def soft_argmax(probs: torch.Tensor, h: int, w: int) -> torch.Tensor:
    """Expected cell centre under ``probs`` ``[..., h*w]`` (row-major), normalised: ``[..., 2]`` (x, y).

    As the reference: sum of p * (j + 0.5, i + 0.5) over cells, then divided by (w, h).
    """
    ys, xs = torch.meshgrid(torch.arange(h, device=probs.device, dtype=torch.float32) + 0.5,
                            torch.arange(w, device=probs.device, dtype=torch.float32) + 0.5, indexing="ij")
    centres = torch.stack((xs, ys), -1).reshape(-1, 2)
    return (probs @ centres) / torch.tensor([w, h], device=probs.device, dtype=torch.float32)


def local_soft_argmax(probs: torch.Tensor, h: int, w: int) -> torch.Tensor:
    """:func:`soft_argmax` of ``probs`` ``[..., h*w]`` restricted to the 3 x 3 cells around its arg-max and
    renormalised (+1e-10), as CapeFormer's ``ProposalGenerator`` (a one-hot arg-max dilated by a 3 x 3 max-pool;
    the reference reshapes that mask as (w, h), the same thing for the square maps CAPE uses).
    """
    peak = probs.argmax(-1, keepdim=True)
    rows = torch.arange(h, device=probs.device).repeat_interleave(w)
    cols = torch.arange(w, device=probs.device).repeat(h)
    near = ((rows - peak // w).abs() <= 1) & ((cols - peak % w).abs() <= 1)
    local = probs * near
    return soft_argmax(local / (local.sum(-1, keepdim=True) + 1e-10), h, w)


def inverse_sigmoid(x: torch.Tensor, eps: float = 1e-3) -> torch.Tensor:
    """log(x / (1 - x)) with x clamped to [0, 1] and both terms to at least ``eps`` (CapeFormer's form)."""
    x = x.clamp(0, 1)
    return torch.log(x.clamp(min=eps) / (1 - x).clamp(min=eps))


class MLP(nn.Sequential):
    """Linear layers with GELU between them (CapeFormer's ``MLP`` and ``TokenDecodeMLP``)."""

    def __init__(self, dims: list[int]):
        layers: list[nn.Module] = []
        for i in range(len(dims) - 1):
            layers += [nn.Linear(dims[i], dims[i + 1])] + ([nn.GELU()] if i < len(dims) - 2 else [])
        super().__init__(*layers)


class ProposalGenerator(nn.Module):
    """Similarity map and the two soft-argmax estimates from it (CapeFormer ``ProposalGenerator``; paper: the
    matching stage). Runs in float32 under autocast: soft-argmax of a bf16 map would be quantised.
    """

    def __init__(self, dim: int, proj_dim: int, dynamic_proj_dim: int):
        super().__init__()
        self.support_proj = nn.Linear(dim, proj_dim)
        self.query_proj = nn.Linear(dim, proj_dim)
        self.dynamic_proj = nn.Sequential(nn.Linear(proj_dim, dynamic_proj_dim), nn.ReLU(),
                                          nn.Linear(dynamic_proj_dim, proj_dim))

    def forward(self, query: torch.Tensor, support: torch.Tensor, h: int, w: int):
        """query ``[M, h*w, D]``, support ``[M, N, D]`` -> (similarity ``[M, N, h, w]``, global soft-argmax
        ``[M, N, 2]``, local soft-argmax ``[M, N, 2]``), all float32."""
        with torch.autocast(query.device.type, enabled=False):
            fs = self.support_proj(support.float())
            fq = self.query_proj(query.float())
            fs = (torch.tanh(self.dynamic_proj(fs)) + 1) * fs              # dynamic pattern attention
            similarity = fs @ fq.transpose(1, 2)                            # [M, N, h*w]
            probs = similarity.softmax(-1)
            return similarity.unflatten(-1, (h, w)), soft_argmax(probs, h, w), local_soft_argmax(probs, h, w)


class EncoderLayer(nn.Module):
    """Post-norm self-attention layer that adds the positional embedding to its input stream, value included
    (CapeFormer ``TransformerEncoderLayer``): x = x + pos; x = norm1(x + attn(x, x, x)); x = norm2(x + FFN(x)).
    """

    def __init__(self, dim: int, heads: int, ffn_dim: int, dropout: float):
        super().__init__()
        self.self_attn = nn.MultiheadAttention(dim, heads, dropout=dropout, batch_first=True)
        self.linear1, self.linear2 = nn.Linear(dim, ffn_dim), nn.Linear(ffn_dim, dim)
        self.norm1, self.norm2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.dropout, self.dropout1, self.dropout2 = nn.Dropout(dropout), nn.Dropout(dropout), nn.Dropout(dropout)

    def forward(self, x: torch.Tensor, pos: torch.Tensor, padding: torch.Tensor) -> torch.Tensor:
        """x ``[M, L, D]``, pos ``[1 or M, L, D]``, padding ``[M, L]`` bool (True: not attended to) -> ``[M, L, D]``."""
        x = x + pos
        x = self.norm1(x + self.dropout1(self.self_attn(x, x, x, key_padding_mask=padding, need_weights=False)[0]))
        return self.norm2(x + self.dropout2(self.linear2(self.dropout(F.relu(self.linear1(x))))))


class DecoderLayer(nn.Module):
    """Post-norm decoder layer with concatenated positions in cross-attention (CapeFormer
    ``TransformerDecoderLayer``; Pose Anything ``GraphTransformerDecoderLayer``, whose ``ffn1``/``ffn2`` are
    ``linear1``/``linear2`` here).

    self-attention among keypoint tokens (queries and keys = tokens + pos); cross-attention of width 2D with
    queries [tokens; pos] and keys [memory; memory_pos] over values memory, then ``choker`` (2D -> D); FFN
    ``linear2(relu(linear1(x)))``, where ``linear1`` is ``nn.Linear`` or, for Pose Anything, a graph layer
    called with the keypoint graph.
    """

    def __init__(self, dim: int, heads: int, ffn_dim: int, dropout: float,
                 ffn_input: Callable[[int, int], nn.Module] = nn.Linear):
        super().__init__()
        self.self_attn = nn.MultiheadAttention(dim, heads, dropout=dropout, batch_first=True)
        self.multihead_attn = nn.MultiheadAttention(2 * dim, heads, dropout=dropout, vdim=dim, batch_first=True)
        self.choker = nn.Linear(2 * dim, dim)
        self.linear1, self.linear2 = ffn_input(dim, ffn_dim), nn.Linear(ffn_dim, dim)
        self.norm1, self.norm2, self.norm3 = nn.LayerNorm(dim), nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.dropout = nn.Dropout(dropout)
        self.dropout1, self.dropout2, self.dropout3 = nn.Dropout(dropout), nn.Dropout(dropout), nn.Dropout(dropout)

    def forward(self, tgt: torch.Tensor, pos: torch.Tensor, memory: torch.Tensor, memory_pos: torch.Tensor,
                padding: torch.Tensor, graph: torch.Tensor | None = None) -> torch.Tensor:
        """tgt, pos ``[M, N, D]``; memory ``[M, hw, D]``; memory_pos ``[1, hw, D]``; padding ``[M, N]`` bool;
        graph ``[M, 2, N, N]`` for a graph ``linear1`` -> ``[M, N, D]``."""
        q = tgt + pos
        attended = self.self_attn(q, q, tgt, key_padding_mask=padding, need_weights=False)[0]
        tgt = self.norm1(tgt + self.dropout1(attended))
        keys = torch.cat((memory, memory_pos.expand(memory.shape[0], -1, -1)), -1)
        attended = self.multihead_attn(torch.cat((tgt, pos), -1), keys, memory, need_weights=False)[0]
        tgt = self.norm2(tgt + self.dropout2(self.choker(attended)))
        hidden = self.linear1(tgt) if graph is None else self.linear1(tgt, graph)
        return self.norm3(tgt + self.dropout3(self.linear2(self.dropout(F.relu(hidden)))))


class CapeFormer(nn.Module):
    """The CapeFormer network (see the module docstring); :class:`~models.cape.pose_anything.PoseAnything`
    reuses it with a graph FFN in the decoder.

    Parameter names follow the reference head (``input_proj``, ``query_proj``, ``kpt_branch``,
    ``transformer.{encoder,decoder,proposal_generator}``), with ``backbone`` for ``encoder_sample``.
    Initialisation as the reference ``init_weights``: Xavier-uniform weights and zero biases for every layer
    outside the backbone, the last layer of each ``kpt_branch`` zero (the first estimate is the proposal).

    Args:
        cfg: the hyperparameters.
        ffn_input: constructor ``(in, out) -> module`` of each decoder layer's first FFN layer.
    """

    def __init__(self, cfg: CapeFormerConfig, ffn_input: Callable[[int, int], nn.Module] = nn.Linear):
        super().__init__()
        self.cfg = cfg
        d = cfg.hidden_dim
        self.backbone = build_backbone(cfg.backbone, cfg.image_size, cfg.backbone_stride, cfg.drop_path_rate,
                                       **cfg.backbone_kwargs)
        self.input_proj = nn.Conv2d(self.backbone.channels, d, 1)
        self.query_proj = nn.Linear(self.backbone.channels, d)
        self.transformer = nn.Module()
        self.transformer.encoder = nn.Module()
        self.transformer.encoder.layers = nn.ModuleList(
            EncoderLayer(d, cfg.num_heads, cfg.ffn_dim, cfg.dropout) for _ in range(cfg.num_encoder_layers))
        self.transformer.proposal_generator = ProposalGenerator(d, cfg.similarity_proj_dim, cfg.dynamic_proj_dim)
        self.transformer.decoder = nn.Module()
        self.transformer.decoder.layers = nn.ModuleList(
            DecoderLayer(d, cfg.num_heads, cfg.ffn_dim, cfg.dropout, ffn_input) for _ in range(cfg.num_decoder_layers))
        self.transformer.decoder.norm = nn.LayerNorm(d)
        self.transformer.decoder.ref_point_head = MLP([d, d, d])
        self.kpt_branch = nn.ModuleList(MLP([d, d, d, d, 2]) for _ in range(cfg.num_decoder_layers))
        for name, m in self.named_modules():
            if not name.startswith("backbone") and isinstance(getattr(m, "weight", None), torch.Tensor) \
                    and m.weight.dim() > 1:
                nn.init.xavier_uniform_(m.weight)
                if getattr(m, "bias", None) is not None:
                    nn.init.zeros_(m.bias)
        for branch in self.kpt_branch:
            nn.init.zeros_(branch[-1].weight)
            nn.init.zeros_(branch[-1].bias)

    def keypoint_graph(self, adjacency: torch.Tensor | None, valid: torch.Tensor) -> torch.Tensor | None:
        """The decoder FFN's keypoint graph ``[B, 2, N, N]``; CapeFormer treats keypoints as a set: None."""
        return None

    def forward(self, support_image: torch.Tensor, support_keypoints: torch.Tensor, support_visible: torch.Tensor,
                query_image: torch.Tensor, keypoint_mask: torch.Tensor,
                adjacency: torch.Tensor | None = None) -> dict[str, torch.Tensor]:
        """Predict the query keypoints of B episodes.

        Args:
            support_image: ``[B, K, 3, S, S]`` ImageNet-normalised. support_keypoints: ``[B, K, N, 2]`` normalised.
            support_visible: ``[B, K, N]`` bool. query_image: ``[B, Q, 3, S, S]``.
            keypoint_mask: ``[B, N]`` bool, False on padding (categories in a batch differ in N).
            adjacency: ``[B, N, N]`` bool skeleton (used by Pose Anything; CapeFormer ignores it).

        Returns:
            ``similarity`` ``[B, Q, N, h, w]`` (logits of the matching map), ``initial`` ``[B, Q, N, 2]`` (its
            global soft-argmax), ``proposals`` ``[B, Q, N, 2]`` (local soft-argmax, the decoder's start),
            ``refined`` ``[L, B, Q, N, 2]`` (after each decoder layer; the last is the prediction), all float32
            and normalised; ``support_mask`` ``[B, N]`` bool: keypoints real and visible, with their Gaussian on
            the heatmap, in every shot (only these are predicted meaningfully and supervised).

        Raises:
            CapeModelError: more than 100 keypoints with the support-order embedding (the reference's max_kpt_num).
        """
        b, k, n = support_visible.shape
        q, size = query_image.shape[1], query_image.shape[-1]
        d = self.cfg.hidden_dim
        if self.cfg.support_order_embedding and n > MAX_KEYPOINTS:
            raise CapeModelError(f"{n} keypoints per category: CapeFormer's support-order embedding covers at most "
                             f"{MAX_KEYPOINTS} (max_kpt_num); MP-100 has at most 68")

        # One backbone call for all images, so BatchNorm statistics never come from a lone support image.
        maps = self.backbone(torch.cat((support_image.flatten(0, 1), query_image.flatten(0, 1))))
        support_maps, query_maps = maps[:b * k], maps[b * k:]

        # Support tokens: heatmap-pooled per shot, averaged over shots, kept where seen in every shot.
        heat, seen = msra_heatmaps(support_keypoints, support_visible & keypoint_mask[:, None],
                                   size // HEATMAP_STRIDE, self.cfg.heatmap_sigma)
        pooled = pool_support_features(support_maps, heat.flatten(0, 1)).view(b, k, n, -1).mean(1)
        support_mask = keypoint_mask & seen.all(1)
        tokens = self.query_proj(pooled * support_mask[..., None].to(pooled.dtype))          # [B, N, D]
        tokens = tokens[:, None].expand(b, q, n, d).reshape(b * q, n, d)
        padding = (~support_mask)[:, None].expand(b, q, n).reshape(b * q, n)

        qmap = self.input_proj(query_maps)                                                   # [M, D, h, w]
        h, w = qmap.shape[-2:]
        memory_pos = grid_embedding(h, w, d // 2, qmap.device)[None].to(tokens.dtype)       # [1, hw, D]
        order_pos = (support_order_embedding(n, d // 2, qmap.device) if self.cfg.support_order_embedding
                     else torch.zeros(n, d, device=qmap.device))[None].to(tokens.dtype)    # [1, N, D]

        # Encoder over [query map; support tokens].
        x = torch.cat((qmap.flatten(2).transpose(1, 2), tokens), 1)
        pos = torch.cat((memory_pos, order_pos), 1)
        pad = torch.cat((torch.zeros(b * q, h * w, dtype=torch.bool, device=x.device), padding), 1)
        for layer in self.transformer.encoder.layers:
            x = layer(x, pos, pad)
        memory, support = x[:, :h * w], x[:, h * w:]

        similarity, initial, proposals = self.transformer.proposal_generator(memory, support, h, w)

        # Decoder. A sample with no usable keypoint still lets keypoint 0 be attended to (no all-masked row).
        valid = support_mask.clone()
        valid[~support_mask.any(-1), 0] = True
        dec_padding = (~valid)[:, None].expand(b, q, n).reshape(b * q, n)
        graph = self.keypoint_graph(adjacency, valid)
        if graph is not None:
            graph = graph[:, None].expand(b, q, *graph.shape[1:]).flatten(0, 1)
        refined = self._refine(support, memory, memory_pos, order_pos, proposals, dec_padding, graph)
        return {"similarity": similarity.view(b, q, n, h, w), "initial": initial.view(b, q, n, 2),
                "proposals": proposals.view(b, q, n, 2), "refined": refined.view(-1, b, q, n, 2),
                "support_mask": support_mask}

    def _refine(self, tgt, memory, memory_pos, order_pos, proposals, padding, graph) -> torch.Tensor:
        """The decoder loop and coordinate heads exactly as the reference wires them: layer l starts from the
        detached estimate of layer l-1 (the first from the proposals, whose embedding keeps its gradient), and
        its output is ``sigmoid(kpt_branch[l](norm(out_l)) + inverse_sigmoid(start_l))``, where ``start_l`` (l > 0)
        is the previous layer's update computed from its un-normed output, not detached. Returns ``[L, M, N, 2]``.
        """
        decoder, num_feats = self.transformer.decoder, self.cfg.hidden_dim // 2
        estimate = proposals.detach()
        start, outputs = estimate, []
        for i, layer in enumerate(decoder.layers):
            where = sine_embedding(proposals if i == 0 else estimate, num_feats)
            pos = decoder.ref_point_head(where.to(tgt.dtype)) + order_pos
            tgt = layer(tgt, pos, memory, memory_pos, padding, graph)
            outputs.append(torch.sigmoid(self.kpt_branch[i](decoder.norm(tgt)).float() + inverse_sigmoid(start)))
            if i + 1 < len(decoder.layers):
                start = torch.sigmoid(inverse_sigmoid(estimate) + self.kpt_branch[i](tgt).float())
                estimate = start.detach()
        return torch.stack(outputs)
