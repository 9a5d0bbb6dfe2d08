"""hf:// checkpoint specs, resolved offline from a Hugging Face cache the tests write themselves.

The cache layout is huggingface_hub's: ``models--<owner>--<repo>/refs/main`` holds the commit hash,
``snapshots/<commit>/<path in repo>`` are relative symlinks to ``blobs/<sha256>``.
"""

import hashlib
import logging
import os
import subprocess
import sys
from pathlib import Path

import httpx2
import pytest
import torch
from huggingface_hub import HfApi, constants, hf_hub_download
from huggingface_hub.errors import RemoteEntryNotFoundError

from models import build_model, validate_arch
from models.checkpoints import load_pretrained, reference_state_dict
import utils.hub
from utils.config import recipe_config
from utils.hub import resolve_checkpoint
from utils.checkpoint import CheckpointError
from tests.hub_stand_in import HubStandIn, closed_endpoint, point_at, silent_endpoint

REPO_ROOT = Path(__file__).resolve().parent.parent
COMMIT = "0123456789abcdef0123456789abcdef01234567"


def publish(cache: Path, repo_id: str, files: dict[str, bytes]) -> Path:
    """Write ``files`` into ``cache`` as huggingface_hub stores a download of ``repo_id`` at ``main``; the snapshot
    folder."""
    storage = cache / f"models--{repo_id.replace('/', '--')}"
    (storage / "refs").mkdir(parents=True, exist_ok=True)
    (storage / "refs" / "main").write_text(COMMIT)
    snapshot = storage / "snapshots" / COMMIT
    for path, data in files.items():
        blob = storage / "blobs" / hashlib.sha256(data).hexdigest()
        blob.parent.mkdir(parents=True, exist_ok=True)
        blob.write_bytes(data)
        pointer = snapshot / path
        pointer.parent.mkdir(parents=True, exist_ok=True)
        pointer.symlink_to(os.path.relpath(blob, pointer.parent))
    return snapshot


@pytest.fixture
def cache(tmp_path, monkeypatch):
    """An empty offline Hugging Face cache under tmp_path (huggingface_hub reads its settings at import, so the
    module's copies are set along with the environment)."""
    hub = tmp_path / "hf" / "hub"
    hub.mkdir(parents=True)
    for name, value in (("HF_HOME", tmp_path / "hf"), ("HF_HUB_CACHE", hub), ("HF_HUB_OFFLINE", "1")):
        monkeypatch.setenv(name, str(value))
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(hub))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    return hub


def one_line_error(spec: str) -> str:
    with pytest.raises(CheckpointError) as e:
        resolve_checkpoint(spec)
    assert "\n" not in str(e.value)
    return str(e.value)


def test_the_fake_cache_is_one_huggingface_hub_reads(cache):
    snapshot = publish(cache, "owner/repo", {"checkpoint": b"weights", "sub/all_config.yaml": b"a: 1\n"})
    assert Path(hf_hub_download("owner/repo", "sub/all_config.yaml")) == snapshot / "sub" / "all_config.yaml"
    assert Path(hf_hub_download("owner/repo", "checkpoint")).read_bytes() == b"weights"


def test_a_plain_path_is_returned_as_it_is(cache):
    assert resolve_checkpoint("runs/x/step_8.pt") == Path("runs/x/step_8.pt")


def test_a_repo_resolves_to_its_checkpoint_file_with_all_config_beside_it(cache):
    snapshot = publish(cache, "sapientinc/HRM-checkpoint-sudoku-extreme",
                       {"checkpoint": b"weights", "all_config.yaml": b"lr: 1e-4\n", "README.md": b"# HRM\n"})
    path = resolve_checkpoint("hf://sapientinc/HRM-checkpoint-sudoku-extreme")
    assert path == snapshot / "checkpoint"
    assert (path.parent / "all_config.yaml").read_text() == "lr: 1e-4\n"


@pytest.mark.parametrize("name", ["step_26040", "model.pt"])
def test_a_repo_without_a_checkpoint_file_resolves_to_its_single_step_or_pt_file(cache, name):
    snapshot = publish(cache, "owner/trm", {f"sudoku/{name}": b"weights", "README.md": b"# TRM\n"})
    assert resolve_checkpoint("hf://owner/trm") == snapshot / "sudoku" / name


