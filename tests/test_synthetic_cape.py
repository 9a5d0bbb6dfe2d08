"""The synthetic MP-100 stand-in (utils/data/cape/synthetic.py and its CLI): layout, splits, COCO fields, rendering."""

import hashlib
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from utils.data.cape import synthetic as synthetic_cape
from utils.data.cape.mp100 import annotation_path, load_mp100
from utils.run.main import cli_main
from utils.data.cape.synthetic import (KINDS, MAX_KEYPOINTS, MIN_KEYPOINTS, SyntheticCapeError, build, coco_keypoints,
                                       deform, keypoint_counts, main, make_category, render_instance, split_categories)

REPO = Path(__file__).resolve().parents[1]
NUM_CATEGORIES, INSTANCES, SIZE = 10, 4, 64


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    return build(tmp_path_factory.mktemp("synthetic"), num_categories=NUM_CATEGORIES, instances_per_category=INSTANCES,
                 image_size=SIZE, seed=1)


def read(root, split, subset):
    with open(annotation_path(root, split, subset), encoding="utf-8") as f:
        return json.load(f)


def category_with(predicate, n=20, tries=200):
    """The first category (of ``n`` keypoints, seeds 0, 1, ...) that satisfies ``predicate``."""
    for seed in range(tries):
        cat = make_category(np.random.default_rng(seed), 1, n)
        if predicate(cat):
            return cat
    raise AssertionError("no such category in the first seeds")


def test_layout_and_coco_fields(built):
    assert sorted(p.name for p in (built / "annotations").iterdir()) == sorted(
        f"mp100_split{s}_{t}.json" for s in range(1, 6) for t in ("train", "val", "test"))
    for split in range(1, 6):
        for subset in ("train", "val", "test"):
            coco = read(built, split, subset)
            assert set(coco) == {"info", "images", "annotations", "categories"}
            cats = {c["id"]: c for c in coco["categories"]}
            images = {im["id"]: im for im in coco["images"]}
            assert len(images) == len(coco["annotations"]) == INSTANCES * len(cats)
            for c in cats.values():
                assert set(c) == {"supercategory", "id", "name", "keypoints", "skeleton"}
                assert c["supercategory"] in KINDS
                n = len(c["keypoints"])
                assert MIN_KEYPOINTS <= n <= MAX_KEYPOINTS and len(set(c["keypoints"])) == n
                ends = [i for e in c["skeleton"] for i in e]
                # 1-based as in most MP-100 categories, and unambiguously so: keypoint N is named, keypoint 0 never
                assert min(ends) == 1 and max(ends) == n and all(len(e) == 2 and e[0] != e[1] for e in c["skeleton"])
            for im in images.values():
                assert set(im) == {"id", "file_name", "width", "height"} and im["width"] == im["height"] == SIZE
                with Image.open(built / "images" / im["file_name"]) as png:
                    assert png.size == (SIZE, SIZE) and png.mode == "RGB"
            for a in coco["annotations"]:
                assert set(a) == {"id", "image_id", "category_id", "bbox", "keypoints", "num_keypoints", "area",
                                  "iscrowd"}
                assert a["image_id"] in images and a["category_id"] in cats and a["iscrowd"] == 0
                kps = np.array(a["keypoints"], float).reshape(-1, 3)
                assert len(kps) == len(cats[a["category_id"]]["keypoints"])
                x, y, w, h = a["bbox"]
                assert w > 0 and h > 0 and x >= 0 and y >= 0 and x + w <= SIZE and y + h <= SIZE
                assert 0 < a["area"] <= w * h  # the silhouette's pixels, inside its box
                assert set(kps[:, 2]) <= {0, 2} and a["num_keypoints"] == int((kps[:, 2] > 0).sum()) >= 1
                vis = kps[kps[:, 2] > 0, :2]
                assert np.all((vis >= [x, y]) & (vis < [x + w, y + h]))  # visible keypoints lie on the figure


def test_occluded_keypoints_stored_as_coco_does(built):
    coco = read(built, 1, "train")
    hidden = np.concatenate([np.array(a["keypoints"]).reshape(-1, 3) for a in coco["annotations"]])
    hidden = hidden[hidden[:, 2] == 0]
    assert len(hidden) > 0 and np.all(hidden == 0)  # x = y = v = 0, as COCO stores unlabelled points
    assert coco_keypoints(np.array([[1.234, 5.678], [9.0, 9.0]]), np.array([True, False])) == [1.23, 5.68, 2, 0, 0, 0]


