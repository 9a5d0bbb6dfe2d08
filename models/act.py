"""What HRM and TRM share: the config checks, the carry, the embeddings and heads around the recursion, and
the ACT wrapper (halting, exploration, the Q-learning target). Each architecture adds only its recursion.

Sources: ``sapientinc/HRM`` ``models/hrm/hrm_act_v1.py`` and ``SamsungSAILMontreal/TinyRecursiveModels``
``models/recursive_reasoning/trm.py``. Both build their modules in the same order (token embedding,
heads, puzzle embedding, positions, the reasoning levels, then ``H_init``/``L_init``), which fixes the
random stream; :class:`RecurrentCore` keeps that order, so a seed gives the references' initial weights.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Optional

import torch
from torch import nn

from models.layers import (CastedEmbedding, CastedLinear, RotaryEmbedding, RotaryEmbedding2D, grid_side,
                           puzzle_input_embedding, trunc_normal_init_)
from models.sparse_embedding import CastedSparseEmbedding


@dataclass
class ReasoningConfig:
    """The config keys HRM and TRM share (the references' names), building from a reference-style dict, and the
    checks every recursive reasoner needs. Each architecture's config is a subclass (TRM adds three keys).

    ``batch_size`` is the local training batch size (the sparse puzzle embedding needs it); ``seq_len``,
    ``vocab_size`` and ``num_puzzle_identifiers`` come from the dataset.
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

    model_name = "model"

    @classmethod
    def from_dict(cls, config: dict):
        """Build from a reference-style config dict.

        Raises:
            ValueError: a key is unknown or a required key is missing (the valid keys are listed), or a value
                is invalid (see ``validate``).
        """
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(config) - names)
        required = {f.name for f in dataclasses.fields(cls) if f.default is dataclasses.MISSING}
        missing = sorted(required - set(config))
        if unknown or missing:
            raise ValueError(f"bad {cls.model_name} config: unknown keys {unknown}, missing keys {missing}; "
                             f"valid keys are {sorted(names)}")
        cfg = cls(**config)
        cfg.validate()
        return cfg

    def validate(self) -> None:
        """Raises ValueError, naming the key, on values no recursive reasoner can be built with."""
        if min(self.hidden_size, self.num_heads) < 1 or self.expansion <= 0 or self.puzzle_emb_ndim < 0:
            raise ValueError(f"hidden_size ({self.hidden_size}) and num_heads ({self.num_heads}) must be >= 1, "
                             f"expansion ({self.expansion}) > 0 and puzzle_emb_ndim ({self.puzzle_emb_ndim}) >= 0")
        if self.pos_encodings == "rope" and (self.hidden_size % self.num_heads or (self.hidden_size // self.num_heads) % 2):
            raise ValueError(f"rope needs hidden_size ({self.hidden_size}) divisible by num_heads ({self.num_heads}) "
                             "into an even head size")
        if self.rms_norm_eps <= 0 or self.rope_theta <= 0:
            raise ValueError(f"rms_norm_eps ({self.rms_norm_eps}) and rope_theta ({self.rope_theta}) must be > 0")
        if self.forward_dtype not in ("bfloat16", "float32", "float16"):
            raise ValueError(f"forward_dtype={self.forward_dtype!r}: use bfloat16, float32 or float16")
        if self.halt_max_steps < 1:
            raise ValueError(f"halt_max_steps ({self.halt_max_steps}) must be >= 1")
        if not 0 <= self.halt_exploration_prob <= 1:
            raise ValueError(f"halt_exploration_prob={self.halt_exploration_prob} must be in [0, 1]")

    @property
    def torch_dtype(self) -> torch.dtype:
        return getattr(torch, self.forward_dtype)

    @property
    def grid(self) -> bool:
        """Whether the model is size-agnostic over square grids (TRM's ``token_mixer``); the references are not."""
        return False


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

    def restart_nonfinite_rows(self) -> torch.Tensor:
        """Mark halted the rows whose recurrent state holds a NaN or inf, so the next segment restarts them from
        ``H_init``/``L_init`` with a new puzzle (without this, a NaN row stays NaN for every later segment).
        Works on the device, without a host sync; a finite carry is left bitwise as it was.

        Returns:
            the number of rows marked, a 0-dim int64 tensor on the carry's device.
        """
        bad = torch.zeros_like(self.halted)
        for z in dataclasses.astuple(self.inner_carry):
            bad |= ~torch.isfinite(z).flatten(1).all(1)
        self.halted = self.halted | bad
        return bad.sum()

    def state_dict(self) -> dict:
        """Every field as CPU tensors: ``inner`` (the recurrent state by field name), ``steps``, ``halted``,
        ``current_data``."""
        return {"inner": {k: v.cpu() for k, v in dataclasses.asdict(self.inner_carry).items()},
                "steps": self.steps.cpu(), "halted": self.halted.cpu(),
                "current_data": {k: v.cpu() for k, v in self.current_data.items()}}

    @classmethod
    def from_state_dict(cls, state: dict, device: torch.device | str) -> "Carry":
        """The carry :meth:`state_dict` saved, on ``device``."""
        return cls(InnerCarry(**{k: v.to(device) for k, v in state["inner"].items()}), state["steps"].to(device),
                   state["halted"].to(device), {k: v.to(device) for k, v in state["current_data"].items()})


@dataclass
class LatentNoise:
    """Gaussian noise added to the latent state after every recursion update: the test-time exploration of PTRM
    (arXiv 2605.19943, Sec. 3: K trajectories, noise on the latent at every recursion step). Set on a model's
    ``inner.latent_noise`` for a batch and cleared after it; never used in training.

    Attributes:
        std: [B] fp32, each row's noise std (0 for a row that runs the plain recursion).
        generator: draws the noise; on the latent's device, so its seed fixes the noise on that device.
    """

    std: torch.Tensor
    generator: torch.Generator

    def __call__(self, z: torch.Tensor) -> torch.Tensor:
        """``z`` [B, L, D] plus noise of std ``std[b]`` in row b, in ``z``'s dtype."""
        noise = torch.randn(z.shape, generator=self.generator, device=z.device, dtype=torch.float32)
        return z + (noise * self.std.view(-1, 1, 1)).to(z.dtype)


class RecurrentCore(nn.Module):
    """One ACT segment's shared parts: embeddings, heads and initial states; a subclass adds its levels.

    A subclass calls ``super().__init__(config, prefix_len)``, builds its reasoning levels, then calls
    :meth:`add_initial_states` (the references' construction order), and implements ``forward``.
    State-dict keys are the references' ``inner.*``.
    """

    def __init__(self, config, prefix_len: int):
        super().__init__()
        self.config = config
        dtype = config.torch_dtype
        self.embed_scale = math.sqrt(config.hidden_size)
        embed_init_std = 1.0 / self.embed_scale
        self.embed_tokens = CastedEmbedding(config.vocab_size, config.hidden_size, init_std=embed_init_std, cast_to=dtype)
        self.lm_head = CastedLinear(config.hidden_size, config.vocab_size, bias=False)
        self.q_head = CastedLinear(config.hidden_size, 2, bias=True)
        self.puzzle_emb_len = prefix_len
        if config.puzzle_emb_ndim > 0:
            self.puzzle_emb = CastedSparseEmbedding(config.num_puzzle_identifiers, config.puzzle_emb_ndim,
                                                    batch_size=config.batch_size, init_std=0, cast_to=dtype)
        self.total_len = config.seq_len + prefix_len
        if config.pos_encodings == "rope":
            self.rotary_emb = RotaryEmbedding(config.hidden_size // config.num_heads, self.total_len, config.rope_theta)
        elif config.pos_encodings == "rope2d":
            self.rotary_emb = RotaryEmbedding2D(config.hidden_size // config.num_heads, grid_side(config.seq_len),
                                                config.rope_theta)
        elif config.pos_encodings == "learned":
            self.embed_pos = CastedEmbedding(self.total_len, config.hidden_size, init_std=embed_init_std, cast_to=dtype)

    def add_initial_states(self) -> None:
        """``H_init``/``L_init`` (std 1, persistent ``forward_dtype`` buffers) and the Q head's start:
        q_halt = q_continue = -5, so early training rarely halts and explores long reasoning."""
        dtype = self.config.torch_dtype
        self.register_buffer("H_init", trunc_normal_init_(torch.empty(self.config.hidden_size, dtype=dtype), std=1))
        self.register_buffer("L_init", trunc_normal_init_(torch.empty(self.config.hidden_size, dtype=dtype), std=1))
        with torch.no_grad():
            self.q_head.weight.zero_()
            self.q_head.bias.fill_(-5)

    latent_noise: Optional["LatentNoise"] = None  # set by test-time search only; None: the references' recursion
    stochastic = False  # whether the model draws random numbers of its own as it answers (TRM with EqR's settings)

    def perturb(self, z: torch.Tensor) -> torch.Tensor:
        """``z`` after one recursion update, with :attr:`latent_noise` added when test-time search set one."""
        return z if self.latent_noise is None else self.latent_noise(z)

    def rope(self, seq_len: int | None = None):
        """The rotary tables, or None without rotary positions; 2D ones for the grid of ``seq_len`` cells (the
        batch's: a grid model takes any side)."""
        if self.config.pos_encodings == "rope2d":
            return self.rotary_emb(grid_side(seq_len or self.config.seq_len))
        return self.rotary_emb() if self.config.pos_encodings == "rope" else None

    def input_embeddings(self, inputs: torch.Tensor, puzzle_identifiers: torch.Tensor) -> torch.Tensor:
        """Token embeddings behind the puzzle-embedding prefix: ``[B, puzzle_emb_len + S, hidden]``."""
        puzzle = self.puzzle_emb(puzzle_identifiers) if self.config.puzzle_emb_ndim > 0 else None
        positions = self.embed_pos.embedding_weight if self.config.pos_encodings == "learned" else None
        return puzzle_input_embedding(self.embed_tokens(inputs.to(torch.int32)), puzzle, self.puzzle_emb_len,
                                      positions, self.embed_scale)

    def outputs(self, z_H: torch.Tensor, z_L: torch.Tensor):
        """``(detached carry, logits [B, S, V], (q_halt [B], q_continue [B]))``: the logits of the sequence
        positions in the forward dtype, the Q logits in fp32: read at position 0 (the references), or for a grid
        model the minimum over the cells of each cell's."""
        logits = self.lm_head(z_H)[:, self.puzzle_emb_len:]
        q = (self.q_head(z_H).amin(dim=1) if self.config.grid else self.q_head(z_H[:, 0])).to(torch.float32)
        return InnerCarry(z_H.detach(), z_L.detach()), logits, (q[..., 0], q[..., 1])

    def empty_carry(self, batch_size: int, device: torch.device | None = None,
                    seq_len: int | None = None) -> InnerCarry:
        """An uninitialised carry for puzzles of ``seq_len`` cells (default: the config's; a grid model takes any
        square); every row is reset before use because all rows start halted."""
        shape = (batch_size, self.puzzle_emb_len + (seq_len or self.config.seq_len), self.config.hidden_size)
        device = device if device is not None else self.H_init.device
        return InnerCarry(torch.empty(shape, dtype=self.H_init.dtype, device=device),
                          torch.empty(shape, dtype=self.H_init.dtype, device=device))

    def reset_carry(self, reset: torch.Tensor, carry: InnerCarry) -> InnerCarry:
        """Rows with ``reset`` [B] True restart from ``H_init``/``L_init``."""
        flag = reset.view(-1, 1, 1)
        return InnerCarry(torch.where(flag, self.H_init, carry.z_H), torch.where(flag, self.L_init, carry.z_L))


class ACTModel(nn.Module):
    """A recursive reasoner with ACT halting and deep supervision; one call is one segment (one optimizer step
    in training), and the carry persists across calls.

    In training a row halts after ``halt_max_steps`` segments, or earlier when ``q_halt > q_continue``
    (HRM's Q-learning, and TRM with ``no_ACT_continue=False``) or ``q_halt > 0`` (TRM's default
    ``no_ACT_continue=True``); with probability ``halt_exploration_prob`` it must first run
    U{2..halt_max_steps} segments. With Q-continue, one extra no-grad segment on the new carry gives the
    target ``sigmoid(next q_halt)`` at the last step and ``sigmoid(max(next q_halt, next q_continue))``
    otherwise. Evaluation always runs ``halt_max_steps`` segments, so batches stay aligned.

    Subclasses set ``config_class`` and ``inner_class``.

    Args:
        config_dict: reference config keys (see the subclass's ``config_class``).

    Raises:
        ValueError: unknown/missing keys or invalid values.
    """

    config_class: type
    inner_class: type

    def __init__(self, config_dict: dict):
        super().__init__()
        self.config = self.config_class.from_dict(dict(config_dict))
        self.inner = self.inner_class(self.config)

    @property
    def puzzle_emb(self) -> CastedSparseEmbedding:
        return self.inner.puzzle_emb

    @property
    def uses_q_continue(self) -> bool:
        return not getattr(self.config, "no_ACT_continue", False)

    def initial_carry(self, batch: dict[str, torch.Tensor]) -> Carry:
        """A carry for ``batch`` with every row marked halted, so the first call loads fresh data."""
        batch_size = batch["inputs"].shape[0]
        device = batch["inputs"].device
        return Carry(
            inner_carry=self.inner.empty_carry(batch_size, device, batch["inputs"].shape[1]),
            steps=torch.zeros(batch_size, dtype=torch.int32, device=device),
            halted=torch.ones(batch_size, dtype=torch.bool, device=device),
            current_data={k: torch.empty_like(v) for k, v in batch.items()},
        )

    def forward(self, carry: Carry, batch: dict[str, torch.Tensor]) -> tuple[Carry, dict[str, torch.Tensor]]:
        """Advance every row by one segment; halted rows first take their slot's row of ``batch``.

        Returns the new carry and outputs ``logits`` [B, S, V], ``q_halt_logits`` [B],
        ``q_continue_logits`` [B] and, in training with Q-continue, ``target_q_continue`` [B].
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
            if self.training and halt_max > 1:
                halted = halted | (q_halt > (q_continue if self.uses_q_continue else 0))
                # Exploration: some rows must first run U{2..halt_max} segments (the references' draws, in order).
                explore = torch.rand_like(q_halt) < self.config.halt_exploration_prob
                min_steps = explore * torch.randint_like(steps, low=2, high=halt_max + 1)
                halted = halted & (steps >= min_steps)
                if self.uses_q_continue:
                    _, _, (next_q_halt, next_q_continue) = self.inner(inner_carry, current_data)
                    outputs["target_q_continue"] = torch.sigmoid(
                        torch.where(is_last, next_q_halt, torch.maximum(next_q_halt, next_q_continue)))
        return Carry(inner_carry, steps, halted, current_data), outputs


class CarrySlot:
    """The ACT carry a training loop holds between optimizer steps (None before the first batch), as a part of
    the train state: it saves and restores itself on ``device``."""

    def __init__(self, device: torch.device | str):
        self.carry: Carry | None = None
        self.device = device

    def state_dict(self) -> dict | None:
        return None if self.carry is None else self.carry.state_dict()

    def load_state_dict(self, state: dict | None) -> None:
        self.carry = None if state is None else Carry.from_state_dict(state, self.device)
