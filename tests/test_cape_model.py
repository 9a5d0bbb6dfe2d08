"""CAPE backbone, model and losses (models/cape/) against independent float64 re-computations."""

import math

import numpy as np
import pytest
import torch

from models.cape import CapeConfig, CapeModel, ResNet, cape_loss, load_backbone_weights, supervised_mask
from models.cape.losses import gaussian_target
from models.cape.model import gaussian_pool, soft_argmax
from utils.run.checkpoint import CheckpointError

TINY = CapeConfig(backbone="resnet18", hidden_dim=32, num_heads=4, ffn_dim=64, dropout=0.0)


@pytest.mark.parametrize("name,params,keys", [("resnet18", 11_176_512, 120), ("resnet50", 23_508_032, 318)])
def test_backbone_matches_torchvision_layout(name, params, keys):
    # torchvision's resnet18/50 have 11,689,512 / 25,557,032 parameters including the 512/2048 x 1000 fc head.
    net = ResNet(name)
    assert sum(p.numel() for p in net.parameters()) == params
    state = net.state_dict()
    assert len(state) == keys and "layer2.0.downsample.0.weight" in state and "layer4.1.bn2.running_var" in state
    c3, c4, c5 = net(torch.zeros(1, 3, 64, 64))
    assert [tuple(c.shape[1:]) for c in (c3, c4, c5)] == [(net.channels[0], 8, 8), (net.channels[1], 4, 4), (net.channels[2], 2, 2)]


def test_load_backbone_weights(tmp_path):
    src = ResNet("resnet18")
    state = {f"module.{k}": v for k, v in src.state_dict().items()}  # DataParallel prefix is tolerated
    state["fc.weight"], state["fc.bias"] = torch.zeros(1000, 512), torch.zeros(1000)  # the classifier is dropped
    torch.save(state, tmp_path / "r18.pth")
    dst = ResNet("resnet18")
    load_backbone_weights(dst, tmp_path / "r18.pth")
    assert all(torch.equal(a, b) for a, b in zip(src.state_dict().values(), dst.state_dict().values()))
    with pytest.raises(CheckpointError, match="does not fit this backbone"):
        load_backbone_weights(ResNet("resnet50"), tmp_path / "r18.pth")
    with pytest.raises(CheckpointError, match="does not exist"):
        load_backbone_weights(dst, tmp_path / "missing.pth")


def test_gaussian_pool_matches_float64():
    rng = np.random.default_rng(0)
    feats = rng.normal(size=(2, 3, 4, 5))          # [M, D, h, w]
    pts = rng.random((2, 6, 2))                    # [M, N, 2]
    sigma = 0.8
    out = gaussian_pool(torch.tensor(feats, dtype=torch.float32), torch.tensor(pts, dtype=torch.float32), sigma)
    ref = np.zeros((2, 6, 3))
    for m in range(2):
        for n in range(6):
            wts = np.array([[math.exp(-(((j + 0.5) / 5 - pts[m, n, 0]) * 5) ** 2 / (2 * sigma ** 2)
                                      - (((i + 0.5) / 4 - pts[m, n, 1]) * 4) ** 2 / (2 * sigma ** 2))
                             for j in range(5)] for i in range(4)])
            ref[m, n] = (feats[m] * wts).sum((1, 2)) / wts.sum()
    np.testing.assert_allclose(out.numpy(), ref, rtol=1e-4, atol=1e-5)


def test_soft_argmax_and_gaussian_target():
    h, w = 4, 8
    logits = torch.full((1, h * w), -1e4)
    logits[0, 2 * w + 5] = 0.0  # row 2, column 5
    assert torch.allclose(soft_argmax(logits, h, w), torch.tensor([[(5 + 0.5) / w, (2 + 0.5) / h]]))
    uniform = soft_argmax(torch.zeros(1, h * w), h, w)
    assert torch.allclose(uniform, torch.tensor([[0.5, 0.5]]))
    t = gaussian_target(torch.tensor([[(5 + 0.5) / w, (2 + 0.5) / h]]), h, w, sigma=1.0)
    assert t.shape == (1, h, w) and t[0, 2, 5] == 1.0
    assert t[0, 2, 6].item() == pytest.approx(math.exp(-0.5)) and t[0, 3, 6].item() == pytest.approx(math.exp(-1.0))


