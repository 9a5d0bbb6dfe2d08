"""Bundle a trained run as a model that ships in models/pretrained/: the weights only, and a card measured here.

    python scripts/bundle_model.py checkpoints/sudoku-gen-hard-r1-3k-aug-100/RUN --name sudoku_hard_trm
    python scripts/bundle_model.py checkpoints/maze-mixed-6to16-48k/RUN --name maze_grid_trm --replace

It makes ``<name>.pt`` (the run's best checkpoint reduced to what answering needs: the weights in the reference
format, EMA ones where the run kept an EMA, in float32; the settings; the data sizes; the step) and ``<name>.md``,
the card: the recipe the run was trained with and its overrides (read from the run's plan.yaml and checked against
its settings: ``--recipe`` only confirms it), the command, the commit, the data as its dataset.json records it (and
the builder command where the run's dataset_builder makes data of those sizes), the held-out accuracy with its 95%
interval under the run's own test-time compute and with one answer (what that compute buys), the parameter count,
the file's size and SHA-256, and an evaluate.py command that measures the accuracy again.

A bundle is published only once it is proven: both files are written and the accuracies measured on the bundled
file itself in a hidden folder inside ``--out``; the pair is checked as every load checks it; then both move into
place together. A model or card already there is replaced only with ``--replace``, and only when it is a bundle
(never a run's checkpoint or a file of the user's); ``--out`` may not be a run directory.
"""

from __future__ import annotations

import argparse
import logging
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Optional

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402
import torch  # noqa: E402
from omegaconf import OmegaConf  # noqa: E402

from models import validate_arch  # noqa: E402
from utils.cli import ArgumentParser  # noqa: E402
from utils.config import (CONFIG_DIR, PretrainConfig, build_config, leaves, merge_layers, recipe_layers,  # noqa: E402
                          to_dict)
from utils.data.builders import BUILDERS  # noqa: E402
from utils.data.puzzle_dataset import PuzzleDataset, load_metadata  # noqa: E402
from utils.distributed import Dist  # noqa: E402
from utils.errors import UserError  # noqa: E402
from utils.solve import solving  # noqa: E402
from utils.eval.load import (CARD_MARK, card_path, check_against_card, file_sha256, load_trained,  # noqa: E402
                             resolve_checkpoint)
from utils.eval.puzzle import evaluate_puzzles  # noqa: E402
from utils.eval.reasoning import TestTimeCompute  # noqa: E402
from utils.outputs import check_writable_file, replace_together, write_atomically  # noqa: E402
from utils.checkpoint import CheckpointError, safe_load  # noqa: E402
from utils.run.main import cli_main  # noqa: E402
from utils.train.puzzle_trainer import choose_data_paths  # noqa: E402
from utils.run.run_dir import LOCK, run_outputs, read_manifest  # noqa: E402

log = logging.getLogger(__name__)

ANSWER_KEYS = ("model", "config", "data", "step", "trainer")  # what load_trained reads
# A bundle's name is a plain file stem: no folders, no hidden or option-like names, short enough for any file system.
NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]{0,99}")
COMMAND_LINE = "command line"  # the label of the run's overrides in its plan.yaml


def check_name(name: str) -> None:
    """Refuse a ``--name`` that is not a plain file stem (:data:`NAME`).

    Raises:
        UserError: naming the flag and what a name may hold.
    """
    if not NAME.fullmatch(name):
        shown = repr(name) if len(name) <= 40 else f"{name[:40]!r}... ({len(name)} characters)"
        raise UserError(f"--name {shown}: use letters, digits, _ and - (a file name without .pt, starting with a "
                        "letter or digit, at most 100 characters), e.g. --name sudoku_hard_trm")


def is_bundle(path: Path) -> bool:
    """Whether ``path`` holds a model this script bundled: a checkpoint of pretrain.py that holds nothing but what
    answering needs (a run's own checkpoints carry their optimizer, carry and RNG states too)."""
    try:
        payload = safe_load(path)
    except CheckpointError:
        return False
    return (isinstance(payload, dict) and payload.get("trainer") == "pretrain" and "model" in payload
            and set(payload) <= set(ANSWER_KEYS))


