"""HRM: the Hierarchical Reasoning Model with adaptive computation time (ACT), version 1.

Wang et al., "Hierarchical Reasoning Model", arXiv 2506.21734. Two recurrent transformer
modules run at different speeds: a slow high-level module ``H`` and a fast low-level
module ``L``. One ACT *segment* runs ``H_cycles x L_cycles`` updates, of which only the
last L and last H update carry gradients (the "1-step gradient"). A Q-head decides after
each segment whether to halt; it is trained by Q-learning. Construction, parameter names
and initialisation match the reference implementation (docs/REFERENCE.md, HRM), so its
checkpoints load into :class:`HierarchicalReasoningModel_ACTV1` after stripping the
``_orig_mod.model.`` prefix (see :func:`models.checkpoints.strip_reference_prefix`).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from models.act import ACTModel, InnerCarry, ReasoningConfig, RecurrentCore
from models.layers import ReasoningBlock, ReasoningModule


@dataclass
class HierarchicalReasoningModel_ACTV1Config(ReasoningConfig):
    """HRM's architecture keys: exactly the shared ones (:class:`models.act.ReasoningConfig`)."""

    model_name = "HRM"

    def validate(self) -> None:
        """Raises ValueError on values the model cannot be built with."""
        super().validate()
        if self.hidden_size % self.num_heads:
            raise ValueError(f"hidden_size {self.hidden_size} is not divisible by num_heads {self.num_heads}")
        if self.pos_encodings not in ("rope", "learned"):
            raise ValueError(f"pos_encodings={self.pos_encodings!r}: use 'rope' or 'learned'")
        if min(self.H_cycles, self.L_cycles, self.H_layers, self.L_layers) < 1:
            raise ValueError("H_cycles, L_cycles, H_layers and L_layers must all be >= 1")


class HierarchicalReasoningModel_ACTV1_Inner(RecurrentCore):
    """One ACT segment of HRM: the H and L levels of post-norm blocks. State-dict keys are the reference's ``inner.*``."""

    def __init__(self, config: HierarchicalReasoningModel_ACTV1Config):
        super().__init__(config, prefix_len=-(config.puzzle_emb_ndim // -config.hidden_size))  # ceil division

        def block() -> ReasoningBlock:
            return ReasoningBlock(config.hidden_size, config.num_heads, config.expansion, config.rms_norm_eps,
                                  causal=config.causal)

        self.H_level = ReasoningModule([block() for _ in range(config.H_layers)])
        self.L_level = ReasoningModule([block() for _ in range(config.L_layers)])
        self.add_initial_states()

    def forward(self, carry: InnerCarry, batch: dict[str, torch.Tensor]):
        """Run one segment: ``H_cycles x L_cycles`` updates, only the last L and H update differentiated.

        Returns:
            ``(new_carry, logits [B, S, V], (q_halt [B], q_continue [B]))``; Q logits are fp32,
            the carry is detached.
        """
        cos_sin = self.rope()
        x = self.input_embeddings(batch["inputs"], batch["puzzle_identifiers"])
        z_H, z_L = carry.z_H, carry.z_L
        H_cycles, L_cycles = self.config.H_cycles, self.config.L_cycles
        with torch.no_grad():
            for h in range(H_cycles):
                for l in range(L_cycles):
                    if not (h == H_cycles - 1 and l == L_cycles - 1):
                        z_L = self.perturb(self.L_level(z_L, z_H + x, cos_sin))
                if h != H_cycles - 1:
                    z_H = self.perturb(self.H_level(z_H, z_L, cos_sin))
        # 1-step gradient: only the final L and H updates are differentiated.
        z_L = self.perturb(self.L_level(z_L, z_H + x, cos_sin))
        z_H = self.perturb(self.H_level(z_H, z_L, cos_sin))
        return self.outputs(z_H, z_L)


class HierarchicalReasoningModel_ACTV1(ACTModel):
    """HRM with ACT halting and Q-learning (see :class:`models.act.ACTModel`). One call is one segment.

    Args:
        config_dict: reference config keys (see :class:`HierarchicalReasoningModel_ACTV1Config`).

    Raises:
        ValueError: unknown/missing keys or invalid values.
    """

    config_class = HierarchicalReasoningModel_ACTV1Config
    inner_class = HierarchicalReasoningModel_ACTV1_Inner
