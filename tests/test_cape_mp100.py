"""MP-100 loader, crops and episode sampler (utils/data/mp100.py), and the synthetic builder's layout."""

import json

import numpy as np
import pytest
import torch
from PIL import Image

from utils.data.synthetic_cape import build
from utils.data.mp100 import (IMAGENET_MEAN, IMAGENET_STD, Augmentation, EpisodeDataset, EpisodeSampler, MP100FormatError,
                         annotation_path, apply_affine, collate_episodes, load_instance, load_mp100, load_split)
from utils.eval.pck import crop_to_original

# Three categories, one per subset: 3, 4 and 5 keypoints.
CATS = {"train": (1, "cat_a", 3), "val": (2, "cat_b", 4), "test": (3, "cat_c", 5)}


def write_fixture(root, instances=4, size=48):
    """A tiny MP-100-format folder: one category per subset, ``instances`` images each."""
    (root / "annotations").mkdir(parents=True)
    rng = np.random.default_rng(0)
    for subset, (cid, name, n) in CATS.items():
        (root / "images" / name).mkdir(parents=True)
        coco = {"images": [], "annotations": [], "categories": [
            {"id": cid, "name": name, "supercategory": "x", "keypoints": [f"k{i}" for i in range(n)],
             "skeleton": [[i, i + 1] for i in range(1, n)]}]}
        for j in range(instances):
            uid = cid * 100 + j
            file_name = f"{name}/{j}.png"
            Image.fromarray(rng.integers(0, 255, (size, size, 3), dtype=np.uint8)).save(root / "images" / file_name)
            kps = []
            for i in range(n):
                kps += [5.0 + 6 * i, 10.0 + 3 * i, 0 if (i == 0 and j == 0) else 2]
            coco["images"].append({"id": uid, "file_name": file_name, "width": size, "height": size})
            coco["annotations"].append({"id": uid, "image_id": uid, "category_id": cid, "bbox": [4.0, 8.0, 30.0, 20.0],
                                        "keypoints": kps, "num_keypoints": n})
        with open(annotation_path(root, 1, subset), "w") as f:
            json.dump(coco, f)
    return root


def edit_json(path, fn):
    with open(path) as f:
        coco = json.load(f)
    fn(coco)
    with open(path, "w") as f:
        json.dump(coco, f)


def test_loader_reads_fixture(tmp_path):
    splits = load_mp100(write_fixture(tmp_path), 1)
    train = splits["train"]
    assert set(train.categories) == {1}
    cat = train.categories[1]
    assert cat.keypoint_names == ("k0", "k1", "k2") and cat.skeleton == ((1, 2), (2, 3))  # kept 1-indexed
    inst = train.instances[1]
    assert len(inst) == 4
    np.testing.assert_allclose(inst[1].keypoints, [[5, 10], [11, 13], [17, 16]])
    assert inst[0].visible.tolist() == [False, True, True] and inst[1].visible.all()
    assert inst[0].bbox == (4.0, 8.0, 30.0, 20.0)
    assert inst[0].image_path == tmp_path / "images" / "cat_a" / "0.png"


@pytest.mark.parametrize("where,key", [("annotations", "keypoints"), ("annotations", "bbox"),
                                       ("categories", "keypoints"), ("images", "file_name")])
def test_loader_names_a_missing_key(tmp_path, where, key):
    write_fixture(tmp_path)
    path = annotation_path(tmp_path, 1, "val")
    edit_json(path, lambda c: c[where][0].pop(key))
    with pytest.raises(MP100FormatError, match=f"mp100_split1_val.json.*lacks \\['{key}'\\]"):
        load_split(path, tmp_path / "images")


def test_loader_rejects_missing_top_level_key_and_bad_keypoint_length(tmp_path):
    write_fixture(tmp_path)
    path = annotation_path(tmp_path, 1, "train")
    edit_json(path, lambda c: c["annotations"][1].update(keypoints=[1, 2, 2]))
    with pytest.raises(MP100FormatError, match="has 3 keypoint values.*3\\*3 = 9"):
        load_split(path, tmp_path / "images")
    edit_json(path, lambda c: c.pop("categories"))
    with pytest.raises(MP100FormatError, match="top level lacks \\['categories'\\]"):
        load_split(path, tmp_path / "images")


def test_loader_reports_missing_images_and_files(tmp_path):
    write_fixture(tmp_path)
    (tmp_path / "images" / "cat_c" / "2.png").unlink()
    with pytest.raises(MP100FormatError, match="1 image file\\(s\\) named in .*mp100_split1_test.json are missing.*cat_c/2.png"):
        load_mp100(tmp_path, 1)
    with pytest.raises(MP100FormatError, match="not found.*build_synthetic_cape_dataset"):
        load_mp100(tmp_path / "nowhere", 1)


def test_loader_rejects_categories_shared_between_subsets(tmp_path):
    write_fixture(tmp_path)
    with open(annotation_path(tmp_path, 1, "train")) as f:
        train = json.load(f)
    edit_json(annotation_path(tmp_path, 1, "test"), lambda c: c["categories"].append(train["categories"][0]))
    with pytest.raises(MP100FormatError, match="'cat_a'.*both mp100_split1_train.json and mp100_split1_test.json"):
        load_mp100(tmp_path, 1)


