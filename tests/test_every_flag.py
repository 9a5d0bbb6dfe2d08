"""One test for every flag of every command (issue 63): each entry point's parser is found without running the
command, each numeric flag is driven with -1, 0, nan, inf, 1e300 and a word, each path flag with a missing path, a
file where a folder is wanted and a folder where a file is wanted, and each numeric setting ``pretrain.py --help``
lists the same way. A case ends in one of three ways:

- refused: exit code 2 and exactly one ``error:`` line naming the flag (or the value), no traceback, and before the
  command calls into torch, starts a process or opens a socket (:class:`Guard`);
- a documented valid value: :data:`VALID`, each with the reason;
- a case this test cannot run cheaply: :data:`CANNOT_RUN`, each with the reason.

A refusal that is missing or comes too late, in a file this test's author could not change, is :data:`KNOWN`: an
expected failure, not strict: how far a command gets before this test's guard stops it depends on what earlier tests
in the same process cached, so the late refusal may or may not be reached.

Each case runs the command's file in this process (as ``python <file>`` runs it, compiled once), where torch is loaded
already: about 10 ms a case instead of seconds for a new interpreter. A new flag is covered by its parser alone.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import signal
import sys
import traceback
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
pytestmark = pytest.mark.filterwarnings("ignore:--min-difficulty:FutureWarning")  # the deprecated name, driven too
ENTRY_POINTS = ["solve.py", "evaluate.py", "install_dependencies.py"]
NUMBERS = ["-1", "0", "nan", "inf", "1e300", "abc"]
PATHS = ["no-such-path", "a-file.txt", "a-folder"]  # a path that is not there; a file of junk; an empty folder

# type functions that read a number (or a list of numbers) from the command line
NUMERIC_TYPES = {int, float}
NUMERIC_TYPE_NAMES = {"positive_int", "non_negative_int", "number_in", "worker_count", "counts", "ints", "pairs",
                      "parse_shape"}
# a flag names a path if a word of its name, or its metavar, says so
PATH_WORDS = {"path", "dir", "out", "outputs", "file", "checkpoint", "data", "report", "submission", "root", "python",
              "support", "query", "run", "picture", "arc", "maze", "sudoku", "optional", "lists"}
PATH_METAVARS = {"PATH", "DIR", "FILE", "JSON", "IMAGE", "TASK_JSON", "RUN_DIR", "PUZZLE_OR_FILE", "LABEL=RUN_DIR"}
NOT_PATHS = {("scripts/measure_search.py", "--lists"): "names of puzzle lists (named_hard, ...), not files",
             ("scripts/benchmark_quickstart.py", "--runs"): "run labels such as TRM, not folders"}

# a flag whose refusal names another flag, with the reason
ALSO_NAMED = {("scripts/build_sudoku_dataset.py", "--min-difficulty"): ("--min-rating",)}  # its deprecated old name

# scripts/ files without a parser of their own (none today): the completeness check skips exactly these
NO_PARSER: dict[str, str] = {}


# ------------------------------------------------------------------------------------------------------------------
# Finding each command's parser
# ------------------------------------------------------------------------------------------------------------------

_CODE: dict[str, object] = {}


def run_script(script: str) -> None:
    """``python <script>`` in this process, as ``runpy.run_path(..., run_name="__main__")`` runs it, with the
    compiled file kept: the largest (install_dependencies.py) takes longer to compile than a case takes to run."""
    path = ROOT / script
    if script not in _CODE:
        _CODE[script] = compile(path.read_text(), str(path), "exec")
    exec(_CODE[script], {"__name__": "__main__", "__file__": str(path), "__builtins__": __builtins__})


class _Captured(BaseException):
    def __init__(self, parser: argparse.ArgumentParser):
        super().__init__()
        self.parser = parser


def find_parser(script: str) -> argparse.ArgumentParser | None:
    """The parser ``python <script>`` builds, caught as it starts parsing: ``parse_args`` raises with the parser
    itself, so nothing the command does after parsing runs."""
    def capture(self, args=None, namespace=None):
        raise _Captured(self)

    saved = argparse.ArgumentParser.parse_args, argparse.ArgumentParser.parse_known_args, sys.argv
    argparse.ArgumentParser.parse_args = argparse.ArgumentParser.parse_known_args = capture
    sys.argv = [str(ROOT / script)]
    try:
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            run_script(script)
    except _Captured as caught:
        return caught.parser
    except BaseException:  # noqa: BLE001 - a script that ends without parsing has no parser to find
        return None
    finally:
        argparse.ArgumentParser.parse_args, argparse.ArgumentParser.parse_known_args, sys.argv = saved
    return None


@dataclass(frozen=True)
class Flag:
    command: str  # the file, e.g. scripts/build_sudoku_dataset.py
    prefix: tuple[str, ...]  # a subcommand, e.g. ("train",)
    name: str  # --budget, or a positional's dest
    kind: str  # "number" or "path"
    nargs: int  # values it takes
    positional: bool

    @property
    def label(self) -> str:
        return " ".join([self.command, *self.prefix, self.name])


def kind_of(command: str, action: argparse.Action) -> str | None:
    """"number", "path" or None (a switch, a choice, free text) from the parser's own action."""
    name = action.option_strings[-1] if action.option_strings else action.dest
    if action.nargs == 0 or isinstance(action, argparse._SubParsersAction):
        return None
    if action.type in NUMERIC_TYPES or getattr(action.type, "__name__", None) in NUMERIC_TYPE_NAMES:
        return "number"
    if (command, name) in NOT_PATHS or action.choices:
        return None
    words = set(name.lstrip("-").replace("_", "-").split("-"))
    if action.type is Path or words & PATH_WORDS or str(action.metavar) in PATH_METAVARS:
        return "path"
    return None


