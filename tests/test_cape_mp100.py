"""MP-100 loader (utils/data/cape/mp100.py): the official files' oddities, the reference's instance rules,
error messages, crops, augmentation, the training sampler and batching, and the report script."""

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from utils.data.cape.mp100 import (IMAGENET_MEAN, IMAGENET_STD, Augmentation, Episode, EpisodeDataset, EpisodeSampler,
                                   Instance, MP100FormatError, annotation_path, apply_affine, category_report,
                                   clean_bbox, collate_episodes, crop_to_original, format_report, load_instance,
                                   load_mp100, load_split)

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


def write_coco(path, categories, images, annotations):
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as f:
        json.dump({"images": images, "annotations": annotations, "categories": categories}, f)
    return path


def category(cid, n, skeleton=(), named=True):
    names = [f"k{i}" for i in range(n)] if named else []
    return {"id": cid, "name": f"c{cid}", "supercategory": "x", "keypoints": names, "skeleton": [list(e) for e in skeleton]}


def ann(aid, image_id, cid, n, bbox=(10, 10, 50, 40), **extra):
    kps = [v for i in range(n) for v in (12.0 + i, 15.0 + 2 * i, 2)]
    return {"id": aid, "image_id": image_id, "category_id": cid, "bbox": list(bbox), "keypoints": kps,
            "num_keypoints": n, "iscrowd": 0, "area": 100.0, **extra}


IMAGES = [{"id": i, "file_name": f"{i}.jpg", "width": 100, "height": 80} for i in (1, 2, 3)]


def test_loader_reads_fixture(tmp_path):
    splits = load_mp100(write_fixture(tmp_path), 1)
    train = splits["train"]
    assert set(train.categories) == {1}
    cat = train.categories[1]
    assert cat.keypoint_names == ("k0", "k1", "k2") and cat.num_keypoints == 3
    assert cat.skeleton == ((0, 1), (1, 2)) and cat.skeleton_base == 1  # stored 1-based, kept 0-based
    inst = train.instances[1]
    assert len(inst) == 4
    np.testing.assert_allclose(inst[1].keypoints, [[5, 10], [11, 13], [17, 16]])
    assert inst[1].keypoints.dtype == np.float32
    assert inst[0].visible.tolist() == [False, True, True] and inst[1].visible.all()
    # the clean box of [4, 8, 30, 20] in a 48 x 48 image: x2 = min(47, 4 + 29) = 33, y2 = min(47, 8 + 19) = 27
    assert inst[0].bbox == (4.0, 8.0, 29.0, 19.0) and inst[0].normaliser == 29.0
    assert inst[0].image_path == tmp_path / "images" / "cat_a" / "0.png"


def test_clean_bbox_is_the_references_sanitiser():
    assert clean_bbox([4, 8, 30, 20], 48, 48) == (4.0, 8.0, 29.0, 19.0)
    assert clean_bbox([-5.5, -2, 30, 20], 48, 48) == (0.0, 0.0, 29.0, 19.0)   # x1 = max(0, x), then + (w - 1)
    assert clean_bbox([40, 30, 30, 30], 48, 48) == (40.0, 30.0, 7.0, 17.0)    # clipped at W - 1 = 47, H - 1 = 47
    assert clean_bbox([10.25, 3.5, 20.5, 9.75], 100, 80) == (10.25, 3.5, 19.5, 8.75)
    assert clean_bbox([10, 10, -4, 20], 48, 48) is None                          # negative width: x2 = x1
    assert clean_bbox([10, 10, 20, -1], 48, 48) is None
    assert clean_bbox([10, 10, 1, 20], 48, 48) is None                           # w - 1 = 0
    assert clean_bbox([47, 10, 5, 5], 48, 48) is None                            # starts on the last column


