"""CAPE models (models/cape/): backbones and their weights, CapeFormer, Pose Anything's graph decoder, the loss
and the recipes, against hand computations and independent re-computations of the reference rules.

Numerical parity with the reference heads themselves (flyinglynx/CapeFormer, orhir/PoseAnything) was checked
outside the suite by running their code with weights copied from these models (see the module docstrings).
"""

import math

import numpy as np
import pytest
import timm
import torch
import torch.nn.functional as F
import torchvision

from models.cape import CapeModelError, build_model, init_backbone_weights, model_config
from models.cape.backbone import ResNetBackbone, SwinV2Backbone
from models.cape.capeformer import (grid_embedding, inverse_sigmoid, local_soft_argmax, msra_heatmaps,
                                    pool_support_features, sine_embedding, soft_argmax, support_order_embedding)
from models.cape.pose_anything import GCNLayer, gcn_adjacency
from models.cape.recipes import RECIPES, get_recipe, reference_epoch_queries
from utils.checkpoint import CheckpointError

TINY_SWIN = dict(window_size=4, embed_dim=16, depths=(1, 1, 1, 1), num_heads=(1, 1, 2, 2))
TINY_HEAD = dict(hidden_dim=32, num_heads=4, num_encoder_layers=2, ffn_dim=64, similarity_proj_dim=32,
                 dynamic_proj_dim=16, dropout=0.0)
TINY = {
    "capeformer": dict(TINY_HEAD, backbone="resnet18", backbone_stride=16),
    "pose_anything": dict(TINY_HEAD, image_size=64, drop_path_rate=0.0, backbone_kwargs=TINY_SWIN),
}


def tiny_model(name, seed=0):
    torch.manual_seed(seed)
    return build_model(name, **TINY[name])


def episode(b=2, k=2, q=2, n=6, size=64, seed=0):
    """A batch as collate_episodes makes it; episode 1 has only n - 2 real keypoints; a path skeleton."""
    g = torch.Generator().manual_seed(seed)
    mask = torch.ones(b, n, dtype=torch.bool)
    mask[1, n - 2:] = False
    adjacency = torch.zeros(b, n, n, dtype=torch.bool)
    for i in range(n - 1):
        adjacency[:, i, i + 1] = adjacency[:, i + 1, i] = True
    adjacency &= mask[:, :, None] & mask[:, None, :]
    batch = dict(support_image=torch.randn(b, k, 3, size, size, generator=g),
                 support_keypoints=torch.rand(b, k, n, 2, generator=g) * 0.8 + 0.1,
                 support_visible=torch.ones(b, k, n, dtype=torch.bool) & mask[:, None],
                 query_image=torch.randn(b, q, 3, size, size, generator=g),
                 query_keypoints=torch.rand(b, q, n, 2, generator=g) * 0.8 + 0.1,
                 query_visible=torch.ones(b, q, n, dtype=torch.bool) & mask[:, None],
                 keypoint_mask=mask, adjacency=adjacency)
    batch["support_visible"][0, k - 1, 2] = False  # keypoint 2 of episode 0 unseen in a shot: not a token
    batch["query_visible"][0, 0, 1] = False
    return batch


def forward(model, batch):
    return model(batch["support_image"], batch["support_keypoints"], batch["support_visible"], batch["query_image"],
                 batch["keypoint_mask"], batch["adjacency"])


def mmpose_msra(point_px, visible, size, sigma, stride=4):
    """mmpose 0.x TopDownGenerateTarget "MSRA" for one keypoint, written out from its rule."""
    target = np.zeros((size, size), np.float32)
    mu = [int(point_px[0] / stride + 0.5), int(point_px[1] / stride + 0.5)]
    tmp = 3 * sigma
    ul, br = [int(mu[0] - tmp), int(mu[1] - tmp)], [int(mu[0] + tmp + 1), int(mu[1] + tmp + 1)]
    weight = visible and not (ul[0] >= size or ul[1] >= size or br[0] < 0 or br[1] < 0)
    if weight:
        for y in range(max(0, ul[1]), min(br[1], size)):
            for x in range(max(0, ul[0]), min(br[0], size)):
                target[y, x] = math.exp(-((x - mu[0]) ** 2 + (y - mu[1]) ** 2) / (2 * sigma ** 2))
    return target, weight


