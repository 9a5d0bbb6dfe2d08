"""The MP-100 evaluation protocol (utils/eval/pck.py) against independent re-implementations of the reference:
CapeFormer's instance pools and episode draw (random.seed(1) + random.sample), the clean-box normaliser, and
PCK re-computed from a predictions file."""

import json
import random

import numpy as np
import pytest
from PIL import Image

from tests.test_cape_pck import mmpose_pck
from utils.data.cape.mp100 import EpisodeDataset, MP100FormatError, annotation_path, collate_episodes, load_split
from utils.eval.pck import EpisodeEvaluator, PCKError, protocol_episodes

# (id, keypoints, names given, skeleton as stored); deliberately not in id order: the protocol uses file order
CATEGORIES = [(7, 3, True, [[1, 2], [2, 3]]), (3, 4, False, [[0, 1], [1, 2], [2, 3]]), (12, 2, True, [])]


def write_protocol_fixture(root, per_category=20, subset="test", images=True):
    """An MP-100-format file with the official oddities and extra annotations the reference drops.

    Annotations are shuffled, so file order differs from the reference's image-major order; boxes are
    fractional and partly outside their images, so the clean box matters.
    """
    rng = np.random.default_rng(0)
    sizes = [(int(rng.integers(60, 90)), int(rng.integers(40, 70))) for _ in range(12)]
    coco = {"images": [{"id": 100 + i, "file_name": f"im/{i}.png", "width": w, "height": h}
                       for i, (w, h) in enumerate(sizes)],
            "categories": [{"id": cid, "name": f"cat{cid}", "supercategory": "x",
                            "keypoints": [f"k{i}" for i in range(n)] if named else [], "skeleton": sk}
                           for cid, n, named, sk in CATEGORIES],
            "annotations": []}
    aid = 1000
    for cid, n, _, _ in CATEGORIES:
        for j in range(per_category + 4):
            im = int(rng.integers(len(sizes)))
            w_img, h_img = sizes[im]
            x, y = rng.uniform(-4, 20), rng.uniform(-4, 15)
            w, h = rng.uniform(15, 60), rng.uniform(15, 50)
            xy = np.stack([rng.uniform(max(x, 0), x + w, n), rng.uniform(max(y, 0), y + h, n)], 1).round(3)
            v = rng.choice([0, 1, 2], n, p=[0.25, 0.25, 0.5])
            kps = [float(c) if k < 2 else int(vv) for p, vv in zip(xy, v) for k, c in enumerate([*p, vv])]
            a = {"id": aid, "image_id": 100 + im, "category_id": cid, "bbox": [round(x, 2), round(y, 2), round(w, 2),
                 round(h, 2)], "keypoints": kps, "num_keypoints": int((v > 0).sum()), "iscrowd": 0, "area": w * h}
            if not v.any():  # no visible keypoint: kept by the reference when num_keypoints is absent
                del a["num_keypoints"]
            if j == per_category:
                a["iscrowd"] = 1
            elif j == per_category + 1:
                a["bbox"][2] = -a["bbox"][2]  # negative width, as in a few official annotations
            elif j == per_category + 2:
                a["keypoints"] = [0] * (3 * n)
            elif j == per_category + 3:
                a["num_keypoints"] = 0
            coco["annotations"].append(a)
            aid += 1
    order = rng.permutation(len(coco["annotations"]))
    coco["annotations"] = [coco["annotations"][i] for i in order]
    path = annotation_path(root, 1, subset)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(coco))
    if images:
        (root / "images" / "im").mkdir(parents=True, exist_ok=True)
        for i, (w, h) in enumerate(sizes):
            Image.fromarray(rng.integers(0, 255, (h, w, 3), dtype=np.uint8)).save(root / "images" / f"im/{i}.png")
    return path, coco


def reference_pools(coco):
    """CapeFormer TestPoseDataset._get_db / cat2obj, re-implemented: annotation ids per category, in order."""
    pools = {c["id"]: [] for c in coco["categories"]}
    for im in coco["images"]:
        for a in (a for a in coco["annotations"] if a["image_id"] == im["id"]):
            if a.get("iscrowd", False) != False:  # noqa: E712 (getAnnIds(iscrowd=False) compares with ==)
                continue
            x, y, w, h = a["bbox"]
            x1, y1 = max(0, x), max(0, y)
            x2, y2 = min(im["width"] - 1, x1 + max(0, w - 1)), min(im["height"] - 1, y1 + max(0, h - 1))
            if not (("area" not in a or a["area"] > 0) and x2 > x1 and y2 > y1):
                continue
            if max(a["keypoints"]) == 0 or ("num_keypoints" in a and a["num_keypoints"] == 0):
                continue
            pools[a["category_id"]].append(a["id"])
    return pools


def reference_episodes(coco, shots, queries, num_episodes):
    """CapeFormer make_paired_samples, re-implemented with the global random module: [support ids + query ids]."""
    pools = reference_pools(coco)
    state = random.getstate()
    random.seed(1)
    try:
        return [random.sample(pools[c["id"]], shots + queries) for c in coco["categories"] for _ in range(num_episodes)]
    finally:
        random.setstate(state)