def test_official_oddities(tmp_path):
    """Empty keypoint names with keypoints in the annotations, 0-based / 1-based / empty skeletons, and the
    reference's drop rules (iscrowd, empty or negative box, area 0, all-zero keypoints, num_keypoints 0)."""
    cats = [category(18, 4, named=False), category(51, 3, [(0, 1), (1, 2), (2, 0)]),
            category(9, 3, [(1, 2), (2, 3)]), category(7, 2)]
    zero = ann(9, 2, 51, 3)
    zero["keypoints"] = [0] * 9
    hidden = ann(10, 2, 51, 3)
    hidden["keypoints"] = [12.0, 15.0, 0] * 3  # no visible keypoint, but max() > 0: the reference keeps it
    del hidden["num_keypoints"]
    anns = [ann(1, 1, 18, 4), ann(2, 1, 18, 4, iscrowd=1), ann(3, 1, 18, 4, bbox=(10, 10, -20, 30)),
            ann(4, 2, 51, 3, bbox=(10, 10, 30, -2)), ann(5, 2, 51, 3, area=0), ann(6, 2, 51, 3, num_keypoints=0),
            ann(7, 3, 9, 3), ann(8, 3, 7, 2), zero, hidden]
    del anns[7]["iscrowd"]  # xtcocotools treats a missing iscrowd as 0
    split = load_split(write_coco(tmp_path / "a.json", cats, IMAGES, anns), tmp_path, missing_images="allow")
    c = split.categories
    assert c[18].keypoint_names == () and c[18].num_keypoints == 4 and c[18].skeleton_base is None
    assert c[51].skeleton_base == 0 and c[51].skeleton == ((0, 1), (1, 2), (2, 0))
    assert c[9].skeleton_base == 1 and c[9].skeleton == ((0, 1), (1, 2))
    assert c[7].skeleton == () and c[7].skeleton_base is None
    assert {k: [i.ann_id for i in v] for k, v in split.instances.items()} == {18: [1], 51: [10], 9: [7], 7: [8]}
    assert split.dropped == {"iscrowd": [2], "empty bbox": [3, 4, 5], "all keypoint values 0": [9],
                             "num_keypoints 0": [6], "missing image": []}
    assert not split.instances[51][0].visible.any()
    assert [r["skeleton_base"] for r in category_report(split)] == [None, 0, 1, None]
    text = format_report(split)
    assert "a.json: 4 categories, 4 instances" in text and "dropped (empty bbox): 3 annotation(s): 3, 4, 5" in text
    assert "4*" in text and "0-based" in text and "1-based" in text and "empty" in text


def test_instances_follow_image_order_then_annotation_order(tmp_path):
    """The evaluation episodes index each category's pool, so its order must be the reference's."""
    images = [IMAGES[2], IMAGES[0], IMAGES[1]]  # file order 3, 1, 2
    anns = [ann(1, 1, 5, 2), ann(2, 2, 5, 2), ann(3, 3, 5, 2), ann(4, 1, 5, 2), ann(5, 3, 5, 2)]
    split = load_split(write_coco(tmp_path / "a.json", [category(5, 2)], images, anns), tmp_path, "allow")
    assert [i.ann_id for i in split.instances[5]] == [3, 5, 1, 4, 2]


