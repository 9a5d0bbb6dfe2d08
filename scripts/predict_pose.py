"""Category-agnostic pose estimation on your own images with a trained CAPE checkpoint.

    python scripts/predict_pose.py --checkpoint RUN/best.pt --support dog1.jpg [dog2.jpg ...] \\
        --support-keypoints support.json --query q1.jpg [q2.jpg ...] --out predictions/

Annotate the keypoints you want on one or more support images (any category, also one never trained on), and
the model finds the same keypoints on every query image. Writes ``OUT/predictions.json`` and one picture per
query, ``OUT/query<i>_<name>.png`` (the supports with their keypoints beside the query with its predictions).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from utils.cli import ArgumentParser  # noqa: E402
from utils.outputs import check_writable_dir, check_writable_file, unused_name, write_atomically  # noqa: E402

# The model, the images and the pictures are imported where they are used: --help is answered without them.
if TYPE_CHECKING:
    import numpy as np
    from PIL import Image

    import models.cape.predict as predict
    from utils.data.cape.mp100 import Instance

FORMAT = """support keypoints file (--support-keypoints), JSON, one entry per --support image in the same order:
  {"supports": [{"keypoints": [[x, y], ...],   N points in that image's pixels (x right, y down, from the
                                               top-left corner; COCO / MP-100 coordinates)
                 "visible": [1, 0, ...],       optional: N flags, 0 or false = not annotated (default all 1)
                 "bbox": [x, y, w, h]},        optional: the object's box in pixels (default: the whole image)
                ...],
   "skeleton": [[0, 1], [1, 2], ...],         optional: 0-based keypoint pairs, drawn in the pictures
   "names": ["nose", "left ear", ...]}        optional: N keypoint names, written with the predictions
Every support needs the same N. Queries are cropped around the whole image, so an object that fills
most of its image works best. A keypoint is predicted only when it is visible in every support.

predictions.json:
  {"checkpoint", "model", "image_size", "supports": [paths], "names" (when given), "skeleton",
   "queries": [{"image", "width", "height", "picture", "keypoints": [[x, y] or null, ...]}]}
keypoints in the query's original pixels, one per support keypoint, null where a support does not see
it; a prediction can lie slightly outside the image (the crop is the box enlarged by 1.25)."""


def build_parser() -> ArgumentParser:
    p = ArgumentParser(prog="python scripts/predict_pose.py", description=__doc__.split("\n\n")[0], epilog=FORMAT,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--checkpoint", required=True, help="a CAPE checkpoint of models.train_cape_episodic "
                                                       "(best.pt or step_<N>.pt)")
    p.add_argument("--support", nargs="+", required=True, metavar="IMAGE", help="support image(s)")
    p.add_argument("--support-keypoints", required=True, metavar="JSON", help="the supports' keypoints (format below)")
    p.add_argument("--query", nargs="+", required=True, metavar="IMAGE", help="query image(s)")
    p.add_argument("--out", required=True, metavar="DIR", help="output folder (created)")
    p.add_argument("--device", default="auto", help="auto, cpu, mps, cuda or cuda:N (default: auto)")
    p.add_argument("--batch-size", type=int, default=8, help="queries per forward pass (default: 8)")
    p.add_argument("--picture-height", type=int, default=384, help="height of each panel in pixels (default: 384)")
    return p


def picture_name(index: int, image: str) -> str:
    """``query<index + 1>_<image stem>.png``: unique even when two queries share a file name."""
    return f"query{index + 1}_{Path(image).stem}.png"


def run(args: argparse.Namespace) -> int:
    """Check every input and output path, predict, write ``predictions.json`` and the pictures.

    Raises:
        PoseInputError, OutputPathError, CheckpointError, DeviceError: bad input, one line each.
    """
    import numpy as np

    import models.cape.predict as predict
    from models.cape.checkpoint import load_trained
    from utils.data.cape.mp100 import Category, skeleton_adjacency
    from utils.device import select_device

    out = Path(args.out)
    check_writable_dir(out, "--out")
    wanted = ["predictions.json"] + [picture_name(i, q) for i, q in enumerate(args.query)]
    names = [unused_name(out, name) for name in wanted]  # a file already in --out is kept
    for name in names:
        check_writable_file(out / name, "--out")
    if args.batch_size < 1 or args.picture_height < 32:
        raise predict.PoseInputError(f"--batch-size {args.batch_size} / --picture-height {args.picture_height}: "
                                     "use a batch of 1 or more and a height of 32 pixels or more")
    poses = predict.read_support_poses(args.support_keypoints, len(args.support))
    support_sizes = [predict.image_size_of(p, f"--support image {s + 1}") for s, p in enumerate(args.support)]
    query_sizes = [predict.image_size_of(p, f"--query image {q + 1}") for q, p in enumerate(args.query)]
    supports = [predict.user_instance(s, p, size, poses.bboxes[s], poses.keypoints[s], poses.visible[s],
                                      f"{args.support_keypoints}: supports[{s}] ({p})")
                for s, (p, size) in enumerate(zip(args.support, support_sizes))]
    n = poses.num_keypoints
    queries = [predict.user_instance(q, p, size, None, np.zeros((n, 2), np.float32), np.zeros(n, bool),
                                     f"--query image {q + 1}")
               for q, (p, size) in enumerate(zip(args.query, query_sizes))]
    device = select_device(args.device).device
    model, architecture = load_trained(args.checkpoint)
    model.to(device)
    adjacency = skeleton_adjacency(Category(0, "user", poses.names or (), n, poses.skeleton, 0))
    pred = predict.predict_keypoints(model, supports, queries, adjacency, architecture["image_size"], device,
                                     args.batch_size)
    shown = poses.predicted()
    records = []
    for q, (inst, (width, height)) in enumerate(zip(queries, query_sizes)):
        picture = draw(args, supports, inst, pred[q], shown, poses)
        write_atomically(out / names[q + 1], lambda f: picture.save(f, format="PNG"), "picture")
        records.append({"image": str(inst.image_path), "width": width, "height": height, "picture": names[q + 1],
                        "keypoints": [p.tolist() if seen else None for p, seen in zip(pred[q], shown)]})
    result = {"checkpoint": str(args.checkpoint), "model": architecture["model"],
              "image_size": architecture["image_size"], "supports": [str(p) for p in args.support],
              **({"names": list(poses.names)} if poses.names else {}),
              "skeleton": [list(e) for e in poses.skeleton], "queries": records}
    write_atomically(out / names[0], lambda f: f.write((json.dumps(result, indent=2) + "\n").encode()), "predictions")
    print(f"{len(records)} queries, {int(shown.sum())} of {n} keypoints predicted: {out / names[0]}")
    return 0


def draw(args, supports: list[Instance], query: Instance, pred: np.ndarray, shown: np.ndarray,
         poses: predict.SupportPoses) -> Image.Image:
    """The picture of one query: the support images with their keypoints, the query with its predictions."""
    from PIL import Image

    from utils.viz.pose import prediction_picture

    opened = []
    for inst in supports:
        with Image.open(inst.image_path) as im:
            opened.append((im.convert("RGB"), inst.keypoints, inst.visible))
    with Image.open(query.image_path) as im:
        query_image = im.convert("RGB")
    captions = [f"support {s + 1}: {Path(i.image_path).name}" for s, i in enumerate(supports)]
    return prediction_picture(opened, query_image, pred, shown, poses.skeleton, poses.names,
                              captions + [f"query: {query.image_path.name}"], args.picture_height)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    from utils.run.main import cli_main

    return cli_main(lambda: run(args))


if __name__ == "__main__":
    sys.exit(main())
