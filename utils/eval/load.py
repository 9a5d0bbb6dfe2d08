"""Loading a trained HRM/TRM for evaluation or solving: from a checkpoint file, a run directory (its best
checkpoint), or a Hugging Face Hub repository (``hf://owner/repo[/file]``).

Accepts our checkpoints (``step_<N>.pt`` and ``best.pt``, which carry their settings and, since they record it,
the data's ``seq_len`` and ``vocab_size``) and the reference repositories' released ones (a raw state dict named
``checkpoint`` or ``step_<N>`` next to ``all_config.yaml``).

A bundled model (``<name>.pt`` with the card ``<name>.md`` that ``scripts/bundle_model.py`` wrote beside it) is
checked against its card on every load: a file whose size or SHA-256 is not the card's is refused, so weights
damaged or swapped after they were measured never answer in the card's name. A model in :data:`BUNDLED_DIR` (the
ones this repository ships) always has its card, so one there whose card is missing, unreadable or without its
marker and file row is refused too: deleting or editing the card does not switch the check off.
"""

from __future__ import annotations

import hashlib
import logging
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

import torch
from omegaconf import OmegaConf

from models import build_model, is_grid, validate_arch
from models.layers import grid_side
from models.checkpoints import load_model_weights
from models.maze_targets import answer_labels_for
from utils.config import ConfigError, PretrainConfig, build_config, to_dict
from utils.data.puzzle_dataset import load_metadata
from utils.checkpoint import CheckpointError, check_checkpoint_file, safe_load
from utils.run.run_dir import PLAN, newest_loadable, read_manifest, recorded_checkpoints

log = logging.getLogger(__name__)

# The models this repository ships (utils/solve/solving.py BUNDLED), and where scripts/bundle_model.py writes by
# default: every model here comes with its card.
BUNDLED_DIR = Path(__file__).resolve().parents[2] / "models" / "pretrained"
# The introduction of every card scripts/bundle_model.py writes says so; a Markdown file beside a model without it
# is someone's notes, not a card.
CARD_MARK = "bundled with `scripts/bundle_model.py`"
_CARD_FILE_ROW = re.compile(r"^\| file \| `[^`]+`, (?P<size>[\d,]+) bytes\b.*?SHA-256 `(?P<sha256>[0-9a-f]{64})`", re.M)


@dataclass(frozen=True)
class Card:
    """What the card of a bundled model (``path``) records of its file: ``size`` in bytes and ``sha256`` (hex)."""

    path: Path
    size: int
    sha256: str


def card_path(model: Path) -> Optional[Path]:
    """The card of the bundled model ``model`` (``<stem>.md`` beside it), when there is one that
    ``scripts/bundle_model.py`` wrote (its introduction names the script); None otherwise."""
    path = model.with_suffix(".md")
    try:
        with open(path, encoding="utf-8") as f:
            introduction = f.read(4096).split("\n|", 1)[0]  # the text above the card's table
    except (OSError, UnicodeDecodeError):  # no such file, a folder, unreadable or not text: not a card
        return None
    return path if introduction.startswith("# ") and CARD_MARK in introduction else None


def read_card(model: Path) -> Optional[Card]:
    """The size and SHA-256 the card of the bundled model ``model`` records (see :func:`card_path`); None when
    ``model`` has no card.

    Raises:
        CheckpointError: a card without its ``file`` row (size and SHA-256).
    """
    path = card_path(model)
    if path is None:
        return None
    found = _CARD_FILE_ROW.search(path.read_text(encoding="utf-8", errors="replace"))
    if found is None:
        raise CheckpointError(f"{path}, the card of {model}, records no size and SHA-256 (its `| file |` row): "
                              "restore the card, or bundle the model again with scripts/bundle_model.py")
    return Card(path, int(found["size"].replace(",", "")), found["sha256"])


def file_sha256(path: Path) -> str:
    """The SHA-256 of the file at ``path``, as hex, read in pieces (as utils/data/hub_source.py hashes its CSVs)."""
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def check_against_card(model: Path) -> Optional[Card]:
    """Refuse a bundled model that is not the file its card describes; the card checked, None for a model outside
    :data:`BUNDLED_DIR` without a card (nothing to check: not a bundled model).

    Raises:
        CheckpointError: the size or the SHA-256 differs from the card's, naming both hashes; a card without them
            (:func:`read_card`); or a model in :data:`BUNDLED_DIR` without its card.
    """
    if not model.is_file():
        return None
    shipped = model.resolve().parent == BUNDLED_DIR.resolve()
    model = model.resolve() if shipped else model  # a link to a shipped model: its card is the one beside it
    card = read_card(model)
    if card is None and shipped:
        raise CheckpointError(f"{model} has no card: {model.with_suffix('.md').name} beside it is missing, unreadable "
                              "or not one scripts/bundle_model.py wrote, and every model in that folder comes with its "
                              "card (its size and SHA-256); restore the card (a shipped model: git checkout -- "
                              "models/pretrained/), bundle the model again with scripts/bundle_model.py, or keep a "
                              "checkpoint of your own elsewhere")
    if card is None:
        return None
    size, digest = model.stat().st_size, file_sha256(model)
    if (size, digest) != (card.size, card.sha256):
        raise CheckpointError(f"{model} is not the file its card {card.path.name} describes: it is {size:,} bytes "
                              f"with SHA-256 {digest}, the card says {card.size:,} bytes with SHA-256 {card.sha256}; "
                              "restore the file (a shipped model: git checkout -- the file), or bundle it again with "
                              "scripts/bundle_model.py")
    return card