def as_ids(split, episodes):
    return [[split.instances[e.category_id][i].ann_id for i in e.support + e.query] for e in episodes]


@pytest.fixture(scope="module")
def fixture(tmp_path_factory):
    root = tmp_path_factory.mktemp("mp100_protocol")
    path, coco = write_protocol_fixture(root)
    return root, path, coco, load_split(path, root / "images")


def test_instance_pools_are_the_references(fixture):
    _, _, coco, split = fixture
    pools = reference_pools(coco)
    assert {cid: [i.ann_id for i in insts] for cid, insts in split.instances.items()} == pools
    assert list(split.categories) == [7, 3, 12] and all(len(p) == 20 for p in pools.values())
    assert sum(len(ids) for ids in split.dropped.values()) == 12


@pytest.mark.parametrize("shots", [1, 5])
def test_episodes_are_the_references_draw(fixture, shots):
    _, _, coco, split = fixture
    ours = protocol_episodes(split, shots, num_episodes=7)
    assert [e.category_id for e in ours] == [7] * 7 + [3] * 7 + [12] * 7
    assert all(len(e.support) == shots and len(e.query) == 15 for e in ours)
    assert as_ids(split, ours) == reference_episodes(coco, shots, 15, 7)


def test_shorter_evaluation_is_a_prefix_of_the_full_one(fixture):
    _, _, coco, split = fixture
    full = protocol_episodes(split, 1, num_episodes=7)
    short = protocol_episodes(split, 1, num_episodes=7, first=3)
    assert short == [e for c in range(3) for e in full[7 * c:7 * c + 3]]
    # whereas the reference run with num_episodes=3 is its own stream: equal for the first category only
    own = protocol_episodes(split, 1, num_episodes=3)
    assert as_ids(split, own) == reference_episodes(coco, 1, 15, 3)
    assert own[:3] == short[:3] and own[3:] != short[3:]


def test_default_episode_counts_per_subset_and_bad_requests(tmp_path):
    for subset, per_category in (("val", 100), ("test", 200)):
        path, _ = write_protocol_fixture(tmp_path, subset=subset, images=False)
        split = load_split(path, tmp_path / "images", missing_images="allow")
        assert len(protocol_episodes(split, 5)) == 3 * per_category
    with pytest.raises(ValueError, match="first=201: a shorter evaluation keeps 1..200"):
        protocol_episodes(split, 1, first=201)
    split.path = tmp_path / "mine.json"
    with pytest.raises(ValueError, match="mine.json is not a val or test file.*pass num_episodes"):
        protocol_episodes(split, 1)
    with pytest.raises(MP100FormatError, match=r"category 7 \('cat7'\) has 20 instances, but an episode needs 6 \+ 15"):
        protocol_episodes(split, 6, num_episodes=1)


def recompute_from_file(coco, records):
    """Per-query PCK from a predictions file and the annotation JSON alone (no loader, no evaluator)."""
    anns = {a["id"]: a for a in coco["annotations"]}
    images = {im["id"]: im for im in coco["images"]}
    out = []
    for r in records:
        q = anns[r["query_id"]]
        kps = np.asarray(q["keypoints"], np.float64).reshape(-1, 3)
        mask = kps[:, 2] > 0
        for s in r["support_ids"]:
            mask &= np.asarray(anns[s]["keypoints"]).reshape(-1, 3)[:, 2] > 0
        im = images[q["image_id"]]
        x, y, w, h = q["bbox"]
        x1, y1 = max(0, x), max(0, y)
        x2, y2 = min(im["width"] - 1, x1 + max(0, w - 1)), min(im["height"] - 1, y1 + max(0, h - 1))
        out.append(mmpose_pck(np.asarray(r["pred"]), kps[:, :2], mask, max(x2 - x1, y2 - y1)))
    return np.array(out, np.float64)