# --------------------------------------------------------------------------------------------- backbones

def test_resnet50_torchvision_state_dict_loads_with_no_missing_keys(tmp_path):
    source = torchvision.models.resnet50()
    torch.save(source.state_dict(), tmp_path / "resnet50.pth")  # with the fc head, as torchvision ships it
    for stride in (32, 16):
        net = ResNetBackbone("resnet50", stride)
        assert "weights from" in init_backbone_weights(net, tmp_path / "resnet50.pth")
        reference = source.state_dict()
        assert all(torch.equal(v, reference[k]) for k, v in net.state_dict().items())
    assert len(ResNetBackbone("resnet50").state_dict()) == len(source.state_dict()) - 2  # all but fc.weight/bias


def test_swinv2_timm_state_dict_loads_with_no_missing_keys(tmp_path):
    source = timm.create_model("swinv2_tiny_window16_256")
    torch.save(source.state_dict(), tmp_path / "swinv2_t.pth")  # timm layout with its classifier
    net = SwinV2Backbone("swinv2_tiny_window16_256", 256, 0.0)
    init_backbone_weights(net, tmp_path / "swinv2_t.pth")
    reference = source.state_dict()
    assert net.channels == 768
    assert all(torch.equal(v, reference[k.removeprefix("body.")]) for k, v in net.state_dict().items())


def _microsoft_layout(timm_state):
    """timm -> Microsoft Swin-Transformer layout: patch merging ends stage i instead of starting stage i + 1."""
    out = {}
    for k, v in timm_state.items():
        parts = k.split(".")
        if parts[0] == "layers" and parts[2] == "downsample":
            parts[1] = str(int(parts[1]) - 1)
        out[".".join(parts).replace("head.fc.", "head.")] = v
    return out


@pytest.mark.parametrize("layout", ["microsoft", "simmim", "safetensors"])
def test_swinv2_other_layouts_load(tmp_path, layout):
    torch.manual_seed(0)
    source = timm.create_model("swinv2_tiny_window16_256", img_size=64, **TINY_SWIN)
    state = source.state_dict()
    if layout == "microsoft":
        torch.save({"model": _microsoft_layout(state)}, path := tmp_path / "ms.pth")
    elif layout == "simmim":
        ms = {("encoder." + k).replace("cpb_mlp", "rpe_mlp"): v for k, v in _microsoft_layout(state).items()
              if not k.startswith("head.")}
        torch.save({"model": {**ms, "encoder.mask_token": torch.zeros(1, 1, 16), "decoder.0.weight": torch.zeros(3)}},
                   path := tmp_path / "simmim.pth")
    else:
        from safetensors.torch import save_file
        save_file(state, path := tmp_path / "model.safetensors")
    net = SwinV2Backbone("swinv2_tiny_window16_256", 64, 0.0, **TINY_SWIN)
    init_backbone_weights(net, path)
    assert all(torch.equal(v, state[k.removeprefix("body.")]) for k, v in net.state_dict().items())


def test_backbone_weights_errors_are_one_line(tmp_path):
    torch.save(torchvision.models.resnet18().state_dict(), tmp_path / "r18.pth")
    (tmp_path / "junk.pth").write_bytes(b"not a checkpoint")
    torch.save(torch.zeros(3), tmp_path / "tensor.pth")
    cases = [(ResNetBackbone("resnet50"), tmp_path / "r18.pth", "do not fit: .* missing"),
             (ResNetBackbone("resnet18"), tmp_path / "missing.pth", "does not exist"),
             (ResNetBackbone("resnet18"), tmp_path / "junk.pth", None),  # wording is utils/checkpoint.py's
             (ResNetBackbone("resnet18"), tmp_path / "tensor.pth", "no state dict"),
             (SwinV2Backbone("swinv2_tiny_window16_256", 64, 0.0, **TINY_SWIN), tmp_path / "r18.pth", "do not fit")]
    for net, path, message in cases:
        with pytest.raises(CheckpointError, match=message) as info:
            init_backbone_weights(net, path)
        assert "\n" not in str(info.value) and str(path) in str(info.value)