def test_splits_are_disjoint_and_each_category_tests_once(built):
    for n in (10, 12, 100):
        splits = split_categories(np.random.default_rng(0), list(range(1, n + 1)))
        assert len(splits) == 5
        for s in splits:
            assert sorted(s["train"] + s["val"] + s["test"]) == list(range(1, n + 1))  # disjoint and complete
        assert sorted(c for s in splits for c in s["test"]) == list(range(1, n + 1))
    assert [tuple(len(s[k]) for k in ("train", "val", "test")) for s in splits] == [(70, 10, 20)] * 5
    tested = []
    for split in range(1, 6):
        subsets = load_mp100(built, split)  # the loader checks disjointness and that every image exists
        assert {k: len(v.categories) for k, v in subsets.items()} == {"train": 7, "val": 1, "test": 2}
        tested += list(subsets["test"].categories)
    assert sorted(tested) == list(range(1, NUM_CATEGORIES + 1))


def test_loader_reads_every_instance(built):
    subsets = load_mp100(built, 3)
    for subset, sp in subsets.items():
        coco = read(built, 3, subset)
        anns = {a["id"]: a for a in coco["annotations"]}
        for cid, insts in sp.instances.items():
            assert len(insts) == INSTANCES  # nothing dropped: every instance has a visible keypoint and a box
            for inst in insts:
                kps = np.array(anns[inst.ann_id]["keypoints"], np.float32).reshape(-1, 3)
                np.testing.assert_array_equal(inst.keypoints, kps[:, :2])
                np.testing.assert_array_equal(inst.visible, kps[:, 2] > 0)


def test_keypoint_counts():
    counts = keypoint_counts(np.random.default_rng(0), 100)
    assert counts.min() == MIN_KEYPOINTS and counts.max() == MAX_KEYPOINTS and np.median(counts) < 30
    for kind in KINDS:
        for n in (8, 9, 37, 68):
            cat = category_with(lambda c: c.kind == kind, n)
            assert cat.template.shape == (n, 2) and len(cat.coco()["keypoints"]) == n
            assert np.allclose(np.ptp(cat.template, 0).max(), 1.0)  # a unit box


def test_deterministic(built, tmp_path):
    def digest(root):
        return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
                for p in sorted(root.rglob("*")) if p.is_file()}

    sizes = {"num_categories": NUM_CATEGORIES, "instances_per_category": INSTANCES, "image_size": SIZE}
    again = build(tmp_path / "again", **sizes, seed=1)
    assert digest(again) == digest(built)
    other = build(tmp_path / "other", **sizes, seed=2)
    assert digest(other).keys() == digest(built).keys() and digest(other) != digest(built)


def test_all_keypoints_of_a_category_look_the_same():
    """The dot on every visible keypoint is one colour (the category's); with no dots, keypoint pixels are the
    figure's own fill, pattern or stroke colours: nothing local tells keypoint i from keypoint j."""
    for with_marker in (True, False):
        cat = category_with(lambda c: (c.style.marker is not None) == with_marker, 30)
        own = {cat.style.fill, cat.style.fill2, cat.style.stroke}
        for seed in range(6):
            r = render_instance(np.random.default_rng(seed), cat, 128, 60.0)
            pixels = np.asarray(r.image)
            cells = np.floor(r.keypoints[r.visible]).astype(int)
            colours = {tuple(int(v) for v in pixels[y, x]) for x, y in cells}
            assert colours == {cat.style.marker} if with_marker else colours <= own
            assert r.visible.sum() >= len(r.keypoints) / 2


def test_occluders_hide_what_they_cover():
    """A keypoint inside the image that is marked invisible has its dot covered; a visible one shows it."""
    cat = category_with(lambda c: c.style.marker is not None, 20)
    hidden_inside = 0
    for seed in range(40):
        r = render_instance(np.random.default_rng(seed), cat, 96, 60.0)
        inside = np.all((r.keypoints >= 0) & (r.keypoints < 96), 1)
        pixels = np.asarray(r.image)
        for (x, y), v in zip(np.floor(r.keypoints[inside]).astype(int), r.visible[inside]):
            assert (tuple(int(c) for c in pixels[y, x]) == cat.style.marker) == bool(v)
        hidden_inside += int((inside & ~r.visible).sum())
    assert hidden_inside > 0


def test_instances_deform_non_rigidly():
    """Limbs keep their length within the stretch range (0.9..1.1) but turn, so poses differ beyond a similarity."""
    cat = category_with(lambda c: c.kind == "animal", 30)
    limbs = [(i, p) for i, p in enumerate(cat.parent) if p >= 0]
    ref = np.array([np.linalg.norm(cat.template[i] - cat.template[p]) for i, p in limbs])
    residuals = []
    for seed in range(5):
        pose, torso = deform(np.random.default_rng(seed), cat)
        assert torso is None
        ratio = np.array([np.linalg.norm(pose[i] - pose[p]) for i, p in limbs]) / ref
        assert np.all((ratio >= 0.9 - 1e-9) & (ratio <= 1.1 + 1e-9))
        # least-squares similarity fit of the template onto the pose (complex numbers): what it cannot explain
        t, q = cat.template @ [1, 1j], pose @ [1, 1j]
        a = np.vdot(t - t.mean(), q - q.mean()) / np.vdot(t - t.mean(), t - t.mean())
        residuals.append(np.abs((t - t.mean()) * a + q.mean() - q).mean())
    assert min(residuals) > 0.005 and max(residuals) < 0.2  # template units: real articulation, same creature


