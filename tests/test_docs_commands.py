"""Every command in the README and in docs/ still runs as written: its script, module and config exist, and every
flag it passes is one the program's ``--help`` lists (device=cpu; nothing is trained: ``--help`` only).

The commands are the lines of the fenced ``bash`` blocks. A ``python X.py`` or ``python -m M`` command (also behind
``torchrun`` and ``VAR=value`` prefixes) must name an existing file or module; each ``--flag`` it passes must appear
in that program's ``--help``; ``pretrain.py``'s ``--config-name`` must be a recipe in ``config/`` and each
``key=value`` a setting its ``--help`` lists. ``./START_CAPE_TRAINING.sh`` passes its flags to the CAPE trainer, so
they are checked against that. Other programs (pip, tensorboard, ...) must be on the short list below, so a command
of a tool the project does not document fails here rather than on a reader's machine.
"""

from __future__ import annotations

import contextlib
import importlib.util
import io
import re
import runpy
import shlex
import sys
import warnings
from functools import lru_cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
EXTERNAL = {"pip", "apt", "apt-get", "tensorboard", "git", "hf", "bash", "cd", "export", "nvidia-smi", "sbatch"}
CAPE_SCRIPT = "START_CAPE_TRAINING.sh"
CAPE_MODULE = "models.train_cape_episodic"


def bash_commands(page: Path) -> list[str]:
    """The commands of ``page``'s fenced bash blocks, continuation lines joined, comments and blank lines dropped."""
    commands, block = [], None
    for line in page.read_text(encoding="utf-8").splitlines():
        if line.strip().startswith("```"):
            block = [] if block is None and line.strip() == "```bash" else None
            continue
        if block is not None:
            if commands and commands[-1].endswith("\\"):
                commands[-1] = commands[-1][:-1] + " " + line.strip()
            else:
                commands.append(line.strip())
    words = (shlex.split(c, comments=True) for c in commands)
    return [" ".join(shlex.quote(w) for w in w_) for w_ in words if w_]


def split_env(words: list[str]) -> tuple[dict[str, str], list[str]]:
    """A command's ``VAR=value`` prefixes (the environment it sets) and the words after them."""
    env = {}
    while words and re.fullmatch(r"[A-Z_][A-Z0-9_]*=\S*", words[0]):
        key, value = words[0].split("=", 1)
        env[key], words = value, words[1:]
    return env, words


def program(words: list[str]) -> tuple[str, list[str]]:
    """``(what runs, its arguments)`` of a command's words: ``VAR=value`` prefixes and torchrun's own options
    skipped; ``what`` is a script path, ``-m module``, ``./START_CAPE_TRAINING.sh`` or another program's name."""
    _, words = split_env(words)
    if words[0] == "torchrun":
        rest = words[1:]
        while rest and rest[0].startswith("-") and rest[0] != "-m":
            rest = rest[1 + ("=" not in rest[0]):]  # an option and its value
        words = ["python", *rest]
    if words[0] in ("python", "python3"):
        if words[1] == "-m":
            return f"-m {words[2]}", words[3:]
        return words[1], words[2:]
    return words[0], words[1:]


@lru_cache(maxsize=None)
def help_text(target: str) -> str:
    """What ``target`` (a script path under the repository, or ``-m module``) prints for ``--help``, run in this
    process (device=cpu: ``--help`` builds no model)."""
    out = io.StringIO()
    argv = sys.argv
    sys.argv = [target, "--help"]
    try:
        with contextlib.redirect_stdout(out), pytest.raises(SystemExit), warnings.catch_warnings():
            # A module another test imported runs again here as __main__; `python -m` in a fresh process would not
            # find it already loaded, so runpy's warning about that is this stand-in's, not the command's.
            warnings.filterwarnings("ignore", "'.*' found in sys.modules after import of package", RuntimeWarning)
            if target.startswith("-m "):
                runpy.run_module(target[3:], run_name="__main__", alter_sys=False)
            else:
                runpy.run_path(str(ROOT / target), run_name="__main__")
    finally:
        sys.argv = argv
    return out.getvalue()


def check_python(target: str, args: list[str]) -> list[str]:
    """The problems of a ``python`` command: a missing file or module, a flag or setting its --help lacks."""
    if target.startswith("-m "):
        if importlib.util.find_spec(target[3:]) is None:
            return [f"no module {target[3:]}"]
    elif not (ROOT / target).is_file():
        return [f"no file {target}"]
    flags = [a.split("=", 1)[0] for a in args if a.startswith("--")]
    settings = [a.split("=", 1)[0] for a in args if not a.startswith("-") and re.fullmatch(r"[a-z_.]+=.*", a)]
    if not flags and not settings:
        return []
    text = help_text(target)
    problems = [f"{target} has no flag {f}" for f in flags if not re.search(rf"{re.escape(f)}\b", text)]
    if target == "pretrain.py":
        for arg in args:
            if arg.startswith("--config-name="):
                name = arg.split("=", 1)[1]
                if not (ROOT / "config" / f"{name}.yaml").is_file():
                    problems.append(f"no recipe config/{name}.yaml")
        problems += [f"pretrain.py has no setting {s}" for s in settings
                     if s != "arch" and not re.search(rf"(^|\s){re.escape(s)}\b", text, re.M)]
    return problems


def check(command: str) -> list[str]:
    """The problems of one documented command ([] when it runs as written)."""
    what, args = program(shlex.split(command))
    if what.endswith(".py") or what.startswith("-m "):
        return check_python(what, args)
    if what == f"./{CAPE_SCRIPT}":
        return check_python(f"-m {CAPE_MODULE}", args)
    return [] if what in EXTERNAL else [f"{what} is not a program the project documents"]


COMMANDS = [(page.relative_to(ROOT).as_posix(), c) for page in PAGES for c in bash_commands(page)]


def test_the_pages_hold_commands():
    pages = {page for page, _ in COMMANDS}
    assert "README.md" in pages and len(pages) >= 5, pages
    assert len(COMMANDS) >= 30


@pytest.mark.parametrize("page,command", COMMANDS, ids=[f"{p}:{i}" for i, (p, _) in enumerate(COMMANDS)])
def test_documented_command_runs_as_written(page, command):
    assert check(command) == [], f"{page}: {command}"


def test_the_checker_catches_a_renamed_flag_setting_recipe_and_script():
    assert check("python evaluate.py --checkpoint RUN --segmentz 4") == ["evaluate.py has no flag --segmentz"]
    assert check("python pretrain.py --config-name=cfg_pretrain_nope") == ["no recipe config/cfg_pretrain_nope.yaml"]
    assert check("python pretrain.py --config-name=cfg_pretrain_cpu lr_warmup_stepz=3") == \
        ["pretrain.py has no setting lr_warmup_stepz"]
    assert check("python scripts/nope.py --x 1") == ["no file scripts/nope.py"]
    assert check("./START_CAPE_TRAINING.sh --epochz 1") == [f"-m {CAPE_MODULE} has no flag --epochz"]
    assert check("curl http://example.com") == ["curl is not a program the project documents"]


README_MOST_LINES = 150  # the front door: what it is, try it, train, headline results, install, test, read more


def test_the_readme_is_at_most_150_lines_as_wc_counts_them():
    """``wc -l README.md``: the line ends in the file (issue 43's promise, held since issue 75)."""
    lines = (ROOT / "README.md").read_bytes().count(b"\n")
    assert lines <= README_MOST_LINES, f"README.md has {lines} lines; at most {README_MOST_LINES}: move detail to docs/"