def test_backbone_weights_from_local_caches_or_random(tmp_path, monkeypatch):
    import huggingface_hub.constants

    monkeypatch.setattr(torch.hub, "get_dir", lambda: str(tmp_path / "torch"))
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path / "hf"))
    net = ResNetBackbone("resnet18")
    before = {k: v.clone() for k, v in net.state_dict().items()}
    line = init_backbone_weights(net)
    assert "random initialisation" in line and "published numbers assume ImageNet" in line
    assert all(torch.equal(v, before[k]) for k, v in net.state_dict().items())

    (tmp_path / "torch" / "checkpoints").mkdir(parents=True)
    source = torchvision.models.resnet18().state_dict()
    torch.save(source, tmp_path / "torch" / "checkpoints" / "resnet18-f37072fd.pth")
    assert "(local cache)" in init_backbone_weights(net)
    assert all(torch.equal(v, source[k]) for k, v in net.state_dict().items())

    from safetensors.torch import save_file
    swin = timm.create_model("swinv2_tiny_window16_256", img_size=64, **TINY_SWIN).state_dict()
    snapshot = tmp_path / "hf" / "models--timm--swinv2_tiny_window16_256.ms_in1k" / "snapshots" / "abc123"
    snapshot.mkdir(parents=True)
    save_file(swin, snapshot / "model.safetensors")
    (snapshot.parent.parent / "refs").mkdir()
    (snapshot.parent.parent / "refs" / "main").write_text("abc123")
    net = SwinV2Backbone("swinv2_tiny_window16_256", 64, 0.0, **TINY_SWIN)
    assert "(local cache)" in init_backbone_weights(net)
    assert all(torch.equal(v, swin[k.removeprefix("body.")]) for k, v in net.state_dict().items())


def test_backbone_feature_shapes():
    x = torch.zeros(2, 3, 64, 64)
    assert ResNetBackbone("resnet18", 32)(x).shape == (2, 512, 2, 2)
    assert ResNetBackbone("resnet18", 16)(x).shape == (2, 256, 4, 4)
    assert ResNetBackbone("resnet50", 16).channels == 1024
    swin = SwinV2Backbone("swinv2_tiny_window16_256", 64, 0.0, **TINY_SWIN)
    assert swin(x).shape == (2, 128, 4, 4)
    with pytest.raises(CapeModelError, match="built for 64 px"):
        swin(torch.zeros(1, 3, 128, 128))
    assert ResNetBackbone("resnet18", 8)(x).shape == (2, 128, 8, 8)


# --------------------------------------------------------------------------------------------- shared pieces

def test_msra_heatmaps_follow_the_mmpose_rule():
    size, sigma = 16, 2
    points = torch.tensor([[10.4 / 64, 20.6 / 64],     # mu = (int(10.4 / 4 + .5), int(20.6 / 4 + .5)) = (3, 5)
                           [0.99, 0.02],               # window clipped at the edges
                           [-0.12, 0.5],               # mu_x = int(-1.42) = -1 (truncation), window reaches the map
                           [-0.6, 0.5],                # mu_x = -9: window [-15, -3] wholly off the map: weight 0
                           [0.5, 0.5]])                # invisible
    visible = torch.tensor([True, True, True, True, False])
    heat, weight = msra_heatmaps(points, visible, size, sigma)
    assert weight.tolist() == [True, True, True, False, False]
    assert heat[0, 5, 3] == 1.0 and heat[0, 5, 5].item() == pytest.approx(math.exp(-4 / 8))
    assert heat[0, 5, 10] == 0.0  # 7 cells away: outside the 3-sigma window
    for i in range(len(points)):
        expected, w = mmpose_msra((points[i] * 64).tolist(), bool(visible[i]), size, sigma)
        assert w == bool(weight[i])
        np.testing.assert_allclose(heat[i].numpy(), expected, rtol=1e-6, atol=1e-7)