@pytest.mark.parametrize("edit,message", [
    (lambda c: c["annotations"][1].update(keypoints=[1, 2, 2]),
     r"a\.json: annotation 2 has 1 keypoints in field 'keypoints', but its category 5 \('c5'\) names 2"),
    (lambda c: c["annotations"][0].update(keypoints=[1, 2, 2, 4]),
     r"a\.json: annotation 1 has field 'keypoints' that is not a non-empty list of numbers.*4 values"),
    (lambda c: c["annotations"][0].update(keypoints=[1, 2, 2, "x", 4, 2]), r"annotation 1 has field 'keypoints'"),
    (lambda c: c["annotations"][1].update(bbox=[1, 2, 3]), r"annotation 2 has field 'bbox' = \[1, 2, 3\]"),
    (lambda c: c["annotations"][1].update(image_id=99), r"annotation 2 has field 'image_id' = 99, not in 'images'"),
    (lambda c: c["annotations"][1].update(image_id="2"), r"annotation 2 has field 'image_id' = '2', not an integer"),
    (lambda c: c["annotations"][1].update(category_id=4), r"annotation 2 has field 'category_id' = 4"),
    (lambda c: c["annotations"][1].update(id=1), r"annotation 1 appears twice"),
    (lambda c: c["annotations"][1].update(num_keypoints="2"), r"annotation 2 has field 'num_keypoints' = '2'"),
    (lambda c: c["images"][0].pop("width"), r"image 1 lacks \['width'\]"),
    (lambda c: c["categories"][0].update(keypoints=["a", "b", "c"]),
     r"annotation 1 has 2 keypoints in field 'keypoints', but its category 5 \('c5'\) names 3"),
    (lambda c: c["categories"][0].update(skeleton=[[1, 1]]), r"category 5 \('c5'\) has field 'skeleton' using "
                                                             r"keypoints 1\.\.1 only.*cannot be told"),
    (lambda c: c["categories"][0].update(skeleton=[[0, 2]]), r"keypoints 0\.\.2, which fit neither 0\.\.1"),
    (lambda c: c["categories"][0].update(skeleton=[[1, 5]]), r"keypoints 1\.\.5, which fit neither"),
    (lambda c: c["categories"][0].update(skeleton=[[1]]), r"field 'skeleton' = \[\[1\]\], not a list of \[i, j\]"),
])
def test_malformed_file_names_file_entry_and_field(tmp_path, edit, message):
    path = write_coco(tmp_path / "a.json", [category(5, 2)], IMAGES, [ann(1, 1, 5, 2), ann(2, 2, 5, 2)])
    edit_json(path, edit)
    with pytest.raises(MP100FormatError, match=message) as e:
        load_split(path, tmp_path, "allow")
    assert "\n" not in str(e.value)


@pytest.mark.parametrize("named,counts,message", [
    (False, {5: 17, 9: 17, 17: 15, 20: 17},
     r"annotation 17 has 15 keypoints in field 'keypoints', but annotation 5 of the same category 3 has 17 "
     r"\(as 3 of its 4 annotations do\)"),
    (False, {5: 15, 9: 17, 17: 17},  # the first one seen is the odd one out
     r"annotation 5 has 15 keypoints in field 'keypoints', but annotation 9 of the same category 3 has 17 "
     r"\(as 2 of its 3 annotations do\)"),
    (True, {5: 15, 9: 17, 17: 17}, r"annotation 5 has 15 keypoints in field 'keypoints', but its category 3 "
                                   r"\('c3'\) names 17"),
    (True, {5: 17, 9: 17, 17: 15}, r"annotation 17 has 15 keypoints in field 'keypoints', but its category 3 "
                                   r"\('c3'\) names 17"),
])
def test_keypoint_count_error_names_the_annotation_that_disagrees(tmp_path, named, counts, message):
    """A category's count is its name list's length, else what most of its annotations have; not the first one's."""
    anns = [ann(aid, 1, 3, n) for aid, n in counts.items()]
    path = write_coco(tmp_path / "a.json", [category(3, 17, named=named)], IMAGES, anns)
    with pytest.raises(MP100FormatError, match=f"a\\.json: {message}; fix or re-download the file$"):
        load_split(path, tmp_path, "allow")


@pytest.mark.parametrize("extra,note", [
    ([], "12 annotation(s) were dropped: empty bbox: ids 1, 2, 3, ... (12 in all), fix their bbox fields"),
    ([ann(13, 3, 5, 2, iscrowd=1), ann(14, 3, 5, 2)],
     "13 annotation(s) were dropped: iscrowd: ids 13, set their iscrowd to 0 if each is one object; "
     "empty bbox: ids 1, 2, 3, ... (12 in all), fix their bbox fields"),
])
def test_sampler_error_counts_the_dropped_annotations(tmp_path, extra, note):
    anns = [ann(i, 1, 5, 2, bbox=(10, 10, -20, 30)) for i in range(1, 13)] + extra
    split = load_split(write_coco(tmp_path / "a.json", [category(5, 2)], IMAGES, anns), tmp_path, "allow")
    with pytest.raises(MP100FormatError) as e:
        EpisodeSampler(split, shots=1, queries=2)
    assert str(e.value) == (f"{tmp_path / 'a.json'}: no category has 3 instances for 1 shot(s) + 2 queries ({note}); "
                            "lower --shots/--queries")


