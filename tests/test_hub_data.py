"""Issue 45: the published CSVs fetched from the Hugging Face Hub, and released checkpoints scored, through the real
``huggingface_hub`` client against a stand-in Hub on 127.0.0.1 (tests/hub_stand_in.py). No test reaches the internet:
the builder scripts run with ``HF_ENDPOINT`` at the stand-in (or at a closed local port), and the in-process tests
point huggingface_hub's endpoint and cache at it (the ``online`` fixture checks that its URLs do go there).
"""

import hashlib
import io
import json
import logging
import os
import runpy
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from omegaconf import OmegaConf

import evaluate
import utils.hub
from models import build_model, validate_arch
from models.checkpoints import reference_state_dict
from tests.hub_stand_in import HubStandIn, closed_endpoint, point_at
from utils.config import recipe_config, to_dict
from utils.data import maze
from utils.data.sudoku import build as sudoku
from utils.data.builders import build_dataset

REPO = Path(__file__).resolve().parents[1]
HEADER = "source,question,answer,rating\n"
SCRIPTS = {"sudoku": REPO / "scripts" / "build_sudoku_dataset.py", "maze": REPO / "scripts" / "build_maze_dataset.py"}


def sudoku_csv(n: int, seed: int) -> bytes:
    rng = np.random.default_rng(seed)
    rows = []
    for k in range(n):
        q, a = sudoku.generate_puzzle(rng, 40)
        rows.append(f"src{k},{''.join(str(d) if d else '.' for d in q)},{''.join(map(str, a))},{k}\n")
    return (HEADER + "".join(rows)).encode()


def maze_csv(n: int, seed: int) -> bytes:
    rng = np.random.default_rng(seed)
    rows = []
    for k in range(n):
        q, a = maze.generate_maze(rng, size=6, min_path_length=6)
        rows.append(f"gen{k},{maze.decode_maze(q)},{maze.decode_maze(a)},0\n")
    return (HEADER + "".join(rows)).encode()


@pytest.fixture(scope="module")
def csvs():
    """The CSV bytes the stand-in serves: Sudoku at ``main`` and at the older tag ``v1``, and mazes."""
    return {"sudoku": {"train.csv": sudoku_csv(8, 1), "test.csv": sudoku_csv(3, 2)},
            "sudoku-v1": {"train.csv": sudoku_csv(5, 3), "test.csv": sudoku_csv(2, 4)},
            "maze": {"train.csv": maze_csv(6, 5), "test.csv": maze_csv(3, 6)}}


@pytest.fixture(scope="module")
def hub(csvs):
    """The stand-in Hub serving the reference dataset repos, and broken ones; ``hub.commits`` names their commits."""
    stand_in = HubStandIn()
    stand_in.commits = {
        "sudoku-v1": stand_in.publish("dataset", sudoku.HUB_REPO, csvs["sudoku-v1"], tags=("v1",)),
        "sudoku": stand_in.publish("dataset", sudoku.HUB_REPO, csvs["sudoku"]),
        "maze": stand_in.publish("dataset", maze.HUB_REPO, csvs["maze"]),
    }
    train, test = csvs["sudoku"]["train.csv"], csvs["sudoku"]["test.csv"]
    stand_in.publish("dataset", "owner/no-test", {"train.csv": train})
    stand_in.publish("dataset", "owner/truncated", {"train.csv": train[:-100], "test.csv": test})
    stand_in.publish("dataset", "owner/bad-header", {"train.csv": train.replace(b"question", b"puzzle", 1),
                                                     "test.csv": test})
    maze_train, maze_test = csvs["maze"]["train.csv"], csvs["maze"]["test.csv"]
    stand_in.publish("dataset", "owner/maze-truncated", {"train.csv": maze_train[:-20], "test.csv": maze_test})
    stand_in.publish("dataset", "owner/maze-no-header", {"train.csv": maze_train.split(b"\n", 1)[1],
                                                         "test.csv": maze_test})
    with stand_in:
        yield stand_in


@pytest.fixture
def online(hub, tmp_path, monkeypatch):
    """This process's huggingface_hub at the stand-in, with an empty cache; the cache's path."""
    cache = tmp_path / "hf" / "hub"
    point_at(monkeypatch, hub.endpoint, cache)
    return cache


def source_dir(tmp_path: Path, files: dict[str, bytes]) -> Path:
    """The CSVs as a local copy, for the --source-dir build the Hub build must equal."""
    path = tmp_path / "local-csvs"
    path.mkdir(exist_ok=True)
    for name, data in files.items():
        (path / name).write_bytes(data)
    return path


