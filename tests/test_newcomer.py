"""What a newcomer meets first (issue 51): the documented recipes start, a CPU run's output carries no CUDA noise, and
every entry point answers --help without loading torch's compiler."""

import logging
from functools import partial
from pathlib import Path

import pytest
import torch

from utils.data.builders import build_dataset
from utils.distributed import Dist
from utils.train import puzzle_trainer

ROOT = Path(__file__).resolve().parent.parent


def test_newcomer_the_expert_recipe_builds_its_dataset(tmp_path, monkeypatch):
    """device=cpu: cfg_pretrain_trm_cpu_expert's dataset_builder, as pretrain.py resolves it (it inherits
    cfg_pretrain_trm_cpu's), passes every check of the builder and reaches the generation, stopped there: a real
    expert build takes minutes."""
    from utils.data.sudoku import build as sudoku

    class Generating(Exception):
        """The builder got past its checks."""

    def generation(*args, **kwargs):
        raise Generating

    setup = puzzle_trainer.resolve_setup(
        puzzle_trainer.parse_args(["--config-name=cfg_pretrain_trm_cpu_expert", "device=cpu"]), Dist())
    monkeypatch.setattr(sudoku, "_source_puzzles", generation)
    assert setup.cfg.dataset_builder["expert"]
    with pytest.raises(Generating):
        build_dataset(tmp_path / "expert", setup.cfg.dataset_builder)


def test_newcomer_no_cuda_runtime_note_on_a_machine_without_cuda(monkeypatch, capfd):
    """device=cpu: torch's "No CUDA runtime is found" note (a CUDA toolkit installed, no GPU; it is logged when
    torch.compile first runs on a CPU) is not printed; another warning of the same logger still is."""
    import utils  # noqa: F401  (every entry point imports it first)
    from torch.utils import cpp_extension

    monkeypatch.setenv("CUDA_HOME", "/usr/local/cuda")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert cpp_extension._find_cuda_home() == "/usr/local/cuda"
    logging.getLogger("torch.utils.cpp_extension").warning("a real warning")
    err = capfd.readouterr().err
    assert "No CUDA runtime is found" not in err and "a real warning" in err


def test_newcomer_evaluate_shows_its_total_and_the_time_left(tmp_path, monkeypatch, capsys):
    """device=cpu: evaluate.py's bar counts to the split's size (or --max-examples in whole batches) with the time
    left: the bundled maze model on 8 generated 10x10 mazes, 3 to a batch, at most 5 of them: 2 batches, 6 mazes."""
    import re

    import evaluate
    from utils.data.maze import build_maze_dataset
    from utils.eval import puzzle
    from utils.solve.bundled import BUNDLED

    data = build_maze_dataset(tmp_path / "mazes", generate=True, size=10, train_size=1, test_size=8)
    monkeypatch.setattr(puzzle, "tqdm", partial(puzzle.tqdm, mininterval=0))  # every update drawn
    assert evaluate.main(["--checkpoint", str(ROOT / "models/pretrained" / BUNDLED["maze"].file), "--data-path", str(data),
                          "--device", "cpu", "--batch-size", "3", "--max-examples", "5", "--segments", "2",
                          "--json"]) == 0
    drawn = capsys.readouterr().err
    assert re.search(r"eval: +50%\|[^|]*\| 3/6 \[\d\d:\d\d<\d\d:\d\d", drawn), drawn


# What --help must not load anywhere: the compiler stack and other heavy libraries (seconds of a small machine's start).
HEAVY = ("torch._dynamo", "torch._inductor", "sympy", "torchvision", "timm", "numba", "matplotlib", "scipy",
         "tensorboard")
# These answer --help without torch at all (it takes seconds to import on a small machine); the other scripts' parsers
# still sit beside code that imports it at the top.
WITHOUT_TORCH = ("pretrain.py", "evaluate.py", "solve.py", "scripts/benchmark_cape_learning.py",
                 "scripts/benchmark_passes.py", "scripts/benchmark_quickstart.py", "scripts/benchmark_startup.py",
                 "scripts/benchmark_step.py",
                 "scripts/build_arc_dataset.py", "scripts/build_maze_dataset.py", "scripts/build_outside_sudoku.py",
                 "scripts/build_sudoku_dataset.py", "scripts/build_synthetic_cape_dataset.py", "scripts/predict_pose.py",
                 "scripts/recipe_lengths.py", "scripts/reference_trm.py", "scripts/reproduce.py", "scripts/visualize.py")
