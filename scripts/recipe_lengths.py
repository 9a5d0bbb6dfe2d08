"""How long each training recipe of config/ takes on named classes of machine, from its FLOPs: a markdown table.

    python scripts/recipe_lengths.py                                         # every recipe in config/
    python scripts/recipe_lengths.py cfg_pretrain_trm_cpu cfg_pretrain_cpu   # these
    python scripts/recipe_lengths.py --here                                  # and a column for this machine

A recipe's training FLOPs are its optimizer steps times the FLOPs of one step (forward and backward of one ACT
segment at the global batch, at each depth its depth_curriculum trains), counted as the trainer counts them before
its first step (utils/train/puzzle_trainer.py: the model traced on the meta device, the steps from the training
split's size). No data is built: the size comes from the dataset where it is built, else from the recipe's
dataset_builder or the published datasets (utils/data/sizes.py). A length is the FLOPs divided by a stated rate times
the share of it a step is assumed to reach, with a shortest step below which a GPU waits on kernel launches; each
machine's figures and their sources are printed under the table (:data:`MACHINES`). Evaluations, data builds and
compilation are not counted: a run takes longer by those.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))  # run as a script: make the repo root importable

from utils.cli import ArgumentParser  # noqa: E402
from utils.config import CONFIG_DIR  # noqa: E402

CPU_HOUR = 3600  # the README names the recipes that end within this on the 2-core CPU


@dataclass(frozen=True)
class Machine:
    """A class of machine: ``rate`` (FLOP/s, in the dtype recipes run there), the ``share`` of it a training step is
    assumed to reach, ``floor_s``, the shortest a step takes there whatever its FLOPs (seconds), and the sources."""

    name: str
    rate: float
    share: float
    floor_s: float
    source: str

    def seconds(self, steps: int, flops_per_step: float) -> tuple[float, bool]:
        """The time of ``steps`` steps of ``flops_per_step`` FLOPs each, and whether the floor decided it."""
        flop_time = flops_per_step / (self.rate * self.share)
        return steps * max(flop_time, self.floor_s), flop_time < self.floor_s


# An H200 ran the 0.5M-parameter hard-Sudoku recipe at 73-79 steps/s, 13 ms a step, where its FLOPs allowed 4 ms
# (utils/run/estimate.py): kernel launches and host work, not FLOPs, bound small steps on a GPU.
GPU_FLOOR_S = 0.013
GPU_SHARE_SOURCE = ("assumed 25% of it: half (the trainers' step share of a GEMM, utils/run/estimate.py "
                    "STEP_EFFICIENCY) of a GEMM assumed at half the peak; not measured by this project (for scale: "
                    "Llama 3's training reached 38-43% of the H100's peak with a model 10^5 times larger, arXiv "
                    "2407.21783, Table 4; HRM's README reports its laptop Sudoku recipe, cfg_pretrain_apple_silicon's "
                    "733 PFLOP, in about 10 h on an RTX 4070 laptop GPU: 20 TFLOP/s achieved)")
MACHINES = (
    Machine("2-core AVX2 CPU", 100e9, 0.62, 0.0,
            "fp32 GEMM 100 GFLOP/s, the project's GEMM probe (utils/run/estimate.py matmul_rate) on 2-vCPU AVX2 AMD "
            "EPYC VMs: 74-122 GFLOP/s in the runs the README and docs/results.md record; 62% of it, measured there: "
            "cfg_pretrain_trm_cpu's whole run, evaluations and compilation included, took 31 min 36 s at a GEMM of "
            "122 GFLOP/s (README), 0.143 PFLOP at 75 GFLOP/s (the trainers' own estimate assumes 50%)"),
    Machine("Apple M1 GPU", 2.6e12, 0.25, GPU_FLOOR_S,
            "2.6 TFLOP/s fp32, Apple's peak for the 8-core M1 GPU (Apple newsroom, 2020-11-10; the M-series' "
            f"smallest), {GPU_SHARE_SOURCE}; at least {GPU_FLOOR_S * 1e3:.0f} ms a step (the H200's, below)"),
    Machine("one H100/H200", 989e12, 0.25, GPU_FLOOR_S,
            f"989 TFLOP/s bf16 dense, NVIDIA's peak for the H100 and H200 SXM (datasheets), {GPU_SHARE_SOURCE}; at "
            f"least {GPU_FLOOR_S * 1e3:.0f} ms a step, measured on an H200 (the hard-Sudoku recipe's 0.5M-parameter "
            "model, 73-79 steps/s: kernel launches, utils/run/estimate.py)"),
)


@dataclass
class RecipeSize:
    """What a recipe trains: its parameters, optimizer steps, and the steps at each depth with one step's FLOPs."""

    name: str
    parameters: int
    steps: int
    pieces: list[tuple[int, float]]  # (steps, FLOPs of one of them), one per depth of the curriculum

    @property
    def flops(self) -> float:
        return sum(steps * flops for steps, flops in self.pieces)

    def seconds(self, machine: Machine) -> tuple[float, bool]:
        """The training time on ``machine``, and whether the floor decided it for every step."""
        timed = [machine.seconds(steps, flops) for steps, flops in self.pieces]
        return sum(s for s, _ in timed), all(bound for _, bound in timed)