def flags_of(command: str, parser: argparse.ArgumentParser, prefix: tuple[str, ...] = ()) -> list[Flag]:
    found = []
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub, subparser in action.choices.items():
                found += flags_of(command, subparser, prefix + (sub,))
        elif not isinstance(action, argparse._HelpAction) and (kind := kind_of(command, action)):
            nargs = action.nargs if isinstance(action.nargs, int) else 1
            name = action.option_strings[-1] if action.option_strings else action.dest
            found.append(Flag(command, prefix, name, kind, nargs, not action.option_strings))
    return found


def typed_actions(parser: argparse.ArgumentParser):
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for subparser in action.choices.values():
                yield from typed_actions(subparser)
        elif action.type is not None:
            yield action


SCRIPTS = sorted(f"scripts/{p.name}" for p in (ROOT / "scripts").glob("*.py") if p.name != "__init__.py")
PARSERS = {c: p for c in ENTRY_POINTS + SCRIPTS if (p := find_parser(c)) is not None}
FLAGS = [flag for command, parser in PARSERS.items() for flag in flags_of(command, parser)]


# ------------------------------------------------------------------------------------------------------------------
# What each command needs besides the flag under test, and the cases that are not refusals
# ------------------------------------------------------------------------------------------------------------------

PUZZLE = "...3...9.2....9..1...5...3...94...151....8...6.4...7.8..2.64....9..3.4...8..5...."