def test_keypoints_cut_off_by_the_border_are_invisible():
    cat = category_with(lambda c: c.kind == "stick", 12)
    cut = 0
    for seed in range(60):
        r = render_instance(np.random.default_rng(seed), cat, 64, 0.0)
        outside = ~np.all((r.keypoints >= 0) & (np.round(r.keypoints, 2) < 64), 1)
        assert not (r.visible & outside).any() and r.visible.any()
        x, y, w, h = r.bbox
        assert 0 <= x and 0 <= y and x + w <= 64 and y + h <= 64 and 0 < r.area <= w * h
        cut += int(outside.any())
    assert 0 < cut < 20  # about one instance in ten is truncated


def test_bad_arguments_and_foreign_folders(tmp_path, capsys):
    for kwargs, match in (({"num_categories": 9}, "num_categories=9"), ({"instances_per_category": 1}, "at least 2"),
                          ({"image_size": 16}, "image_size=16"), ({"max_rotation": 200}, "max_rotation=200"),
                          ({"seed": -1}, "seed=-1")):
        with pytest.raises(SyntheticCapeError, match=match):
            build(tmp_path / "x", **kwargs)
    foreign = tmp_path / "mine"
    foreign.mkdir()
    (foreign / "notes.txt").write_text("keep me")
    assert cli_main(lambda: main(["--output-dir", str(foreign), "--num-categories", "10",
                                  "--instances-per-category", "2"])) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and "notes.txt" in err and err.count("\n") == 1
    assert (foreign / "notes.txt").read_text() == "keep me"
    assert sorted(p.name for p in foreign.iterdir()) == ["notes.txt"]
    assert cli_main(lambda: main(["--num-categories", "3", "--output-dir", str(tmp_path / "y")])) == 2
    assert "num_categories=3" in capsys.readouterr().err
    # real MP-100 annotations (no synthetic 'info') in the folder: refused, left as they were
    real = tmp_path / "mp100" / "annotations" / "mp100_split1_train.json"
    real.parent.mkdir(parents=True)
    real.write_text('{"images": [], "annotations": [], "categories": []}')
    with pytest.raises(SyntheticCapeError, match="mp100_split1_train.json, which this builder did not write"):
        build(tmp_path / "mp100", num_categories=10, instances_per_category=2)
    assert real.read_text() == '{"images": [], "annotations": [], "categories": []}'
    assert not (tmp_path / "mp100" / "images").exists()


def test_rebuild_over_an_earlier_build(tmp_path, monkeypatch):
    root = build(tmp_path / "d", num_categories=10, instances_per_category=2, image_size=48, seed=0)
    first = (root / "annotations" / "mp100_split5_test.json").read_bytes()
    build(root, num_categories=10, instances_per_category=2, image_size=48, seed=0)
    assert (root / "annotations" / "mp100_split5_test.json").read_bytes() == first
    assert not list(root.rglob("*.tmp"))

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(synthetic_cape, "render_instance", interrupted)
    with pytest.raises(KeyboardInterrupt):
        build(root, num_categories=10, instances_per_category=2, image_size=48, seed=1)
    assert list((root / "annotations").iterdir()) == []  # nothing says "finished" over half-new images


@pytest.mark.slow
def test_cli_help_and_run(tmp_path):
    script = REPO / "scripts" / "build_synthetic_cape_dataset.py"
    out = subprocess.run([sys.executable, str(script), "--help"], capture_output=True, text=True, check=True).stdout
    assert "--instances-per-category" in out and "MP-100" in out
    run = subprocess.run([sys.executable, str(script), "--output-dir", str(tmp_path / "c"), "--num-categories", "10",
                          "--instances-per-category", "2", "--image-size", "48"], capture_output=True, text=True)
    assert run.returncode == 0 and (tmp_path / "c" / "annotations" / "mp100_split5_test.json").is_file()
    bad = subprocess.run([sys.executable, str(script), "--output-dir", str(tmp_path / "c"), "--image-size", "8"],
                         capture_output=True, text=True)
    assert bad.returncode == 2 and bad.stderr.strip() == "error: image_size=8: use 32..4096 pixels"
