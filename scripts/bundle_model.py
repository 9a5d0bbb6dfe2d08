"""Bundle a trained run as a model that ships in models/pretrained/: the weights only, and a card measured here.

    python scripts/bundle_model.py checkpoints/sudoku-gen-hard-r1-3k-aug-100/RUN --name sudoku_hard_trm \\
        --recipe cfg_pretrain_trm_cpu_hard
    python scripts/bundle_model.py checkpoints/maze-gen-10x10-24k-aug/RUN --name maze_10x10_trm \\
        --recipe cfg_pretrain_trm_maze_cpu

It writes ``models/pretrained/<name>.pt`` (the run's best checkpoint reduced to what answering needs: the weights
in the reference format, EMA ones where the run kept an EMA, in float32; the settings; the data sizes; the step) and
``<name>.md``, the card: the recipe and the command that trained it, the commit, the data and how to build it, the
held-out accuracy with its 95% interval under the run's own test-time compute and with one answer (what that
compute buys), the parameter count, and the file's size and SHA-256. The accuracies are measured on the bundled
file itself, as ``evaluate.py`` measures them (the command is on the card).
"""

from __future__ import annotations

import argparse
import hashlib
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from utils.data.builders import BUILDERS  # noqa: E402
from utils.data.puzzle_dataset import PuzzleDataset  # noqa: E402
from utils.distributed import Dist  # noqa: E402
from utils.errors import UserError  # noqa: E402
from utils.eval.load import load_trained, resolve_checkpoint  # noqa: E402
from utils.eval.puzzle import evaluate_puzzles  # noqa: E402
from utils.eval.reasoning import TestTimeCompute  # noqa: E402
from utils.eval.solving import BUNDLED_DIR  # noqa: E402
from utils.outputs import announce_replacing, check_writable_file, write_atomically  # noqa: E402
from utils.run.checkpoint import safe_load  # noqa: E402
from utils.run.main import ArgumentParser, cli_main  # noqa: E402

ANSWER_KEYS = ("model", "config", "data", "step", "trainer")  # what load_trained reads


def commit_of(path: Path) -> str:
    """The commit of the git work tree holding ``path`` (``+ local changes`` when it has some), or ``unknown``."""
    def git(*argv: str) -> str:
        done = subprocess.run(["git", "-C", str(path), *argv], capture_output=True, text=True, timeout=60)
        return done.stdout.strip() if done.returncode == 0 else ""

    commit = git("rev-parse", "HEAD")
    return (commit + (" + local changes" if git("status", "--porcelain", "--untracked-files=no") else "")) or "unknown"


def builder_command(spec: dict, output_dir: str) -> str:
    """The builder script's command line that builds ``spec`` (a recipe's ``dataset_builder``) at ``output_dir``."""
    options = dict(spec)
    script = BUILDERS[options.pop("kind", "sudoku")][2]
    flags = []
    for key, value in options.items():
        if value is True:
            flags.append(f"--{key.replace('_', '-')}")
        elif value not in (None, False):
            flags.append(f"--{key.replace('_', '-')} {value}")
    return f"python {script} --output-dir {output_dir} {' '.join(flags)}"


def score(spec: Path, data_path: str, ttc: TestTimeCompute) -> dict[str, float]:
    """exact_accuracy (with its interval and count) of the bundled file on the test split, on the CPU in float32."""
    trained = load_trained(str(spec), torch.device("cpu"), torch.float32, 1, data_path)
    loader = PuzzleDataset(data_path, "test", trained.cfg.global_batch_size, seed=trained.cfg.seed)
    return evaluate_puzzles(trained.head, trained.head, loader, torch.device("cpu"), Dist(), ttc=ttc)