# the other arguments of a command line, so that the flag under test is what it stops at; {tmp} is a fresh folder
# holding c.pt (not a checkpoint), k.json ([]), s.png and q.png (not pictures); {ckpt} is the shipped Sudoku model
BASE: dict[str, list[str]] = {
    "solve.py": ["--sudoku", PUZZLE, "--out", "{tmp}/solutions", "--device", "cpu"],
    "evaluate.py": ["--checkpoint", "{ckpt}", "--device", "cpu"],
    "install_dependencies.py": ["--dry-run", "--report", "{tmp}/report.json"],
    "scripts/build_arc_dataset.py": ["--dataset", "arc-agi-1", "--output-dir", "{tmp}/out", "--max-tasks", "1"],
    "scripts/build_maze_dataset.py": ["--generate", "--output-dir", "{tmp}/out"],
    "scripts/build_outside_sudoku.py": ["--output-dir", "{tmp}/out"],
    "scripts/build_sudoku_dataset.py": ["--generate", "--output-dir", "{tmp}/out"],
    "scripts/build_synthetic_cape_dataset.py": ["--output-dir", "{tmp}/out"],
    "scripts/bundle_model.py": ["{tmp}/run", "--name", "tiny"],
    "scripts/check_gpu.py": ["--device", "cpu"],
    "scripts/compute_curve.py": ["--run", "a={tmp}/run"],
    "scripts/mp100_report.py": ["--split", "1"],
    "scripts/predict_pose.py": ["--checkpoint", "{tmp}/c.pt", "--support", "{tmp}/s.png", "--support-keypoints",
                                "{tmp}/k.json", "--query", "{tmp}/q.png", "--out", "{tmp}/out"],
    "scripts/benchmark_test_time.py": ["--checkpoint", "{ckpt}"],
    "scripts/reference_trm.py": ["--reference-dir", "{tmp}"],
    "scripts/reproduce.py": ["--dry-run", "sudoku-extreme-trm-mlp"],
    "scripts/visualize.py": ["--data-path", "{tmp}/data", "--out", "{tmp}/out"],
}
SUBCOMMAND_BASE = {("scripts/reference_trm.py", "train"): ["--data-path", "{tmp}/data", "--out", "{tmp}/curve.json"],
                   ("scripts/reference_trm.py", "step-worker"): ["--arch", "{{}}"]}
# after the flag under test, when it is not a subcommand's: the subcommand the parser requires
TAIL = {"scripts/reference_trm.py": ["step-worker", "--arch", "{{}}"]}
SHIPPED = ROOT / "models" / "pretrained" / "sudoku_hard_trm.pt"