def test_pooling_equals_the_reference_resize_then_weight():
    g = torch.Generator().manual_seed(0)
    features = torch.randn(2, 5, 3, 4, generator=g)             # [M, C, h, w]
    heat = torch.rand(2, 3, 12, 16, generator=g)                # [M, N, H, W]
    heat[1, 2] = 0                                              # an empty map pools to zeros
    resized = F.interpolate(features, size=(12, 16), mode="bilinear", align_corners=False)
    weights = heat / (heat.sum((-2, -1), keepdim=True) + 1e-8)
    expected = weights.flatten(2) @ resized.flatten(2).transpose(1, 2)
    pooled = pool_support_features(features, heat)
    torch.testing.assert_close(pooled, expected, rtol=1e-5, atol=1e-6)
    assert torch.equal(pooled[1, 2], torch.zeros(5))


def test_soft_argmax_global_and_local():
    h = w = 4
    probs = torch.zeros(1, h * w)
    probs[0, 1 * w + 1] = 0.5  # cell (row 1, col 1)
    probs[0, 3 * w + 3] = 0.5  # cell (row 3, col 3), outside the 3 x 3 window around the first arg-max
    torch.testing.assert_close(soft_argmax(probs, h, w), torch.tensor([[(1.5 + 3.5) / 2 / w, (1.5 + 3.5) / 2 / h]]))
    torch.testing.assert_close(local_soft_argmax(probs, h, w), torch.tensor([[1.5 / w, 1.5 / h]]))
    probs = torch.zeros(1, h * w)
    probs[0, [0, 1, 5]] = torch.tensor([0.5, 0.3, 0.2])  # all within the window of cell (0, 0)
    torch.testing.assert_close(local_soft_argmax(probs, h, w),
                               torch.tensor([[(0.5 * 0.5 + 0.3 * 1.5 + 0.2 * 1.5) / w, (0.8 * 0.5 + 0.2 * 1.5) / h]]))


def test_sine_embeddings_by_hand():
    emb = sine_embedding(torch.tensor([[0.25, 0.5]]), num_feats=4)[0]  # frequencies 1, 1, 100, 100
    expected = [math.sin(math.pi), math.cos(math.pi), math.sin(math.pi / 100), math.cos(math.pi / 100),  # y
                math.sin(math.pi / 2), math.cos(math.pi / 2), math.sin(math.pi / 200), math.cos(math.pi / 200)]
    torch.testing.assert_close(emb, torch.tensor(expected), atol=1e-6, rtol=0)
    grid = grid_embedding(2, 3, 4, torch.device("cpu"))
    torch.testing.assert_close(grid[1 * 3 + 2], sine_embedding(torch.tensor([3 / (3 + 1e-6), 2 / (2 + 1e-6)]), 4))
    torch.testing.assert_close(support_order_embedding(10, 4, torch.device("cpu"))[:3],
                               support_order_embedding(3, 4, torch.device("cpu")))  # normalised by 100, not N
    torch.testing.assert_close(support_order_embedding(1, 4, torch.device("cpu"))[0],
                               sine_embedding(torch.tensor([1 / (100 + 1e-6), 1 / (1 + 1e-6)]), 4))
    torch.testing.assert_close(inverse_sigmoid(torch.tensor([0.0, 0.5, 1.2])),
                               torch.tensor([math.log(1e-3), 0.0, math.log(1 / 1e-3)]))


# --------------------------------------------------------------------------------------------- graph layer