def recipe_size(name: str) -> RecipeSize:
    """Count recipe ``name`` as ``pretrain.py --config-name=NAME device=cpu`` would before its first step.

    Raises:
        UserError: the recipe does not resolve, or its dataset's size is unknown (utils/data/sizes.py).
    """
    from utils.data.sizes import training_size
    from utils.distributed import Dist
    from utils.train.curriculum import DepthCurriculum
    from utils.train.puzzle_trainer import Launch, depth_flops, meta_model, resolve_setup, schedule_steps

    setup = resolve_setup(Launch(name, {"device": "cpu"}), Dist())
    metadata = training_size(setup.cfg.data_path, setup.cfg.dataset_builder)
    steps = schedule_steps(setup.cfg, metadata)
    curriculum = DepthCurriculum(setup.cfg.depth_curriculum, (setup.arch["H_cycles"], setup.arch["L_cycles"]), steps)
    flops = depth_flops(setup, metadata, curriculum, 1)
    parameters = sum(p.numel() for p in meta_model(setup, metadata).model.parameters())
    pieces = [(end - start, flops[depth]) for start, end, depth in curriculum.segments()]
    return RecipeSize(name, parameters, steps, pieces)


def this_machine() -> Machine:
    """This machine: its device and dtype as a run picks them, its GEMM timed now at the trainers' step share."""
    from utils.device import select_device, select_dtype
    from utils.run.estimate import STEP_EFFICIENCY, matmul_rate

    device = select_device("auto").device
    dtype, _ = select_dtype(device)
    rate = matmul_rate(device, dtype, seconds=1.0)
    return Machine(f"here ({device.type})", rate, STEP_EFFICIENCY, 0.0,
                   f"{rate / 1e9:.0f} GFLOP/s {str(dtype).removeprefix('torch.')} GEMM timed now on {device} "
                   f"(utils/run/estimate.py matmul_rate), {STEP_EFFICIENCY:.0%} of it")


def table(sizes: list[RecipeSize], failed: dict[str, str], machines: tuple[Machine, ...]) -> str:
    """The markdown table, each machine's figures and sources, and the recipes within an hour on the first machine."""
    from utils.run.estimate import duration

    head = ["recipe", "parameters", "optimizer steps", "training PFLOP", *(m.name for m in machines)]
    lines = ["| " + " | ".join(head) + " |", "|---|" + "---:|" * (len(head) - 1)]
    for size in sizes:
        cells = []
        for machine in machines:
            seconds, launch_bound = size.seconds(machine)
            cells.append(duration(seconds) + (" (launches)" if launch_bound else ""))
        lines.append(f"| `{size.name}` | {size.parameters:,} | {size.steps:,} | {size.flops / 1e15:.3g} | "
                     + " | ".join(cells) + " |")
    lines += [f"| `{name}` | {why} |" + " |" * (len(head) - 2) for name, why in failed.items()]
    lines += ["", "Training only (no evaluations, data builds or compilation); \"(launches)\": every step at the "
                  "machine's shortest step, not its FLOPs."]
    lines += [f"- {m.name}: {m.source}." for m in machines]
    quick = [f"`{s.name}`" for s in sizes if s.seconds(machines[0])[0] <= CPU_HOUR]
    lines.append(f"- Within an hour on the {machines[0].name}: {', '.join(quick) or 'none'}.")
    return "\n".join(lines)


def known_recipes() -> list[str]:
    """The recipes of config/ (``cfg_*.yaml``), by name: what the table counts with no RECIPE given."""
    return sorted(p.stem for p in CONFIG_DIR.glob("cfg_*.yaml"))


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    """The command line (default: ``sys.argv``), each RECIPE checked against config/.

    Raises:
        SystemExit: 0 after ``--help``; 2 after one ``error:`` line for a bad command line or an unknown RECIPE.
    """
    parser = ArgumentParser(
        description="Print how long each training recipe of config/ takes on a 2-core AVX2 CPU, an Apple M1 GPU and "
                    "one H100/H200, from its FLOPs and a stated rate per machine (a markdown table; no data is built).",
        epilog="examples:\n  python scripts/recipe_lengths.py\n"
               "  python scripts/recipe_lengths.py cfg_pretrain_trm_cpu cfg_pretrain_cpu --here",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("recipes", nargs="*", metavar="RECIPE",
                        help="config/<RECIPE>.yaml to count (default: every recipe in config/)")
    parser.add_argument("--here", action="store_true",
                        help="add a column for this machine: its GEMM timed now (a second) at the trainers' step share")
    args = parser.parse_args(argv)
    # A name that is no recipe is a typo to fix before anything is counted, not a row of the table (the rows that
    # stay are known recipes whose dataset size is unknown).
    known = known_recipes()
    unknown = [name for name in args.recipes if name not in known]
    if unknown:
        parser.error(f"unknown recipe {', '.join(unknown)}: config/ has no such cfg_*.yaml; known recipes: "
                     f"{', '.join(known)}; give none to count them all")
    return args


def run(args: argparse.Namespace) -> int:
    from utils.errors import UserError

    names = args.recipes or known_recipes()
    sizes, failed = [], {}
    for name in names:
        try:
            sizes.append(recipe_size(name))
        except UserError as e:
            failed[name] = str(e)
    machines = MACHINES + ((this_machine(),) if args.here else ())
    print(table(sizes, failed, machines))
    return 1 if failed else 0


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    from utils.run.main import cli_main

    return cli_main(lambda: run(args))


if __name__ == "__main__":
    sys.exit(main())