# (command, flag, value): why the value is a valid one (the test checks only that it is not refused by name)
VALID: dict[tuple[str, str, str], str] = {
    ("solve.py", "--budget", "0"): "0 s asks for fixed compute, the model's own test-time settings (--help)",
    ("solve.py", "--port", "0"): "0 picks a free port (--help)",
    ("solve.py", "--num-aug", "0"): "no augmented copies: the task as given is adapted to and answered",
    ("solve.py", "--noise", "0"): "no noise: every rollout starts from the same state",
    ("evaluate.py", "--noise", "0"): "no noise: every rollout starts from the same state",
    ("solve.py", "--rollout-seed", "0"): "a seed of 0 is a seed",
    ("evaluate.py", "--rollout-seed", "0"): "a seed of 0 is a seed",
    ("scripts/build_arc_dataset.py", "--seed", "0"): "a seed of 0 is a seed",
    ("scripts/build_maze_dataset.py", "--seed", "0"): "a seed of 0 is a seed",
    ("scripts/build_sudoku_dataset.py", "--seed", "0"): "a seed of 0 is a seed",
    ("scripts/build_synthetic_cape_dataset.py", "--seed", "0"): "a seed of 0 is a seed",
    ("scripts/build_arc_dataset.py", "--num-aug", "0"): "no augmented copies: the tasks as published",
    ("scripts/build_sudoku_dataset.py", "--num-aug", "0"): "no augmented copies: the puzzles as generated",
    ("scripts/build_synthetic_cape_dataset.py", "--max-rotation", "0"): "upright instances",
    ("scripts/benchmark_attention.py", "--warmup", "0"): "no untimed rounds first",
    ("scripts/reference_trm.py", "--warmup", "0"): "no untimed steps first",
    ("scripts/reproduce.py", "--timed-steps", "0"): "0: no timing (the docstring's `all --dry-run --timed-steps 0`)",
    ("evaluate.py", "--budget", "0"): "0 s asks for fixed compute, as solve.py's --budget 0",
    ("scripts/build_maze_dataset.py", "--wall-density", "0"): "LOW = HIGH = 0: open grids, no inner walls",
    **{("scripts/build_sudoku_dataset.py", flag, "0"): "0 is the lowest bound of the filter: every puzzle passes"
       for flag in ("--min-rating", "--min-difficulty", "--min-blanks")},
    ("scripts/build_sudoku_dataset.py", "--max-rating", "0"): "only puzzles rated 0, the easiest",
    **{(command, flag, value): "an output that is not there yet is created"
       for command, flag in [("solve.py", "--out"), ("install_dependencies.py", "--report"),
                             ("scripts/benchmark_cape_learning.py", "--output-dir"),
                             ("scripts/benchmark_quickstart.py", "--out"), ("scripts/measure_search.py", "--out"),
                             ("scripts/build_arc_dataset.py", "--output-dir"),
                             ("scripts/build_maze_dataset.py", "--output-dir"),
                             ("scripts/build_outside_sudoku.py", "--output-dir"),
                             ("scripts/build_sudoku_dataset.py", "--output-dir"),
                             ("scripts/build_synthetic_cape_dataset.py", "--output-dir"),
                             ("scripts/reference_trm.py", "--out"), ("scripts/predict_pose.py", "--out"),
                             ("scripts/benchmark_test_time.py", "--picture"), ("scripts/bundle_model.py", "--out")]
       for value in ["no-such-path"]},
    **{(command, flag, "a-folder"): "an existing, empty output folder is written into"
       for command, flag in [("solve.py", "--out"), ("scripts/benchmark_cape_learning.py", "--output-dir"),
                             ("scripts/benchmark_quickstart.py", "--out"), ("scripts/predict_pose.py", "--out"),
                             ("scripts/build_synthetic_cape_dataset.py", "--output-dir"),
                             ("scripts/build_arc_dataset.py", "--output-dir"),
                             ("scripts/build_maze_dataset.py", "--output-dir"),
                             ("scripts/build_outside_sudoku.py", "--output-dir"),
                             ("scripts/build_sudoku_dataset.py", "--output-dir"), ("scripts/bundle_model.py", "--out")]},
    ("scripts/benchmark_test_time.py", "--picture", "a-file.txt"): "the picture replaces the file",
    ("scripts/benchmark_maze_sizes.py", "--budget", "0"): "0: model-only figures, no anytime solving (--help)",
    ("scripts/benchmark_maze_sizes.py", "--seed", "0"): "a seed of 0 is a seed",
    **{("scripts/benchmark_maze_sizes.py", flag, value): "an output: created, or the file replaced"
       for flag in ("--json", "--picture") for value in ("no-such-path", "a-file.txt")},
    **{("scripts/benchmark_maze_sizes.py", "--wrong", value): "an output folder: created, or written into"
       for value in ("no-such-path", "a-folder")},
    **{("evaluate.py", flag, value): "an output: created, or written into (a folder) or replaced (a file)"
       for flag, values in [("--save-outputs", ["no-such-path", "a-folder"]),
                            ("--submission", ["no-such-path", "a-file.txt"]), ("--report", ["no-such-path", "a-file.txt"])]
       for value in values},
    ("install_dependencies.py", "--report", "a-file.txt"): "the report replaces the file",
    ("install_dependencies.py", "--optional", "a-file.txt"): "any text file is a requirements list: each line is "
                                                              "tried on its own and removed again if it fails",
}

# (command, flag, value): why this test does not run it
CANNOT_RUN: dict[tuple[str, str, str], str] = {
    **{("scripts/predict_pose.py", flag, value): "checked after the support images are opened (PIL), which needs real "
                                                 "pictures; tests/test_predict_pose.py drives it"
       for flag in ("--checkpoint", "--query") for value in PATHS},
    **{("scripts/visualize.py", "--outputs", value): "checked after --data-path, which needs a built dataset; "
                                                     "tests/test_visualize.py drives it" for value in PATHS},
    ("scripts/bundle_model.py", "--out", "a-file.txt"): "checked after the run directory, which needs a trained run; "
                                                        "tests/test_bundling.py drives it",
}

# (command, flag, value): a missing or late refusal in a file this test's author was asked not to change; expected
# failures, each reported in the issue
KNOWN: dict[tuple[str, str, str], str] = {}