def test_several_checkpoint_files_are_a_one_line_error_naming_each(cache):
    publish(cache, "owner/trm", {"arc1/step_100": b"a", "arc2/step_200": b"b", "README.md": b""})
    message = one_line_error("hf://owner/trm")
    assert "hf://owner/trm/arc1/step_100" in message and "hf://owner/trm/arc2/step_200" in message


def test_a_repo_without_any_checkpoint_file_is_an_error(cache):
    publish(cache, "owner/notes", {"README.md": b""})
    assert "holds no checkpoint file" in one_line_error("hf://owner/notes")


def test_a_path_in_the_repo_resolves_to_that_file(cache):
    snapshot = publish(cache, "owner/repo", {"checkpoint": b"x", "sub/file.pt": b"weights",
                                             "sub/all_config.yaml": b"seed: 0\n"})
    path = resolve_checkpoint("hf://owner/repo/sub/file.pt")
    assert path == snapshot / "sub" / "file.pt" and path.read_bytes() == b"weights"
    assert (path.parent / "all_config.yaml").is_file()


def test_what_the_cache_lacks_offline_is_a_one_line_error_with_the_download_command(cache):
    message = one_line_error("hf://owner/elsewhere")
    assert "HF_HUB_OFFLINE=1" in message and "hf download owner/elsewhere" in message
    publish(cache, "owner/repo", {"checkpoint": b"x"})
    message = one_line_error("hf://owner/repo/sub/missing.pt")
    assert "lacks sub/missing.pt of owner/repo" in message and "hf download owner/repo sub/missing.pt" in message


@pytest.mark.parametrize("spec, expected", [("hf://owner", "Repository id must be 'namespace/name'"),
                                            ("hf://", "Write hf://owner/repo"),
                                            ("hf://datasets/owner/data", "names a dataset repository")])
def test_a_bad_spec_is_a_one_line_error(cache, spec, expected):
    assert expected in one_line_error(spec)


def test_online_a_repo_without_a_checkpoint_file_is_listed_on_the_hub_and_its_step_file_downloaded(
        cache, monkeypatch):
    # A stand-in Hub: downloads serve the snapshot this test publishes; a file it lacks is a 404.
    snapshot = publish(cache, "owner/trm", {"sudoku/step_26040": b"weights", "README.md": b""})
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    requested = []

    def download(repo_id, filename, revision=None, local_files_only=False, **_):  # _: the progress bar's class
        requested.append(filename)
        if not (snapshot / filename).is_file():
            response = httpx2.Response(404, request=httpx2.Request("HEAD", f"https://hub/{repo_id}/{filename}"))
            raise RemoteEntryNotFoundError(f"no {filename}", response=response)
        return str(snapshot / filename)

    monkeypatch.setattr(utils.hub, "hf_hub_download", download)
    monkeypatch.setattr(HfApi, "list_repo_files", lambda self, repo_id, revision=None: ["README.md", "sudoku/step_26040"])
    monkeypatch.setattr(HfApi, "repo_info", lambda self, repo_id, **_: None)  # the probe: the Hub answers
    assert resolve_checkpoint("hf://owner/trm") == snapshot / "sudoku" / "step_26040"
    assert requested == ["checkpoint", "sudoku/step_26040", "sudoku/all_config.yaml"]
    assert "has no file sub/x.pt" in one_line_error("hf://owner/trm/sub/x.pt")


def test_huggingface_hub_finds_the_cache_from_the_environment_alone(cache):
    snapshot = publish(cache, "owner/repo", {"checkpoint": b"weights"})
    env = {k: v for k, v in os.environ.items() if k != "HF_HUB_CACHE"}  # HF_HOME/hub is the default place
    out = subprocess.run([sys.executable, "-c", "from utils.hub import resolve_checkpoint; "
                          "print(resolve_checkpoint('hf://owner/repo'))"],
                         cwd=REPO_ROOT, env=env, capture_output=True, text=True, check=True)
    assert Path(out.stdout.strip()) == snapshot / "checkpoint"