def check_out(out: Path) -> None:
    """Refuse an ``--out`` that is a run directory: a bundle there could replace the run's checkpoints.

    Raises:
        UserError: naming the run's files found there.
    """
    found = (run_outputs(out) + ([LOCK] if (out / LOCK).exists() else [])) if out.is_dir() else []
    if found:
        raise UserError(f"--out {out} is a run directory (it holds {', '.join(found[:3])}): a bundle is written "
                        f"elsewhere, e.g. --out {shown(solving.BUNDLED_DIR)} (the default)")


def check_replaceable(model: Path, replacing: bool) -> None:
    """Refuse to write over what is at ``model`` and its card unless both are a bundle's and ``--replace`` was
    given: a file this script did not write is never replaced.

    Raises:
        UserError: naming the file and what to do.
    """
    card = model.with_suffix(".md")
    for path, kind, ours in ((model, "a model", is_bundle), (card, "a card", lambda _: card_path(model) is not None)):
        if not os.path.lexists(path):
            continue
        if path.is_symlink() or not ours(path):
            raise UserError(f"{path} exists and is not {kind} scripts/bundle_model.py wrote (a run's checkpoint or "
                            "a file of your own?): it is kept; choose another --name or --out")
        if not replacing:
            raise UserError(f"{path} exists ({kind} bundled earlier): pass --replace to replace it with this run's "
                            "once the new one is measured, or choose another --name")
        log.warning("%s will be replaced (--replace) once the new bundle is measured", path)


@dataclass
class Training:
    """How a run was trained, as the run itself records it: the ``recipe`` (checked against the run's settings)
    and the ``overrides`` its command line gave (``key=value``, as pretrain.py takes them)."""

    recipe: str
    overrides: list[str]

    def command(self) -> str:
        return shlex.join(["python", "pretrain.py", f"--config-name={self.recipe}", *self.overrides])


def training_of(source: Path, settings: dict, asked: Optional[str]) -> Training:
    """The recipe and overrides of the run that wrote ``source``, from the run directory's plan.yaml (the layer that
    set each setting) and run.json (its command); ``asked`` (``--recipe``) must be a recipe that, with the run's
    overrides, gives the run's ``settings``.

    Raises:
        UserError: no plan.yaml; ``asked`` is no recipe, or disagrees with the run (the setting named); no recipe
            the run records agrees with it.
    """
    changed = read_changed(source.parent / "plan.yaml", source)
    candidates = recorded_recipes(source.parent, changed)
    if asked is not None and (Path(asked).name != asked or not (CONFIG_DIR / f"{asked}.yaml").is_file()):
        raise UserError(f"--recipe {asked}: no config/{asked}.yaml; the recipes: "
                        f"{', '.join(sorted(p.stem for p in CONFIG_DIR.glob('*.yaml')))} (or leave --recipe out: the "
                        "run records its own)")
    verdicts = {recipe: disagreement(recipe, settings, changed) for recipe in dict.fromkeys([asked, *candidates])
                if recipe is not None}
    agreeing = [recipe for recipe, (why, _) in verdicts.items() if why is None]
    if asked is not None and verdicts[asked][0] is not None:
        own = f"; it was trained with {agreeing[0]}" if agreeing else ""
        raise UserError(f"--recipe {asked} disagrees with the run {source.parent}: {verdicts[asked][0]}{own}")
    if not verdicts:
        raise UserError(f"the run {source.parent} does not record its recipe (its run.json names no pretrain.py "
                        "--config-name, its plan.yaml no recipe file): give --recipe NAME")
    if not agreeing:
        raise UserError(f"no recipe the run {source.parent} names agrees with its settings ({candidates[0]}: "
                        f"{verdicts[candidates[0]][0]}): give the recipe it was trained with as --recipe")
    return Training(agreeing[0], verdicts[agreeing[0]][1])


