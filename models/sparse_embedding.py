"""The puzzle embedding and its optimizer: sign-SGD with decoupled weight decay on touched rows.

Each puzzle identifier owns one row of an fp32 table. The table is a buffer, not a
parameter: in training only the rows of the current batch are copied into a small
``local_weights`` leaf that receives gradients, so memory and optimizer cost do not grow
with the number of puzzles (ARC has about 1M identifiers). The reference HRM
(docs/REFERENCE.md, HRM) does the same; buffer names match its state dict.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn

from models.layers import trunc_normal_init_


class CastedSparseEmbedding(nn.Module):
    """Per-puzzle embedding table ``weights`` [num_embeddings, dim] fp32, trained sparsely.

    Args:
        batch_size: the local batch size. Training batches must have exactly this many rows,
            because the gradient buffer ``local_weights`` [batch_size, dim] is preallocated.
        init_std: truncated-normal std of the table (0 gives zeros, as HRM uses).
        cast_to: dtype of the returned embeddings.

    Shapes: ids ``[B]`` int -> ``[B, dim]`` of ``cast_to``.
    """

    def __init__(self, num_embeddings: int, embedding_dim: int, batch_size: int, init_std: float, cast_to: torch.dtype):
        super().__init__()
        self.cast_to = cast_to
        self.register_buffer("weights", trunc_normal_init_(torch.empty(num_embeddings, embedding_dim), std=init_std))
        self.register_buffer("local_weights", torch.zeros(batch_size, embedding_dim, requires_grad=True), persistent=False)
        self.register_buffer("local_ids", torch.zeros(batch_size, dtype=torch.int32), persistent=False)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        if not self.training:
            return self.weights[ids].to(self.cast_to)
        if ids.shape[0] != self.local_weights.shape[0]:
            raise ValueError(
                f"puzzle embedding got a training batch of {ids.shape[0]} rows but was built for "
                f"{self.local_weights.shape[0]}: training batches must have exactly the local batch size"
            )
        with torch.no_grad():
            self.local_weights.copy_(self.weights[ids])
            self.local_ids.copy_(ids)
        return self.local_weights.to(self.cast_to)

    def _apply(self, fn, recurse=True):
        # Moving a buffer that requires grad yields a non-leaf copy whose .grad stays None;
        # make local_weights a leaf again after .to()/.cuda()/.half().
        super()._apply(fn, recurse)
        self.local_weights = self.local_weights.detach().requires_grad_(True)
        return self


class SparseEmbeddingSignSGD(torch.optim.Optimizer):
    """Sign-SGD with decoupled weight decay for :class:`CastedSparseEmbedding` tables.

    For every id touched in the (global) batch, its row gradients are summed, then
    ``w <- w * (1 - lr * weight_decay) - lr * sign(g)`` (docs/REFERENCE.md, HRM). Under
    ``torch.distributed`` the row gradients and ids are all-gathered first, so every rank
    applies the same update to its copy of the table.

    Args:
        embeddings: the :class:`CastedSparseEmbedding` modules to train.
        lr: step size (set per step by the trainer, so 0 is allowed).
        weight_decay: decoupled decay coefficient.
    """

    def __init__(self, embeddings: list[CastedSparseEmbedding], lr: float = 1e-2, weight_decay: float = 0.0):
        if lr < 0 or weight_decay < 0:
            raise ValueError(f"lr ({lr}) and weight_decay ({weight_decay}) must be >= 0")
        self.embeddings = list(embeddings)
        params = [e.local_weights for e in self.embeddings]
        super().__init__(params, dict(lr=lr, weight_decay=weight_decay))

    @torch.no_grad()
    def step(self, closure=None):
        """Apply one update to every embedding whose ``local_weights`` received a gradient."""
        if closure is not None:
            raise ValueError("SparseEmbeddingSignSGD does not take a closure")
        group = self.param_groups[0]
        for emb in self.embeddings:
            grad = emb.local_weights.grad
            if grad is None:
                continue
            sign_sgd_rows_(emb.weights, emb.local_ids, grad, group["lr"], group["weight_decay"])

    def zero_grad(self, set_to_none: bool = True):
        for emb in self.embeddings:
            emb.local_weights.grad = None


def sign_sgd_rows_(weights: torch.Tensor, ids: torch.Tensor, grad: torch.Tensor, lr: float, weight_decay: float) -> None:
    """In place on ``weights`` [N, D]: sum ``grad`` [B, D] per id in ``ids`` [B] (across ranks), then sign-SGD.

    Rows not in ``ids`` are untouched, decay included: the decay is lazy, as in the reference.
    """
    if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
        world = dist.get_world_size()
        all_grad = [torch.empty_like(grad) for _ in range(world)]
        all_ids = [torch.empty_like(ids) for _ in range(world)]
        dist.all_gather(all_grad, grad.contiguous())
        dist.all_gather(all_ids, ids.contiguous())
        grad, ids = torch.cat(all_grad), torch.cat(all_ids)
    unique_ids, inverse = ids.long().unique(return_inverse=True)
    summed = torch.zeros(len(unique_ids), grad.shape[1], dtype=grad.dtype, device=grad.device)
    summed.index_add_(0, inverse, grad)
    rows = weights[unique_ids]
    rows.mul_(1 - lr * weight_decay).add_(torch.sign(summed), alpha=-lr)
    weights[unique_ids] = rows
