"""Apple Silicon (MPS) checks: real MPS training steps on a Mac, the MPS code paths by simulation elsewhere.

    python test_apple_silicon.py        # standalone: prints PASS/FAIL per check, exits 1 on any failure
    python -m pytest test_apple_silicon.py

On a machine without MPS, every check that needs the GPU is run with MPS simulated
(``torch.backends.mps.is_available`` and the macOS version monkeypatched), and the output
says so. Those checks cover the decisions our code makes for MPS; the real kernels are
only exercised on a Mac.
"""

import utils  # noqa: F401  (must come before torch: sets PYTORCH_ENABLE_MPS_FALLBACK)

import functools
import os
import platform
import subprocess
import sys
from contextlib import contextmanager
from unittest import mock

import torch

from models.hrm.hrm_act_v1 import HierarchicalReasoningModel_ACTV1
from models.layers import attention_backend
from models import losses
from models.losses import ACTLossHead, stablemax_cross_entropy, stablemax_dtype
from models.sparse_embedding import SparseEmbeddingSignSGD
from utils import device as device_mod
from utils.optimizer_utils import AdamATan2, get_adam_atan2_optimizer

HAS_MPS = torch.backends.mps.is_available()


@contextmanager
def simulated_mac(macos: str = "14.5", mps: bool = True):
    """Pretend to be an arm64 Mac with (or without) a working MPS backend and no CUDA.

    The MPS stand-ins keep ``__wrapped__`` (torch._dynamo reads it from ``is_available`` when it is first imported).
    """
    with mock.patch.object(torch.backends.mps, "is_available", functools.wraps(torch.backends.mps.is_available)(lambda: mps)), \
            mock.patch.object(torch.backends.mps, "is_built", functools.wraps(torch.backends.mps.is_built)(lambda: True)), \
            mock.patch.object(torch.cuda, "is_available", return_value=False), \
            mock.patch.object(platform, "system", return_value="Darwin"), \
            mock.patch.object(platform, "machine", return_value="arm64"), \
            mock.patch.object(platform, "mac_ver", return_value=(macos, ("", "", ""), "arm64")):
        yield


def _tiny_hrm(device: torch.device, dtype: str = "float32") -> ACTLossHead:
    cfg = dict(batch_size=8, seq_len=16, vocab_size=6, num_puzzle_identifiers=2, H_cycles=2, L_cycles=2, H_layers=1,
               L_layers=1, hidden_size=64, expansion=2, num_heads=4, pos_encodings="rope", halt_max_steps=2,
               halt_exploration_prob=0.1, puzzle_emb_ndim=64, forward_dtype=dtype)
    with torch.device(device):
        return ACTLossHead(HierarchicalReasoningModel_ACTV1(cfg))


def _train_steps(device: torch.device, steps: int = 30, dtype: str = "float32") -> tuple[float, float]:
    """Train a tiny HRM to copy its input; return (first loss, last loss)."""
    torch.manual_seed(0)
    head = _tiny_hrm(device, dtype).train()
    opt = AdamATan2(head.model.parameters(), lr=3e-3, betas=(0.9, 0.95), weight_decay=0.0)
    emb_opt = SparseEmbeddingSignSGD([head.model.puzzle_emb], lr=1e-3)
    inputs = torch.randint(1, 6, (8, 16), dtype=torch.int32, device=device)
    batch = {"inputs": inputs, "labels": inputs.clone(), "puzzle_identifiers": torch.zeros(8, dtype=torch.int32, device=device)}
    carry = head.initial_carry(batch)
    losses = []
    for _ in range(steps):
        carry, loss, metrics, _, _ = head(carry, batch)
        (loss / 8).backward()
        opt.step(), emb_opt.step()
        opt.zero_grad(), emb_opt.zero_grad()
        losses.append(metrics["lm_loss"].item())
    return losses[0], losses[-1]


def test_mps_fallback_env_is_set_before_torch_import():
    code = "import utils, os, sys; assert 'torch' not in sys.modules; print(os.environ['PYTORCH_ENABLE_MPS_FALLBACK'])"
    env = {k: v for k, v in os.environ.items() if k != "PYTORCH_ENABLE_MPS_FALLBACK"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                         cwd=os.path.dirname(os.path.abspath(__file__)))
    assert out.returncode == 0 and out.stdout.strip() == "1", out.stderr


def test_device_policy_on_a_mac():
    with simulated_mac():
        choice = device_mod.select_device("auto")
        assert choice.device.type == "mps", choice
    with simulated_mac(mps=False):
        choice = device_mod.select_device("auto")
        assert choice.device.type == "cpu" and "mps not available" in choice.reason, choice
    if not HAS_MPS:
        try:
            device_mod.select_device("mps")
        except device_mod.DeviceError as e:
            assert "MPS is not available" in str(e)
        else:
            raise AssertionError("device=mps on a machine without MPS must be a clear error")


def test_precision_and_compile_policy_on_mps():
    mps = torch.device("mps")
    with simulated_mac("14.5"):
        assert device_mod.select_dtype(mps)[0] == torch.bfloat16
    with simulated_mac("13.6"):
        assert device_mod.select_dtype(mps)[0] == torch.float32
    assert device_mod.compile_decision(mps, True)[0] is False
    assert attention_backend(mps, torch.bfloat16)[0] == "sdpa"


def test_stablemax_runs_without_float64_on_mps():
    assert stablemax_dtype(torch.device("mps")) == torch.float32
    logits = torch.randn(4, 81, 11) * 30
    labels = torch.randint(0, 11, (4, 81))
    reference = stablemax_cross_entropy(logits, labels)  # on the CPU: float64, as the reference computes it
    assert reference.dtype == torch.float64
    # The path MPS takes (no float64 there): the same function with the fp32 computation dtype.
    with mock.patch.object(losses, "stablemax_dtype", lambda device: torch.float32):
        mps_path = stablemax_cross_entropy(logits, labels)
    assert mps_path.dtype == torch.float32
    torch.testing.assert_close(mps_path.double(), reference, rtol=1e-5, atol=1e-5)


def test_optimizer_on_mps_is_exact_pure_pytorch_adam_atan2():
    params = [torch.nn.Parameter(torch.zeros(3))]
    with simulated_mac():
        opt = get_adam_atan2_optimizer(params, lr=1e-3, betas=(0.9, 0.95), weight_decay=0.1)
    assert isinstance(opt, AdamATan2)


def test_training_steps_reduce_loss():
    """Real MPS steps on a Mac; elsewhere the same steps on CPU, which is what MPS falls back to."""
    device = torch.device("mps" if HAS_MPS else "cpu")
    first, last = _train_steps(device)
    assert last < 0.7 * first, (first, last)


CHECKS = [test_mps_fallback_env_is_set_before_torch_import, test_device_policy_on_a_mac,
          test_precision_and_compile_policy_on_mps, test_stablemax_runs_without_float64_on_mps,
          test_optimizer_on_mps_is_exact_pure_pytorch_adam_atan2, test_training_steps_reduce_loss]


def main() -> int:
    mode = "real MPS device" if HAS_MPS else (
        "SIMULATED: this machine has no MPS, so MPS is faked for the policy checks and the training steps run on CPU")
    print(f"Apple Silicon checks ({platform.system()} {platform.machine()}, torch {torch.__version__}): {mode}")
    failed = 0
    for check in CHECKS:
        try:
            check()
            print(f"PASS {check.__name__}")
        except Exception as e:  # noqa: BLE001 - report every failure, then exit non-zero
            failed += 1
            print(f"FAIL {check.__name__}: {type(e).__name__}: {e}")
    print(f"{len(CHECKS) - failed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