# Each entry point runs in a process forked from a parent that has imported only the standard library (and, for the
# second group, torch already: only what --help adds beyond it is seen), as `python SCRIPT --help` would.
HELP_PROBE = r"""
import json, os, runpy, sys
for name in sys.argv[2].split(","):
    __import__(name)
found = {}
for path in sys.argv[1].split(","):
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(read)
        quiet = os.open(os.devnull, os.O_WRONLY)
        os.dup2(quiet, 1), os.dup2(quiet, 2)
        sys.argv, sys.path[0] = [path, "--help"], os.path.dirname(os.path.abspath(path))
        try:
            runpy.run_path(path, run_name="__main__")
        except SystemExit:
            pass
        os.write(write, json.dumps(sorted(sys.modules)).encode())
        os._exit(0)
    os.close(write)
    with os.fdopen(read) as pipe:
        found[path] = json.loads(pipe.read() or "[]")
    os.waitpid(pid, 0)
print(json.dumps(found))
"""


def sudoku_builder(path: str) -> bool:
    """A Sudoku build script: utils/data/sudoku/build.py loads its numba solver on import, --help included (its owners'
    to defer; issue 51's report names it)."""
    return path.startswith("scripts/build_") and "sudoku" in path


def test_newcomer_help_loads_no_compiler_and_the_main_commands_no_torch():
    """device=cpu: ``--help`` of pretrain.py, evaluate.py, solve.py and every scripts/*.py, each in a fresh process:
    none imports torch's compiler or another heavy library, and those of WITHOUT_TORCH not torch either."""
    import json
    import subprocess
    import sys

    scripts = [str(p.relative_to(ROOT)) for p in sorted((ROOT / "scripts").glob("*.py")) if p.name != "__init__.py"]
    others = [p for p in scripts if p not in WITHOUT_TORCH]
    probes = [subprocess.Popen([sys.executable, "-c", HELP_PROBE, ",".join(paths), preload], cwd=ROOT, text=True,
                               stdout=subprocess.PIPE) for paths, preload in ((WITHOUT_TORCH, "json"),
                                                                              (others, "torch,numpy"))]
    found = {}
    for probe in probes:
        out, _ = probe.communicate(timeout=300)
        assert probe.returncode == 0
        found.update(json.loads(out))
    assert set(found) == {*WITHOUT_TORCH, *others} and all(found.values())  # every one ran
    loaded = {path: [m for m in HEAVY if m in modules and not (m == "numba" and sudoku_builder(path))]
              for path, modules in found.items()}
    assert not any(loaded.values()), {path: heavy for path, heavy in loaded.items() if heavy}
    assert not [path for path in WITHOUT_TORCH if "torch" in found[path]]


def test_newcomer_recipe_lengths_on_two_recipes(capsys):
    """device=cpu (the meta device: nothing is built or trained): scripts/recipe_lengths.py counts each recipe as
    the trainer does and divides by each machine's stated rate and share. The expert recipe's count agrees with its
    measured run (docs/results.md: 0.0666 PFLOP in 1209 steps at depth (1, 2)); both recipes end within an hour on
    the 2-core CPU."""
    from scripts import recipe_lengths
    from utils.run.estimate import duration

    assert recipe_lengths.main(["cfg_pretrain_trm_cpu_expert", "cfg_pretrain_cpu"]) == 0
    printed = capsys.readouterr().out
    rows = {line.split("|")[1].strip(" `"): [cell.strip() for cell in line.split("|")[2:-1]]
            for line in printed.splitlines() if line.startswith("| `")}
    assert list(rows) == ["cfg_pretrain_trm_cpu_expert", "cfg_pretrain_cpu"]
    parameters, steps, pflop, *lengths = rows["cfg_pretrain_trm_cpu_expert"]
    assert (parameters, steps) == ("520,706", "1,218") and float(pflop) == pytest.approx(0.0666 / 1209 * 1218, rel=0.01)
    cpu, mac, gpu = recipe_lengths.MACHINES
    assert lengths[0] == duration(float(pflop) * 1e15 / (cpu.rate * cpu.share))
    assert lengths[2] == duration(1218 * gpu.floor_s) + " (launches)"  # a 0.5M-parameter model's steps on a GPU
    assert rows["cfg_pretrain_cpu"][:2] == ["1,051,650", "1,250"]
    assert "- Within an hour on the 2-core AVX2 CPU: `cfg_pretrain_trm_cpu_expert`, `cfg_pretrain_cpu`." in printed
    assert all(f"- {m.name}: " in printed for m in recipe_lengths.MACHINES)