def _episode(b=2, k=2, q=3, n=5, size=64, seed=0):
    g = torch.Generator().manual_seed(seed)
    return dict(support_image=torch.randn(b, k, 3, size, size, generator=g),
                support_keypoints=torch.rand(b, k, n, 2, generator=g),
                support_visible=torch.rand(b, k, n, generator=g) > 0.2,
                query_image=torch.randn(b, q, 3, size, size, generator=g),
                keypoint_mask=torch.ones(b, n, dtype=torch.bool))


def test_model_shapes_and_padding_invariance():
    torch.manual_seed(0)
    model = CapeModel(TINY).eval()
    ep = _episode()
    with torch.no_grad():
        out = model(**ep)
    assert out["heatmap_logits"].shape == (2, 3, 5, 8, 8)
    assert out["initial"].shape == (2, 3, 5, 2) and out["refined"].shape == (3, 2, 3, 5, 2)
    assert ((out["refined"] > 0) & (out["refined"] < 1)).all()
    # Padding a category with extra (masked) keypoints must not change the real keypoints' predictions.
    padded = dict(ep)
    padded["support_keypoints"] = torch.cat([ep["support_keypoints"], torch.rand(2, 2, 3, 2)], 2)
    padded["support_visible"] = torch.cat([ep["support_visible"], torch.zeros(2, 2, 3, dtype=torch.bool)], 2)
    padded["keypoint_mask"] = torch.cat([ep["keypoint_mask"], torch.zeros(2, 3, dtype=torch.bool)], 1)
    with torch.no_grad():
        out_p = model(**padded)
    assert torch.allclose(out_p["refined"][..., :5, :], out["refined"], atol=1e-5)
    assert torch.allclose(out_p["initial"][..., :5, :], out["initial"], atol=1e-6)


def test_cape_loss_matches_hand_computation():
    rng = np.random.default_rng(1)
    b, q, n, h, w, layers = 1, 2, 3, 4, 4, 3
    logits = rng.normal(size=(b, q, n, h, w))
    initial, refined = rng.random((b, q, n, 2)), rng.random((layers, b, q, n, 2))
    gt = rng.random((b, q, n, 2))
    mask = np.array([[[True, False, True], [True, True, False]]])
    out = {"heatmap_logits": torch.tensor(logits), "initial": torch.tensor(initial), "refined": torch.tensor(refined)}
    total, parts = cape_loss(out, torch.tensor(gt), torch.tensor(mask), heatmap_weight=0.5, heatmap_sigma=1.0)

    ys, xs = np.mgrid[0:h, 0:w]
    hm, l1_init, l1_ref = [], [], np.zeros(layers)
    for qi, ni in zip(*np.nonzero(mask[0])):
        target = np.exp(-(((xs + 0.5) / w - gt[0, qi, ni, 0]) * w) ** 2 / 2 - (((ys + 0.5) / h - gt[0, qi, ni, 1]) * h) ** 2 / 2)
        hm.append(((1 / (1 + np.exp(-logits[0, qi, ni])) - target) ** 2).sum())
        l1_init.append(np.abs(initial[0, qi, ni] - gt[0, qi, ni]).mean())
        l1_ref += np.abs(refined[:, 0, qi, ni] - gt[0, qi, ni]).mean(-1)
    count = mask.sum()
    expected = 0.5 * np.mean(hm) + np.mean(l1_init) + l1_ref.sum() / count
    assert total.item() == pytest.approx(expected, rel=1e-5)
    assert parts["heatmap"].item() == pytest.approx(np.mean(hm), rel=1e-5)
    assert parts["l1_refined"].item() == pytest.approx(l1_ref[-1] / count, rel=1e-5)


def test_supervised_mask_and_gradients_reach_the_backbone():
    qv = torch.tensor([[[True, True, False]]])
    sv = torch.tensor([[[False, True, True], [False, False, True]]])  # kp0 is seen by no support
    km = torch.tensor([[True, True, True]])
    assert supervised_mask(qv, sv, km).tolist() == [[[False, True, False]]]

    torch.manual_seed(0)
    model = CapeModel(TINY)
    ep = _episode(b=1, k=1, q=2, n=4)
    ep["support_visible"][:] = True
    out = model(**ep)
    loss, _ = cape_loss(out, torch.rand(1, 2, 4, 2), torch.ones(1, 2, 4, dtype=torch.bool))
    loss.backward()
    assert model.backbone.conv1.weight.grad.abs().sum() > 0
    assert all(h[-1].weight.grad.abs().sum() > 0 for h in model.offset_heads)
