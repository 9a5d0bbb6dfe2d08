"""Shared utilities: device and precision policy, configs, checkpoints, optimizers, data.

MPS falls back to the CPU for operators it lacks only when ``PYTORCH_ENABLE_MPS_FALLBACK`` is set before torch is
imported, and OpenMP reads how its idle threads wait (utils/threads.py) as torch loads it, so both are set here:
every entry point imports ``utils`` before it touches torch.
"""

import logging
import os

os.environ.setdefault("PYTORCH_ENABLE_MPS_FALLBACK", "1")

from utils.threads import set_wait_policy  # noqa: E402  (OpenMP reads its wait policy as torch starts)

set_wait_policy()


def _not_the_cuda_home_note(record: logging.LogRecord) -> bool:
    """False for torch's ``No CUDA runtime is found, using CUDA_HOME=...`` alone. torch.utils.cpp_extension logs it
    on import where a CUDA toolkit is installed but torch finds no GPU, and torch.compile imports that module on a
    CPU, so the line landed in CPU runs' progress bars; it concerns building CUDA extensions, which a machine without
    CUDA never does. The logger's other records pass."""
    return not record.getMessage().startswith("No CUDA runtime is found")


logging.getLogger("torch.utils.cpp_extension").addFilter(_not_the_cuda_home_note)
