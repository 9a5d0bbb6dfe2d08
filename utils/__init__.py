"""Shared utilities: device and precision policy, configs, checkpoints, optimizers, data.

MPS falls back to the CPU for operators it lacks only when this variable is set
before torch is imported, so it is set here: every entry point imports ``utils``
before it touches torch.
"""

import os

os.environ.setdefault("PYTORCH_ENABLE_MPS_FALLBACK", "1")