def read_changed(plan: Path, source: Path) -> dict[str, tuple[Any, str]]:
    """The ``changed`` record of a run's plan.yaml: dotted key -> (value, the layer that set it).

    Raises:
        UserError: no plan.yaml beside ``source``, or one that is not a run's plan.
    """
    if not plan.is_file():
        raise UserError(f"{source} has no plan.yaml beside it, which records the run's recipe and overrides: give "
                        "the run directory that trained it")
    try:
        return {key: (entry["value"], entry["from"])
                for key, entry in (OmegaConf.to_container(OmegaConf.load(plan))["changed"] or {}).items()}
    except Exception as e:  # a YAML error or another shape, as a damaged or foreign file has
        raise UserError(f"{plan} is not a run's plan ({str(e).splitlines()[0] if str(e) else type(e).__name__}): "
                        "give the run directory that trained it") from None


def recorded_recipes(run: Path, changed: dict[str, tuple[Any, str]]) -> list[str]:
    """The recipes the run names, surest first: its command's ``--config-name`` (run.json, when pretrain.py ran as
    a command), then each recipe file its plan.yaml credits with a setting, those that include the most first."""
    names = []
    argv = str((read_manifest(run) or {}).get("command", "")).split()
    if argv[:1] == ["pretrain.py"]:
        given = [a.split("=", 1)[1] for a in argv if a.startswith("--config-name=")]
        given += [b for a, b in zip(argv, argv[1:]) if a == "--config-name"]
        names.append(given[-1] if given else "cfg_pretrain")  # pretrain.py's default
    files = {Path(layer).stem for _, layer in changed.values() if re.fullmatch(r"config/[^/]+\.yaml", layer)}
    depth = {name: len(recipe_layers(name)) for name in files if (CONFIG_DIR / f"{name}.yaml").is_file()}
    return list(dict.fromkeys(names + sorted(depth, key=lambda n: (-depth[n], n))))


def arch_option(name: str) -> Optional[str]:
    """The config/arch/ file (its stem) of the architecture ``name`` (a run's ``arch.name``), if one is there."""
    return next((p.stem for p in sorted((CONFIG_DIR / "arch").glob("*.yaml"))
                 if OmegaConf.load(p).get("name") == name), None)


def disagreement(recipe: str, settings: dict, changed: dict[str, tuple[Any, str]]) -> tuple[Optional[str], list[str]]:
    """Whether ``recipe`` with the run's command-line overrides gives the run's ``settings``.

    Args:
        settings: the run's settings (its checkpoint's ``config``).
        changed: the run's plan.yaml ``changed``: dotted key -> (value, the layer that set it).
    Returns:
        ``(None, overrides)`` when it does (the overrides as ``key=value``, with ``arch=...`` where the run swapped
        the recipe's architecture); else ``(the first setting that differs, said in words, [])``.
    """
    typed = {key: value for key, (value, layer) in changed.items() if layer == COMMAND_LINE}
    own = next((Path(label).stem for label, _ in recipe_layers(recipe) if label.startswith("config/arch/")), None)
    swapped = arch_option(settings.get("arch", {}).get("name"))
    groups = {"arch": swapped} if own and swapped and swapped != own else {}
    layers = recipe_layers(recipe, groups=groups)
    labels = [label for label, _ in layers]
    foreign = sorted({layer for _, layer in changed.values() if layer.startswith("config/")} - set(labels))
    if foreign:
        return f"settings of the run come from {foreign[0]}, which {recipe} does not include", []
    cli = OmegaConf.create({})
    for key, value in typed.items():
        OmegaConf.update(cli, key, value, force_add=True)
    merged, sources = merge_layers([("defaults", to_dict(PretrainConfig())), *layers, (COMMAND_LINE, cli)])
    cfg = build_config(merged)
    choose_data_paths(cfg, sources, ["defaults", *labels, COMMAND_LINE])
    expected, actual = leaves(to_dict(cfg) | {"arch": validate_arch(cfg.arch)}), leaves(settings)
    for key in sorted(expected.keys() | actual.keys()):
        layer = changed.get(key, (None, "defaults"))[1]
        if layer not in ("defaults", COMMAND_LINE) and not layer.startswith("config/"):
            continue  # a hardware profile's choice for the machine it ran on, not the recipe's
        if expected.get(key) != actual.get(key):
            return (f"{key} is {dotlist_value(actual.get(key))} in the run but {dotlist_value(expected.get(key))} in "
                    f"{recipe} with the run's overrides"), []
    return None, [f"arch={swapped}"] * bool(groups) + [f"{key}={dotlist_value(value)}" for key, value in typed.items()]


