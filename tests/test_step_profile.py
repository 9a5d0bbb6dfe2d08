"""utils/step_profile.py on hand-made traces (device=cpu: the events are plain objects shaped as torch.profiler's
FunctionEvent), every figure re-computed by hand; the same reading of a real CPU trace is tests/test_benchmarks.py's
profile test."""

from types import SimpleNamespace

import pytest

from utils import step_profile
from utils.step_profile import MEASUREMENT, analyse, union


def event(name, start, end, device="CPU", parent=None, self_us=None, annotation=False):
    made = SimpleNamespace(name=name, time_range=SimpleNamespace(start=start, end=end), cpu_parent=parent,
                           cpu_children=[], device_type=SimpleNamespace(name=device), is_user_annotation=annotation,
                           self_cpu_time_total=end - start if self_us is None else self_us)
    if parent is not None:
        parent.cpu_children.append(made)
    return made


def test_union_counts_overlaps_once_and_lists_the_gaps_in_order():
    assert union([(10, 20), (0, 5), (15, 30), (40, 41), (30, 35)]) == (5 + 25 + 1, [5, 5])
    assert union([]) == (0.0, [])


def test_a_gpu_trace_kernels_gemm_share_gaps_and_the_syncs_with_their_line():
    frame = event("utils/optimizer_utils.py(155): _bucket", 0, 100)
    item = event("aten::_local_scalar_dense", 10, 30, parent=frame)
    sync = event("cudaStreamSynchronize", 12, 28, parent=item)
    wait = event(MEASUREMENT, 180, 200, annotation=True)
    final = event("cudaDeviceSynchronize", 181, 199, parent=wait)  # the benchmark's own wait: not counted
    kernels = [event("sm90_xmma_gemm_bf16", 40, 100, device="CUDA"), event("ampere_bf16_gemm", 90, 120, device="CUDA"),
               event("flash_fwd_kernel", 130, 150, device="CUDA"), event("triton_poi_fused_mul_0", 160, 170,
                                                                            device="CUDA")]
    profile = analyse([frame, item, sync, wait, final, *kernels], steps=2, on_gpu=True)
    assert profile.window_us == 200 and profile.kernel_us == 60 + 30 + 20 + 10
    assert profile.busy_us == 80 + 20 + 10 and profile.gaps_us == [10, 10]
    assert profile.share(step_profile.GEMM) == pytest.approx(90 / 120)
    assert profile.share(step_profile.ATTENTION) == pytest.approx(20 / 120)
    assert dict(profile.syncs) == {
        "cudaStreamSynchronize (in aten::_local_scalar_dense) at utils/optimizer_utils.py:155 (_bucket)": 1}
    text = profile.report()
    assert "GPU busy 0.06 ms of 0.10 ms per step (55%); idle between kernels 0.04 ms in 1 gaps" in text
    assert "GEMM 75% of kernel time, attention 17%, other 8%" in text and "host syncs per step: 0.5" in text
    assert text.splitlines()[-4].split() == ["50.0%", "0.030", "0.5", "sm90_xmma_gemm_bf16"]


def test_a_cpu_trace_weighs_operators_by_their_own_time_and_lists_the_value_reads():
    outside = event("torch/nn/modules/module.py(1959): __getattr__", 0, 5)  # a frame of the library, not ours
    mm = event("aten::mm", 10, 50, self_us=30)
    event("aten::empty", 12, 22, parent=mm)  # inside mm: not a second stretch of busy time
    kernel = event("graph_0_cpp_fused_mul_0", 60, 70)
    item = event("aten::_local_scalar_dense", 80, 82, parent=outside)
    annotation = event("ProfilerStep#1", 0, 90, annotation=True)
    profile = analyse([outside, mm, *mm.cpu_children, kernel, item, annotation], steps=1, on_gpu=False)
    assert dict(profile.kernels) == {"aten::mm": 30, "aten::empty": 10, "graph_0_cpp_fused_mul_0": 10,
                                     "aten::_local_scalar_dense": 2}
    assert profile.busy_us == 40 + 10 + 2 and profile.gaps_us == [10, 10]
    assert profile.share(step_profile.GEMM) == pytest.approx(30 / 52)
    assert dict(profile.syncs) == {"aten::_local_scalar_dense at ?": 1}
    assert "value reads per step: 1 (each a host sync where its tensor is on a GPU" in profile.report()


def test_steps_must_be_positive():
    with pytest.raises(ValueError, match="steps=0: profile at least one step"):
        analyse([], steps=0, on_gpu=False)