def resolve_checkpoint(spec: str) -> tuple[Path, str]:
    """The checkpoint file ``spec`` names, and a note saying which one was picked and why.

    ``spec`` is a checkpoint file; a run directory (its ``best.pt`` when the run recorded one, else its newest
    valid step checkpoint); a folder of runs, such as ``checkpoints/<dataset>`` (its newest run, as a run directory);
    or ``hf://owner/repo[/file]`` (see :func:`utils.hub.resolve_checkpoint`).

    Raises:
        CheckpointError: nothing there, a file that is empty or not a checkpoint (:func:`check_checkpoint_file`), or
            a run directory without a checkpoint.
    """
    if spec.startswith("hf://"):
        from utils.hub import resolve_checkpoint as from_hub  # only Hub users need huggingface_hub at import

        path = from_hub(spec)
        return path, f"{spec} -> {path}"
    path = Path(spec)
    if not path.is_dir():
        return check_checkpoint_file(path), ""
    run = newest_run(path)
    if run is not None:
        found, why = resolve_checkpoint(str(run))
        return found, f"the newest run in {path}, {run.name}: {why}"
    manifest = read_manifest(path) or {}
    best = manifest.get("best")
    if best and (path / best).is_file():
        record = manifest.get("best_metric") or {}
        why = f" ({record['metric']} {record['value']:.4f} at step {record['step']})" if record.get("value") is not None else ""
        return path / best, f"the run's best checkpoint {best}{why}"
    found = newest_loadable(reversed(recorded_checkpoints(path)))
    if found is None:
        raise CheckpointError(f"{path} holds no valid checkpoint (no best.pt, no loadable step_<N>.pt); pass a "
                              "checkpoint file or a run directory with one")
    return found[0], f"the run's newest checkpoint {found[0].name} (it has no best.pt)"


def newest_run(folder: Path) -> Optional[Path]:
    """The run directory (one with a ``plan.yaml``, which a run writes first) most recently started among
    ``folder``'s own folders, when ``folder`` is not a run directory itself and holds no checkpoint; else None."""
    if (folder / PLAN).is_file() or any(folder.glob("*.pt")):
        return None
    runs = [child for child in folder.iterdir() if (child / PLAN).is_file()]
    return max(runs, key=lambda run: (run / PLAN).stat().st_mtime, default=None)


def checkpoint_settings(path: Path, payload: dict) -> PretrainConfig:
    """The training settings stored in our checkpoint, or the reference's ``all_config.yaml`` beside it.

    Raises:
        CheckpointError: a CAPE checkpoint.
        ConfigError: neither exists, or they do not validate.
    """
    if payload.get("trainer") == "cape":
        raise CheckpointError(f"{path} is a CAPE checkpoint of models.train_cape_episodic, not an HRM/TRM one; give "
                              "a checkpoint of pretrain.py (use scripts/predict_pose.py with this one)")
    if isinstance(payload.get("config"), dict):
        raw = payload["config"]
    else:
        yaml_path = path.parent / "all_config.yaml"
        if not yaml_path.is_file():
            raise ConfigError(f"{path} carries no settings and there is no {yaml_path}; put the run's all_config.yaml next to it")
        try:
            raw = OmegaConf.to_container(OmegaConf.load(yaml_path), resolve=True)
        except Exception as e:  # a YAML parser error: name the file, not the parser's internals
            raise ConfigError(f"could not read {yaml_path}: {str(e).splitlines()[0]}") from None
    known = set(to_dict(PretrainConfig()))
    dropped = sorted(set(raw) - known)
    if dropped:
        log.info("ignoring settings this trainer does not use: %s", ", ".join(dropped))
    return build_config({k: v for k, v in raw.items() if k in known})


@dataclass
class Trained:
    """A trained model ready to answer: the loss head (eval mode), its settings, where it came from, its step, the
    data sizes it was built for (``seq_len``, ``vocab_size``), the ``card`` it was checked against (a bundled
    model's, :func:`check_against_card`; None for any other checkpoint), and whether it is a ``grid`` model
    (:func:`models.is_grid`: it takes square puzzles of any side, ``seq_len`` being the one it was trained on)."""

    head: Any
    cfg: PretrainConfig
    path: Path
    note: str
    step: int
    seq_len: int
    vocab_size: int
    card: Optional[Path] = None
    grid: bool = False
    bundled: bool = False  # whether it answers as the task's bundled model (utils/solve/solving.py open_model)