def dotlist_value(value: Any) -> str:
    """``value`` as a ``key=value`` override spells it (``[a,b]``, ``null``, ``true``)."""
    if isinstance(value, list):
        return f"[{','.join(map(dotlist_value, value))}]"
    return "null" if value is None else str(value).lower() if isinstance(value, bool) else str(value)


def commit_of(path: Path) -> str:
    """The commit of the git work tree holding ``path`` (``+ local changes`` when it has some), or ``unknown``."""
    def git(*argv: str) -> str:
        done = subprocess.run(["git", "-C", str(path), *argv], capture_output=True, text=True, timeout=60)
        return done.stdout.strip() if done.returncode == 0 else ""

    commit = git("rev-parse", "HEAD")
    return (commit + (" + local changes" if git("status", "--porcelain", "--untracked-files=no") else "")) or "unknown"


def shown(path: Path) -> str:
    """``path`` relative to the repository's root when inside it (what every clone shares), else absolute."""
    path = path.resolve()
    return str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else str(path)


def builder_command(spec: dict, output_dir: str) -> str:
    """The builder script's command line that builds ``spec`` (a ``dataset_builder``) at ``output_dir``."""
    options = dict(spec)
    script = BUILDERS[options.pop("kind", "sudoku")][2]
    flags = []
    for key, value in options.items():
        if value is True:
            flags.append(f"--{key.replace('_', '-')}")
        elif value not in (None, False):
            flags.append(f"--{key.replace('_', '-')} {value}")
    return f"python {script} --output-dir {shlex.quote(output_dir)} {' '.join(flags)}"


def split_sizes(path: Path, split: str) -> tuple[int, int]:
    """``(puzzles, examples)`` of a dataset split as its files record them: puzzle groups (an original and its
    augmentations) and the rows they hold."""
    metadata = load_metadata(path, split)
    rows = sum(np.load(path / split / f"{name}__inputs.npy", mmap_mode="r").shape[0] for name in metadata.sets)
    return metadata.total_groups, rows


