"""PCK@0.2 and the MP-100 evaluation protocol of the CAPE papers (CapeFormer, Pose Anything, POMNet).

Every rule below is the reference's, checked in its code; the sources are CapeFormer
(flyinglynx/CapeFormer, ``capeformer/datasets/datasets/mp100/test_dataset.py`` ``TestPoseDataset`` and
``test_base_dataset.py`` ``TestBaseDataset._report_metric``; Pose Anything's copies, orhir/PoseAnything
``models/datasets/datasets/mp100/``, are the same) and mmpose 0.28.1, which CapeFormer pins
(``mmpose/core/evaluation/top_down_eval.py``: ``keypoint_pck_accuracy``, ``_calc_distances``, ``_distance_acc``).

- Instances: the reference's filters and order, see ``utils/data/cape/mp100.py``.
- Episodes (``make_paired_samples``): ``random.seed(1)`` once, then for each category in file order and
  for each of its episodes ``random.sample(pool, K + 15)``, the first K drawn being the supports and the
  other 15 the queries. Test uses 200 episodes per category, validation 100 (the configs' ``num_episodes``).
  One random stream runs over all categories, so the reference run with ``num_episodes=E < 200``
  (``num_episodes=E`` here) shares only the first category's episodes with the full run; ``first=E``
  instead keeps the first E episodes of each category of the full stream, a subset of the official
  episodes. A category with fewer than K + 15 instances makes the reference fail (``random.sample`` raises).
  ``random.Random(1).sample`` reproduces the draw on CPython 3.2+ (same seeding and sampling algorithm).
- Counted keypoints: visible (v > 0) in the query and in every support.
- Distance: ``((pred - gt) / normaliser)`` in float64 (gt is float32, as ``joints_3d``), its 2-norm
  stored in float32; correct when that float32 distance is ``< thr`` (strict). So a distance just below
  0.2 that rounds to float32(0.2) is wrong, as in the reference. The normaliser is max(w', h') of the
  clean box (float64); a zero normaliser counts nothing, a negative one becomes 1e6 (mmpose's guards).
- A query's PCK is the mean over its counted keypoints; with none it is 0 (``keypoint_pck_accuracy``
  returns ``avg_acc = 0`` when no keypoint is valid) and it stays in the mean.
- The reported number is ``np.mean`` over all (episode, query) pairs in episode order; the papers print
  it in percent and average the five splits. (numpy 1.x and 2.x sum in different orders, so that mean can
  differ in its last bit between them; the per-query values do not.)

Units. The functions here return fractions (0..1); everything written for a reader (the predictions file, the
report, the table, the trainer's metrics) is in percent, under a name that says so: :func:`pck_field`,
``"PCK@0.2_percent"``.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

import numpy as np
import torch

from utils.data.cape.mp100 import Episode, MP100FormatError, MP100Split
from utils.errors import UserError

EVAL_SEED = 1
EVAL_QUERIES = 15
EVAL_EPISODES = {"val": 100, "test": 200}
PCK_THRESHOLD = 0.2


class PCKError(UserError):
    """Predictions or episode identities that do not fit the ground truth they are scored against."""


def pck_field(thr: float = PCK_THRESHOLD) -> str:
    """The name of a PCK value in percent wherever one is written: ``"PCK@0.2_percent"`` for ``thr`` 0.2."""
    return f"PCK@{thr:g}_percent"


def protocol_episodes(split: MP100Split, shots: int, num_episodes: int | None = None, queries: int = EVAL_QUERIES,
                      first: int | None = None) -> list[Episode]:
    """The reference's evaluation episodes, in its order (categories in file order, then episodes).

    Args:
        split: the val or test file, loaded by ``utils.data.cape.mp100.load_split``.
        shots: K supports per episode (1 or 5 in the papers).
        num_episodes: episodes per category in the random stream; default ``EVAL_EPISODES`` for the
            subset named in the file name (val 100, test 200).
        queries: queries per episode (15 in the papers).
        first: keep only the first ``first`` episodes of each category (a shorter evaluation whose episodes
            are a subset of the full one); None keeps all.

    Returns:
        ``num_episodes`` (or ``first``) Episodes per category; their indices point into ``split.instances[cid]``.

    Raises:
        MP100FormatError: a category has fewer than ``shots + queries`` instances (the reference fails there too).
        ValueError: ``num_episodes`` is not given and the file name names no val/test subset, ``first`` is
            not in 1..num_episodes, or ``shots`` or ``queries`` is below 1.
    """
    if shots < 1 or queries < 1:
        raise ValueError(f"shots={shots}, queries={queries}: an episode needs at least one of each")
    if num_episodes is None:
        subset = split.split_and_subset[1]
        if subset not in EVAL_EPISODES:
            raise ValueError(f"{split.path.name} is not a val or test file named mp100_split<N>_<val|test>.json; "
                             "pass num_episodes (the protocol uses 100 for val, 200 for test)")
        num_episodes = EVAL_EPISODES[subset]
    first = num_episodes if first is None else first
    if not 1 <= first <= num_episodes:
        raise ValueError(f"first={first}: a shorter evaluation keeps 1..{num_episodes} episodes per category")
    need = shots + queries
    rng = random.Random(EVAL_SEED)  # the reference's random.seed(1): the same Mersenne Twister state
    episodes = []
    for cid, insts in split.instances.items():
        if len(insts) < need:
            raise MP100FormatError(f"{split.path}: category {cid} ({split.categories[cid].name!r}) has {len(insts)} "
                                   f"instances, but an episode needs {shots} + {queries} = {need}; the protocol cannot "
                                   "evaluate this file (CapeFormer's random.sample fails on it too)")
        for e in range(num_episodes):
            # Sampling positions from range(n) picks exactly what sampling the reference's pool list picks.
            drawn = rng.sample(range(len(insts)), need)
            if e < first:
                episodes.append(Episode(cid, tuple(drawn[:shots]), tuple(drawn[shots:])))
    return episodes


def keypoint_pck(pred, gt, mask, normaliser, thr: float = PCK_THRESHOLD) -> np.ndarray:
    """Per-query PCK exactly as mmpose 0.28.1 ``keypoint_pck_accuracy`` computes it, one query at a time.

    Args:
        pred: [Q, N, 2] predicted keypoints in original image pixels (converted to float64).
        gt: [Q, N, 2] ground truth in original pixels (converted to float32, as the reference stores it).
        mask: [Q, N] bool, the keypoints to count (visible in the query and in every support).
        normaliser: [Q] float64, max(w', h') of each query's clean box, pixels.
        thr: the threshold as a fraction of the normaliser.

    Returns:
        [Q] float64: correct / counted keypoints, and 0 for a query with none counted.

    Raises:
        PCKError: the shapes disagree.
    """
    pred, gt = np.asarray(pred, np.float64), np.asarray(gt, np.float32)
    mask, norm = np.asarray(mask, bool), np.array(normaliser, np.float64)
    if pred.ndim != 3 or pred.shape[-1] != 2 or gt.shape != pred.shape or mask.shape != pred.shape[:2] \
            or norm.shape != pred.shape[:1]:
        raise PCKError(f"pck: shapes disagree: pred {pred.shape}, gt {gt.shape}, mask {mask.shape}, normaliser "
                       f"{norm.shape}; expected [Q, N, 2], [Q, N, 2], [Q, N], [Q]")
    mask = mask & (norm != 0)[:, None]
    norm[norm <= 0] = 1e6
    dist = np.full(mask.shape, -1, np.float32)
    dist[mask] = np.linalg.norm(((pred - gt) / norm[:, None, None])[mask], axis=-1)
    correct = (dist < thr) & mask
    counted = mask.sum(-1)
    return np.where(counted > 0, correct.sum(-1) / np.maximum(counted, 1), 0.0)


def evaluation_mask(query_visible: torch.Tensor, support_visible: torch.Tensor, keypoint_mask: torch.Tensor) -> torch.Tensor:
    """Which keypoints PCK counts: visible in the query and in every support, and not padding.

    Args:
        query_visible: [B, Q, N] bool. support_visible: [B, K, N] bool. keypoint_mask: [B, N] bool (False on padding).

    Returns:
        [B, Q, N] bool.
    """
    return query_visible & support_visible.all(1, keepdim=True) & keypoint_mask[:, None]


def batch_pck(pred: torch.Tensor, gt: torch.Tensor, bbox_size: torch.Tensor, mask: torch.Tensor,
              thr: float = PCK_THRESHOLD) -> np.ndarray:
    """:func:`keypoint_pck` over any leading dimensions of torch tensors (e.g. a collated batch's [B, Q]).

    Args:
        pred: [..., N, 2] predictions in original pixels. gt: [..., N, 2] ground truth in original pixels.
        bbox_size: [...] the normaliser, pixels (``query_bbox_size``). mask: [..., N] bool, the keypoints to count
            (:func:`evaluation_mask`).

    Returns:
        [...] float64 per-query PCK, a fraction.
    """
    n = pred.shape[-2]
    pck = keypoint_pck(pred.detach().cpu().double().reshape(-1, n, 2).numpy(), gt.cpu().reshape(-1, n, 2).numpy(),
                       mask.cpu().reshape(-1, n).numpy(), bbox_size.cpu().double().reshape(-1).numpy(), thr)
    return pck.reshape(tuple(pred.shape[:-2]))


class EpisodeEvaluator:
    """The protocol's PCK for one split, from predictions and episode identities; keeps a record per query.

    Ground truth, visibility and normaliser come from ``split`` by annotation id, so the score needs nothing
    from the model's data pipeline. A record (a line of the predictions file) is ``{"category_id", "episode",
    "support_ids", "query_id", "pred": [[x, y], ...] original pixels, "PCK@0.2_percent"}`` (the query's PCK in
    percent, named by :func:`pck_field`); ``episode`` counts episodes in the order they were added.
    ``query_pck`` holds the same per-query values as fractions, in record order.
    """

    def __init__(self, split: MP100Split, shots: int, thr: float = PCK_THRESHOLD):
        self.split, self.shots, self.thr = split, shots, thr
        self.field = pck_field(thr)
        self._where = split.instance_index()
        self.records: list[dict] = []
        self.query_pck: list[float] = []
        self.episodes = 0

    def _instance(self, ann_id: int, category_id: int):
        if ann_id not in self._where:
            raise PCKError(f"annotation {ann_id} is not an instance of {self.split.path.name} (not in the file, or "
                           "dropped by the protocol's rules); score predictions against the file they were made on")
        cid, i = self._where[ann_id]
        if cid != category_id:
            raise PCKError(f"annotation {ann_id} belongs to category {cid}, "
                           f"not to the episode's category {category_id}")
        return self.split.instances[cid][i]

    def add_episode(self, category_id: int, support_ids: list[int], query_ids: list[int], pred) -> np.ndarray:
        """Score one episode's queries and record them.

        Args:
            category_id: the episode's category. support_ids: its K support annotation ids. query_ids: its Q query
                annotation ids. pred: [Q, N', 2] predictions in original pixels, N' >= the category's N (padding
                beyond N is ignored).

        Returns:
            [Q] float64 per-query PCK.

        Raises:
            PCKError: an id is not an instance of this category in the split, K is not ``shots``, or ``pred``
                has the wrong shape.
        """
        if len(support_ids) != self.shots:
            raise PCKError(f"episode of category {category_id} has {len(support_ids)} supports; this evaluator is "
                           f"{self.shots}-shot")
        supports = [self._instance(int(i), category_id) for i in support_ids]
        queries = [self._instance(int(i), category_id) for i in query_ids]
        n = self.split.categories[category_id].num_keypoints
        pred = np.asarray(pred, np.float64)
        if pred.ndim != 3 or pred.shape[0] != len(queries) or pred.shape[1] < n or pred.shape[2] != 2:
            raise PCKError(f"predictions for category {category_id} have shape {pred.shape}; expected "
                           f"[{len(queries)}, >= {n}, 2] (queries, keypoints, xy)")
        pred = pred[:, :n]
        mask = np.stack([q.visible for q in queries]) & np.stack([s.visible for s in supports]).all(0)
        pck = keypoint_pck(pred, np.stack([q.keypoints for q in queries]), mask, [q.normaliser for q in queries],
                           self.thr)
        for q, p, v in zip(queries, pred, pck):
            self.records.append({"category_id": category_id, "episode": self.episodes,
                                 "support_ids": [s.ann_id for s in supports], "query_id": q.ann_id,
                                 "pred": p.tolist(), self.field: 100 * float(v)})
            self.query_pck.append(float(v))
        self.episodes += 1
        return pck

    def update_batch(self, batch: dict[str, torch.Tensor], pred) -> None:
        """Score a batch from ``utils.data.cape.mp100.collate_episodes``; ``pred`` [B, Q, N_max, 2] original pixels."""
        pred = pred.detach().cpu().double().numpy() if torch.is_tensor(pred) else np.asarray(pred, np.float64)
        for b, cid in enumerate(batch["category_id"].tolist()):
            self.add_episode(cid, batch["support_ann_id"][b].tolist(), batch["query_ann_id"][b].tolist(), pred[b])

    def pck(self) -> float:
        """The split's number: the mean over all recorded queries, a fraction (NaN before any)."""
        return float(np.mean(self.query_pck)) if self.query_pck else float("nan")

    def per_category(self) -> list[dict]:
        """``{"id", "name", "episodes", "queries", "PCK@0.2_percent"}`` per category with records, in file order;
        the PCK is the mean over the category's queries, in percent."""
        by_category: dict[int, list[tuple[dict, float]]] = {}
        for r, v in zip(self.records, self.query_pck):
            by_category.setdefault(r["category_id"], []).append((r, v))
        return [{"id": cid, "name": cat.name, "episodes": len({r["episode"] for r, _ in by_category[cid]}),
                 "queries": len(by_category[cid]), self.field: 100 * float(np.mean([v for _, v in by_category[cid]]))}
                for cid, cat in self.split.categories.items() if cid in by_category]

    def report(self) -> dict:
        """What ``pck_report.json`` holds: the file, split, subset, shots, threshold (a fraction of the box), the
        mean PCK in percent under ``"PCK@0.2_percent"``, episode and query counts, and :meth:`per_category`."""
        split, subset = self.split.split_and_subset
        return {"file": self.split.path.name, "split": split, "subset": subset, "shots": self.shots,
                "threshold": self.thr, self.field: 100 * self.pck(), "episodes": self.episodes,
                "queries": len(self.records), "categories": self.per_category()}

    def format_table(self) -> str:
        """A printable per-category table, PCK in percent as the papers print it."""
        lines = [f"{self.split.path.name}, {self.shots}-shot, PCK@{self.thr:g} in percent",
                 f"  {'id':>4} {'name':<28} {'episodes':>8} {'queries':>7} {'PCK %':>6}"]
        lines += [f"  {r['id']:>4} {r['name'][:28]:<28} {r['episodes']:>8} {r['queries']:>7} {r[self.field]:>6.2f}"
                  for r in self.per_category()]
        lines.append(f"  mean over {len(self.records)} queries ({self.episodes} episodes): {100 * self.pck():.2f}%")
        return "\n".join(lines)

    def write_predictions(self, path: str | Path) -> None:
        """Write the records as JSON lines, one query per line, in the order they were added (creating the folder).

        A non-finite prediction is written as ``NaN``/``Infinity``, as Python's json does; it scores as wrong.
        """
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        with open(path, "w", encoding="utf-8") as f:
            for r in self.records:
                f.write(json.dumps(r) + "\n")

    def write_report(self, path: str | Path) -> None:
        """Write :meth:`report` as JSON (``pck_report.json`` by convention), creating the folder."""
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        with open(path, "w", encoding="utf-8") as f:
            json.dump(self.report(), f, indent=2)
            f.write("\n")


def copy_support_baseline(support_keypoints: torch.Tensor, support_visible: torch.Tensor, num_queries: int) -> torch.Tensor:
    """The "copy the support keypoints" floor: every query gets the mean of the supports' keypoints.

    Args:
        support_keypoints: [B, K, N, 2] normalised crop coordinates. support_visible: [B, K, N] bool.

    Returns:
        [B, Q, N, 2] normalised crop coordinates (the mean over visible shots; 0.5 where no shot sees the keypoint).
    """
    w = support_visible.to(support_keypoints.dtype)[..., None]
    mean = (support_keypoints * w).sum(1) / w.sum(1).clamp_min(1)
    mean = torch.where(w.sum(1) > 0, mean, torch.full_like(mean, 0.5))
    return mean[:, None].expand(-1, num_queries, -1, -1)