# ------------------------------------------------------------------------------------------------------------------
# Running one case
# ------------------------------------------------------------------------------------------------------------------

class Reached(BaseException):
    """The command got past its checks: it called into torch, started a process, or ran out of time."""


# the work a command must not begin before its command line is checked
HEAVY = ("torch", "numba", "subprocess", "multiprocessing.pool", "multiprocessing.popen", "concurrent.futures",
         "socket", "http.server", "urllib.request", "huggingface_hub", "PIL", "tqdm")
# and these project functions: a worker pool, a dataset's generation
HEAVY_FUNCTIONS = {("utils.data.common", "worker_pool")}


class Guard:
    """Raise :class:`Reached` at the first call into :data:`HEAVY` code outside an import (the modules are loaded in
    this process already; their imports re-run nothing), or after ``seconds``. Without ``trace`` only the clock
    stops it (tracing costs about 1 us a Python call: 0.1 s of pretrain.py's OmegaConf merges)."""

    def __init__(self, seconds: float = 5.0, trace: bool = True):
        self.seconds, self.tracing = seconds, trace

    def trace(self, frame, event, arg):
        module = frame.f_globals.get("__name__") or ""
        if event == "call" and (module.startswith(HEAVY) or (module, frame.f_code.co_name) in HEAVY_FUNCTIONS) \
                and not self._importing(frame):
            raise Reached(f"{module}.{frame.f_code.co_name}")
        return None

    @staticmethod
    def _importing(frame) -> bool:
        while frame is not None:
            if frame.f_code.co_name == "<module>" and frame.f_globals.get("__name__") != "__main__":
                return True
            frame = frame.f_back
        return False

    def _alarm(self, signum, stack):
        raise Reached(f"still running after {self.seconds:g} s")

    def __enter__(self):
        self.saved_alarm = signal.signal(signal.SIGALRM, self._alarm)
        signal.setitimer(signal.ITIMER_REAL, self.seconds)
        if self.tracing:
            sys.settrace(self.trace)
        return self

    def __exit__(self, *exc):
        sys.settrace(None)
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, self.saved_alarm)
        return False


@dataclass
class Outcome:
    code: int | str  # the exit code, or "reached <where>"
    err: str

    def refusal(self, flag: Flag, value: str) -> str | None:
        """None if this is a proper refusal of ``flag``; else what is wrong with it."""
        errors = [line for line in self.err.splitlines() if line.startswith("error:")]
        if self.code != 2:
            return f"exit {self.code}, not 2"
        if "Traceback" in self.err or len(errors) != 1:
            return f"{len(errors)} error lines{', and a traceback' if 'Traceback' in self.err else ''}"
        names = {flag.name, flag.name.lstrip("-"), flag.name.lstrip("-").replace("-", "_"),
                 *ALSO_NAMED.get((flag.command, flag.name), ())}
        if flag.kind == "path":  # a path's error may name the path instead (a number's "0" would match anything)
            names |= {value, Path(value).name}
        if not any(name in errors[0] for name in names):
            return "refused for another reason (fix BASE so that this flag is reached)"
        return None


def run_command(command: str, argv: list[str], trace: bool = True) -> Outcome:
    """``python <command> <argv>`` in this process: its exit code (or where :class:`Guard` stopped it) and stderr."""
    err, saved_argv = io.StringIO(), sys.argv
    sys.argv = [str(ROOT / command), *argv]
    try:
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(err), Guard(trace=trace):
            run_script(command)
        code: int | str = 0
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
        if not isinstance(e.code, (int, type(None))):
            err.write(f"{e.code}\n")
    except Reached as e:
        code = f"reached {e}"
    except Exception:  # noqa: BLE001 - a traceback is a finding, reported as the case's failure
        code = 1
        err.write(traceback.format_exc())
    finally:
        sys.argv = saved_argv
    return Outcome(code, err.getvalue())