def describe_data(path: Path, spec: Optional[dict]) -> str:
    """The dataset at ``path`` as its dataset.json files record it, and how it was built as far as that shows: the
    builder command of the run's ``dataset_builder`` (``spec``, None where none builds this path) only where it makes
    data of these sizes."""
    sizes = {split: split_sizes(path, split) for split in ("train", "test")
             if (path / split / "dataset.json").is_file()}
    train, rows = sizes.get("train", (0, 0))
    parts = ([f"{train:,} training puzzles" + (f" ({rows:,} with their augmentations)" if rows != train else "")]
             * ("train" in sizes) + [f"{sizes['test'][0]:,} held-out"] * ("test" in sizes))
    text = f"`{shown(path)}`: {', '.join(parts)}"
    if not spec:
        return text + "; how it was built is not recorded"
    found = {"train_size": train, "test_size": sizes.get("test", (0, 0))[0], "num_aug": rows // max(train, 1) - 1}
    differs = [f"{key} {spec[key]}" for key in found if key in spec and spec[key] != found[key]]
    if differs:
        return (text + f"; not the sizes of the run's `dataset_builder` ({', '.join(differs)}): how it was built is "
                "not recorded")
    return text + f"; the sizes the run's `dataset_builder` builds: `{builder_command(spec, shown(path))}`"


def evaluate_command(bundled: Path, data: Path) -> str:
    """An evaluate.py command that measures the card's first accuracy again: from the repository's root when the
    model and the data lie in it (paths every clone shares), else from anywhere (a ``cd`` to this repository)."""
    tail = "--device cpu --forward-dtype float32"
    if all(p.resolve().is_relative_to(ROOT) for p in (bundled, data)):
        return (f"python evaluate.py --checkpoint {shlex.quote(shown(bundled))} "
                f"--data-path {shlex.quote(shown(data))} {tail}")
    return (f"cd {shlex.quote(str(ROOT))} && python evaluate.py --checkpoint {shlex.quote(str(bundled.resolve()))} "
            f"--data-path {shlex.quote(str(data.resolve()))} {tail}")


def score(spec: Path, data_path: str, ttc: TestTimeCompute) -> dict[str, float]:
    """exact_accuracy (with its interval and count) of the bundled file on the test split, on the CPU in float32."""
    trained = load_trained(str(spec), torch.device("cpu"), torch.float32, 1, data_path)
    loader = PuzzleDataset(data_path, "test", trained.cfg.global_batch_size, seed=trained.cfg.seed)
    return evaluate_puzzles(trained.head, trained.head, loader, torch.device("cpu"), Dist(), ttc=ttc)


def card(name: str, training: Training, source: Path, payload: dict, staged: Path, published: Path, params: int,
         default: dict, plain: dict, ttc: TestTimeCompute) -> str:
    """The model card (Markdown) of the bundle ``staged``, which is to be published at ``published``."""
    cfg = payload["config"]
    data = Path((cfg.get("data_paths_test") or cfg.get("data_paths") or [cfg["data_path"]])[0])
    datasets = dict.fromkeys([*(cfg.get("data_paths") or [cfg["data_path"]]), *(cfg.get("data_paths_test") or [])])
    # The run's dataset_builder builds its data_path only (pretrain.py, on first use).
    described = "; ".join(describe_data(Path(p), cfg.get("dataset_builder") if p == cfg["data_path"] else None)
                          for p in datasets)

    def accuracy(m: dict) -> str:
        return (f"**{100 * m['exact_accuracy']:.1f}%** exact (95% CI {100 * m['exact_accuracy_ci95_low']:.1f}-"
                f"{100 * m['exact_accuracy_ci95_high']:.1f}%, n={m['count']:.0f}); {m['steps']:.1f} segments per puzzle")

    segments = ttc.segments or cfg["arch"]["halt_max_steps"]
    compute = (f"{segments} segments" + (f", early exit from segment {ttc.min_segments}" if ttc.early_exit else "")
               + (f", {ttc.rollouts} rollouts (noise {ttc.noise}, seed {ttc.seed})" if ttc.rollouts > 1 else "")
               + (f", {ttc.views} dihedral views voting" if ttc.views > 1 else ""))
    default_model = published.resolve() in {(solving.BUNDLED_DIR / b.file).resolve() for b in solving.BUNDLED.values()}
    use = ("`python solve.py` uses it when no `--checkpoint` is given." if default_model else
           f"`python solve.py --checkpoint {shlex.quote(shown(published))}` answers with it.")
    command = evaluate_command(published, data)
    where = "from the repository's root" if not command.startswith("cd ") else "from anywhere"
    overrides = ", ".join(f"`{o}`" for o in training.overrides) or "none"
    return f"""# {name}

{cfg['arch']['name'].upper()} trained with this project's recipe `{training.recipe}`, {CARD_MARK}.
{use}

| | |
|---|---|
| trained by | `{training.command()}` (run `{source.parent.name}`, its `{source.name}` at step {payload['step']}) |
| recipe | `{training.recipe}` (config/{training.recipe}.yaml), as the run's own record gives it and its settings confirm |
| overrides | {overrides} |
| commit | `{commit_of(source.parent)}` |
| architecture | `{cfg['arch']['name']}`, hidden {cfg['arch'].get('hidden_size')}, {params:,} parameters |
| data | {described} |
| held-out accuracy, the recipe's test-time compute ({compute}; `solve.py --budget 0`) | {accuracy(default)} |
| held-out accuracy, one answer ({cfg['arch']['halt_max_steps']} segments, the references' evaluation) | {accuracy(plain)} |
| file | `{published.name}`, {staged.stat().st_size:,} bytes, float32 weights{' (the EMA weights)' if cfg.get('ema') else ''}; SHA-256 `{file_sha256(staged)}` |

The held-out puzzles are the test split of the data above, never trained on. Both accuracies were measured on this
file, on the CPU in float32; to measure them again, {where} (the first; `--rollouts 1 --segments {cfg['arch']['halt_max_steps']}` the second):

```bash
{command}
```
"""


def bundle(args: argparse.Namespace) -> int:
    """Build, measure and publish the bundle the arguments ask for (see the module's docstring).

    Raises:
        UserError: a bad name, recipe, output folder or run, a file in the way, or the run's data missing.
        RunFailure: writing or moving the files failed (nothing was replaced).
    """
    check_name(args.name)
    out = Path(args.out)
    model, written = out / f"{args.name}.pt", out / f"{args.name}.md"
    source, _ = resolve_checkpoint(args.run)
    check_out(out)
    for path in (model, written):
        check_writable_file(path, "--out")
    check_replaceable(model, args.replace)
    payload = safe_load(source)
    if not isinstance(payload, dict) or payload.get("trainer") != "pretrain":
        raise UserError(f"{source} is not a checkpoint of pretrain.py; give a run directory or its best.pt")
    training = training_of(source, payload["config"], args.recipe)
    kept = {k: payload[k] for k in ANSWER_KEYS if k in payload}
    kept["model"] = {k: v.float() if v.is_floating_point() else v for k, v in kept["model"].items()}
    out.mkdir(parents=True, exist_ok=True)
    stage = Path(tempfile.mkdtemp(prefix=f".bundling-{args.name}-", dir=out))  # beside the targets: a rename away
    try:
        staged, staged_card = stage / model.name, stage / written.name
        write_atomically(staged, lambda f: torch.save(kept, f), "bundled model")
        trained = load_trained(str(staged), torch.device("cpu"), torch.float32, 1)
        cfg, params = trained.cfg, sum(p.numel() for p in trained.head.model.parameters())
        data_path = (cfg.data_paths_test or cfg.data_paths or [cfg.data_path])[0]
        default = TestTimeCompute.of_run(cfg)
        results = {name: score(staged, data_path, ttc) for name, ttc in
                   (("default", default), ("plain", replace(default, segments=None, early_exit=False, rollouts=1,
                                                            noise=0.0, views=1)))}
        text = card(args.name, training, source, kept, staged, model, params, results["default"], results["plain"],
                    default)
        write_atomically(staged_card, lambda f: f.write(text.encode()), "model card")
        check_against_card(staged)  # the pair as every load will see it
        check_replaceable(model, args.replace)  # again: something may have arrived while it was measured
        replace_together({model: staged, written: staged_card}, "bundled model and its card")
    finally:
        shutil.rmtree(stage, ignore_errors=True)
    print(text)
    print(f"wrote {model} and {written}")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = ArgumentParser(description=__doc__.split("\n\n")[0], epilog=__doc__.split("\n\n", 1)[1],
                            formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("run", help="the trained run directory (its best.pt) or a checkpoint file in it")
    parser.add_argument("--name", required=True, help="the bundled model's file name, without .pt")
    parser.add_argument("--recipe", help="the config the run was trained with: optional, the run records it; given, "
                                         "it must agree with the run's settings")
    parser.add_argument("--out", default=str(solving.BUNDLED_DIR),
                        help=f"where to write (default: {solving.BUNDLED_DIR}); not a run directory")
    parser.add_argument("--replace", action="store_true",
                        help="replace a model and card of that name bundled earlier (only a bundle, and only once "
                             "the new one is measured)")
    args = parser.parse_args(argv)
    return cli_main(lambda: bundle(args))


if __name__ == "__main__":
    sys.exit(main())