def tiny_head(seed: int) -> torch.nn.Module:
    arch = validate_arch(recipe_config("cfg_pretrain", ["arch.hidden_size=16", "arch.num_heads=2", "arch.H_layers=1",
                                                        "arch.L_layers=1"]).arch)
    torch.manual_seed(seed)
    head = build_model(arch, batch_size=2, seq_len=4, vocab_size=5, num_puzzle_identifiers=3, dtype=torch.float32,
                       device="cpu")
    with torch.no_grad():
        for p in head.parameters():
            p.normal_()
    return head


def test_load_pretrained_reads_a_released_checkpoint_through_an_hf_spec(cache, tmp_path):
    donor = tiny_head(seed=1)
    torch.save(reference_state_dict(donor), tmp_path / "checkpoint")  # as the HRM release: a bare state dict
    publish(cache, "sapientinc/HRM-checkpoint-tiny", {"checkpoint": (tmp_path / "checkpoint").read_bytes()})
    head = tiny_head(seed=2)
    assert load_pretrained(head, "hf://sapientinc/HRM-checkpoint-tiny") is None
    for key, value in donor.state_dict().items():
        assert torch.equal(head.state_dict()[key], value), key


# ---- issue 53: hf:// against an endpoint that misbehaves on purpose, or does not answer -----------------------------

@pytest.fixture
def stand_in(tmp_path, monkeypatch):
    """A stand-in Hub (tests/hub_stand_in.py) holding the model repo owner/trm, whose one checkpoint is
    ``sudoku/step_10``, and this process's huggingface_hub pointed at it with an empty cache."""
    with HubStandIn() as hub:
        hub.publish("model", "owner/trm", {"sudoku/step_10": b"weights", "README.md": b"# TRM\n"})
        point_at(monkeypatch, hub.endpoint, tmp_path / "hf" / "hub")
        yield hub


def test_campaign5_p01_an_hf_revision_that_is_no_ref_name_is_refused_before_any_request(stand_in, tmp_path):
    stand_in.faults.any_revision = True  # a permissive endpoint: it serves main for whatever revision it is asked
    victim = tmp_path / "victim.txt"
    victim.write_text("mine")
    escape = os.path.relpath(victim, tmp_path / "hf" / "hub" / "models--owner--trm" / "refs").replace("/", "%2F")
    message = one_line_error(f"hf://owner/trm@{escape}/sudoku/step_10")
    assert "the revision '../../../../victim.txt' is not a branch, tag or commit name (it holds '..')" in message
    assert victim.read_text() == "mine" and stand_in.requests == []


def test_campaign5_p10_an_hf_spec_probes_a_silent_hub_once_then_uses_the_cached_file(tmp_path, monkeypatch):
    cache = tmp_path / "hf" / "hub"
    snapshot = publish(cache, "owner/repo", {"checkpoint": b"weights"})  # no all_config.yaml: not asked for again
    monkeypatch.setattr(utils.hub, "PROBE_TIMEOUT_S", 0.5, raising=False)  # how long the one probe waits
    with silent_endpoint() as (endpoint, connections):
        point_at(monkeypatch, endpoint, cache)
        assert resolve_checkpoint("hf://owner/repo") == snapshot / "checkpoint"
        assert len(connections) == 1


def test_campaign5_p10_an_unreachable_hub_is_one_line_without_retry_warnings(tmp_path, monkeypatch, caplog):
    point_at(monkeypatch, closed_endpoint(), tmp_path / "hf" / "hub")
    assert "the Hub cannot be reached" in one_line_error("hf://owner/elsewhere")
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING] == []


def test_campaign5_p20_a_listing_or_commit_id_that_is_not_a_hubs_is_one_line(stand_in):
    stand_in.faults.tree = b'{"files": "step_10"}'  # a listing the client cannot read (it wants a list of entries)
    message = one_line_error("hf://owner/trm")
    assert f"hf://owner/trm: {stand_in.endpoint} answered, but not as a Hugging Face Hub does (TypeError: " in message
    stand_in.faults.commit = "../elsewhere"
    message = one_line_error("hf://owner/trm/sudoku/step_10")
    assert "answered, but not as a Hugging Face Hub does (ValueError: Invalid pointer path" in message


def test_campaign5_p21_an_hf_answer_without_x_repo_commit_is_named_not_taken_for_an_unreachable_hub(stand_in):
    stand_in.faults.commit = ""
    message = one_line_error("hf://owner/trm/sudoku/step_10")
    assert "is missing the 'X-Repo-Commit' header" in message and "cannot be reached" not in message