def test_gcn_adjacency_and_layer_by_hand():
    adjacency = torch.zeros(1, 5, 5, dtype=torch.bool)
    adjacency[0, 0, 1] = adjacency[0, 1, 2] = adjacency[0, 3, 4] = True      # one direction is enough
    valid = torch.tensor([[True, True, True, True, False]])                  # keypoint 4 not usable
    graph = gcn_adjacency(adjacency, valid)
    neighbours = torch.tensor([[0, 1, 0, 0, 0], [.5, 0, .5, 0, 0], [0, 1, 0, 0, 0], [0] * 5, [0] * 5])
    torch.testing.assert_close(graph[0, 0], torch.diag(torch.tensor([1.0, 1, 1, 1, 0])))
    torch.testing.assert_close(graph[0, 1], neighbours.float())

    layer = GCNLayer(2, 1)
    with torch.no_grad():
        layer.proj.weight.copy_(torch.tensor([[1.0, 0.0], [0.0, 1.0]]))    # kernel 0 reads x[0], kernel 1 x[1]
        layer.proj.bias.copy_(torch.tensor([0.0, 0.1]))
    x = torch.tensor([[[1.0, 10.0], [2.0, 20.0], [3.0, 30.0], [4.0, 40.0], [5.0, 50.0]]])
    out = layer(x, graph)[0, :, 0]
    # node w: x_w[0] + sum over neighbours v of (x_v[1] + 0.1) / deg(v); 4 is invalid, 3 has no valid neighbour
    expected = [1 + (20.1 / 2), 2 + 10.1 / 1 + 30.1 / 1, 3 + 20.1 / 2, 4, 0]
    torch.testing.assert_close(out, torch.tensor(expected))


def test_empty_skeleton_falls_back_to_self_loops():
    graph = gcn_adjacency(torch.zeros(1, 3, 3, dtype=torch.bool), torch.ones(1, 3, dtype=torch.bool))
    assert torch.equal(graph[0, 1], torch.zeros(3, 3)) and torch.equal(graph[0, 0], torch.eye(3))
    layer = GCNLayer(4, 3)
    x = torch.randn(1, 3, 4)
    expected = F.relu(x @ layer.proj.weight[:3].T + layer.proj.bias[:3])
    torch.testing.assert_close(layer(x, graph), expected)


# --------------------------------------------------------------------------------------------- models

def test_reference_architecture_settings():
    cf = build_model("capeformer")[0]
    assert cf.backbone.name == "resnet50" and cf.backbone.stride == 32 and cf.query_proj.in_features == 2048
    layer = cf.transformer.decoder.layers[0]
    assert layer.linear1.out_features == 2048 and layer.multihead_attn.embed_dim == 512   # positions concatenated
    assert layer.multihead_attn.vdim == 256 and layer.choker.in_features == 512
    assert len(cf.transformer.encoder.layers) == 3 and len(cf.kpt_branch) == 3
    assert all(torch.equal(b[-1].weight, torch.zeros_like(b[-1].weight)) for b in cf.kpt_branch)
    pa = model_config("pose_anything")
    assert (pa.backbone, pa.ffn_dim, pa.heatmap_sigma, pa.support_order_embedding) == (
        "swinv2_tiny_window16_256", 768, 1, False)
    lite = model_config("capeformer_lite")
    assert (lite.backbone, lite.backbone_stride, lite.hidden_dim) == ("resnet18", 16, 128)


