"""HRM: the Hierarchical Reasoning Model with adaptive computation time (ACT), version 1.

Wang et al., "Hierarchical Reasoning Model", arXiv 2506.21734. Two recurrent transformer
modules run at different speeds: a slow high-level module ``H`` and a fast low-level
module ``L``. One ACT *segment* runs ``H_cycles x L_cycles`` updates, of which only the
last L and last H update carry gradients (the "1-step gradient"). A Q-head decides after
each segment whether to halt; it is trained by Q-learning. Construction, parameter names
and initialisation match the reference implementation (REFERENCE.md §1), so its
checkpoints load into :class:`HierarchicalReasoningModel_ACTV1` after stripping the
``_orig_mod.model.`` prefix (see :func:`models.checkpoints.strip_reference_prefix`).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field

import torch
from torch import nn

from models.layers import Attention, CastedEmbedding, CastedLinear, CosSin, RotaryEmbedding, SwiGLU, rms_norm, trunc_normal_init_
from models.sparse_embedding import CastedSparseEmbedding


@dataclass
class HierarchicalReasoningModel_ACTV1Config:
    """Architecture hyperparameters; the names are the reference's config keys.

    ``batch_size`` is the local training batch size (the sparse puzzle embedding needs it);
    ``seq_len``, ``vocab_size`` and ``num_puzzle_identifiers`` come from the dataset.
    """

    batch_size: int
    seq_len: int
    vocab_size: int
    num_puzzle_identifiers: int
    H_cycles: int
    L_cycles: int
    H_layers: int
    L_layers: int
    hidden_size: int
    expansion: float
    num_heads: int
    pos_encodings: str
    halt_max_steps: int
    halt_exploration_prob: float
    puzzle_emb_ndim: int = 0
    rms_norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    forward_dtype: str = "bfloat16"
    causal: bool = False

    @classmethod
    def from_dict(cls, config: dict) -> "HierarchicalReasoningModel_ACTV1Config":
        """Build from a reference-style config dict.

        Raises:
            ValueError: a key is unknown or a required key is missing, with the valid keys listed.
        """
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(config) - names)
        required = {f.name for f in dataclasses.fields(cls) if f.default is dataclasses.MISSING}
        missing = sorted(required - set(config))
        if unknown or missing:
            raise ValueError(
                f"bad HRM config: unknown keys {unknown}, missing keys {missing}; valid keys are {sorted(names)}")
        cfg = cls(**config)
        cfg.validate()
        return cfg

    def validate(self) -> None:
        """Raises ValueError on values the model cannot be built with."""
        if min(self.hidden_size, self.num_heads) < 1 or self.expansion <= 0 or self.puzzle_emb_ndim < 0:
            raise ValueError(f"hidden_size ({self.hidden_size}) and num_heads ({self.num_heads}) must be >= 1, "
                             f"expansion ({self.expansion}) > 0 and puzzle_emb_ndim ({self.puzzle_emb_ndim}) >= 0")
        if self.hidden_size % self.num_heads:
            raise ValueError(f"hidden_size {self.hidden_size} is not divisible by num_heads {self.num_heads}")
        if self.pos_encodings not in ("rope", "learned"):
            raise ValueError(f"pos_encodings={self.pos_encodings!r}: use 'rope' or 'learned'")
        if self.pos_encodings == "rope" and (self.hidden_size // self.num_heads) % 2:
            raise ValueError(f"rope needs an even head size, got hidden_size/num_heads = {self.hidden_size // self.num_heads}")
        if self.rms_norm_eps <= 0 or self.rope_theta <= 0:
            raise ValueError(f"rms_norm_eps ({self.rms_norm_eps}) and rope_theta ({self.rope_theta}) must be > 0")
        if self.forward_dtype not in ("bfloat16", "float32", "float16"):
            raise ValueError(f"forward_dtype={self.forward_dtype!r}: use bfloat16, float32 or float16")
        if self.halt_max_steps < 1 or min(self.H_cycles, self.L_cycles, self.H_layers, self.L_layers) < 1:
            raise ValueError("halt_max_steps, H_cycles, L_cycles, H_layers and L_layers must all be >= 1")
        if not 0 <= self.halt_exploration_prob <= 1:
            raise ValueError(f"halt_exploration_prob={self.halt_exploration_prob} must be in [0, 1]")

    @property
    def torch_dtype(self) -> torch.dtype:
        return getattr(torch, self.forward_dtype)


@dataclass
class InnerCarry:
    """Recurrent state: ``z_H``, ``z_L`` ``[B, puzzle_emb_len + seq_len, hidden]`` in the forward dtype."""

    z_H: torch.Tensor
    z_L: torch.Tensor


@dataclass
class Carry:
    """ACT state carried across optimizer steps.

    ``steps`` [B] int32 segments run so far; ``halted`` [B] bool; ``current_data`` the batch
    rows each slot is working on (a row keeps its data until it halts).
    """

    inner_carry: InnerCarry
    steps: torch.Tensor
    halted: torch.Tensor
    current_data: dict[str, torch.Tensor] = field(default_factory=dict)


class HRMBlock(nn.Module):
    """Post-norm transformer block: ``x = rms(x + attn(x)); x = rms(x + swiglu(x))``."""

    def __init__(self, config: HierarchicalReasoningModel_ACTV1Config):
        super().__init__()
        head_dim = config.hidden_size // config.num_heads
        self.self_attn = Attention(config.hidden_size, head_dim, config.num_heads, config.num_heads, causal=config.causal)
        self.mlp = SwiGLU(config.hidden_size, config.expansion)
        self.eps = config.rms_norm_eps

    def forward(self, x: torch.Tensor, cos_sin: CosSin | None) -> torch.Tensor:
        x = rms_norm(x + self.self_attn(x, cos_sin=cos_sin), self.eps)
        return rms_norm(x + self.mlp(x), self.eps)


class ReasoningModule(nn.Module):
    """A stack of blocks that first adds its input injection: ``layers(z + injection)``."""

    def __init__(self, layers: list[HRMBlock]):
        super().__init__()
        self.layers = nn.ModuleList(layers)

    def forward(self, z: torch.Tensor, injection: torch.Tensor, cos_sin: CosSin | None) -> torch.Tensor:
        z = z + injection
        for layer in self.layers:
            z = layer(z, cos_sin)
        return z


class HierarchicalReasoningModel_ACTV1_Inner(nn.Module):
    """One ACT segment of HRM. State-dict keys match the reference's ``inner.*``."""

    def __init__(self, config: HierarchicalReasoningModel_ACTV1Config):
        super().__init__()
        self.config = config
        dtype = config.torch_dtype
        self.embed_scale = math.sqrt(config.hidden_size)
        embed_init_std = 1.0 / self.embed_scale

        self.embed_tokens = CastedEmbedding(config.vocab_size, config.hidden_size, init_std=embed_init_std, cast_to=dtype)
        self.lm_head = CastedLinear(config.hidden_size, config.vocab_size, bias=False)
        self.q_head = CastedLinear(config.hidden_size, 2, bias=True)

        self.puzzle_emb_len = -(config.puzzle_emb_ndim // -config.hidden_size)  # ceil division
        if config.puzzle_emb_ndim > 0:
            self.puzzle_emb = CastedSparseEmbedding(config.num_puzzle_identifiers, config.puzzle_emb_ndim,
                                                    batch_size=config.batch_size, init_std=0, cast_to=dtype)
        total_len = config.seq_len + self.puzzle_emb_len
        if config.pos_encodings == "rope":
            self.rotary_emb = RotaryEmbedding(config.hidden_size // config.num_heads, total_len, config.rope_theta)
        else:
            self.embed_pos = CastedEmbedding(total_len, config.hidden_size, init_std=embed_init_std, cast_to=dtype)

        self.H_level = ReasoningModule([HRMBlock(config) for _ in range(config.H_layers)])
        self.L_level = ReasoningModule([HRMBlock(config) for _ in range(config.L_layers)])

        self.register_buffer("H_init", trunc_normal_init_(torch.empty(config.hidden_size, dtype=dtype), std=1))
        self.register_buffer("L_init", trunc_normal_init_(torch.empty(config.hidden_size, dtype=dtype), std=1))

        # Start with "continue": q_halt ~ sigmoid(-5), so early training explores long reasoning.
        with torch.no_grad():
            self.q_head.weight.zero_()
            self.q_head.bias.fill_(-5)

    def _input_embeddings(self, inputs: torch.Tensor, puzzle_identifiers: torch.Tensor) -> torch.Tensor:
        """Token embeddings with the puzzle-embedding prefix: ``[B, puzzle_emb_len + S, hidden]``."""
        embedding = self.embed_tokens(inputs.to(torch.int32))
        if self.config.puzzle_emb_ndim > 0:
            puzzle = self.puzzle_emb(puzzle_identifiers)
            pad = self.puzzle_emb_len * self.config.hidden_size - puzzle.shape[-1]
            if pad > 0:
                puzzle = torch.nn.functional.pad(puzzle, (0, pad))
            embedding = torch.cat((puzzle.view(-1, self.puzzle_emb_len, self.config.hidden_size), embedding), dim=-2)
        if self.config.pos_encodings == "learned":
            # 1/sqrt(2) keeps the variance of the sum equal to that of each term.
            embedding = 0.707106781 * (embedding + self.embed_pos.embedding_weight.to(embedding.dtype))
        return self.embed_scale * embedding

    def empty_carry(self, batch_size: int, device: torch.device | None = None) -> InnerCarry:
        """An uninitialised carry; every row is reset before use because all rows start halted."""
        shape = (batch_size, self.config.seq_len + self.puzzle_emb_len, self.config.hidden_size)
        device = device if device is not None else self.H_init.device
        return InnerCarry(torch.empty(shape, dtype=self.H_init.dtype, device=device),
                          torch.empty(shape, dtype=self.H_init.dtype, device=device))

    def reset_carry(self, reset: torch.Tensor, carry: InnerCarry) -> InnerCarry:
        """Rows with ``reset`` [B] True restart from ``H_init``/``L_init``."""
        flag = reset.view(-1, 1, 1)
        return InnerCarry(torch.where(flag, self.H_init, carry.z_H), torch.where(flag, self.L_init, carry.z_L))

    def forward(self, carry: InnerCarry, batch: dict[str, torch.Tensor]):
        """Run one segment.

        Returns:
            ``(new_carry, logits [B, S, V], (q_halt [B], q_continue [B]))``; Q logits are fp32,
            the carry is detached.
        """
        cos_sin = self.rotary_emb() if self.config.pos_encodings == "rope" else None
        x = self._input_embeddings(batch["inputs"], batch["puzzle_identifiers"])
        z_H, z_L = carry.z_H, carry.z_L
        H_cycles, L_cycles = self.config.H_cycles, self.config.L_cycles
        with torch.no_grad():
            for h in range(H_cycles):
                for l in range(L_cycles):
                    if not (h == H_cycles - 1 and l == L_cycles - 1):
                        z_L = self.L_level(z_L, z_H + x, cos_sin)
                if h != H_cycles - 1:
                    z_H = self.H_level(z_H, z_L, cos_sin)
        # 1-step gradient: only the final L and H updates are differentiated.
        z_L = self.L_level(z_L, z_H + x, cos_sin)
        z_H = self.H_level(z_H, z_L, cos_sin)

        logits = self.lm_head(z_H)[:, self.puzzle_emb_len:]
        q = self.q_head(z_H[:, 0]).to(torch.float32)
        return InnerCarry(z_H.detach(), z_L.detach()), logits, (q[..., 0], q[..., 1])


class HierarchicalReasoningModel_ACTV1(nn.Module):
    """HRM with ACT halting. One call is one segment (and one optimizer step in training).

    Args:
        config_dict: reference config keys (see :class:`HierarchicalReasoningModel_ACTV1Config`).

    Raises:
        ValueError: unknown/missing keys or invalid values.
    """

    config_class = HierarchicalReasoningModel_ACTV1Config

    def __init__(self, config_dict: dict):
        super().__init__()
        self.config = HierarchicalReasoningModel_ACTV1Config.from_dict(dict(config_dict))
        self.inner = HierarchicalReasoningModel_ACTV1_Inner(self.config)

    @property
    def puzzle_emb(self):
        return self.inner.puzzle_emb

    def initial_carry(self, batch: dict[str, torch.Tensor]) -> Carry:
        """A carry for ``batch`` with every row marked halted, so the first call loads fresh data."""
        batch_size = batch["inputs"].shape[0]
        device = batch["inputs"].device
        return Carry(
            inner_carry=self.inner.empty_carry(batch_size, device),
            steps=torch.zeros(batch_size, dtype=torch.int32, device=device),
            halted=torch.ones(batch_size, dtype=torch.bool, device=device),
            current_data={k: torch.empty_like(v) for k, v in batch.items()},
        )

    def forward(self, carry: Carry, batch: dict[str, torch.Tensor]) -> tuple[Carry, dict[str, torch.Tensor]]:
        """Advance every row by one segment; halted rows first take their slot's row of ``batch``.

        Returns the new carry and outputs ``logits`` [B, S, V], ``q_halt_logits`` [B],
        ``q_continue_logits`` [B] and, in training, ``target_q_continue`` [B].
        """
        inner_carry = self.inner.reset_carry(carry.halted, carry.inner_carry)
        steps = torch.where(carry.halted, 0, carry.steps)
        current_data = {
            k: torch.where(carry.halted.view((-1,) + (1,) * (batch[k].ndim - 1)), batch[k], v)
            for k, v in carry.current_data.items()
        }
        inner_carry, logits, (q_halt, q_continue) = self.inner(inner_carry, current_data)
        outputs = {"logits": logits, "q_halt_logits": q_halt, "q_continue_logits": q_continue}

        with torch.no_grad():
            steps = steps + 1
            halt_max = self.config.halt_max_steps
            is_last = steps >= halt_max
            halted = is_last
            # Evaluation always runs halt_max_steps segments, so batches stay aligned.
            if self.training and halt_max > 1:
                halted = halted | (q_halt > q_continue)
                # Exploration: some rows must run at least U{2..halt_max} segments.
                explore = torch.rand_like(q_halt) < self.config.halt_exploration_prob
                min_steps = explore * torch.randint_like(steps, low=2, high=halt_max + 1)
                halted = halted & (steps >= min_steps)
                # Q-learning target from one extra segment (no grad) on the new carry.
                _, _, (next_q_halt, next_q_continue) = self.inner(inner_carry, current_data)
                outputs["target_q_continue"] = torch.sigmoid(
                    torch.where(is_last, next_q_halt, torch.maximum(next_q_halt, next_q_continue)))
        return Carry(inner_carry, steps, halted, current_data), outputs