def dataset_files(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def assert_same_as_source_dir_build(hub_build: Path, local_build: Path) -> dict:
    """Every file byte-identical but each split's dataset.json, which differs only by its ``source`` record
    (returned, the same in both splits)."""
    got, want = dataset_files(hub_build), dataset_files(local_build)
    assert sorted(got) == sorted(want)
    records = []
    for name in got:
        if name.endswith("dataset.json"):
            metadata = json.loads(got[name])
            records.append(metadata.pop("source"))
            assert json.dumps(metadata) == want[name].decode(), name
        else:
            assert got[name] == want[name], name
    assert records and all(r == records[0] for r in records)
    return records[0]


def expected_record(repo: str, revision: str, commit: str, files: dict[str, bytes]) -> dict:
    return {"repo": repo, "revision": revision, "commit": commit,
            "files": {name: {"sha256": hashlib.sha256(data).hexdigest(), "rows": data.count(b"\n") - 1}
                      for name, data in files.items()}}


def run_builder(kind: str, argv: list[str], hub: HubStandIn, tmp_path: Path, own_process: bool, monkeypatch,
                capsys) -> tuple[int, str, str]:
    """A builder script's exit status, stdout and stderr, against the stand-in Hub with its cache under tmp_path: in
    a process of its own with ``HF_ENDPOINT`` set, or (faster: no second torch import) in this one."""
    if own_process:
        env = {k: v for k, v in os.environ.items() if not k.startswith("HF_")} | hub.env(tmp_path / "hf")
        result = subprocess.run([sys.executable, str(SCRIPTS[kind]), *argv], cwd=REPO, env=env, capture_output=True,
                                text=True, timeout=300)
        return result.returncode, result.stdout, result.stderr
    point_at(monkeypatch, hub.endpoint, tmp_path / "hf" / "hub")
    monkeypatch.setattr(sys, "argv", [SCRIPTS[kind].name, *argv])
    with pytest.raises(SystemExit) as info:
        runpy.run_path(str(SCRIPTS[kind]), run_name="__main__")
    out, err = capsys.readouterr()
    return info.value.code, out, err


@pytest.mark.parametrize("kind, flags, build_locally, own_process", [
    ("sudoku", ["--subsample-size", "4", "--num-aug", "2"],
     lambda out, src: sudoku.build_dataset(out, source_dir=src, subsample_size=4, num_aug=2), True),
    ("maze", ["--subsample-size", "4", "--aug"],
     lambda out, src: maze.build_maze_dataset(out, source_dir=src, subsample_size=4, aug=True), False),
])
def test_issue45_a_builder_without_a_source_downloads_the_hub_csvs_and_equals_a_source_dir_build(
        hub, csvs, tmp_path, monkeypatch, capsys, kind, flags, build_locally, own_process):
    out = tmp_path / "hub-build"
    code, stdout, stderr = run_builder(kind, ["--output-dir", str(out), *flags], hub, tmp_path, own_process,
                                       monkeypatch, capsys)
    assert code == 0, stderr
    local = build_locally(tmp_path / "local-build", source_dir(tmp_path, csvs[kind]))
    repo = {"sudoku": sudoku.HUB_REPO, "maze": maze.HUB_REPO}[kind]
    record = expected_record(repo, "main", hub.commits[kind], csvs[kind])
    assert assert_same_as_source_dir_build(out, local) == record
    # The build prints where its CSVs came from; the download shows a progress bar.
    assert f"source: {repo} revision main = commit {hub.commits[kind]}: train.csv sha256 " \
           f"{record['files']['train.csv']['sha256']}, {record['files']['train.csv']['rows']} rows" in stdout
    assert "train.csv: 100%" in stderr
    assert ("GET", f"/api/datasets/{repo}/revision/main") in hub.requests


def test_issue45_a_rerun_needs_no_network_offline_or_with_the_hub_gone(csvs, tmp_path, monkeypatch, capsys):
    cache = tmp_path / "hf" / "hub"
    with HubStandIn() as own:
        own.publish("dataset", sudoku.HUB_REPO, csvs["sudoku"])
        point_at(monkeypatch, own.endpoint, cache)
        first = sudoku.main(["--output-dir", str(tmp_path / "first"), "--num-aug", "1"])
    for offline in (True, False):  # HF_HUB_OFFLINE=1, then a Hub that does not answer
        point_at(monkeypatch, own.endpoint, cache, offline=offline)
        again = sudoku.main(["--output-dir", str(tmp_path / f"again-{offline}"), "--num-aug", "1"])
        assert dataset_files(again) == dataset_files(first)
    assert "source: sapientinc/sudoku-extreme revision main" in capsys.readouterr().out


def test_issue45_a_pinned_revision_builds_that_commit(hub, csvs, online, tmp_path):
    v1 = hub.commits["sudoku-v1"]
    local = sudoku.build_dataset(tmp_path / "local", source_dir=source_dir(tmp_path, csvs["sudoku-v1"]), num_aug=1)
    # As a recipe's dataset_builder names it (utils/data/builders.py), by tag, then by commit.
    by_tag = build_dataset(tmp_path / "tag", {"kind": "sudoku", "revision": "v1", "num_aug": 1})
    assert assert_same_as_source_dir_build(by_tag, local) == expected_record(sudoku.HUB_REPO, "v1", v1,
                                                                              csvs["sudoku-v1"])
    by_commit = sudoku.build_dataset(tmp_path / "commit", revision=v1, num_aug=1)
    assert assert_same_as_source_dir_build(by_commit, local)["commit"] == v1


def run_script(kind: str, argv: list[str], monkeypatch, capsys) -> str:
    """Run a builder script in this process as its command line does; returns its one-line error (exit status 2)."""
    monkeypatch.setattr(sys, "argv", [SCRIPTS[kind].name, *argv])
    with pytest.raises(SystemExit) as info:
        runpy.run_path(str(SCRIPTS[kind]), run_name="__main__")
    err = capsys.readouterr().err
    assert info.value.code == 2, err
    errors = [line for line in err.splitlines() if line.startswith("error:")]  # the rest: progress bars
    assert len(errors) == 1 and err.rstrip().endswith(errors[0]), err
    return errors[0]


@pytest.mark.parametrize("kind, flags, message", [
    ("sudoku", ["--repo", "nobody/nothing"], "no dataset repo nobody/nothing on the Hugging Face Hub"),
    ("sudoku", ["--revision", "v9"], "the dataset repo sapientinc/sudoku-extreme has no revision 'v9'"),
    ("sudoku", ["--repo", "owner/no-test"], "the dataset repo owner/no-test at revision main (commit "),
    ("sudoku", ["--repo", "owner/truncated"], "train.csv:9: expected 4 columns"),
    ("sudoku", ["--repo", "owner/bad-header"], "train.csv:1: expected the header source,question,answer,rating"),
    ("maze", ["--repo", "owner/maze-truncated"], "train.csv:7: expected 4 columns"),
    ("maze", ["--repo", "owner/maze-no-header"], "train.csv:1: expected the header row"),
])
def test_issue45_a_bad_repo_file_or_csv_is_one_line_and_leaves_nothing(online, tmp_path, monkeypatch, capsys, kind,
                                                                       flags, message):
    out = tmp_path / "data" / "built"
    out.parent.mkdir()
    assert message in run_script(kind, ["--output-dir", str(out), *flags], monkeypatch, capsys)
    assert list(out.parent.iterdir()) == []  # neither the dataset nor its staging directory


@pytest.mark.parametrize("kind, repo", [("sudoku", sudoku.HUB_REPO), ("maze", maze.HUB_REPO)])
def test_issue45_an_unreachable_hub_with_nothing_cached_is_one_line_naming_both_ways_forward(
        tmp_path, monkeypatch, capsys, kind, repo):
    point_at(monkeypatch, closed_endpoint(), tmp_path / "hf" / "hub")
    line = run_script(kind, ["--output-dir", str(tmp_path / "out")], monkeypatch, capsys)
    assert "cannot be reached" in line and repo in line
    assert "on a machine with network" in line and "--source-dir DIR" in line
    point_at(monkeypatch, closed_endpoint(), tmp_path / "hf" / "hub", offline=True)
    assert "HF_HUB_OFFLINE=1 is set" in run_script(kind, ["--output-dir", str(tmp_path / "out")], monkeypatch, capsys)
    assert not (tmp_path / "out").exists()


def tiny_released_checkpoint() -> tuple[bytes, bytes]:
    """A tiny HRM for Sudoku (81 cells, vocabulary 11) as the releases ship one: a bare state dict under the
    reference's key names (``checkpoint``), and its ``all_config.yaml``."""
    cfg = recipe_config("cfg_pretrain", ["arch.hidden_size=16", "arch.num_heads=2", "arch.H_layers=1",
                                         "arch.L_layers=1", "arch.halt_max_steps=2", "global_batch_size=4"])
    arch = validate_arch(cfg.arch)
    torch.manual_seed(0)
    head = build_model(arch, batch_size=4, seq_len=81, vocab_size=11, num_puzzle_identifiers=1, dtype=torch.float32,
                       device="cpu")
    weights = io.BytesIO()
    torch.save(reference_state_dict(head), weights)
    return weights.getvalue(), OmegaConf.to_yaml(OmegaConf.create(to_dict(cfg) | {"arch": arch})).encode()


@pytest.mark.parametrize("repo, layout", [
    ("sapientinc/HRM-checkpoint-tiny", {"checkpoint": "weights", "all_config.yaml": "config"}),  # HRM's releases
    ("owner/trm-tiny", {"sudoku/step_10": "weights", "sudoku/all_config.yaml": "config", "README.md": "readme"}),
])
def test_issue45_evaluate_scores_an_hf_checkpoint_end_to_end(hub, csvs, online, tmp_path, capsys, repo, layout):
    weights, config = tiny_released_checkpoint()
    assert len(weights) > 1024 >= len(b"# x")  # the weights are an LFS file, served through the CDN
    contents = {"weights": weights, "config": config, "readme": b"# x"}
    hub.publish("model", repo, {path: contents[what] for path, what in layout.items()})
    data = sudoku.build_dataset(tmp_path / "data", source_dir=source_dir(tmp_path, csvs["sudoku"]))
    capsys.readouterr()
    assert evaluate.main(["--checkpoint", f"hf://{repo}", "--data-path", str(data), "--device", "cpu",
                          "--forward-dtype", "float32", "--json"]) == 0
    metrics = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert metrics["count"] == 3 and 0 <= metrics["exact_accuracy"] <= 1
    cached = sorted(p.name for p in online.rglob("*") if p.is_file() and "snapshots" in p.parts)
    assert cached == sorted(Path(path).name for path, what in layout.items() if what != "readme")


# ---- issue 53: an endpoint that misbehaves on purpose, a damaged cache ----------------------------------------------

@pytest.fixture
def faulty(csvs, tmp_path, monkeypatch):
    """A stand-in of its own serving the reference CSVs, its ``faults`` set by each test, and this process's
    huggingface_hub pointed at it with an empty cache."""
    with HubStandIn() as own:
        own.publish("dataset", sudoku.HUB_REPO, csvs["sudoku"])
        own.publish("dataset", maze.HUB_REPO, csvs["maze"])
        point_at(monkeypatch, own.endpoint, tmp_path / "hf" / "hub")
        yield own


@pytest.mark.parametrize("kind, repo", [("sudoku", sudoku.HUB_REPO), ("maze", maze.HUB_REPO)])
def test_campaign5_p01_a_revision_that_is_no_ref_name_is_refused_before_any_request(faulty, tmp_path, monkeypatch,
                                                                                    capsys, kind, repo):
    faulty.faults.any_revision = True  # a permissive endpoint: it serves main for whatever revision it is asked
    victim = tmp_path / "victim.txt"
    victim.write_text("mine")
    refs = tmp_path / "hf" / "hub" / f"datasets--{repo.replace('/', '--')}" / "refs"  # where the revision is written
    line = run_script(kind, ["--output-dir", str(tmp_path / "out"), "--revision", os.path.relpath(victim, refs)],
                      monkeypatch, capsys)
    assert "--revision '../../../../victim.txt' cannot name a branch, tag or commit (it holds '..')" in line
    assert victim.read_text() == "mine" and faulty.requests == [] and not (tmp_path / "out").exists()


@pytest.mark.parametrize("kind", ["sudoku", "maze"])
@pytest.mark.parametrize("repo", ["owner/../name", "owner/name/more"])
def test_campaign5_p16_a_repo_that_is_no_repo_id_is_one_line(faulty, tmp_path, monkeypatch, capsys, kind, repo):
    line = run_script(kind, ["--output-dir", str(tmp_path / "out"), "--repo", repo], monkeypatch, capsys)
    assert f"--repo {repo!r} cannot name a Hugging Face Hub repo (a repo id is owner/name" in line
    assert faulty.requests == []


def test_campaign5_p05_a_cached_csv_cut_short_is_refused_naming_it(faulty, tmp_path, monkeypatch, capsys):
    sudoku.main(["--output-dir", str(tmp_path / "first")])  # fills the cache
    blob = next((tmp_path / "hf" / "hub").glob("datasets--*/snapshots/*/train.csv")).resolve()
    blob.write_bytes(b"".join(blob.read_bytes().splitlines(keepends=True)[:4]))  # cut at a line: 3 of 8 rows
    for offline in (True, False):
        point_at(monkeypatch, faulty.endpoint, tmp_path / "hf" / "hub", offline=offline)
        line = run_script("sudoku", ["--output-dir", str(tmp_path / f"again-{offline}")], monkeypatch, capsys)
        assert f"train.csv in the Hugging Face cache ({blob}) does not have the hash the Hub gave for it" in line
        assert f"delete {blob} and rerun" in line and not (tmp_path / f"again-{offline}").exists()


def test_campaign5_p06_two_files_announced_with_one_hash_or_bytes_of_another_hash_are_refused(
        faulty, csvs, tmp_path, monkeypatch, capsys):
    faulty.faults.etag = hashlib.sha256(csvs["sudoku"]["train.csv"]).hexdigest()  # test.csv announced as train.csv
    line = run_script("sudoku", ["--output-dir", str(tmp_path / "same")], monkeypatch, capsys)
    assert f"gave train.csv and test.csv of the dataset repo {sudoku.HUB_REPO} at revision main" in line
    assert "one hash: the splits would be the same file" in line
    point_at(monkeypatch, faulty.endpoint, tmp_path / "other-cache")
    faulty.faults.etag = "0" * 64  # announced, but not the hash of the bytes that come
    line = run_script("sudoku", ["--output-dir", str(tmp_path / "wrong")], monkeypatch, capsys)
    assert "train.csv in the Hugging Face cache" in line and "does not have the hash the Hub gave for it" in line
    assert not (tmp_path / "same").exists() and not (tmp_path / "wrong").exists()


def test_campaign5_p13_a_dripping_download_is_ended_by_its_deadline(faulty, tmp_path, monkeypatch, capsys):
    faulty.faults.drip_s = 0.05  # 20 bytes a second: 1.4 kB of train.csv would take over a minute
    monkeypatch.setattr(utils.hub, "DOWNLOAD_GRACE_S", 0.5, raising=False)
    line = run_script("sudoku", ["--output-dir", str(tmp_path / "out")], monkeypatch, capsys)
    assert line.startswith(f"error: fetching train.csv of the dataset repo {sudoku.HUB_REPO} at revision main: ")
    assert "under the 10.0kB/s a download must keep" in line and "--source-dir DIR" in line


def test_campaign5_p20_a_commit_id_that_is_no_folder_name_is_one_line(faulty, tmp_path, monkeypatch, capsys):
    faulty.faults.commit = "../../elsewhere"
    line = run_script("sudoku", ["--output-dir", str(tmp_path / "out")], monkeypatch, capsys)
    assert f"{faulty.endpoint} answered, but not as a Hugging Face Hub does (ValueError: Invalid pointer path" in line


def test_campaign5_p21_an_answer_without_x_repo_commit_is_named_not_taken_for_an_unreachable_hub(
        faulty, tmp_path, monkeypatch, capsys):
    faulty.faults.commit = ""
    line = run_script("sudoku", ["--output-dir", str(tmp_path / "out")], monkeypatch, capsys)
    assert f"{faulty.endpoint} answered, but not as a Hugging Face Hub does (FileMetadataError: Response from " in line
    assert "is missing the 'X-Repo-Commit' header" in line and "cannot be reached" not in line
    assert ("HEAD", f"/datasets/{sudoku.HUB_REPO}/resolve/main/train.csv") in faulty.requests  # it did answer


def test_campaign5_p23_a_hub_build_logs_no_http_request_line_before_its_error(faulty, tmp_path, monkeypatch, capsys,
                                                                               caplog):
    caplog.set_level(logging.INFO)  # as the builders log (utils/run/main.py setup_logging)
    line = run_script("sudoku", ["--output-dir", str(tmp_path / "out"), "--revision", "v9"], monkeypatch, capsys)
    assert "has no revision 'v9'" in line and faulty.requests  # the Hub was asked
    assert [r.getMessage() for r in caplog.records if "HTTP Request" in r.getMessage()] == []
