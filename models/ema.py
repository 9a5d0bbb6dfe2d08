"""Exponential moving average (EMA) of a model's weights, as TRM trains and evaluates with it.

Reference: ``EMAHelper`` in TRM's ``models/ema.py`` and its use in TRM's ``pretrain.py``
(``SamsungSAILMontreal/TinyRecursiveModels``), switched on by ``ema: true`` with ``ema_rate: 0.999``:

- The shadow starts as a copy of every parameter with ``requires_grad``, taken once the model is
  built and any checkpoint is loaded.
- After every training batch (after the optimizer step),
  ``shadow = (1 - ema_rate) * param + ema_rate * shadow``: no bias correction, no warm-up.
- Only parameters are averaged. Buffers keep their live values, above all the sparse
  puzzle-embedding table (trained by sign-SGD), and ``H_init``/``L_init``.
- Evaluation and the checkpoint written after it use the EMA parameters with the live buffers.
  The reference deep-copies the train state for this. :meth:`EMAHelper.swapped` exchanges the
  tensors in place instead, which costs no copy and keeps the optimizer's references valid.
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Iterator

import torch
from torch import nn


def unwrap(module: nn.Module) -> nn.Module:
    """The module under ``torch.compile`` (``_orig_mod``) and DataParallel/DDP (``module``) wrappers."""
    while True:
        if isinstance(module, (nn.DataParallel, nn.parallel.DistributedDataParallel)):
            module = module.module
        elif "_orig_mod" in module._modules:
            module = module._modules["_orig_mod"]
        else:
            return module


class EMAHelper:
    """EMA of ``module``'s trainable parameters (those with ``requires_grad``).

    Args:
        module: the model, or a wrapper of it (the loss head, ``torch.compile``, DDP): wrappers
            are looked through, so names are those of the unwrapped module.
        mu: the decay, ``ema_rate`` in the config (0.999 in the reference).

    Raises:
        ValueError: ``mu`` is outside [0, 1], or ``module`` has no trainable parameter.
    """

    def __init__(self, module: nn.Module, mu: float = 0.999):
        if not 0.0 <= mu <= 1.0:
            raise ValueError(f"ema_rate={mu} must be in [0, 1] (the reference uses 0.999)")
        named = [(n, p) for n, p in unwrap(module).named_parameters() if p.requires_grad]
        if not named:
            raise ValueError(f"{type(module).__name__} has no trainable parameter to average")
        self.mu = mu
        self.names = [n for n, _ in named]
        self._params = [p for _, p in named]
        self._shadow = [p.detach().clone() for p in self._params]
        self._swapped = False

    def _check_not_swapped(self, what: str) -> None:
        if self._swapped:
            raise RuntimeError(f"EMAHelper.{what}() called inside swapped(): the model holds the EMA weights there; "
                               "call it after the with-block")

    @torch.no_grad()
    def update(self) -> None:
        """``shadow = (1 - mu) * param + mu * shadow`` for every tracked parameter.

        Rounded as the reference's expression is (two products, then their sum), so the shadow
        matches it bitwise.
        """
        self._check_not_swapped("update")
        torch._foreach_mul_(self._shadow, self.mu)
        torch._foreach_add_(self._shadow, torch._foreach_mul([p.detach() for p in self._params], 1.0 - self.mu))

    @torch.no_grad()
    def _swap(self) -> None:
        # Exchanging the tensors behind the parameters is O(1): the Parameter objects (held by the
        # optimizer and the compiled graph) stay the same, only their data changes places.
        for i, (param, shadow) in enumerate(zip(self._params, self._shadow)):
            live = param.data
            param.data = shadow
            self._shadow[i] = live

    @contextmanager
    def swapped(self) -> Iterator[None]:
        """Inside the block the model's parameters are the EMA weights; on exit (even by an exception) the live ones.

        Use it for evaluation and for writing the reference-format model checkpoint, as the
        reference evaluates and saves its EMA copy.
        """
        self._check_not_swapped("swapped")
        self._swap()
        self._swapped = True
        try:
            yield
        finally:
            self._swap()
            self._swapped = False

    def state_dict(self) -> dict[str, torch.Tensor]:
        """``{parameter name: shadow tensor}``, the reference's layout (its ``shadow`` dict)."""
        self._check_not_swapped("state_dict")
        return dict(zip(self.names, self._shadow))

    @torch.no_grad()
    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        """Copy a saved shadow into this one (values only: dtypes and devices stay this model's).

        Raises:
            ValueError: the names or shapes differ from this model's trainable parameters.
        """
        self._check_not_swapped("load_state_dict")
        missing = [n for n in self.names if n not in state]
        unexpected = sorted(set(state) - set(self.names))
        mismatched = [f"{n}: saved {tuple(state[n].shape)} vs model {tuple(s.shape)}"
                      for n, s in zip(self.names, self._shadow) if n in state and state[n].shape != s.shape]
        if missing or unexpected or mismatched:
            raise ValueError(f"EMA state does not fit this model: missing {missing[:3]}, unexpected {unexpected[:3]}, "
                             f"shape mismatches {mismatched[:3]}; resume with the arch.* settings it was saved with")
        for name, shadow in zip(self.names, self._shadow):
            shadow.copy_(state[name])
