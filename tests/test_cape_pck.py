"""PCK@0.2 (utils/eval/pck.py) against hand-computed cases."""

import numpy as np
import pytest
import torch

from utils.eval.pck import PCKAccumulator, copy_support_baseline, crop_to_original, evaluation_mask, pck_per_query


def test_pck_threshold_is_strict_and_normalised_by_bbox_size():
    gt = torch.zeros(1, 4, 2)
    # bbox size 100 -> threshold 20 px: distances 0, 19.9, 20 (not < 20), 30 (3-4-5 triangle)
    pred = torch.tensor([[[0.0, 0.0], [19.9, 0.0], [0.0, 20.0], [18.0, 24.0]]])
    pck, counted = pck_per_query(pred, gt, torch.tensor([100.0]), torch.ones(1, 4, dtype=torch.bool))
    assert counted.tolist() == [4]
    assert pck.item() == pytest.approx(2 / 4)
    # the same errors under a bbox of 200 px (threshold 40) are all correct
    pck, _ = pck_per_query(pred, gt, torch.tensor([200.0]), torch.ones(1, 4, dtype=torch.bool))
    assert pck.item() == 1.0


def test_pck_counts_only_masked_keypoints():
    gt = torch.zeros(1, 3, 2)
    pred = torch.tensor([[[1.0, 0.0], [50.0, 0.0], [50.0, 0.0]]])
    mask = torch.tensor([[True, True, False]])  # the third miss is not counted
    pck, counted = pck_per_query(pred, gt, torch.tensor([100.0]), mask)
    assert counted.item() == 2 and pck.item() == pytest.approx(0.5)


def test_evaluation_mask_needs_visibility_in_query_and_every_support():
    query_visible = torch.tensor([[[True, True, True, False, True]]])          # [B=1, Q=1, N=5]
    support_visible = torch.tensor([[[True, True, False, True, True],
                                     [True, False, True, True, True]]])        # [B=1, K=2, N=5]
    keypoint_mask = torch.tensor([[True, True, True, True, False]])            # last is padding
    mask = evaluation_mask(query_visible, support_visible, keypoint_mask)
    # kp0: all visible; kp1: second shot misses it; kp2: first shot misses it; kp3: query misses it; kp4: padding
    assert mask.tolist() == [[[True, False, False, False, False]]]


def test_accumulator_averages_over_queries_and_skips_empty_ones():
    gt = torch.zeros(1, 3, 2, 2)
    pred = torch.tensor([[[[0.0, 0.0], [90.0, 0.0]],      # query A: 1 of 2 correct
                          [[1.0, 1.0], [2.0, 2.0]],       # query B: 2 of 2 correct
                          [[99.0, 0.0], [99.0, 0.0]]]])   # query C: nothing counted
    mask = torch.tensor([[[True, True], [True, True], [False, False]]])
    acc = PCKAccumulator(0.2)
    acc.update(pred, gt, torch.full((1, 3), 100.0), mask)
    assert acc.queries == 2
    assert acc.value() == pytest.approx(75.0)  # mean of 50% and 100%, not a pooled 3/4 over keypoints
    acc.update(pred[:, :1], gt[:, :1], torch.full((1, 1), 100.0), mask[:, :1])
    assert acc.value() == pytest.approx(100 * (0.5 + 1.0 + 0.5) / 3)


def test_pck_rejects_bad_input():
    with pytest.raises(ValueError, match="shapes disagree"):
        pck_per_query(torch.zeros(2, 3, 2), torch.zeros(2, 4, 2), torch.ones(2), torch.ones(2, 3, dtype=torch.bool))
    with pytest.raises(ValueError, match="bbox size <= 0"):
        pck_per_query(torch.zeros(1, 2, 2), torch.zeros(1, 2, 2), torch.zeros(1), torch.ones(1, 2, dtype=torch.bool))


def test_crop_to_original_matches_float64_affine():
    rng = np.random.default_rng(0)
    pts = rng.random((2, 3, 5, 2))
    aff = rng.normal(size=(2, 3, 2, 3))
    out = crop_to_original(torch.tensor(pts, dtype=torch.float32), torch.tensor(aff, dtype=torch.float32), 128)
    ref = np.einsum("bqij,bqnj->bqni", aff[..., :2], pts * 128) + aff[..., None, :, 2]
    np.testing.assert_allclose(out.numpy(), ref, rtol=1e-5, atol=1e-4)


def test_copy_support_baseline_is_mean_of_visible_shots():
    sk = torch.tensor([[[[0.2, 0.4], [0.1, 0.1]], [[0.4, 0.8], [0.9, 0.9]]]])  # [B=1, K=2, N=2, 2]
    sv = torch.tensor([[[True, False], [True, False]]])                        # kp1 seen by no shot
    out = copy_support_baseline(sk, sv, num_queries=3)
    assert out.shape == (1, 3, 2, 2)
    assert torch.allclose(out[0, 2, 0], torch.tensor([0.3, 0.6]))
    assert torch.allclose(out[0, 0, 1], torch.tensor([0.5, 0.5]))
    sv = torch.tensor([[[True, True], [False, True]]])
    assert torch.allclose(copy_support_baseline(sk, sv, 1)[0, 0], torch.tensor([[0.2, 0.4], [0.5, 0.5]]))