def test_crop_coordinates_follow_image_content(tmp_path):
    """A Gaussian blob drawn at a keypoint must land where the keypoint's crop coordinates say (rotated crop too)."""
    size, c = 96, np.array([40.5, 30.5])
    ys, xs = np.mgrid[0:size, 0:size]
    blob = 255 * np.exp(-((xs + 0.5 - c[0]) ** 2 + (ys + 0.5 - c[1]) ** 2) / (2 * 2.0 ** 2))
    Image.fromarray(np.repeat(blob[..., None], 3, 2).astype(np.uint8)).save(tmp_path / "blob.png")
    from utils.data.mp100 import Instance
    inst = Instance(1, 1, tmp_path / "blob.png", (20.0, 15.0, 40.0, 30.0), c[None].astype(np.float32), np.array([True]))
    rng = np.random.default_rng(3)
    for augment in (None, Augmentation(scale=0.2, rotation=30.0, colour=0.0)):
        out = load_instance(inst, 64, augment, rng)
        img = out["image"][0] * IMAGENET_STD[0] + IMAGENET_MEAN[0]
        w = img / img.sum()
        yy, xx = np.mgrid[0:64, 0:64]
        centroid = np.array([(w * (xx + 0.5)).sum(), (w * (yy + 0.5)).sum()])
        np.testing.assert_allclose(out["keypoints"][0] * 64, centroid, atol=0.1)
        # and back to original pixels through crop_to_orig
        back = apply_affine(out["crop_to_orig"].astype(np.float64), out["keypoints"][0] * 64)
        np.testing.assert_allclose(back, c, atol=1e-3)
        assert out["bbox_size"] == 40.0
        np.testing.assert_array_equal(out["keypoints_orig"], c[None])


def test_augmentation_hides_points_pushed_out_of_the_crop(tmp_path):
    write_fixture(tmp_path)
    inst = load_split(annotation_path(tmp_path, 1, "test"), tmp_path / "images").instances[3][1]
    far = type(inst)(inst.ann_id, inst.category_id, inst.image_path, inst.bbox,
                     np.array([[19.0, 18.0], [500.0, 18.0], [19.0, -300.0], [20, 20], [21, 21]], np.float32), inst.visible)
    out = load_instance(far, 32, Augmentation(scale=0.01, rotation=0.0, colour=0.2), np.random.default_rng(0))
    assert out["visible"].tolist() == [True, False, False, True, True]
    assert load_instance(far, 32)["visible"].all()  # evaluation keeps the annotation's visibility


def test_sampler_and_dataset_batches(tmp_path):
    splits = load_mp100(write_fixture(tmp_path, instances=5), 1)
    sampler = EpisodeSampler(splits["test"], shots=2, queries=3)
    ep = sampler.sample(np.random.default_rng(0))
    assert ep.category_id == 3 and len(set(ep.support + ep.query)) == 5
    assert sampler.fixed_episodes(3, seed=7) == sampler.fixed_episodes(3, seed=7)
    with pytest.raises(MP100FormatError, match="no category has 6 instances"):
        EpisodeSampler(splits["test"], shots=2, queries=4)

    # categories with 3 and 5 keypoints batched together: padded to 5 with a mask
    ds_train = EpisodeDataset(splits["train"], EpisodeSampler(splits["train"], 1, 2), 32, Augmentation(), num_episodes=4)
    ds_test = EpisodeDataset(splits["test"], EpisodeSampler(splits["test"], 1, 2), 32, None, num_episodes=4)
    batch = collate_episodes([ds_train[0], ds_test[0]])
    assert batch["support_image"].shape == (2, 1, 3, 32, 32) and batch["query_image"].shape == (2, 2, 3, 32, 32)
    assert batch["query_keypoints"].shape == (2, 2, 5, 2) and batch["query_crop_to_orig"].shape == (2, 2, 2, 3)
    assert batch["keypoint_mask"].tolist() == [[True] * 3 + [False] * 2, [True] * 5]
    assert not batch["query_visible"][0, :, 3:].any() and not batch["support_visible"][0, :, 3:].any()
    assert batch["category_id"].tolist() == [1, 3]
    # the stored original-pixel ground truth is the crop ground truth mapped back (eval crops are not augmented)
    back = crop_to_original(batch["query_keypoints"][1:], batch["query_crop_to_orig"][1:], 32)
    assert torch.allclose(back.float(), batch["query_keypoints_orig"][1:], atol=1e-3)
    # a training stream replays exactly from a resume point
    ds_train.set_epoch(2, start=0)
    first = [ds_train[i]["query_keypoints"] for i in range(4)]
    ds_train.set_epoch(2, start=2)
    assert len(ds_train) == 2 and np.array_equal(ds_train[0]["query_keypoints"], first[2])


def test_synthetic_builder_writes_mp100_layout(tmp_path):
    build(tmp_path, num_categories=10, instances_per_category=3, image_size=48, seed=1)
    test_cats = []
    for split in range(1, 6):
        splits = load_mp100(tmp_path, split)  # checks disjointness and that every image exists
        sizes = {s: len(splits[s].categories) for s in splits}
        assert sizes == {"train": 7, "val": 1, "test": 2}
        test_cats += list(splits["test"].categories)
        for sp in splits.values():
            for cat in sp.categories.values():
                n = len(cat.keypoint_names)
                assert 8 <= n <= 68
                assert len(cat.skeleton) == n - 1 and all(1 <= i <= n for e in cat.skeleton for i in e)
    assert sorted(test_cats) == list(range(1, 11))  # each category is a test category in exactly one split
    with open(annotation_path(tmp_path, 1, "train")) as f:
        coco = json.load(f)
    counts = sorted(len(c["keypoints"]) for c in coco["categories"])
    ann = coco["annotations"][0]
    assert {"id", "image_id", "category_id", "bbox", "keypoints", "num_keypoints"} <= set(ann)
    assert ann["num_keypoints"] == sum(v > 0 for v in ann["keypoints"][2::3])
    assert counts[0] >= 8 and counts[-1] <= 68