@pytest.mark.parametrize("name", ["capeformer", "pose_anything"])
def test_forward_shapes_and_padding_invariance(name):
    model, _ = tiny_model(name)
    model.eval()
    batch = episode()
    with torch.no_grad():
        out = forward(model, batch)
    b, q, n = 2, 2, 6
    assert out["similarity"].shape == (b, q, n, 4, 4) and out["refined"].shape == (3, b, q, n, 2)
    assert out["initial"].shape == out["proposals"].shape == (b, q, n, 2)
    assert all(v.dtype == torch.float32 for k, v in out.items() if k != "support_mask")
    assert out["support_mask"].tolist() == [[True, True, False, True, True, True], [True] * 4 + [False] * 2]
    # Three more padded keypoints (anywhere, joined to nothing) must not change any real keypoint's output.
    padded = dict(batch)
    for key, extra in (("support_keypoints", torch.rand(b, 2, 3, 2)), ("query_keypoints", torch.rand(b, q, 3, 2))):
        padded[key] = torch.cat([batch[key], extra], 2)
    for key in ("support_visible", "query_visible"):
        padded[key] = torch.cat([batch[key], torch.zeros(*batch[key].shape[:2], 3, dtype=torch.bool)], 2)
    padded["keypoint_mask"] = torch.cat([batch["keypoint_mask"], torch.zeros(b, 3, dtype=torch.bool)], 1)
    padded["adjacency"] = F.pad(batch["adjacency"], (0, 3, 0, 3))
    with torch.no_grad():
        out_p = forward(model, padded)
    real = batch["keypoint_mask"]
    for key in ("initial", "proposals"):
        torch.testing.assert_close(out_p[key][..., :n, :][real[:, None].expand(b, q, n)],
                                   out[key][real[:, None].expand(b, q, n)], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(out_p["refined"][..., :n, :][:, real[:, None].expand(b, q, n)],
                               out["refined"][:, real[:, None].expand(b, q, n)], atol=1e-5, rtol=1e-5)


def test_skeleton_changes_pose_anything_but_not_capeformer():
    batch = episode()
    no_edges = dict(batch, adjacency=torch.zeros_like(batch["adjacency"]))
    for name, changes in (("capeformer", False), ("pose_anything", True)):
        model, _ = tiny_model(name)
        with torch.no_grad():
            for branch in model.kpt_branch:  # let the decoder move the points
                branch[-1].weight.normal_(0, 0.5)
        model.eval()
        with torch.no_grad():
            a, b = forward(model, batch)["refined"], forward(model, no_edges)["refined"]
        assert (not torch.allclose(a, b, atol=1e-4)) == changes


@pytest.mark.parametrize("name", ["capeformer", "pose_anything"])
def test_gradients_reach_the_backbone_and_a_step_lowers_the_loss(name):
    model, loss_fn = tiny_model(name)
    batch = episode()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    loss, parts = loss_fn(forward(model, batch), batch)
    loss.backward()
    first = next(p for n, p in model.named_parameters() if n.startswith("backbone."))
    assert first.grad is not None and first.grad.abs().sum() > 0
    assert all(b[-1].weight.grad.abs().sum() > 0 for b in model.kpt_branch)  # the zero-initialised last layers
    assert set(parts) == {"heatmap_loss", "proposal_loss", "l1_loss_layer0", "l1_loss_layer1", "l1_loss_layer2"}
    optimizer.step()
    with torch.no_grad():
        after, _ = loss_fn(forward(model, batch), batch)
    assert after < loss


def test_loss_matches_hand_computation():
    rng = np.random.default_rng(1)
    b, q, n, h, w, layers, sigma, size = 1, 2, 3, 4, 4, 2, 1, 32   # heatmap grid 32 / 4 = 8
    gt = rng.random((b, q, n, 2)) * 0.9
    gt[0, 1, 2] = [1.5, 0.5]                                          # Gaussian off the map: weight 0
    visible = np.array([[[True, False, True], [True, True, True]]])
    support_mask = np.array([[True, True, False]])
    outputs = {"similarity": torch.tensor(rng.normal(size=(b, q, n, h, w)), dtype=torch.float32),
               "initial": torch.tensor(rng.random((b, q, n, 2)), dtype=torch.float32),
               "refined": torch.tensor(rng.random((layers, b, q, n, 2)), dtype=torch.float32),
               "support_mask": torch.tensor(support_mask)}
    batch = {"query_keypoints": torch.tensor(gt, dtype=torch.float32), "query_visible": torch.tensor(visible),
             "query_image": torch.zeros(b, q, 3, size, size)}
    total, parts = build_model("capeformer", backbone="resnet18", heatmap_sigma=sigma)[1](outputs, batch,
                                                                                        heatmap_weight=2.0)
    heat_terms, l1_init, l1_layers = [], [], np.zeros(layers)
    for qi in range(q):
        weights, hm, init, per_layer = [], 0.0, 0.0, np.zeros(layers)
        for ni in range(n):
            target, on_map = mmpose_msra((gt[0, qi, ni] * size).tolist(), bool(visible[0, qi, ni]), 8, sigma)
            wt = float(on_map and support_mask[0, ni])
            weights.append(wt)
            small = F.interpolate(torch.tensor(target)[None, None], size=(h, w), mode="bilinear",
                                  align_corners=False)[0, 0].numpy()
            small = small / (small.max() + 1e-10)
            sig = 1 / (1 + np.exp(-outputs["similarity"][0, qi, ni].double().numpy()))
            hm += wt * ((sig - small) ** 2).mean()
            init += wt * np.abs(outputs["initial"][0, qi, ni].numpy() - gt[0, qi, ni]).sum()
            per_layer += wt * np.abs(outputs["refined"][:, 0, qi, ni].numpy() - gt[0, qi, ni]).sum(-1)
        z = max(1.0, sum(weights))
        heat_terms.append(hm / z)
        l1_init.append(init / z)
        l1_layers += per_layer / z / q
    assert parts["heatmap_loss"].item() == pytest.approx(2.0 * np.mean(heat_terms), rel=1e-5)
    assert parts["proposal_loss"].item() == pytest.approx(np.mean(l1_init), rel=1e-5)
    assert parts["l1_loss_layer1"].item() == pytest.approx(l1_layers[1], rel=1e-5)
    assert total.item() == pytest.approx(2.0 * np.mean(heat_terms) + np.mean(l1_init) + l1_layers.sum(), rel=1e-5)


def test_bad_settings_and_inputs_raise_one_line():
    with pytest.raises(CapeModelError, match="not one of"):
        build_model("capeformer_xl")
    with pytest.raises(CapeModelError, match="no setting"):
        model_config("capeformer", hidden=3)
    with pytest.raises(CapeModelError, match="divisible"):
        model_config("capeformer", hidden_dim=30)
    with pytest.raises(CapeModelError, match="positive integer"):
        model_config("pose_anything", heatmap_sigma=1.5)
    with pytest.raises(CapeModelError, match="resnet18"):
        build_model("capeformer", backbone="resnet34")
    model, _ = tiny_model("pose_anything")
    batch = episode()
    with pytest.raises(CapeModelError, match="adjacency") as info:
        model(batch["support_image"], batch["support_keypoints"], batch["support_visible"], batch["query_image"],
              batch["keypoint_mask"])
    assert "\n" not in str(info.value)
    model, _ = tiny_model("capeformer")
    big = {k: v[:, :, :1].expand(-1, -1, 101, *v.shape[3:]) if k.endswith(("keypoints", "visible")) else v
           for k, v in batch.items() if k != "adjacency"}
    big["keypoint_mask"] = torch.ones(2, 101, dtype=torch.bool)
    with pytest.raises(CapeModelError, match="at most 100"):
        forward(model, dict(big, adjacency=None))


@pytest.mark.parametrize("name", ["capeformer", "pose_anything"])
def test_bf16_autocast_step_on_cpu(name):
    """The CUDA AMP path's numerics, simulated with CPU bf16 autocast: float32 outputs, finite gradients."""
    model, loss_fn = tiny_model(name)
    batch = episode()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = forward(model, batch)
        loss, _ = loss_fn(out, batch)
    assert out["refined"].dtype == out["similarity"].dtype == torch.float32
    loss.backward()
    assert torch.isfinite(loss) and all(torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None)


@pytest.mark.gpu  # the same step under CPU bf16 autocast: test_bf16_autocast_step_on_cpu
@pytest.mark.parametrize("name", ["capeformer", "pose_anything"])
def test_cuda_amp_step(name):
    model, loss_fn = tiny_model(name)
    model.cuda()
    batch = {k: v.cuda() for k, v in episode().items()}
    bf16 = torch.cuda.is_bf16_supported()
    scaler = None if bf16 else torch.amp.GradScaler("cuda")
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-4)
    with torch.autocast("cuda", dtype=torch.bfloat16 if bf16 else torch.float16):
        loss, _ = loss_fn(forward(model, batch), batch)
    (scaler.scale(loss) if scaler else loss).backward()
    (scaler.step(optimizer) if scaler else optimizer.step())
    assert torch.isfinite(loss)
    assert all(torch.isfinite(p).all() for p in model.parameters())