def load_trained(spec: str, device: torch.device, dtype: torch.dtype, batch_size: int,
                 data_path: Optional[str] = None, seq_len: Optional[int] = None,
                 resolved: Optional[tuple[Path, str]] = None) -> Trained:
    """Build the model a checkpoint describes and load its weights.

    ``resolved`` is what :func:`resolve_checkpoint` made of ``spec`` already, for a command that checked its inputs
    before choosing the device: a run directory is then not searched twice (nor its skipped checkpoints warned of
    twice, nor a Hub file looked up twice).

    The data sizes (``seq_len``, ``vocab_size``) come from ``data_path`` when given (the dataset to evaluate: for a
    grid model, square puzzles of any side in its vocabulary), else
    from the checkpoint's ``data`` record, else from the training data its settings name when that dataset is here,
    else from ``seq_len`` (a puzzle's own) with the vocabulary read off the weights.

    Raises:
        CheckpointError, ConfigError: see :func:`resolve_checkpoint`, :func:`check_against_card` (a bundled model
            that is not the file its card describes) and :func:`checkpoint_settings`; the weights do not fit the
            architecture; or the data sizes cannot be told.
    """
    path, note = resolved or resolve_checkpoint(spec)
    card = check_against_card(path)
    payload = safe_load(path)
    if not isinstance(payload, dict):
        raise CheckpointError(f"{path} holds a {type(payload).__name__}, not a checkpoint (a dict)")
    state = payload["model"] if isinstance(payload.get("model"), dict) else payload
    cfg = checkpoint_settings(path, payload)
    sizes = _data_sizes(path, payload, state, cfg, data_path, seq_len)
    # The puzzle-embedding table was sized by the training data; the checkpoint knows its size.
    table = next((v for k, v in state.items() if k.endswith("puzzle_emb.weights")), None)
    arch = validate_arch(cfg.arch)
    head = build_model(arch, batch_size=batch_size, seq_len=sizes["seq_len"],
                       vocab_size=sizes["vocab_size"], dtype=dtype, device=device,
                       num_puzzle_identifiers=1 if table is None else table.shape[0])
    load_model_weights(head, state, str(path))
    head.answer_labels = answer_labels_for(cfg.maze_targets, head.loss_fn, sizes["vocab_size"])
    head.eval()
    step = payload.get("step") if isinstance(payload.get("step"), int) else 0
    return Trained(head, cfg, path, note, step, sizes["seq_len"], sizes["vocab_size"], card and card.path,
                   is_grid(arch))


def _grid_fits(cfg: PretrainConfig, sizes: dict[str, int], own: dict[str, int]) -> bool:
    """Whether a grid model (:func:`models.is_grid`) trained on ``own`` sizes takes a dataset of ``sizes``: the same
    vocabulary, and square puzzles of any side."""
    if sizes["vocab_size"] != own["vocab_size"] or not is_grid(validate_arch(cfg.arch)):
        return False
    try:
        grid_side(sizes["seq_len"])
    except ValueError:
        return False
    return True


def _data_sizes(path: Path, payload: dict, state: dict, cfg: PretrainConfig, data_path: Optional[str],
                seq_len: Optional[int]) -> dict[str, int]:
    """``{"seq_len", "vocab_size"}`` by the rule of :func:`load_trained`.

    Raises:
        ConfigError: ``data_path`` holds puzzles of other sizes than the checkpoint was trained on.
    """
    trained_on = (cfg.data_paths_test or cfg.data_paths or [cfg.data_path])[0]
    recorded = {k: int(payload["data"][k]) for k in ("seq_len", "vocab_size")} if isinstance(payload.get("data"), dict) \
        else None
    vocab = next((v.shape[0] for k, v in state.items() if k.endswith("embed_tokens.embedding_weight")), None)
    for candidate in (data_path, None, trained_on):
        if candidate is None and recorded is not None:
            return recorded
        if candidate and (Path(candidate) / "test" / "dataset.json").is_file():
            metadata = load_metadata(candidate, "test")
            sizes = {"seq_len": metadata.seq_len, "vocab_size": metadata.vocab_size}
            own = recorded or {"seq_len": sizes["seq_len"], "vocab_size": vocab or sizes["vocab_size"]}
            if candidate == data_path and sizes != own and not _grid_fits(cfg, sizes, own):
                raise ConfigError(f"the dataset {data_path} holds puzzles of {sizes['seq_len']} cells and a vocabulary "
                                  f"of {sizes['vocab_size']}, but {path} was trained on {own['seq_len']} cells and a "
                                  f"vocabulary of {own['vocab_size']} ({trained_on}): give the dataset it was trained on")
            return sizes
    if seq_len is None or vocab is None:
        raise CheckpointError(f"{path} does not record its data sizes and the dataset {data_path or trained_on} is "
                              "not here; pass --data-path with the dataset it was trained on")
    return {"seq_len": seq_len, "vocab_size": vocab}