def test_predictions_file_rescored_independently_equals_the_report(fixture, tmp_path):
    """A fake predictor (ground truth plus seeded noise) through the real pipeline: fixed protocol episodes,
    crops, collation, original pixels; then the written file is scored again from the annotation JSON."""
    _, _, coco, split = fixture
    episodes = protocol_episodes(split, 2, num_episodes=2)
    dataset = EpisodeDataset(split, None, 32, None, fixed=episodes)
    evaluator = EpisodeEvaluator(split, shots=2)
    rng = np.random.default_rng(7)
    for start in range(0, len(episodes), 4):
        batch = collate_episodes([dataset[i] for i in range(start, min(start + 4, len(episodes)))])
        gt = batch["query_keypoints_orig"].double().numpy()
        pred = gt + rng.normal(0, 0.15, gt.shape) * batch["query_bbox_size"].double().numpy()[..., None, None]
        evaluator.update_batch(batch, pred)
    evaluator.write_predictions(tmp_path / "run" / "predictions.jsonl")  # the folder is created
    evaluator.write_report(tmp_path / "run" / "pck_report.json")

    records = [json.loads(line) for line in (tmp_path / "run" / "predictions.jsonl").read_text().splitlines()]
    report = json.loads((tmp_path / "run" / "pck_report.json").read_text())
    assert len(records) == 6 * 15 and [r["query_id"] for r in records[:15]] == as_ids(split, episodes[:1])[0][2:]
    assert records[0]["support_ids"] == as_ids(split, episodes[:1])[0][:2]
    assert all(len(r["pred"]) == split.categories[r["category_id"]].num_keypoints for r in records)  # no padding
    again = recompute_from_file(coco, records)
    np.testing.assert_array_equal(100 * again, [r["PCK@0.2_percent"] for r in records])  # percent, as printed
    assert 0.2 < again.mean() < 0.95
    assert report["PCK@0.2_percent"] == pytest.approx(100 * again.mean(), abs=1e-4)
    assert {k: report[k] for k in ("file", "split", "subset", "shots", "threshold", "episodes", "queries")} == {
        "file": "mp100_split1_test.json", "split": 1, "subset": "test", "shots": 2, "threshold": 0.2,
        "episodes": 6, "queries": 90}
    by_cat = {c["id"]: c for c in report["categories"]}
    for k, cid in enumerate((7, 3, 12)):
        assert by_cat[cid]["episodes"] == 2 and by_cat[cid]["queries"] == 30
        assert by_cat[cid]["PCK@0.2_percent"] == pytest.approx(100 * again[30 * k:30 * (k + 1)].mean(), abs=1e-10)
    table = evaluator.format_table()
    assert f"mean over 90 queries (6 episodes): {100 * again.mean():.2f}%" in table and "cat3" in table


def test_normaliser_is_the_clean_box_and_empty_queries_score_zero(tmp_path):
    images = [{"id": 1, "file_name": "a.png", "width": 100, "height": 80}]
    cats = [{"id": 1, "name": "c", "keypoints": ["a", "b"], "skeleton": []}]
    anns = [{"id": 1, "image_id": 1, "category_id": 1, "bbox": [10.25, 3.5, 20.5, 9.75],
             "keypoints": [20, 10, 2, 25, 10, 2]},
            {"id": 2, "image_id": 1, "category_id": 1, "bbox": [0, 0, 30, 30], "keypoints": [20, 10, 2, 25, 10, 0]},
            {"id": 3, "image_id": 1, "category_id": 1, "bbox": [0, 0, 30, 30], "keypoints": [5, 5, 0, 6, 6, 0]}]
    path = tmp_path / "x.json"
    path.write_text(json.dumps({"images": images, "annotations": anns, "categories": cats}))
    split = load_split(path, tmp_path, missing_images="allow")
    assert split.instances[1][0].normaliser == 19.5  # clean box: w' = 20.5 - 1, h' = 9.75 - 1
    ev = EpisodeEvaluator(split, shots=1)
    # query 1 against the clean box 19.5: 3.89 px is 0.1995 (correct), 3.91 px is 0.2005 (wrong; the raw
    # width 20.5 would have made it 0.19); support 2 hides keypoint b, so only keypoint a counts
    pck = ev.add_episode(1, [2], [1, 1], [[[23.89, 10.0], [0.0, 0.0]], [[23.91, 10.0], [0.0, 0.0]]])
    assert pck.tolist() == [1.0, 0.0]
    assert ev.add_episode(1, [2], [3], [[[5.0, 5.0], [6.0, 6.0]]]).tolist() == [0.0]  # nothing visible: 0
    assert ev.pck() == pytest.approx(1 / 3) and ev.report()["queries"] == 3 and ev.episodes == 2
    assert ev.report()["split"] is None and ev.report()["file"] == "x.json"


def test_evaluator_rejects_foreign_ids_and_bad_predictions(fixture):
    _, _, coco, split = fixture
    ev = EpisodeEvaluator(split, shots=1)
    a7, b7 = [i.ann_id for i in split.instances[7][:2]]
    dropped = split.dropped["iscrowd"][0]
    with pytest.raises(PCKError, match=f"annotation {dropped} is not an instance of mp100_split1_test.json"):
        ev.add_episode(7, [a7], [dropped], np.zeros((1, 3, 2)))
    with pytest.raises(PCKError, match=f"annotation {b7} belongs to category 7, not to the episode's category 3"):
        ev.add_episode(3, [split.instances[3][0].ann_id], [b7], np.zeros((1, 4, 2)))
    with pytest.raises(PCKError, match=r"shape \(1, 2, 2\); expected \[1, >= 3, 2\]"):
        ev.add_episode(7, [a7], [b7], np.zeros((1, 2, 2)))
    with pytest.raises(PCKError, match="has 2 supports; this evaluator is 1-shot"):
        ev.add_episode(7, [a7, b7], [b7], np.zeros((1, 3, 2)))
    assert ev.records == []