def value_tokens(flag: Flag, value: str, tmp: Path) -> list[str]:
    if flag.kind == "path":
        (tmp / "a-file.txt").write_text("not what this flag wants\n")
        (tmp / "a-folder").mkdir(exist_ok=True)
        value = str(tmp / value)
    return ([] if flag.positional else [flag.name]) + [value] * flag.nargs


def command_line(flag: Flag, value: str, tmp: Path) -> list[str]:
    """The whole command line of one case: the base, the flag under test with ``value``, a required subcommand."""
    tokens = value_tokens(flag, value, tmp)
    if flag.prefix:
        return base_argv(flag, tmp) + tokens
    return base_argv(flag, tmp) + tokens + [a.format(tmp=tmp) for a in TAIL.get(flag.command, [])]


def base_argv(flag: Flag, tmp: Path) -> list[str]:
    argv = BASE.get(flag.command, []) + list(flag.prefix) + SUBCOMMAND_BASE.get((flag.command, *flag.prefix), [])
    for name, text in [("c.pt", "not a checkpoint"), ("k.json", "[]"), ("s.png", "x"), ("q.png", "x")]:
        (tmp / name).write_text(text)
    argv = [a.format(tmp=tmp, ckpt=SHIPPED) for a in argv]
    # a flag under test that the base gives too: the base's value goes, the one under test stays
    if flag.name in argv:
        at = argv.index(flag.name)
        del argv[at:at + 1 + flag.nargs]
    elif flag.positional and flag.command == "scripts/bundle_model.py":
        argv = argv[1:]  # the run directory is the flag under test
    return argv


CASES = [(flag, value) for flag in FLAGS for value in (NUMBERS if flag.kind == "number" else PATHS)]


def _param(flag: Flag, value: str):
    key = (flag.command, flag.name, value)
    marks = []
    if key in KNOWN:
        # Not strict: how far a command gets before the guard stops it depends on what earlier tests in this process
        # cached (a device probe, a loaded module), so a late refusal may be reached here, or not.
        marks.append(pytest.mark.xfail(reason=KNOWN[key], strict=False))
    return pytest.param(flag, value, id=f"{flag.label}={value}", marks=marks)


@pytest.mark.parametrize("flag,value", [_param(f, v) for f, v in CASES])
def test_flag(flag: Flag, value: str, tmp_path):
    key = (flag.command, flag.name, value)
    if key in CANNOT_RUN:
        pytest.skip(CANNOT_RUN[key])
    shown = value if flag.kind == "number" else str(tmp_path / value)
    outcome = run_command(flag.command, command_line(flag, value, tmp_path))
    problem = outcome.refusal(flag, shown)
    if key in VALID:
        assert problem is not None, f"{flag.label} {value} is listed as valid ({VALID[key]}) but refused:\n{outcome.err}"
        return
    assert problem is None, f"{flag.label} {value}: {problem}\n{outcome.err[-2000:]}"


# ------------------------------------------------------------------------------------------------------------------
# pretrain.py: the numeric settings its --help lists
# ------------------------------------------------------------------------------------------------------------------

def pretrain_numeric_keys() -> list[str]:
    from utils.config import describe_keys
    rows = [line.split() for line in describe_keys()[1:]]
    return [key for key, type_name, *_ in rows if set(type_name.split("|")) - {"null"} <= {"int", "float"}]


PRETRAIN_KEYS = pretrain_numeric_keys()
# (key, value): why the value is a valid one; the ranges are utils/config.py's (FLOAT_RANGES, --help)
PRETRAIN_VALID: dict[tuple[str, str], str] = {
    ("min_eval_interval", "0"): "the default: evaluate from the first interval",
    ("first_eval_step", "0"): "0: no first, quick look (--help)",
    ("eval_noise", "0"): "the default: rollouts without noise",
    ("lr", "0"): "in the published range [0, 1]: the weights stay (only the puzzle embedding learns)",
    ("lr_min_ratio", "0"): "cosine down to 0, as TRM's recipes",
    ("lr_warmup_steps", "0"): "no warmup",
    ("beta1", "0"): "in Adam's range [0, 1): no momentum",
    ("beta2", "0"): "in Adam's range [0, 1)",
    ("weight_decay", "0"): "no weight decay",
    ("puzzle_emb_weight_decay", "0"): "no weight decay of the puzzle embedding",
    ("puzzle_emb_lr", "0"): "a frozen puzzle embedding",
    ("ema_rate", "0"): "in the range [0, 1]: the EMA is the live weights",
    ("seed", "0"): "the default seed",
    ("keep_last_checkpoints", "0"): "0 keeps all (--help)",
}