def card(name: str, recipe: str, run: Path, source: Path, payload: dict, bundled: Path, params: int,
         default: dict, plain: dict, ttc: TestTimeCompute) -> str:
    """The model card (Markdown)."""
    cfg = payload["config"]
    data_path = (cfg.get("data_paths_test") or cfg.get("data_paths") or [cfg["data_path"]])[0]
    digest = hashlib.sha256(bundled.read_bytes()).hexdigest()

    def accuracy(m: dict) -> str:
        return (f"**{100 * m['exact_accuracy']:.1f}%** exact (95% CI {100 * m['exact_accuracy_ci95_low']:.1f}-"
                f"{100 * m['exact_accuracy_ci95_high']:.1f}%, n={m['count']:.0f}); {m['steps']:.1f} segments per puzzle")

    segments = ttc.segments or cfg["arch"]["halt_max_steps"]
    compute = (f"{segments} segments" + (f", early exit from segment {ttc.min_segments}" if ttc.early_exit else "")
               + (f", {ttc.rollouts} rollouts (noise {ttc.noise}, seed {ttc.seed})" if ttc.rollouts > 1 else "")
               + (f", {ttc.views} dihedral views voting" if ttc.views > 1 else ""))
    builder = cfg.get("dataset_builder")
    build = (f"`python pretrain.py --config-name={recipe}` builds it on first use; alone: "
             f"`{builder_command(builder, data_path)}`" if builder else "a dataset of your own at that path")
    return f"""# {name}

{cfg['arch']['name'].upper()} trained by this project's recipe `{recipe}`, bundled with `scripts/bundle_model.py`.
`python solve.py` uses it when no `--checkpoint` is given.

| | |
|---|---|
| trained by | `python pretrain.py --config-name={recipe}` (run `{run.name}`, its `{source.name}` at step {payload['step']}) |
| commit | `{commit_of(run)}` |
| architecture | `{cfg['arch']['name']}`, hidden {cfg['arch'].get('hidden_size')}, {params:,} parameters |
| data | `{data_path}`: {build} |
| held-out accuracy, the recipe's test-time compute ({compute}; solve.py's default) | {accuracy(default)} |
| held-out accuracy, one answer ({cfg['arch']['halt_max_steps']} segments, the references' evaluation) | {accuracy(plain)} |
| file | `{bundled.name}`, {bundled.stat().st_size:,} bytes, float32 weights{' (the EMA weights)' if cfg.get('ema') else ''}; SHA-256 `{digest}` |

The held-out puzzles are the test split of the data above, never trained on. Both accuracies were measured on this
file, on the CPU in float32; to measure them again (the first; `--rollouts 1 --segments {cfg['arch']['halt_max_steps']}` the second):

```bash
python evaluate.py --checkpoint models/pretrained/{bundled.name} --data-path {data_path} --device cpu --forward-dtype float32
```
"""


def main(argv: list[str] | None = None) -> int:
    parser = ArgumentParser(description=__doc__.split("\n\n")[0], epilog=__doc__.split("\n\n", 1)[1],
                            formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("run", help="the trained run directory (its best.pt) or a checkpoint file")
    parser.add_argument("--name", required=True, help="the bundled model's file name, without .pt")
    parser.add_argument("--recipe", required=True, help="the config it was trained with (for the card)")
    parser.add_argument("--out", default=str(BUNDLED_DIR), help=f"where to write (default: {BUNDLED_DIR})")
    args = parser.parse_args(argv)

    def body() -> int:
        if not args.name.replace("_", "").replace("-", "").isalnum():
            raise UserError(f"--name {args.name!r}: use letters, digits, _ and -")
        bundled, written = Path(args.out) / f"{args.name}.pt", Path(args.out) / f"{args.name}.md"
        for path in (bundled, written):
            check_writable_file(path, "--out")
            announce_replacing(path, "--name")
        source, _ = resolve_checkpoint(args.run)
        payload = safe_load(source)
        if not isinstance(payload, dict) or payload.get("trainer") != "pretrain":
            raise UserError(f"{source} is not a checkpoint of pretrain.py; give a run directory or its best.pt")
        kept = {k: payload[k] for k in ANSWER_KEYS if k in payload}
        kept["model"] = {k: v.float() if v.is_floating_point() else v for k, v in kept["model"].items()}
        write_atomically(bundled, lambda f: torch.save(kept, f), "bundled model")
        trained = load_trained(str(bundled), torch.device("cpu"), torch.float32, 1)
        cfg, params = trained.cfg, sum(p.numel() for p in trained.head.model.parameters())
        data_path = (cfg.data_paths_test or cfg.data_paths or [cfg.data_path])[0]
        default = TestTimeCompute.of_run(cfg)
        results = {name: score(bundled, data_path, ttc) for name, ttc in
                   (("default", default), ("plain", replace(default, segments=None, early_exit=False, rollouts=1,
                                                            noise=0.0, views=1)))}
        text = card(args.name, args.recipe, Path(args.run).resolve(), source, kept, bundled, params,
                    results["default"], results["plain"], default)
        write_atomically(written, lambda f: f.write(text.encode()), "model card")
        print(text)
        print(f"wrote {bundled} and {written}")
        return 0

    return cli_main(body)


if __name__ == "__main__":
    sys.exit(main())
