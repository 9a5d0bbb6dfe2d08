"""PCK@0.2 (utils/eval/pck.py): hand-computed cases and an independent re-implementation of mmpose 0.28.1's rule."""

import numpy as np
import pytest
import torch

from utils.data.cape.mp100 import crop_to_original
from utils.eval.pck import PCKError, batch_pck, copy_support_baseline, evaluation_mask, keypoint_pck


def one_query(pred, gt, normaliser, mask=None):
    pred, gt = np.asarray(pred, np.float64)[None], np.asarray(gt, np.float64)[None]
    mask = np.ones(pred.shape[:2], bool) if mask is None else np.asarray(mask)[None]
    return float(keypoint_pck(pred, gt, mask, [normaliser])[0])


def test_threshold_is_strict_and_normalised_by_the_normaliser():
    gt = np.zeros((4, 2))
    # normaliser 100 -> threshold 20 px: distances 0, 19.9, 20 (not < 20), 30 (3-4-5 triangle)
    pred = [[0.0, 0.0], [19.9, 0.0], [0.0, 20.0], [18.0, 24.0]]
    assert one_query(pred, gt, 100.0) == 2 / 4
    assert one_query(pred, gt, 200.0) == 1.0  # the same errors under a 200 px box (threshold 40) are all correct
    assert one_query(pred, gt, 100.0, mask=[True, True, False, False]) == 1.0  # uncounted misses do not count


def test_distance_is_rounded_to_float32_before_the_threshold():
    """mmpose stores distances in a float32 array: 0.199999999 becomes float32(0.2), which is not < 0.2."""
    assert np.float32(0.199999999) == np.float32(0.2) and np.float32(0.19999999) < np.float32(0.2)
    assert one_query([[19.9999999, 0.0]], [[0.0, 0.0]], 100.0) == 0.0  # a float64 rule would say correct
    assert one_query([[19.999999, 0.0]], [[0.0, 0.0]], 100.0) == 1.0


def test_ground_truth_is_float32_as_the_reference_stores_it():
    # float32(19.9999995) is 20.0, so the error is exactly 0.2 of the box: wrong. In float64 it would be
    # 0.199999995, whose float32 is 0.19999999 < 0.2: correct.
    assert np.float32(19.9999995) == 20.0 and np.float32(0.199999995) < np.float32(0.2)
    assert one_query([[0.0, 0.0]], [[19.9999995, 0.0]], 100.0) == 0.0


def test_empty_query_scores_zero_and_normaliser_guards():
    assert one_query([[5.0, 5.0]], [[0.0, 0.0]], 100.0, mask=[False]) == 0.0
    assert one_query([[5.0, 5.0]], [[0.0, 0.0]], 0.0) == 0.0  # a zero normaliser counts nothing (mmpose)
    assert one_query([[5000.0, 0.0]], [[0.0, 0.0]], -1.0) == 1.0  # a negative one becomes 1e6 (mmpose)


def mmpose_pck(pred, gt, mask, normaliser, thr=0.2):
    """mmpose 0.28.1 keypoint_pck_accuracy on one query (N=1), rewritten from its documented steps."""
    norm = np.array([[normaliser, normaliser]], np.float64)
    m = mask[None].copy()
    if (norm == 0).any():
        m[:] = False
    norm[norm <= 0] = 1e6
    dist = np.full(m.shape, -1, np.float32)
    diff = (pred[None].astype(np.float64) - gt[None].astype(np.float32)) / norm[:, None, :]
    dist[m] = np.sqrt((diff ** 2).sum(-1))[m]
    acc = []
    for d in dist.T:  # per keypoint
        valid = d != -1
        acc.append((d[valid] < thr).sum() / valid.sum() if valid.sum() else -1)
    acc = np.array(acc, np.float64)
    return acc[acc >= 0].mean() if (acc >= 0).any() else 0


def test_matches_an_independent_mmpose_re_implementation_near_the_threshold():
    rng = np.random.default_rng(0)
    q, n = 300, 7
    gt = rng.uniform(0, 400, (q, n, 2)).astype(np.float32)
    norm = rng.uniform(10, 300, q)
    norm[:3] = (0.0, -5.0, 1e-3)
    angle = rng.uniform(0, 2 * np.pi, (q, n))
    # distances within 1e-12 .. 1e-6 of the threshold, on both sides: where float32 rounding decides
    frac = 0.2 + rng.choice([-1, 1], (q, n)) * 10.0 ** rng.uniform(-12, -6, (q, n))
    pred = gt + np.stack([np.cos(angle), np.sin(angle)], -1) * (frac * norm[:, None])[..., None]
    mask = rng.random((q, n)) < 0.8
    mask[3:6] = False
    ours = keypoint_pck(pred, gt, mask, norm)
    ref = np.array([mmpose_pck(pred[i], gt[i], mask[i], norm[i]) for i in range(q)])
    np.testing.assert_array_equal(ours, ref)
    dist, m = np.linalg.norm(pred[6:] - gt[6:], axis=-1) / norm[6:, None], mask[6:]  # rows without guards or empties
    naive = ((dist < 0.2) & m).sum(1) / m.sum(1)
    assert (naive != ref[6:]).sum() > 50  # the data does hit the cases a float64 rule gets wrong


def test_evaluation_mask_needs_visibility_in_query_and_every_support():
    query_visible = torch.tensor([[[True, True, True, False, True]]])          # [B=1, Q=1, N=5]
    support_visible = torch.tensor([[[True, True, False, True, True],
                                     [True, False, True, True, True]]])        # [B=1, K=2, N=5]
    keypoint_mask = torch.tensor([[True, True, True, True, False]])            # last is padding
    mask = evaluation_mask(query_visible, support_visible, keypoint_mask)
    # kp0: all visible; kp1: second shot misses it; kp2: first shot misses it; kp3: query misses it; kp4: padding
    assert mask.tolist() == [[[True, False, False, False, False]]]


def test_pck_is_per_query_and_a_query_with_nothing_counted_scores_zero():
    gt = torch.zeros(1, 3, 2, 2)
    pred = torch.tensor([[[[0.0, 0.0], [90.0, 0.0]],      # query A: 1 of 2 correct
                          [[1.0, 1.0], [2.0, 2.0]],       # query B: 2 of 2 correct
                          [[99.0, 0.0], [99.0, 0.0]]]])   # query C: nothing counted, scores 0
    mask = torch.tensor([[[True, True], [True, True], [False, False]]])
    pck = batch_pck(pred, gt, torch.full((1, 3), 100.0), mask, 0.2)
    assert pck.shape == (1, 3) and pck.tolist() == [[0.5, 1.0, 0.0]]  # per query: the mean is over queries


def test_pck_rejects_bad_shapes():
    with pytest.raises(PCKError, match="shapes disagree"):
        keypoint_pck(np.zeros((2, 3, 2)), np.zeros((2, 4, 2)), np.ones((2, 3), bool), np.ones(2))
    with pytest.raises(PCKError, match="shapes disagree"):
        keypoint_pck(np.zeros((2, 3, 2)), np.zeros((2, 3, 2)), np.ones((2, 3), bool), np.ones(3))


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