@pytest.mark.parametrize("key,value", [
    pytest.param(k, v, id=f"{k}={v}") for k in PRETRAIN_KEYS for v in NUMBERS])
def test_pretrain_setting(key, value, tmp_path, monkeypatch):
    """``python pretrain.py --config-name=cfg_pretrain_trm_cpu key=value`` from an empty folder: refused in one line
    before the device is chosen and the dataset built (or the value is documented as valid)."""
    from utils.run import plan

    def device_chosen(*args, **kwargs):
        raise Reached("utils.run.plan.select_device")

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(plan, "select_device", device_chosen)  # the first torch call of a run, after every check
    outcome = run_command("pretrain.py", ["--config-name=cfg_pretrain_trm_cpu", f"{key}={value}"], trace=False)
    flag = Flag("pretrain.py", (), key, "number", 1, True)
    if (key, value) in PRETRAIN_VALID:
        assert outcome.refusal(flag, value) is not None, \
            f"{key}={value} is listed as valid ({PRETRAIN_VALID[(key, value)]}) but refused:\n{outcome.err}"
        return
    assert outcome.refusal(flag, value) is None, f"{key}={value}: {outcome.refusal(flag, value)}\n{outcome.err}"
    assert not list(tmp_path.iterdir()), "a dataset or run directory was made before the refusal"


# ------------------------------------------------------------------------------------------------------------------
# The discovery itself
# ------------------------------------------------------------------------------------------------------------------

def test_every_script_with_a_parser_is_found():
    missing = [s for s in SCRIPTS if s not in PARSERS and s not in NO_PARSER]
    assert not missing, f"no parser found for {missing}: give it one, or list it in NO_PARSER with the reason"
    assert all(c in PARSERS for c in ENTRY_POINTS)


def test_the_discovery_found_a_plausible_number_of_flags():
    numbers = [f for f in FLAGS if f.kind == "number"]
    paths = [f for f in FLAGS if f.kind == "path"]
    assert len(PARSERS) >= 25 and len(numbers) >= 80 and len(paths) >= 40 and len(CASES) >= 600, \
        (len(PARSERS), len(numbers), len(paths), len(CASES))
    assert len(PRETRAIN_KEYS) >= 20 and {"lr", "global_batch_size", "epochs"} <= set(PRETRAIN_KEYS)


def test_every_typed_flag_is_classified():
    """A flag with a type function this file does not know is neither driven nor skipped silently."""
    unknown = {f"{c} {a.option_strings or a.dest}: {getattr(a.type, '__name__', a.type)}"
               for c, p in PARSERS.items() for a in typed_actions(p)
               if a.type not in NUMERIC_TYPES | {Path, str} and getattr(a.type, "__name__", "") not in NUMERIC_TYPE_NAMES}
    assert not unknown, f"add to NUMERIC_TYPE_NAMES (a number) or to this check's known types: {sorted(unknown)}"


def test_the_lists_name_real_cases():
    cases = {(f.command, f.name, v) for f, v in CASES}
    for listing in (VALID, CANNOT_RUN, KNOWN):
        stale = set(listing) - cases
        assert not stale, f"no such case (a flag renamed or removed?): {sorted(stale)}"
    assert all(reason.strip() for listing in (VALID, CANNOT_RUN, KNOWN, PRETRAIN_VALID, NOT_PATHS,
                                              NO_PARSER)
               for reason in listing.values())
    assert {k for k, _ in PRETRAIN_VALID} <= set(PRETRAIN_KEYS)