@pytest.mark.parametrize("where,key", [("annotations", "keypoints"), ("annotations", "bbox"),
                                       ("categories", "keypoints"), ("images", "file_name")])
def test_loader_names_a_missing_key(tmp_path, where, key):
    write_fixture(tmp_path)
    path = annotation_path(tmp_path, 1, "val")
    edit_json(path, lambda c: c[where][0].pop(key))
    with pytest.raises(MP100FormatError, match=f"mp100_split1_val.json: .* \\d+ lacks \\['{key}'\\]"):
        load_split(path, tmp_path / "images")


def test_loader_rejects_missing_top_level_key_and_bad_json(tmp_path):
    write_fixture(tmp_path)
    path = annotation_path(tmp_path, 1, "train")
    edit_json(path, lambda c: c.pop("categories"))
    with pytest.raises(MP100FormatError, match="top level lacks \\['categories'\\]"):
        load_split(path, tmp_path / "images")
    path.write_text('{"images": [')
    with pytest.raises(MP100FormatError, match="mp100_split1_train.json is not valid JSON"):
        load_split(path, tmp_path / "images")


def test_missing_images_are_listed_dropped_or_allowed(tmp_path):
    images = [{"id": i, "file_name": f"im/{i}.jpg", "width": 100, "height": 80} for i in range(1, 9)]
    path = write_coco(tmp_path / "a.json", [category(5, 2)], images, [ann(i, i, 5, 2) for i in range(1, 9)])
    (tmp_path / "im").mkdir()
    for i in (2, 5):
        (tmp_path / "im" / f"{i}.jpg").touch()
    with pytest.raises(MP100FormatError) as e:
        load_split(path, tmp_path)
    msg = str(e.value)
    assert msg.startswith(f"6 image file(s) named in {path} are missing under {tmp_path}: ")
    assert "im/1.jpg" in msg and "im/7.jpg" in msg and "im/8.jpg" not in msg and "(6 in all)" in msg
    dropped = load_split(path, tmp_path, missing_images="drop")
    assert [i.ann_id for i in dropped.instances[5]] == [2, 5] and dropped.dropped["missing image"] == [1, 3, 4, 6, 7, 8]
    allowed = load_split(path, tmp_path, missing_images="allow")
    assert len(allowed.instances[5]) == 8
    assert [p.name for p in allowed.missing_images] == [f"{i}.jpg" for i in (1, 3, 4, 6, 7, 8)]
    with pytest.raises(ValueError, match="missing_images='skip'"):
        load_split(path, tmp_path, missing_images="skip")


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
    assert sampler.sample(np.random.default_rng(7)) == sampler.sample(np.random.default_rng(7))
    with pytest.raises(MP100FormatError, match="no category has 6 instances"):
        EpisodeSampler(splits["test"], shots=2, queries=4)

    # categories with 3 and 5 keypoints batched together: padded to 5 with a mask
    ds_train = EpisodeDataset(splits["train"], EpisodeSampler(splits["train"], 1, 2), 32, Augmentation(), num_episodes=4)
    ds_test = EpisodeDataset(splits["test"], EpisodeSampler(splits["test"], 1, 2), 32, None, num_episodes=4)
    items = [ds_train[0], ds_test[0]]
    batch = collate_episodes(items)
    assert batch["support_image"].shape == (2, 1, 3, 32, 32) and batch["query_image"].shape == (2, 2, 3, 32, 32)
    assert batch["query_keypoints"].shape == (2, 2, 5, 2) and batch["query_crop_to_orig"].shape == (2, 2, 2, 3)
    assert batch["keypoint_mask"].tolist() == [[True] * 3 + [False] * 2, [True] * 5]
    assert not batch["query_visible"][0, :, 3:].any() and not batch["support_visible"][0, :, 3:].any()
    assert batch["category_id"].tolist() == [1, 3]
    # annotation ids of the episode's instances (uid = category * 100 + image)
    assert batch["support_ann_id"].shape == (2, 1) and batch["query_ann_id"].shape == (2, 2)
    assert batch["support_ann_id"].dtype == batch["query_ann_id"].dtype == torch.int64
    for b, cid in enumerate((1, 3)):
        ids = batch["support_ann_id"][b].tolist() + batch["query_ann_id"][b].tolist()
        assert all(i // 100 == cid for i in ids) and len(set(ids)) == 3
    # the skeleton (1-based chains 1-2, 2-3, ... in the file) as a symmetric 0-based adjacency; padding joins nothing
    adjacency = torch.zeros(2, 5, 5, dtype=torch.bool)
    for b, n in enumerate((3, 5)):
        for i in range(n - 1):
            adjacency[b, i, i + 1] = adjacency[b, i + 1, i] = True
    assert batch["adjacency"].dtype == torch.bool and torch.equal(batch["adjacency"], adjacency)
    # the stored original-pixel ground truth is the crop ground truth mapped back (eval crops are not augmented)
    back = crop_to_original(batch["query_keypoints"][1:], batch["query_crop_to_orig"][1:], 32)
    assert torch.allclose(back.float(), batch["query_keypoints_orig"][1:], atol=1e-3)
    # a training stream replays exactly from a resume point
    ds_train.set_epoch(2, start=0)
    first = [ds_train[i]["query_keypoints"] for i in range(4)]
    ds_train.set_epoch(2, start=2)
    assert len(ds_train) == 2 and np.array_equal(ds_train[0]["query_keypoints"], first[2])


def test_adjacency_drops_self_loops_and_uses_0_based_edges(tmp_path):
    cats = [category(51, 4, [(0, 1), (1, 1), (3, 2), (0, 1)])]
    images = [{"id": i, "file_name": f"{i}.png", "width": 48, "height": 48} for i in range(1, 4)]
    for i in range(1, 4):
        Image.fromarray(np.zeros((48, 48, 3), np.uint8)).save(tmp_path / f"{i}.png")
    anns = [ann(i, i, 51, 4, bbox=(2, 2, 40, 40)) for i in range(1, 4)]
    split = load_split(write_coco(tmp_path / "a.json", cats, images, anns), tmp_path)
    item = EpisodeDataset(split, None, 32, None, fixed=[Episode(51, (0,), (1, 2))])[0]
    assert item["adjacency"].tolist() == [[False, True, False, False], [True, False, False, False],
                                          [False, False, False, True], [False, False, True, False]]


def test_augmentation_draws_mmpose_random_scale_and_rotation():
    aug = Augmentation()  # the papers' TopDownGetRandomScaleRotation: scale 0.15, rotation 15, probability 0.6
    rng = np.random.default_rng(0)
    scales, rotations = np.array([aug.sample(rng) for _ in range(4000)]).T
    assert scales.min() >= 0.85 and scales.max() <= 1.15 and (scales == 1.15).any() and (scales == 0.85).any()
    assert np.abs(rotations).max() <= 30 and (np.abs(rotations) == 30).any()
    assert abs((rotations == 0).mean() - 0.4) < 0.03
    by_hand = np.random.default_rng(5)
    n_scale, u, n_rotation = by_hand.standard_normal(), by_hand.random(), by_hand.standard_normal()
    expected = (np.clip(1 + 0.15 * n_scale, 0.85, 1.15), np.clip(15 * n_rotation, -30, 30) if u <= 0.6 else 0.0)
    assert aug.sample(np.random.default_rng(5)) == pytest.approx(expected)


def test_report_script_prints_every_category_with_its_skeleton_base(tmp_path, capsys):
    import runpy
    import sys

    from tests.test_cape_protocol import write_protocol_fixture
    write_protocol_fixture(tmp_path, per_category=20, subset="test", images=False)
    argv = sys.argv
    sys.argv = ["mp100_report.py", "--data_root", str(tmp_path), "--split", "1", "--subset", "test"]
    try:
        with pytest.raises(SystemExit) as done:
            runpy.run_path(str(Path(__file__).resolve().parent.parent / "scripts" / "mp100_report.py"), run_name="__main__")
    finally:
        sys.argv = argv
    out = capsys.readouterr().out
    assert done.value.code == 0 and "mp100_split1_test.json: 3 categories, 60 instances" in out
    assert "1-based" in out and "0-based" in out and "empty" in out and "4*" in out  # category 3 has no names
