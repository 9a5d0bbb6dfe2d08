"""TRM: the Tiny Recursive Model with adaptive computation time (ACT), version 1.

Jolicoeur-Martineau, "Less is More: Recursive Reasoning with Tiny Networks", arXiv 2510.04871;
reference code ``SamsungSAILMontreal/TinyRecursiveModels``, ``models/recursive_reasoning/trm.py``.

One small network (``L_level``, ``L_layers`` post-norm blocks) refines two states: the answer
``z_H`` (the paper's y) and the latent ``z_L`` (the paper's z). One *latent recursion* is
``L_cycles`` updates ``z_L = net(z_L + z_H + x)`` followed by one ``z_H = net(z_H + z_L)``.
One ACT segment runs ``H_cycles`` recursions: the first ``H_cycles - 1`` without gradient, the
last one fully backpropagated (not HRM's 1-step gradient). Halting is decided from ``q_halt``
alone (``no_ACT_continue``), so there is no extra target forward pass. Parameter names,
initialisation and random-number order match the reference, so its checkpoints load (after
:func:`models.checkpoints.strip_reference_prefix`) and, under the same seed, it initialises bitwise like it.

The blocks, the loss head (:class:`models.losses.ACTLossHead`), the sparse puzzle embedding, the carry
and the ACT wrapper are shared with HRM (:mod:`models.act`); only the recursion and the halting rule are TRM's own.

**Training for restarts (opt-in).** EqR (arXiv 2605.21488; ``locuslab/EqR`` ``models/eqr.py``, its keys) trains
TRM so that restarting it and running it deeper help: every row that starts a puzzle draws a fresh latent
(``random_reset``: z_H and z_L of every position from a truncated normal of std ``H_init_std``/``L_init_std``,
instead of the fixed ``H_init``/``L_init``), and every update of the network is damped and noisy,
``z <- (1 - lambda_) z + lambda_ net(z + injection) + N(0, noise_scale^2)``, in training and evaluation alike.
At the defaults (``random_reset`` off, ``lambda_`` 1, ``noise_scale`` 0) none of it runs: the model is the
reference TRM, bitwise.

**A size-agnostic variant (opt-in).** The reference mixes the cells by attention with positions made for one
sequence length, or by ``mlp_t``, a weight as wide as the sequence: neither runs on another size. With
``token_mixer: conv`` each block mixes a cell with its 3x3 neighbourhood on the square grid
(:class:`models.layers.GridConv`), so the same weights take a grid of any side, and information crosses one cell
per block: a larger grid needs more recursion, which more ACT segments give (DT-Net's recall and progressive loss,
arXiv 2202.05826, are TRM's input injection and deep supervision). ``conv_attention`` alternates the convolution
(even layers) with attention (odd layers), and ``pos_encodings: rope2d`` gives attention 2D relative positions over
rows and columns (:class:`models.layers.RotaryEmbedding2D`). Such a *grid* model has no prefix and reads its Q
logits as the minimum over the cells (the least sure cell decides), not at position 0, whose meaning depends on
the size. At the default ``token_mixer: attention`` with the reference's positions, none of it runs.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from models.act import ACTModel, InnerCarry, ReasoningConfig, RecurrentCore
from models.layers import TOKEN_MIXERS, CosSin, ReasoningBlock, ReasoningModule, grid_side, trunc_normal_init_


@dataclass
class TinyRecursiveReasoningModel_ACTV1Config(ReasoningConfig):
    """Architecture hyperparameters; names, defaults and required keys are the reference's.

    The shared keys are :class:`models.act.ReasoningConfig`'s; TRM adds ``mlp_t``, ``puzzle_emb_len`` and
    ``no_ACT_continue``.
    ``H_layers`` is accepted and ignored, as in the reference (TRM has one network).
    ``puzzle_emb_len`` is the number of prefix positions; 0 means ``ceil(puzzle_emb_ndim / hidden_size)``.
    ``pos_encodings`` is ``rope``, ``learned``, ``none`` (the Sudoku ``mlp_t`` recipe uses none) or ``rope2d``
    (a grid model's attention). ``token_mixer`` is ``attention`` (the reference), ``conv`` or ``conv_attention``
    (module docstring); a grid model needs ``puzzle_emb_ndim`` 0, ``mlp_t`` false and a square ``seq_len``.
    ``causal`` is what the trainer passes to every architecture; TRM is non-causal, so only False is valid.
    """

    model_name = "TRM"

    mlp_t: bool = False
    puzzle_emb_len: int = 16
    no_ACT_continue: bool = True
    # EqR's settings (module docstring); the defaults are the reference TRM.
    random_reset: bool = False
    H_init_std: float = 1.0
    L_init_std: float = 1.0
    lambda_: float = 1.0
    noise_scale: float = 0.0
    # The size-agnostic variant (module docstring); the default is the reference TRM.
    token_mixer: str = "attention"

    @property
    def grid(self) -> bool:
        """Whether this is a size-agnostic grid model: a convolution among its mixers, or 2D relative positions."""
        return self.token_mixer != "attention" or self.pos_encodings == "rope2d"

    def validate(self) -> None:
        """Raises ValueError, naming the key and the fix, on values the model cannot be built with."""
        super().validate()
        if self.pos_encodings not in ("rope", "learned", "none", "rope2d"):
            raise ValueError(f"pos_encodings={self.pos_encodings!r}: use 'rope', 'learned' or 'none' (or 'rope2d', "
                             "2D relative positions, for a grid model)")
        if self.token_mixer not in TOKEN_MIXERS:
            raise ValueError(f"token_mixer={self.token_mixer!r}: use one of {', '.join(TOKEN_MIXERS)}")
        if self.grid:
            self.validate_grid()
        if not self.mlp_t and self.hidden_size % self.num_heads:
            raise ValueError(f"hidden_size {self.hidden_size} is not divisible by num_heads {self.num_heads}")
        if min(self.H_cycles, self.L_cycles, self.L_layers) < 1:
            raise ValueError("H_cycles, L_cycles and L_layers must all be >= 1")
        if self.puzzle_emb_len < 0:
            raise ValueError(f"puzzle_emb_len ({self.puzzle_emb_len}) must be >= 0")
        if self.puzzle_emb_ndim == 0 and self.puzzle_emb_len > 0:
            # The reference builds a prefix-sized carry but no prefix, and fails on the first step.
            raise ValueError(f"puzzle_emb_len={self.puzzle_emb_len} needs a puzzle embedding: with puzzle_emb_ndim=0 "
                             "set puzzle_emb_len=0")
        if self.puzzle_emb_ndim > self.prefix_len * self.hidden_size:
            raise ValueError(f"puzzle_emb_ndim={self.puzzle_emb_ndim} does not fit in puzzle_emb_len="
                             f"{self.puzzle_emb_len} positions of hidden_size {self.hidden_size}: raise puzzle_emb_len "
                             "or set it to 0 (auto)")
        if self.causal:
            raise ValueError("causal=True: TRM is non-causal (the reference ignores the key); set causal=False")
        # The latents are normalised to about unit scale (RMSNorm), so a std past 100 only drowns them.
        if not (0 < self.H_init_std <= 100 and 0 < self.L_init_std <= 100):
            raise ValueError(f"H_init_std ({self.H_init_std}) and L_init_std ({self.L_init_std}) must be in (0, 100]")
        if not 0 < self.lambda_ <= 1:
            raise ValueError(f"lambda_={self.lambda_} (EqR's damping) must be in (0, 1]; 1 is no damping")
        if not 0 <= self.noise_scale <= 100:
            raise ValueError(f"noise_scale={self.noise_scale} (EqR's latent noise std) must be in [0, 100]")

    def validate_grid(self) -> None:
        """Raises ValueError, naming the key and the fix, where a grid model (module docstring) cannot be built."""
        if self.mlp_t or self.puzzle_emb_ndim or self.puzzle_emb_len:
            raise ValueError(f"token_mixer={self.token_mixer} / pos_encodings={self.pos_encodings} is a grid model: it "
                             "takes no mlp_t and no puzzle embedding (set mlp_t=false, puzzle_emb_ndim=0, "
                             "puzzle_emb_len=0)")
        if self.pos_encodings in ("rope", "learned"):
            raise ValueError(f"pos_encodings={self.pos_encodings} ties a grid model to one sequence length: use rope2d "
                             "(2D relative positions) or none")
        if self.token_mixer != "conv" and (self.hidden_size // self.num_heads) % 4:
            raise ValueError(f"rope2d needs a head size divisible by 4, got hidden_size {self.hidden_size} / num_heads "
                             f"{self.num_heads}")
        if self.token_mixer != "conv" and self.pos_encodings != "rope2d":
            raise ValueError(f"token_mixer={self.token_mixer} attends without positions: set pos_encodings=rope2d")
        grid_side(self.seq_len)

    @property
    def prefix_len(self) -> int:
        """Prefix positions in front of the sequence: ``puzzle_emb_len``, or ``ceil(puzzle_emb_ndim / hidden)`` if 0."""
        return self.puzzle_emb_len or -(self.puzzle_emb_ndim // -self.hidden_size)


class TinyRecursiveReasoningModel_ACTV1_Inner(RecurrentCore):
    """One ACT segment of TRM: one network ``L_level`` of ``L_layers`` post-norm blocks (attention, or with
    ``mlp_t`` a SwiGLU over the sequence). State-dict keys match the reference's ``inner.*``.

    Weights are fp32 and cast to ``forward_dtype`` in forward; ``H_init``/``L_init`` (the initial
    ``z_H``/``z_L`` of every position, std 1) are persistent ``forward_dtype`` buffers.
    """

    def __init__(self, config: TinyRecursiveReasoningModel_ACTV1Config):
        super().__init__(config, prefix_len=config.prefix_len)
        self.L_level = ReasoningModule([
            ReasoningBlock(config.hidden_size, config.num_heads, config.expansion, config.rms_norm_eps,
                           mlp_t_len=self.total_len if config.mlp_t else None, mixer=self.layer_mixer(i))
            for i in range(config.L_layers)])
        self.add_initial_states()

    def layer_mixer(self, layer: int) -> str:
        """The token mixer of block ``layer``: ``conv_attention`` alternates, the convolution first."""
        mixer = self.config.token_mixer
        if mixer == "conv_attention":
            return "conv" if layer % 2 == 0 else "attention"
        return mixer

    @property
    def stochastic(self) -> bool:
        """Whether the model draws random numbers of its own as it answers (EqR's random reset or noise)."""
        return self.config.random_reset or self.config.noise_scale > 0

    def reset_carry(self, reset: torch.Tensor, carry: InnerCarry) -> InnerCarry:
        """Rows with ``reset`` [B] True restart: from ``H_init``/``L_init``, or with ``random_reset`` from a fresh
        truncated-normal latent per row and position (std ``H_init_std``/``L_init_std``, EqR's ``reset_carry``)."""
        if not self.config.random_reset:
            return super().reset_carry(reset, carry)
        flag = reset.view(-1, 1, 1)
        fresh_H = trunc_normal_init_(torch.empty_like(carry.z_H), std=self.config.H_init_std)
        fresh_L = trunc_normal_init_(torch.empty_like(carry.z_L), std=self.config.L_init_std)
        return InnerCarry(torch.where(flag, fresh_H, carry.z_H), torch.where(flag, fresh_L, carry.z_L))

    def update(self, z: torch.Tensor, injection: torch.Tensor, cos_sin: CosSin | None) -> torch.Tensor:
        """One network update of ``z`` [B, L, D]: ``net(z + injection)``, damped by ``lambda_`` and with EqR's
        noise of std ``noise_scale`` where set, then the test-time search's noise where set (:meth:`perturb`)."""
        new = self.L_level(z, injection, cos_sin)
        if self.config.lambda_ != 1:
            new = (1 - self.config.lambda_) * z + self.config.lambda_ * new
        if self.config.noise_scale:
            new = new + torch.randn_like(new) * self.config.noise_scale
        return self.perturb(new)

    def latent_recursion(self, z_H: torch.Tensor, z_L: torch.Tensor, x: torch.Tensor,
                         cos_sin: CosSin | None) -> tuple[torch.Tensor, torch.Tensor]:
        """``L_cycles`` latent updates given (answer + input), then one answer update (paper, Fig. 3)."""
        for _ in range(self.config.L_cycles):
            z_L = self.update(z_L, z_H + x, cos_sin)
        return self.update(z_H, z_L, cos_sin), z_L

    def forward(self, carry: InnerCarry, batch: dict[str, torch.Tensor]):
        """Run one segment: ``H_cycles - 1`` recursions without gradient, then one with full backprop.

        Args:
            carry: ``z_H``, ``z_L`` ``[B, puzzle_emb_len + S, hidden]`` in the forward dtype.
            batch: ``inputs`` ``[B, S]`` int, ``puzzle_identifiers`` ``[B]`` int.

        Returns:
            ``(new_carry, logits [B, S, V], (q_halt [B], q_continue [B]))``: logits in the forward
            dtype, Q logits fp32 (read at prefix position 0), the carry detached.
        """
        cos_sin = self.rope(batch["inputs"].shape[1])
        x = self.input_embeddings(batch["inputs"], batch["puzzle_identifiers"])
        z_H, z_L = carry.z_H, carry.z_L
        with torch.no_grad():
            for _ in range(self.config.H_cycles - 1):
                z_H, z_L = self.latent_recursion(z_H, z_L, x, cos_sin)
        z_H, z_L = self.latent_recursion(z_H, z_L, x, cos_sin)

        return self.outputs(z_H, z_L)


class TinyRecursiveReasoningModel_ACTV1(ACTModel):
    """TRM with ACT halting and deep supervision. One call is one segment (one optimizer step in training).

    The interface is HRM's, so the trainer, :class:`models.losses.ACTLossHead` and carry
    checkpoints work unchanged. In training a row halts after ``halt_max_steps`` segments, or
    earlier when ``q_halt > 0`` (``no_ACT_continue=True``, the reference default) or
    ``q_halt > q_continue`` (``no_ACT_continue=False``); with probability ``halt_exploration_prob``
    it must first run U{2..halt_max_steps} segments. ``no_ACT_continue=False`` also runs HRM's
    no-grad target segment and outputs ``target_q_continue`` (the reference crashes there: its call
    unpacks five values from the inner model's three). Evaluation always runs ``halt_max_steps``.

    Args:
        config_dict: reference config keys (see :class:`TinyRecursiveReasoningModel_ACTV1Config`).

    Raises:
        ValueError: unknown/missing keys or invalid values.
    """

    config_class = TinyRecursiveReasoningModel_ACTV1Config
    inner_class = TinyRecursiveReasoningModel_ACTV1_Inner