# --------------------------------------------------------------------------------------------- recipes

def test_recipes_hold_the_reference_configs():
    cf, pa, pa_s = RECIPES["capeformer"].flags, RECIPES["pose_anything"].flags, RECIPES["pose_anything_s"].flags
    for flags in (cf, pa, pa_s):
        assert (flags["optimizer"], flags["lr"], flags["weight_decay"], flags["epochs"]) == ("adam", 1e-5, 0.0, 200)
        assert (flags["lr_steps"], flags["lr_gamma"], flags["lr_warmup_steps"]) == ((160, 180), 0.1, 1000)
        assert (flags["image_size"], flags["queries"], flags["clip_max_norm"]) == (256, 1, 0.0)
        assert "accumulation_steps" not in flags  # how a batch of 16 is split to fit memory is the hardware profile's
        assert (flags["heatmap_weight"], flags["use_amp"], flags["shots"]) == (2.0, False, 1)
        assert (flags["aug_scale"], flags["aug_rotation"], flags["aug_rotation_prob"], flags["aug_colour"]) == (
            0.15, 15.0, 0.6, 0.0)
    assert (cf["model"], cf["backbone"], cf["batch_size"]) == ("capeformer", "resnet50", 16)
    assert (pa["backbone"], pa["drop_path_rate"], pa["batch_size"]) == ("swinv2_tiny_window16_256", 0.2, 16)
    assert (pa_s["backbone"], pa_s["drop_path_rate"], pa_s["batch_size"]) == ("swinv2_small_window16_256", 0.3, 8)
    assert RECIPES["capeformer"].published_pck == (85.3, 89.3)
    with pytest.raises(TypeError):
        cf["lr"] = 1.0  # read-only
    with pytest.raises(CapeModelError, match="not one of"):
        get_recipe("capeformer_v2")


def test_step_schedule_and_epoch_size_by_hand():
    assert reference_epoch_queries({7: 5, 9: 12, 11: 3}) == 36
    with pytest.raises(CapeModelError):
        reference_epoch_queries({})


@pytest.mark.parametrize("name", ["capeformer", "pose_anything"])
def test_shots_are_averaged(name):
    """Support tokens are the mean over shots: two identical shots give the one-shot prediction, and a keypoint
    hidden in one shot is dropped (the reference keeps keypoints seen in every shot)."""
    model, _ = tiny_model(name)
    model.eval()
    one = episode(k=1)
    two = dict(one)
    for key in ("support_image", "support_keypoints", "support_visible"):
        two[key] = torch.cat([one[key]] * 2, 1)
    with torch.no_grad():
        a, b = forward(model, one), forward(model, two)
    torch.testing.assert_close(a["refined"], b["refined"], atol=1e-5, rtol=1e-5)
    two["support_visible"] = two["support_visible"].clone()
    two["support_visible"][0, 1, 3] = False
    with torch.no_grad():
        assert not forward(model, two)["support_mask"][0, 3] and a["support_mask"][0, 3]
