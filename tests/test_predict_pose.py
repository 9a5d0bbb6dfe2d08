"""scripts/predict_pose.py end to end on the CPU: a tiny untrained CAPE checkpoint in the trainer's format, supports
from a synthetic MP-100 instance, predictions in original pixels equal to the evaluation pipeline's, pictures, and
every bad input as one error line with exit code 2."""

import json

import numpy as np
import pytest
import torch
from PIL import Image

from models.cape import build_model
from models.cape.checkpoint import model_record
from models.cape.predict import predict_keypoints
from scripts.predict_pose import main
from tests.test_cape_train import one_thread  # noqa: F401  (autouse: one thread for tiny tensors)
from utils.data.cape.mp100 import (Episode, EpisodeDataset, collate_episodes, crop_to_original, load_mp100,
                                   skeleton_adjacency)
from utils.data.cape.synthetic import build

SIZE = 64


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    """A synthetic split, a tiny untrained checkpoint, and a support file from one test instance."""
    root = tmp_path_factory.mktemp("predict")
    build(root / "data", num_categories=10, instances_per_category=20, image_size=SIZE, seed=0)
    split = load_mp100(root / "data", 1)["test"]
    cid = next(iter(split.instances))
    torch.manual_seed(0)
    model, _ = build_model("capeformer_lite", hidden_dim=32, num_heads=4, image_size=SIZE)
    checkpoint = root / "best.pt"
    torch.save({"model": model.state_dict(), "architecture": model_record("capeformer_lite", model), "step": 0},
               checkpoint)
    support = split.instances[cid][0]
    category = split.categories[cid]
    spec = {"supports": [{"keypoints": support.keypoints.tolist(), "visible": support.visible.astype(int).tolist(),
                          "bbox": list(support.bbox)}],
            "skeleton": [list(e) for e in category.skeleton], "names": [f"k{i}" for i in range(category.num_keypoints)]}
    spec_path = root / "support.json"
    spec_path.write_text(json.dumps(spec))
    return split, cid, model.eval(), checkpoint, spec, spec_path, root


def args_for(checkpoint, support, spec_path, queries, out):
    return ["--checkpoint", str(checkpoint), "--support", *map(str, support), "--support-keypoints", str(spec_path),
            "--query", *map(str, queries), "--out", str(out), "--device", "cpu"]


def test_predictions_json_and_pictures(setup, tmp_path):
    split, cid, _, checkpoint, spec, spec_path, _ = setup
    insts = split.instances[cid]
    queries = [insts[1].image_path, insts[2].image_path]
    assert main(args_for(checkpoint, [insts[0].image_path], spec_path, queries, tmp_path / "out")) == 0
    result = json.loads((tmp_path / "out" / "predictions.json").read_text())
    n, seen = split.categories[cid].num_keypoints, insts[0].visible
    assert result["names"] == spec["names"] and result["model"] == "capeformer_lite" and len(result["queries"]) == 2
    for record, path in zip(result["queries"], queries):
        assert record["image"] == str(path) and (record["width"], record["height"]) == Image.open(path).size
        assert len(record["keypoints"]) == n
        assert [p is not None for p in record["keypoints"]] == seen.tolist()  # unseen by the support: null
        points = np.array([p for p in record["keypoints"] if p is not None])
        assert points.shape == (seen.sum(), 2) and np.isfinite(points).all()
        # the crop is the whole image squared and enlarged by 1.25 around its centre: predictions lie inside it
        w, h = record["width"] - 1, record["height"] - 1
        half = 1.25 * max(w, h) / 2
        assert (np.abs(points - [w / 2, h / 2]) <= half + 1e-6).all()
        with Image.open(tmp_path / "out" / record["picture"]) as picture:
            assert picture.format == "PNG" and picture.height > 384


def test_predictions_equal_the_evaluation_pipeline(setup):
    """Given the instances' own boxes, the script's crops and mapping back are the episodic loader's."""
    split, cid, model, *_ = setup
    insts = split.instances[cid]
    adjacency = skeleton_adjacency(split.categories[cid])
    ours = predict_keypoints(model, [insts[0]], insts[1:4], adjacency, SIZE, torch.device("cpu"), batch_size=2)
    batch = collate_episodes([EpisodeDataset(split, None, SIZE, None, fixed=[Episode(cid, (0,), (1, 2, 3))])[0]])
    with torch.no_grad():
        pred = model(batch["support_image"], batch["support_keypoints"], batch["support_visible"],
                     batch["query_image"], batch["keypoint_mask"], batch["adjacency"])["refined"][-1]
    expected = crop_to_original(pred, batch["query_crop_to_orig"], SIZE)[0].numpy()
    np.testing.assert_allclose(ours, expected, atol=1e-3)


def bad(setup, tmp_path, capsys, spec=None, support=None, queries=None, out=None):
    split, cid, _, checkpoint, good, spec_path, _ = setup
    insts = split.instances[cid]
    if spec is not None:
        spec_path = tmp_path / "bad.json"
        spec_path.write_text(spec if isinstance(spec, str) else json.dumps(spec))
    code = main(args_for(checkpoint, support or [insts[0].image_path], spec_path, queries or [insts[1].image_path],
                         out or tmp_path / "out"))
    err = capsys.readouterr().err.strip()
    assert code == 2 and err.startswith("error: ") and "\n" not in err, err
    assert not (tmp_path / "out" / "predictions.json").exists()
    return err


def test_bad_inputs_are_one_line_naming_the_file_and_position(setup, tmp_path, capsys):
    split, cid, _, _, spec, spec_path, _ = setup
    image = split.instances[cid][1].image_path
    assert "--query image 2 " in bad(setup, tmp_path, capsys, queries=[image, tmp_path / "missing.jpg"])
    broken = tmp_path / "broken.jpg"
    broken.write_bytes(b"\xff\xd8 not a jpeg")
    assert f"--support image 1 {broken} cannot be read as an image" in bad(setup, tmp_path, capsys, support=[broken])
    assert "bad.json is not valid JSON" in bad(setup, tmp_path, capsys, spec="{")
    assert 'the top level is not an object with a "supports" list' in bad(setup, tmp_path, capsys, spec=[1, 2])
    two = {"supports": [spec["supports"][0], {"keypoints": spec["supports"][0]["keypoints"][:-1]}]}
    err = bad(setup, tmp_path, capsys, spec=two, support=[image, image])
    assert "supports[1].keypoints has" in err and "every support needs the same keypoints" in err
    assert '"supports" has 2 entries, but 1 --support image' in bad(setup, tmp_path, capsys, spec=two)
    point = {"supports": [{"keypoints": [[1, 2], [3, "x"]]}]}
    assert "bad.json: supports[0].keypoints[1] = [3, 'x'] is not [x, y]" in bad(setup, tmp_path, capsys, spec=point)
    far = {"supports": [{"keypoints": [[1, 2], [3, 9999]]}]}
    assert "keypoint 1 at [3.0, 9999.0] lies outside" in bad(setup, tmp_path, capsys, spec=far)
    edge = {**spec, "skeleton": [[0, 999]]}
    assert "bad.json: skeleton[0] = [0, 999]" in bad(setup, tmp_path, capsys, spec=edge)
    unseen = {"supports": [{"keypoints": [[1, 2]], "visible": [0]}]}
    assert "nothing to predict" in bad(setup, tmp_path, capsys, spec=unseen)
    blocker = tmp_path / "file"
    blocker.write_text("")
    assert "--out " in bad(setup, tmp_path, capsys, out=blocker / "out")
