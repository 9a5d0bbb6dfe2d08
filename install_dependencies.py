#!/usr/bin/env python3
"""Platform-aware installer for HRM/CAPE: CUDA, Apple Silicon (MPS) or CPU.

    python install_dependencies.py             # install what is missing, verify, write install_report.json
    python install_dependencies.py --dry-run   # print the plan (every pip command) and change nothing
    python install_dependencies.py --dry-run --platform cuda   # preview another platform's plan

What it does, in order:
  1. Detect the platform (nvidia-smi, nvcc, Apple Silicon incl. Rosetta) and probe torch and torchvision in a
     subprocess.
  2. Keep a working torch. If there is none, install the pinned torch/torchvision pair in one pip call, choosing
     the builds for this platform (on Linux without an NVIDIA GPU: the CPU builds, or a local copy of the CUDA
     builds; never a multi-GB download of CUDA wheels).
  3. Install the rest of the requirements that are not already satisfied (with the torchvision that matches a
     kept torch), under a constraints file that pins the installed torch, so nothing can swap it out.
  4. On NVIDIA + Linux + a CUDA torch: try each optional CUDA extension (requirements-cuda.txt) on its own,
     after a preflight (compute capability, nvcc), verify it in a subprocess, and remove it if it fails.
  5. Run `pip check`, confirm torch did not change and torchvision imports, and report which optimizer/attention
     backends training will use.

Standard library only (plus packaging, or pip's own copy of it, to check the build requirements a downloaded source
distribution declares): it has to run before torch exists. Exit code 0 when the base environment is
healthy (even if optional extras were skipped or failed), 1 when it is not, 2 for bad arguments, 130 after Ctrl-C
and 143 after SIGTERM (each ends every pip command running at once, with one line).
"""

from __future__ import annotations

import argparse
import ast
import configparser
import contextlib
import gzip
import http.client
import importlib
import json
import os
import platform
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tarfile
import tempfile
import threading
import urllib.request
import zipfile
import zlib
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import BinaryIO, NoReturn
from urllib.parse import unquote, urljoin, urlparse

REPO = Path(__file__).resolve().parent
PLATFORMS = ("apple-silicon", "cuda", "cpu")
BASE_FILES = {"apple-silicon": "requirements-apple-silicon.txt", "cuda": "requirements.txt", "cpu": "requirements.txt"}
CUDA_EXTRAS_FILE = "requirements-cuda.txt"
PYTORCH_INDEX = "https://download.pytorch.org/whl"  # one index per build label: /cpu, /cu128, /rocm6.4, ...
PYTORCH_CPU_INDEX = f"{PYTORCH_INDEX}/cpu"
PYPI_INDEX = "https://pypi.org/simple"  # pip's default index
# Probes ask an index with this per-request timeout and no retries: pip's configured default can be minutes
# (180 s and 5 retries on some machines), and a probe that finds nothing only means "use another source".
PROBE_TIMEOUT_S = 5
# A dry run only previews the plan, so it waits at most this long for each pip probe and says what it skipped: pip can
# spend many minutes reading the wheels of a local folder (it hashes every one), and a probe's own bound is 900 s.
DRY_RUN_PROBE_TIMEOUT_S = 15
TIMED_OUT = 124  # the exit code _capture reports for a probe it ended at its timeout, as timeout(1) does
# The torchvision release built for each torch release: torch 2.N.P pairs with torchvision 0.(N+15).P. Checked
# against the metadata of the torchvision wheels on PyPI, 0.16.0 to 0.29.1: each requires torch==2.N.P exactly,
# except 0.29.1, which requires torch>=2.14.0. torch 2.0 paired differently (0.15.1, 0.15.2) and is not covered.
TORCHVISION_FOR_TORCH = {(2, minor): (0, minor + 15) for minor in range(1, 15)}
CONSTRAINTS = "<constraints.txt>"  # replaced by the real temp file when a step runs
# --no-build-isolation builds with what is installed, so these must be there. ninja turns the hours of a
# serial flash-attn compile into minutes; flash-attn's setup.py imports packaging.
BUILD_TOOLS = ("setuptools", "wheel", "ninja", "packaging")
# What each CUDA extra's build needs beyond BUILD_TOOLS and torch, where its source distribution is not read (a dry
# run, or no index offers it): adam-atan2 0.0.3's setup.py has setup_requires=['setuptools_scm'] with
# use_scm_version=True (without it the build stops at its metadata: seen on an H200); flash-attn 2.x's setup.py has
# setup_requires=["packaging", "psutil", "ninja"]. A real run reads them from the source distribution instead.
KNOWN_BUILD_REQUIRES = {"adam-atan2": ("setuptools_scm",), "flash-attn": ("packaging", "psutil", "ninja")}
SDIST_MAX_BYTES = 64 << 20  # flash-attn's source distribution is a few MB
# A downloaded source distribution is untrusted: these caps bound what reading its metadata can cost, far above what
# a real one needs (its setup.py is kB, its kernels and headers unpacked tens of MB). Over a cap, the installer
# uses KNOWN_BUILD_REQUIRES instead.
SDIST_UNPACKED_MAX_BYTES = 256 << 20
SDIST_MEMBER_MAX_BYTES = 1 << 20  # one pyproject.toml, setup.py or setup.cfg
SDIST_MEMBERS_MAX = 100_000       # files in one archive
BUILD_REQUIRES_MAX = 64           # requirements one file may declare
REQUIREMENT_MAX_CHARS = 500       # one requirement string, markers included
MARKER_NESTING_MAX = 16           # parentheses open at once in one requirement's marker
GB_PER_BUILD_JOB = 4  # one nvcc job can take several GB of RAM; more jobs than this risks the OOM killer


class InstallError(Exception):
    """A problem the user must fix by hand (bad requirement file, broken torch); exit code 1."""

    exit_code = 1


class ArgumentError(InstallError):
    """An argument that cannot work (an interpreter that does not run, a requirements folder or file that is not
    there); exit code 2, like a flag the parser refuses."""

    exit_code = 2


class Parser(argparse.ArgumentParser):
    """argparse whose refusal of a flag is one ``error:`` line and exit code 2 (not the usage block), as the
    project's commands give it (utils/cli.py, which this file cannot import: it runs before the project's
    requirements are there)."""

    def error(self, message: str):
        print(f"error: {message} (see {self.prog} --help)", file=sys.stderr, flush=True)
        raise SystemExit(2)


# --------------------------------------------------------------------------------------------------
# Requirements and versions (a small PEP 440 subset: enough to skip pip when a pin is surely met)
# --------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Requirement:
    """One requirement line. ``specs`` is None when we cannot judge it ourselves (extras, markers, URLs):
    such a line is always handed to pip, which is the authority."""

    name: str                                   # normalized (PEP 503)
    text: str                                   # as written, e.g. "numpy>=1.24,<3"
    specs: tuple[tuple[str, str], ...] | None   # e.g. ((">=", "1.24"), ("<", "3"))
    where: str                                  # "requirements.txt:5"


_NAME_RE = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)\s*(.*)$")
_SPEC_RE = re.compile(r"^(===|==|!=|~=|>=|<=|>|<)\s*([A-Za-z0-9.*+!_-]+)$")
_VERSION_RE = re.compile(
    r"^v?(?P<release>\d+(?:\.\d+)*)"
    r"(?:[-_.]?(?P<pre>a|b|rc|alpha|beta|c)[-_.]?(?P<pre_n>\d*))?"
    r"(?:[-_.]?(?:post|rev|r)[-_.]?(?P<post>\d*))?"
    r"(?:[-_.]?dev[-_.]?(?P<dev>\d*))?"
    r"(?:\+(?P<local>[a-z0-9.]+))?$", re.IGNORECASE)
_PRE_STAGE = {"a": 1, "alpha": 1, "b": 2, "beta": 2, "c": 3, "rc": 3}


def normalize_name(name: str) -> str:
    """PEP 503 name: lower case, runs of ``-_.`` become ``-`` (``Adam_ATan2`` -> ``adam-atan2``)."""
    return re.sub(r"[-_.]+", "-", name).lower()


def parse_requirements(path: Path) -> list[Requirement]:
    """Read a pip requirements file, following ``-r other.txt`` includes.

    Raises:
        InstallError: the file is missing or uses an option this installer does not handle.
    """
    if not path.is_file():
        raise ArgumentError(f"requirements file {path} not found: run the installer from a full checkout of the "
                            "repo, or give --requirements-dir the folder that holds it")
    reqs: list[Requirement] = []
    for n, raw in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        line = re.sub(r"(^|\s)#.*$", "", raw).strip()
        if not line:
            continue
        where = f"{path.name}:{n}"
        if line.startswith(("-r ", "--requirement ", "--requirement=")):
            reqs += parse_requirements(path.parent / re.split(r"[\s=]+", line, maxsplit=1)[1].strip())
            continue
        if line.startswith("-"):
            raise InstallError(f"{where}: option {line!r} is not supported here; only package lines and -r includes are")
        m = _NAME_RE.match(line)
        if not m:
            raise InstallError(f"{where}: cannot read requirement {line!r}")
        name, rest = m.group(1), m.group(2).strip()
        specs: tuple[tuple[str, str], ...] | None = ()
        if rest:
            parts = [_SPEC_RE.match(p.strip()) for p in rest.split(",")]
            specs = tuple((p.group(1), p.group(2)) for p in parts) if all(parts) else None
        reqs.append(Requirement(normalize_name(name), line, specs, where))
    return reqs


def version_key(version: str) -> tuple | None:
    """A sort key for a PEP 440 version without its local label (``2.13.0+cpu`` sorts as ``2.13``);
    None when the version uses syntax outside the subset handled here."""
    m = _VERSION_RE.match(version.strip())
    if not m:
        return None
    release = [int(x) for x in m.group("release").split(".")]
    while len(release) > 1 and release[-1] == 0:
        release.pop()
    pre, post, dev = m.group("pre"), m.group("post"), m.group("dev")
    if pre:
        stage, pre_n = _PRE_STAGE[pre.lower()], int(m.group("pre_n") or 0)
    else:  # a bare X.devN comes before every pre-release of X
        stage, pre_n = (0 if dev is not None and post is None else 4), 0
    return (tuple(release), stage, pre_n, int(post or 0) if post is not None else -1,
            int(dev or 0) if dev is not None else float("inf"))


def _release(version: str) -> list[int]:
    return [int(x) for x in re.match(r"^v?(\d+(?:\.\d+)*)", version).group(1).split(".")]


def satisfies(version: str | None, specs: tuple[tuple[str, str], ...] | None) -> bool | None:
    """Whether an installed ``version`` meets ``specs``; None when this subset cannot tell (pip decides).

    ``==X`` ignores the installed local label, as PEP 440 says (``2.13.0+cpu`` satisfies ``==2.13.0``);
    ``==X+label`` compares the label too.
    """
    if version is None:
        return False
    if specs is None or version_key(version) is None:
        return None
    have = version_key(version)
    for op, want in specs:
        if op == "===":
            ok = version == want
        elif op in ("==", "!=") and want.endswith(".*"):
            prefix = _release(want[:-2])
            got = _release(version) + [0] * len(prefix)
            ok = (got[:len(prefix)] == prefix) == (op == "==")
        else:
            want_key = version_key(want)
            if want_key is None:
                return None
            if op in ("==", "!="):
                same = have == want_key and ("+" not in want or version.lower() == want.lower())
                ok = same == (op == "==")
            elif op == "~=":
                prefix = _release(want)[:-1]
                ok = have >= want_key and (_release(version) + [0] * len(prefix))[:len(prefix)] == prefix
            else:
                ok = {">=": have >= want_key, "<=": have <= want_key, ">": have > want_key, "<": have < want_key}[op]
        if not ok:
            return False
    return True


def local_label(version: str) -> str | None:
    """The PEP 440 local label of a version, lower case: ``2.14.1+cpu`` -> ``cpu``; None without one."""
    return version.partition("+")[2].lower() or None


def same_build(version: str, other: str) -> bool:
    """Whether two versions name the same build: equal releases and equal local labels (``0.29.1+cpu`` is not
    ``0.29.1``: a torchvision built for the CPU torch fails to import beside a CUDA one, and vice versa)."""
    return version_key(version) == version_key(other) and local_label(version) == local_label(other)


def matching_torchvision(torch_version: str) -> str | None:
    """The torchvision release built for ``torch_version``, with the same local label (``2.13.0+cpu`` ->
    ``0.28.0+cpu``, ``2.14.1`` -> ``0.29.1``); None when :data:`TORCHVISION_FOR_TORCH` does not cover it."""
    m = re.fullmatch(r"(\d+)\.(\d+)\.(\d+)(\+[A-Za-z0-9.]+)?", torch_version.strip())
    pair = TORCHVISION_FOR_TORCH.get((int(m.group(1)), int(m.group(2)))) if m else None
    return f"{pair[0]}.{pair[1]}.{m.group(3)}{m.group(4) or ''}" if pair else None


def label_index(version: str) -> str | None:
    """The PyTorch index that serves builds with the local label of ``version`` (``+cpu`` -> .../whl/cpu,
    ``+cu128`` -> .../whl/cu128); None for an unlabelled version or a label PyTorch does not publish."""
    label = local_label(version)
    return f"{PYTORCH_INDEX}/{label}" if label and re.fullmatch(r"cpu|cu\d+|rocm[\d.]+|xpu", label) else None


@dataclass(frozen=True)
class RequirementSet:
    """What to install for one platform: the torch/torchvision pins, the base lines, the optional extras."""

    torch: Requirement
    torchvision: Requirement
    base: list[Requirement]
    base_file: str
    cuda_extras: list[Requirement]
    optional: list[Requirement]

    @property
    def pair(self) -> tuple[str, str]:
        """The pinned versions, e.g. ("2.14.1", "0.29.1")."""
        return self.torch.specs[0][1], self.torchvision.specs[0][1]


def _exact_pin(lines: list[Requirement], name: str, base_file: str) -> Requirement:
    found = [r for r in lines if r.name == name]
    if len(found) != 1 or not found[0].specs or len(found[0].specs) != 1 or found[0].specs[0][0] != "==" \
            or "*" in found[0].specs[0][1]:
        raise InstallError(f"{base_file} must pin {name} exactly once as {name}==X.Y.Z (an open range lets pip "
                           "pull a multi-GB CUDA build on machines without an NVIDIA GPU)")
    return found[0]


def load_requirements(kind: str, repo: Path = REPO, optional_file: Path | None = None) -> RequirementSet:
    """Read the requirement files for platform ``kind``; the torch and torchvision lines are split off the base set.

    Raises:
        InstallError: a file is missing/unreadable, torch or torchvision is not pinned exactly (``==X.Y.Z``), or
            the two pins are not a matched pair.
    """
    base_file = BASE_FILES[kind]
    lines = parse_requirements(repo / base_file)
    torch, torchvision = _exact_pin(lines, "torch", base_file), _exact_pin(lines, "torchvision", base_file)
    want = matching_torchvision(torch.specs[0][1])
    if want is None or not same_build(want, torchvision.specs[0][1]):
        raise InstallError(f"{torchvision.where}: {torchvision.text} is not the release built for {torch.text}; "
                           + (f"pin torchvision=={want}" if want else
                              "add the pair to TORCHVISION_FOR_TORCH in install_dependencies.py"))
    return RequirementSet(
        torch=torch,
        torchvision=torchvision,
        base=[r for r in lines if r.name not in ("torch", "torchvision")],
        base_file=base_file,
        cuda_extras=parse_requirements(repo / CUDA_EXTRAS_FILE),
        optional=parse_requirements(optional_file) if optional_file else [],
    )


# --------------------------------------------------------------------------------------------------
# Detection: read-only probes, each in a subprocess so this file never imports torch
# --------------------------------------------------------------------------------------------------

@dataclass
class PlatformInfo:
    """Everything the plan depends on. Built by :func:`detect_platform` and :func:`probe_torch_and_sources`; tests
    construct it directly."""

    python: str
    python_version: str
    system: str                          # platform.system(): Linux, Darwin, Windows
    machine: str                         # x86_64, arm64, aarch64
    kind: str                            # one of PLATFORMS
    kind_reason: str
    rosetta: bool = False                # x86_64 Python translated on an arm64 Mac
    gpu_name: str | None = None
    nvidia_smi_error: str | None = None      # nvidia-smi exists but failed (e.g. driver/library mismatch)
    gpu_count: int = 0
    driver_version: str | None = None
    compute_capability: str | None = None    # "8.9"
    nvcc_path: str | None = None
    nvcc_version: str | None = None          # "12.8"
    cuda_home: str | None = None
    torch_version: str | None = None         # "2.13.0+cpu", as pip sees it; None when torch does not import
    torch_cuda: str | None = None            # torch.version.cuda: "12.8", None for CPU/MPS builds
    torch_cuda_available: bool = False
    torch_mps_available: bool = False
    torch_error: str | None = None           # why `import torch` failed, when it is installed but broken
    torchvision_version: str | None = None   # "0.29.1"; None when torchvision does not import
    torchvision_error: str | None = None     # why `import torchvision` failed, when it is installed but broken
    # Probed by main() only when the plan needs it (see wanted_builds): build ("torch==2.14.1+cpu") -> where
    # pip can get it: "configured" (pip's own sources) or the PyTorch index URL that offers it.
    build_sources: dict[str, str] = field(default_factory=dict)
    local_pair: dict | None = None           # the pinned pair as wheels on local disk (see probe_local_pair)
    # Probed by main() for a real run on CUDA: extra name -> what its source distribution says its build needs.
    build_requires: dict[str, BuildRequires] = field(default_factory=dict)
    ram_gb: float = 0.0
    cpu_count: int = 1


# Every probe and pip command running, each the leader of its own process group, so that a stop or a timeout ends it
# with whatever it started; a stop (:func:`_stops_end_children`) ends them from the main thread, wherever they run.
_children: set[subprocess.Popen] = set()
_stop_signum: int | None = None  # the signal of a stop under way
# Held while a child starts and is registered; True while the main thread holds it. A stop that comes then is left
# to _child, which acts on it once the child is registered: a stop raised inside Popen would leave the child running.
_start_lock = threading.RLock()
_main_starting = False
# main(): DRY_RUN_PROBE_TIMEOUT_S during a dry run, else None (each pip probe waits its own timeout).
_probe_cap_s: float | None = None


class Stopped(KeyboardInterrupt):
    """Ctrl-C (SIGINT) or SIGTERM reached the installer; every child it had started was ended already."""

    def __init__(self, signum: int):
        super().__init__(signum)
        self.signum = signum


def _kill(proc: subprocess.Popen) -> None:
    """SIGKILL ``proc``'s process group (it leads its own: :func:`_child`); nothing when it has ended."""
    try:
        if hasattr(os, "killpg"):
            os.killpg(proc.pid, signal.SIGKILL)
        else:  # Windows: no process groups to signal
            proc.kill()
    except (ProcessLookupError, PermissionError):
        pass


def _end(proc: subprocess.Popen) -> None:
    """Kill ``proc``'s process group and reap it. Its pipes are closed unread: a process that left the group could
    hold them open, and reading to their end would wait for it."""
    _kill(proc)
    proc.wait()
    for stream in (proc.stdin, proc.stdout, proc.stderr):
        if stream:
            stream.close()


@contextlib.contextmanager
def _child(argv: list[str], env: dict | None, **popen):
    """``subprocess.Popen(argv, ...)`` in a process group of its own, ended with the group when the block is left by
    an exception; a stop ends it wherever it is (:func:`_stops_end_children`).

    Raises:
        FileNotFoundError, PermissionError: the program cannot be run.
        KeyboardInterrupt: a stop came while it started.
    """
    global _main_starting
    in_main = threading.current_thread() is threading.main_thread()
    proc = None
    with _start_lock:
        _main_starting = in_main
        try:
            proc = subprocess.Popen(argv, env=env, start_new_session=True, **popen)
            _children.add(proc)
        finally:
            _main_starting = False
            if proc is None and _stop_signum is not None:  # the start failed while a stop waited for it
                _stop_now()
    try:
        if _stop_signum is not None:  # a stop came while this child started: it is registered now
            _stop_now()
        yield proc
    except BaseException:
        _end(proc)
        raise
    finally:
        _children.discard(proc)


def _stop_now() -> NoReturn:
    """Kill every child running (after any start under way in another thread has registered its child), then raise
    :class:`Stopped` for the stop's signal."""
    with _start_lock:
        for proc in list(_children):
            _kill(proc)
    raise Stopped(_stop_signum)


@contextlib.contextmanager
def _stops_end_children():
    """Within the block, Ctrl-C (SIGINT) or SIGTERM kills every child running (:data:`_children`) at once and raises
    :class:`Stopped` in the main thread. Each child leads its own process group, so a terminal's Ctrl-C does not
    reach it and nothing else ends it: it would otherwise run on to its timeout (up to 900 s) while a thread waits
    for it. Outside the main thread (where no handler can be set) the signals are left as they are."""
    global _stop_signum
    _stop_signum = None
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def stop(signum, _frame):
        global _stop_signum
        _stop_signum = signum
        if not _main_starting:  # else _child stops once the child it starts is registered
            _stop_now()

    previous = {signum: signal.signal(signum, stop) for signum in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


def _capture(argv: list[str], timeout: float = 120, env: dict | None = None) -> tuple[int, str, str] | None:
    """Run a read-only probe and capture its output: (exit code, stdout, stderr); None when the program does not
    exist; (:data:`TIMED_OUT`, "", "timed out after N s") when it ran past ``timeout`` (seconds), ended with
    everything it started."""
    try:
        with _child(argv, env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) as proc:
            try:
                out, err = proc.communicate(timeout=timeout)
            except subprocess.TimeoutExpired:
                _end(proc)
                return TIMED_OUT, "", f"timed out after {timeout:.0f} s"
    except (FileNotFoundError, PermissionError):
        return None
    return proc.returncode, out, err


def _pip_probe(argv: list[str], what: str, if_skipped: str, timeout: float,
               env: dict | None = None) -> tuple[int, str, str] | None:
    """:func:`_capture` of a read-only pip command, with a line saying what it waits for and, when pip does not
    answer within ``timeout`` seconds (at most :data:`DRY_RUN_PROBE_TIMEOUT_S` in a dry run), a line saying what was
    skipped and what is taken instead (``if_skipped``)."""
    if _probe_cap_s is not None:
        timeout = min(timeout, _probe_cap_s)
    print(f"  waiting for pip (at most {timeout:.0f} s): {what}", flush=True)
    out = _capture(argv, timeout=timeout, env=env)
    if out is not None and out[0] == TIMED_OUT and not out[1]:
        print(f"  skipped {what}: pip did not answer in {timeout:.0f} s; {if_skipped}", flush=True)
    return out


def _last_line(text: str) -> str:
    lines = [ln.strip() for ln in text.strip().splitlines() if ln.strip()]
    return lines[-1] if lines else "(no output)"


# Versions as pip sees them (the installed distribution's metadata): torch.__version__ adds a label that the
# wheel's metadata may not have (PyPI's CUDA torch 2.14.1 says 2.14.1+cu130), and a constraint or pin naming that
# label would match no installable build.
_TORCH_PROBE = """
import json, importlib.metadata as md, torch

def version(module):
    try:
        return md.version(module.__name__)
    except md.PackageNotFoundError:  # imported from a source tree
        return module.__version__

out = {"torch_version": version(torch), "torch_cuda": torch.version.cuda,
       "torch_cuda_available": torch.cuda.is_available(), "torch_mps_available": torch.backends.mps.is_available(),
       "torchvision_version": None, "torchvision_error": None}
if out["torch_cuda_available"]:
    out["compute_capability"] = "%d.%d" % torch.cuda.get_device_capability(0)
try:
    import torchvision
    out["torchvision_version"] = version(torchvision)
except Exception as e:  # a torchvision built for another torch fails here ("operator torchvision::nms does not exist")
    if not (isinstance(e, ModuleNotFoundError) and e.name == "torchvision"):
        out["torchvision_error"] = (type(e).__name__ + ": " + str(e)).splitlines()[0][:300]
print(json.dumps(out))
"""

_VERSIONS_PROBE = """
import json, importlib.metadata as md
out = {}
for d in md.distributions():  # sys.path order: the first copy of a name is the one Python imports
    name = d.metadata["Name"]
    if name:
        out.setdefault(name, d.version)
print(json.dumps(out))
"""


def probe_torch(python: str) -> dict:
    """Import torch and torchvision in ``python`` (a subprocess) and return the torch and torchvision fields of
    :class:`PlatformInfo` (plus ``compute_capability`` when torch sees a GPU)."""
    out = _capture([python, "-c", _TORCH_PROBE], timeout=300)
    if out is None:
        raise ArgumentError(f"cannot run {python}: pass an existing interpreter with --python")
    rc, stdout, stderr = out
    if rc == 0:
        return json.loads(stdout.strip().splitlines()[-1]) | {"torch_error": None}
    err = _last_line(stderr)
    missing = "No module named 'torch'" in err and "ModuleNotFoundError" in err
    return {"torch_version": None, "torch_cuda": None, "torch_cuda_available": False,
            "torch_mps_available": False, "torch_error": None if missing else err,
            "torchvision_version": None, "torchvision_error": None}


def installed_versions(python: str) -> dict[str, str]:
    """Normalized name -> version of every distribution ``python`` can import (read via importlib.metadata)."""
    out = _capture([python, "-c", _VERSIONS_PROBE])
    if out is None or out[0] != 0:
        raise InstallError(f"cannot list the packages of {python}: "
                           f"{_last_line(out[2]) if out else 'interpreter not found'}; check --python")
    return {normalize_name(k): v for k, v in json.loads(out[1]).items()}


def _ram_gb() -> float:
    try:
        with open("/proc/meminfo", encoding="utf-8") as f:
            return int(re.search(r"MemTotal:\s+(\d+) kB", f.read()).group(1)) / 2**20
    except (OSError, AttributeError):
        pass
    out = _capture(["sysctl", "-n", "hw.memsize"]) if platform.system() == "Darwin" else None
    if out and out[0] == 0 and out[1].strip().isdigit():
        return int(out[1]) / 2**30
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    except (ValueError, OSError, AttributeError):
        return 0.0


def _cpu_count() -> int:
    try:
        return len(os.sched_getaffinity(0))  # honours container CPU limits
    except AttributeError:
        return os.cpu_count() or 1


def _detect_nvidia() -> tuple[dict, str]:
    """GPU facts from nvidia-smi, and a sentence saying what was (not) found."""
    out = _capture(["nvidia-smi", "--query-gpu=name,driver_version,compute_cap", "--format=csv,noheader"], timeout=60)
    if out is None:
        return {}, "nvidia-smi not found"
    rc, stdout, stderr = out
    rows = [ln.rsplit(",", 2) for ln in stdout.splitlines() if ln.count(",") >= 2]
    if rc != 0 or not rows:
        error = _last_line(stderr or stdout)
        return {"nvidia_smi_error": error}, f"nvidia-smi found no usable GPU ({error})"
    name, driver, cap = (c.strip() for c in rows[0])
    cap = cap if re.fullmatch(r"\d+\.\d+", cap) else None  # old drivers print [N/A]
    return {"gpu_name": name, "gpu_count": len(rows), "driver_version": driver, "compute_capability": cap}, \
        f"NVIDIA {name} (driver {driver})"


def _detect_nvcc() -> dict:
    """nvcc's path and version, and the CUDA toolkit root a build would use (CUDA_HOME)."""
    home = os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH")
    nvcc = shutil.which("nvcc") or (str(Path(home, "bin", "nvcc")) if home and Path(home, "bin", "nvcc").exists() else None)
    if nvcc is None:
        return {"cuda_home": home}
    if home is None:  # nvcc may be a wrapper in /usr/local/bin: only accept a root that holds the headers
        candidates = [Path(nvcc).resolve().parent.parent, Path("/usr/local/cuda")]
        home = next((str(c) for c in candidates if (c / "include" / "cuda.h").exists()), None)
    out = _capture([nvcc, "--version"], timeout=60)
    m = re.search(r"release (\d+\.\d+)", out[1]) if out and out[0] == 0 else None
    return {"nvcc_path": nvcc, "nvcc_version": m.group(1) if m else None, "cuda_home": home}


def _is_rosetta() -> bool:
    out = _capture(["sysctl", "-n", "sysctl.proc_translated"], timeout=10)
    return bool(out) and out[0] == 0 and out[1].strip() == "1"


def detect_platform(python: str) -> PlatformInfo:
    """Probe this machine: OS, Python, GPU, nvcc, RAM and cores. The torch fields stay unset: torch is probed
    apart (:func:`probe_torch`, then :func:`with_torch`), since importing it takes seconds that a dry run spends
    asking pip for sources at the same time (:func:`probe_torch_and_sources`).

    Raises:
        InstallError: ``python`` cannot be run.
    """
    out = _capture([python, "-c", "import platform; print(platform.python_version())"])
    if out is None or out[0] != 0:
        raise ArgumentError(f"cannot run {python}: pass an existing interpreter with --python")
    system, machine = platform.system(), platform.machine()
    # Same check as utils.device.is_apple_silicon, repeated because that module imports torch.
    rosetta = system == "Darwin" and machine == "x86_64" and _is_rosetta()
    nvidia, nvidia_reason = _detect_nvidia() if system != "Darwin" else ({}, "macOS")
    if system == "Darwin" and (machine == "arm64" or rosetta):
        kind, reason = "apple-silicon", "arm64 Mac" + (" (this Python runs under Rosetta)" if rosetta else "")
    elif nvidia.get("gpu_name"):
        kind, reason = "cuda", nvidia_reason
    else:
        kind, reason = "cpu", f"no NVIDIA GPU: {nvidia_reason}"
    return PlatformInfo(python=python, python_version=out[1].strip(), system=system, machine=machine, kind=kind,
                        kind_reason=reason, rosetta=rosetta, **nvidia, **_detect_nvcc(),
                        ram_gb=round(_ram_gb(), 1), cpu_count=_cpu_count())


def with_torch(info: PlatformInfo, torch_fields: dict) -> PlatformInfo:
    """``info`` (from :func:`detect_platform`) with the fields :func:`probe_torch` returned; the compute capability
    nvidia-smi reported wins over torch's, which covers drivers too old to print it."""
    if info.compute_capability:
        torch_fields = {k: v for k, v in torch_fields.items() if k != "compute_capability"}
    return replace(info, **torch_fields)


def simulate_platform(info: PlatformInfo, kind: str) -> PlatformInfo:
    """``info`` as if this machine were ``kind`` (for ``--platform``); GPU/nvcc/torch facts stay as detected."""
    if kind == info.kind:
        return info
    system, machine = (("Darwin", "arm64") if kind == "apple-silicon"
                       else ("Linux", "x86_64") if info.system == "Darwin" else (info.system, info.machine))
    return replace(info, kind=kind, system=system, machine=machine, rosetta=False,
                   kind_reason=f"forced by --platform {kind} (detected: {info.kind})")


# --------------------------------------------------------------------------------------------------
# Sources: where pip can get a torch/torchvision build (read-only pip runs: nothing is installed, and only
# index pages are read, never a wheel from the network)
# --------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class PipSources:
    """Where pip looks for packages: index URLs (the first is ``--index-url``; none means ``--no-index``),
    find-links locations, and the connection options (``--cert``, ``--proxy``, ...) that reaching them needs."""

    indexes: tuple[str, ...] = ()
    find_links: tuple[str, ...] = ()
    network: tuple[str, ...] = ()

    def options(self) -> list[str]:
        """The pip options that name exactly these sources."""
        opts = ["--index-url", self.indexes[0]] if self.indexes else ["--no-index"]
        opts += [a for url in self.indexes[1:] for a in ("--extra-index-url", url)]
        return opts + [a for place in self.find_links for a in ("--find-links", place)] + list(self.network)

    def local(self) -> PipSources:
        """Only the sources on this machine's disk (``file:`` URLs and paths): reading them downloads nothing."""
        def is_local(place: str) -> bool:
            return place.startswith("file:") or "://" not in place
        return PipSources(tuple(filter(is_local, self.indexes)), tuple(filter(is_local, self.find_links)))


_CONFIG_LINE = re.compile(r"^(:env:|[\w-]+)\.([\w-]+)=(.+)$")


def configured_sources(python: str) -> PipSources:
    """The sources ``python -m pip install`` uses, read from ``pip config list`` (pip merges every configuration
    file and PIP_* variable there): per key, a PIP_* variable (``:env:``) wins over an ``[install]`` section,
    which wins over ``[global]``, as in pip. Without readable output: PyPI alone."""
    out = _pip_probe([python, "-m", "pip", "config", "list"], "pip's configuration (pip config list)",
                     "PyPI alone is taken as its source", timeout=60)
    found: dict[str, dict[str, str]] = {}
    for line in (out[1] if out and out[0] == 0 else "").splitlines():
        m = _CONFIG_LINE.match(line.strip())
        try:
            value = ast.literal_eval(m.group(3)) if m else None  # pip prints each value with repr()
        except (ValueError, SyntaxError):
            value = None
        if isinstance(value, str):
            found.setdefault(m.group(2), {})[m.group(1)] = value

    def get(key: str, default: str = "") -> str:
        sections = found.get(key, {})
        return next((sections[s] for s in (":env:", "install", "global") if s in sections), default)

    no_index = get("no-index").lower() in ("1", "y", "yes", "t", "true", "on")
    indexes = () if no_index else (get("index-url", PYPI_INDEX), *get("extra-index-url").split())
    network = [a for key in ("cert", "client-cert", "proxy") if get(key) for a in (f"--{key}", get(key))]
    network += [a for host in get("trusted-host").split() for a in ("--trusted-host", host)]
    return PipSources(indexes, tuple(get("find-links").split()), tuple(network))


def isolated_pip(python: str, command: list[str], sources: PipSources, *args: str) -> tuple[list[str], dict[str, str]]:
    """A pip command that reads no configuration and uses exactly ``sources``: (argv, environment overrides).
    ``PIP_CONFIG_FILE=os.devnull`` turns off every pip configuration file and ``--isolated`` every PIP_* variable
    (pip's documented switches), so a machine-wide constraints file or extra index cannot leak in."""
    return ([python, "-m", "pip", *command, "--isolated", "--disable-pip-version-check", *sources.options(), *args],
            {"PIP_CONFIG_FILE": os.devnull})


def pip_versions(python: str, name: str, sources: PipSources | None = None) -> set[str]:
    """The versions of ``name`` that pip could install into ``python`` (its tags) from ``sources`` (None: pip's
    configured sources), as ``pip index versions`` lists them, local labels included. Empty when there are none or
    the sources do not answer: each index is asked once, with a PROBE_TIMEOUT_S timeout and no retries."""
    args = ["--retries", "0", "--timeout", str(PROBE_TIMEOUT_S)]
    if sources is None:
        argv, env = [python, "-m", "pip", "index", "versions", name, *args], {}
    else:
        argv, env = isolated_pip(python, ["index", "versions", name], sources, *args)
    where = (", ".join(sources.indexes + sources.find_links) or "no source") if sources else "pip's configured sources"
    out = _pip_probe(argv, f"the versions of {name} at {where}", "taken as offering none", timeout=60,
                     env={**os.environ, **env})
    m = re.search(r"Available versions:\s*(.*)", out[1]) if out and out[0] == 0 else None
    return {v.strip() for v in m.group(1).split(",")} if m else set()


def _is_x86(info: PlatformInfo) -> bool:
    return info.machine.lower() in ("x86_64", "amd64")


def torchvision_needed(info: PlatformInfo) -> str | None:
    """The torchvision build that a kept, working torch needs (:func:`matching_torchvision`), or None when the
    installed torchvision already is that build, or when the table does not cover this torch."""
    if not info.torch_version or info.torch_error:
        return None
    want, have = matching_torchvision(info.torch_version), info.torchvision_version
    if want is None or (have and not info.torchvision_error and same_build(have, want)):
        return None
    return want


def cpu_pair(info: PlatformInfo, reqs: RequirementSet) -> list[str]:
    """The CPU builds of the pinned pair for Linux: ``torch==X+cpu torchvision==Y+cpu`` on x86_64, where no CUDA
    wheel carries that label, so whatever index pip reads only the CPU build can match; bare versions elsewhere
    (aarch64), as the PyTorch CPU index labels no aarch64 release build."""
    label = "+cpu" if _is_x86(info) else ""
    return [f"torch=={reqs.pair[0]}{label}", f"torchvision=={reqs.pair[1]}{label}"]


def wanted_builds(info: PlatformInfo, reqs: RequirementSet, fresh: bool) -> dict[str, str]:
    """The builds whose source the plan depends on, each with the PyTorch index that would serve it.

    ``fresh`` (torch is to be installed, or a dry run shows what a fresh install would run): on Linux without an
    NVIDIA GPU, :func:`cpu_pair`. And a kept torch with a local label (``2.13.0+cpu``) whose matching torchvision
    is missing needs that torchvision build (``0.28.0+cpu``), which lies on the index for its label.
    """
    wanted = {}
    if fresh and info.system == "Linux" and info.kind != "cuda":
        wanted = {build: PYTORCH_CPU_INDEX for build in cpu_pair(info, reqs)}
    tv = torchvision_needed(info)
    if tv and label_index(tv):
        wanted[f"torchvision=={tv}"] = label_index(tv)
    return wanted


def _offers(versions: set[str], version: str) -> bool:
    """Whether a listing offers ``version``: that exact build when it has a label, else any build of the release."""
    return version in versions if "+" in version else any(v.partition("+")[0] == version for v in versions)


def probe_builds(python: str, wanted: dict[str, str], configured: PipSources,
                 pair: tuple[str, ...] = ()) -> dict[str, str]:
    """Where each wanted build can be had: "configured" when pip's configured sources list it (labelled builds only:
    a label names one build wherever it lies, a bare version may be a CUDA build there), else its PyTorch index
    when that index alone lists it. Builds found nowhere are left out, and so are the builds of ``pair`` after the
    first of them that is found nowhere: the pair installs from one source (:func:`pair_install`), so no answer
    about the other could change the plan, and each answer is a pip run of about a second."""
    found, pair_ruled_out = {}, False
    for build, index in wanted.items():
        if pair_ruled_out and build in pair:
            continue
        name, _, version = build.partition("==")
        if "+" in version and version in pip_versions(python, name):
            found[build] = "configured"
        elif _offers(pip_versions(python, name, PipSources((index,), network=configured.network)), version):
            found[build] = index
        elif build in pair:
            pair_ruled_out = True
    return found


def _is_cuda_library(requirement: str) -> bool:
    """Whether a requirement of torch is one of its CUDA libraries (several GB together)."""
    name = normalize_name(re.match(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)", requirement).group(1))
    return name.startswith("nvidia-") or name in ("cuda-toolkit", "triton")


def _unpacked_gb(wheel: str) -> float:
    try:
        with zipfile.ZipFile(wheel) as z:
            return sum(i.file_size for i in z.infolist()) / 2**30
    except (OSError, zipfile.BadZipFile):
        return os.path.getsize(wheel) / 2**30 if os.path.exists(wheel) else 0.0


def _local_wheels(python: str, local: PipSources, requirements: list[str], no_deps: bool = False) -> dict | None:
    """The wheels pip would install for ``requirements`` from the ``local`` sources alone (a dry run: nothing is
    installed): normalized name -> {"path", "gb" (unpacked), "requires"}; None when pip cannot resolve them there."""
    with tempfile.TemporaryDirectory(prefix="hrm-install-") as tmp:
        report = Path(tmp, "report.json")
        argv, env = isolated_pip(python, ["install"], local, "--dry-run", "--ignore-installed", "--quiet",
                                 "--only-binary", ":all:", "--report", str(report),
                                 *(["--no-deps"] if no_deps else []), *requirements)
        # Named without their extras and markers: torch's CUDA libraries carry long ones.
        wanted = ", ".join(re.sub(r"\[.*?\]", "", r.partition(";")[0]).strip() for r in requirements)
        where = ", ".join(local.indexes + local.find_links)
        out = _pip_probe(argv, f"a local copy of {wanted} in {where} (pip hashes every wheel it reads)",
                         "taken as not there", timeout=900, env={**os.environ, **env})
        try:
            items = json.loads(report.read_text(encoding="utf-8"))["install"] if out and out[0] == 0 else None
        except (OSError, ValueError, KeyError):
            items = None
    if items is None:
        return None
    wheels = {}
    for item in items:
        url = item.get("download_info", {}).get("url", "")
        path = unquote(urlparse(url).path)
        if not url.startswith("file:") or not path.endswith(".whl"):
            return None
        meta = item.get("metadata", {})
        wheels[normalize_name(meta.get("name", ""))] = {"path": path, "gb": _unpacked_gb(path),
                                                        "requires": meta.get("requires_dist") or []}
    return wheels


def probe_local_pair(python: str, local: PipSources, pins: list[str]) -> dict | None:
    """The pinned pair (``["torch==X", "torchvision==Y"]``) as wheels on this machine's disk, as pip finds them in
    the local sources it is configured with (file:// indexes, find-links folders); None when they are not there.

    Returns {"files": wheel paths, "gb": unpacked size, "cuda": whether torch is a CUDA build, "where": folders}.
    A CUDA build (torch requires nvidia-* packages, cuda-toolkit or triton) counts only when those libraries lie
    there too, so installing it downloads at most torch's few small pure-Python dependencies.
    """
    if not (local.indexes or local.find_links):
        return None
    wheels = _local_wheels(python, local, pins, no_deps=True)
    if wheels is None or "torch" not in wheels:
        return None
    libraries = [r for r in wheels["torch"]["requires"] if _is_cuda_library(r)]
    if libraries:
        found = _local_wheels(python, local, libraries)
        if found is None:
            return None
        wheels |= found
    files = [w["path"] for w in wheels.values()]
    return {"files": files, "gb": round(sum(w["gb"] for w in wheels.values()), 1), "cuda": bool(libraries),
            "where": sorted({str(Path(f).parent) for f in files})}


def probe_sources(info: PlatformInfo, reqs: RequirementSet, fresh: bool) -> PlatformInfo:
    """``info`` with the sources of the builds the plan depends on (:func:`wanted_builds`) added to
    ``build_sources``, and ``local_pair`` filled in when the pair is wanted; pip is asked nothing when there are
    none. The local copy is looked for only when no index offers the CPU builds of the pair."""
    wanted = wanted_builds(info, reqs, fresh)
    if not wanted:
        return info
    print("Asking pip where it can get " + ", ".join(wanted), flush=True)
    configured = configured_sources(info.python)
    pair = cpu_pair(info, reqs)
    kept = wanted_builds(info, reqs, fresh=False)  # a kept torch's torchvision: asked about whatever the pair's fate
    found = info.build_sources | probe_builds(info.python, wanted, configured, tuple(b for b in pair if b not in kept))
    if all(build in wanted for build in pair) and not all(build in found for build in pair):
        print("  the CPU builds are not offered; looking for a local copy of the pinned pair (a dry run)", flush=True)
        pins = [f"{r.name}=={r.specs[0][1]}" for r in (reqs.torch, reqs.torchvision)]
        info = replace(info, local_pair=probe_local_pair(info.python, configured.local(), pins))
    return replace(info, build_sources=found)


def probe_torch_and_sources(machine: PlatformInfo, reqs: RequirementSet, dry_run: bool) -> PlatformInfo:
    """``machine`` (from :func:`detect_platform`) with its torch probed (:func:`probe_torch`) and the sources of the
    builds the plan depends on (:func:`probe_sources`).

    A dry run shows a fresh install's command whatever torch is there, so the pair's sources do not depend on the
    torch probe: pip is asked for them while the probe imports torch and torchvision (seconds each way), and only
    a kept torch's torchvision, which the probe decides, is asked for afterwards. A real run wants the pair only
    when there is no torch, so it asks after the probe.
    """
    if not dry_run:
        info = with_torch(machine, probe_torch(machine.python))
        return probe_sources(info, reqs, fresh=info.torch_version is None)
    with ThreadPoolExecutor(max_workers=1) as pool:
        torch_fields = pool.submit(probe_torch, machine.python)
        info = probe_sources(machine, reqs, fresh=True)
        info = with_torch(info, torch_fields.result())
    return probe_sources(info, reqs, fresh=False)


# --------------------------------------------------------------------------------------------------
# Build requirements: what a --no-build-isolation build needs installed first, read from its source distribution
# --------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class BuildRequires:
    """The requirements one extra's build imports (``packages``, as written) and where that was read (``source``)."""

    packages: tuple[str, ...]
    source: str


def known_build_requires(name: str) -> BuildRequires:
    """:data:`KNOWN_BUILD_REQUIRES` for ``name``, for when its source distribution is not read."""
    return BuildRequires(KNOWN_BUILD_REQUIRES.get(name, ()), "listed in install_dependencies.py")


class MetadataError(ValueError):
    """Build metadata in a downloaded source distribution that this installer will not use (see
    :func:`declared_build_requires`)."""


class _CappedStream:
    """A read-only view of a binary ``stream`` that raises :class:`MetadataError` once more than ``limit`` bytes
    have come through it, so a lying or bomb-like archive costs at most ``limit`` bytes of reading."""

    def __init__(self, stream: BinaryIO, limit: int, what: str):
        self._stream, self._limit, self._left, self._what = stream, limit, limit, what

    def read(self, size: int | None = -1) -> bytes:
        """Up to ``size`` bytes (all that is left under the cap, plus one to detect going over, when negative)."""
        data = self._stream.read(self._left + 1 if size is None or size < 0 else min(size, self._left + 1))
        self._left -= len(data)
        if self._left < 0:
            raise MetadataError(f"{self._what} is over the {self._limit >> 20} MiB this installer reads")
        return data


def _import_first(*modules: str):
    """The first of ``modules`` that imports; None when none does."""
    for name in modules:
        try:
            return importlib.import_module(name)
        except ImportError:
            continue
    return None


def _shown(value: object, width: int = 60) -> str:
    """``repr(value)`` cut to ``width`` characters: a quote of untrusted text that stays on one short line."""
    text = repr(value)
    return text if len(text) <= width else text[:width - 1] + "…"


def _why(error: BaseException) -> str:
    """The first line of an exception's message, or its type when it has none (MemoryError, EOFError())."""
    return (str(error).strip().splitlines() or [type(error).__name__])[0]


def _string_list(value: object, where: str) -> list[str]:
    """``value`` when it is a list (or tuple) of at most BUILD_REQUIRES_MAX strings.

    Raises:
        MetadataError: anything else, e.g. a bare string, which must not be taken one character at a time.
    """
    if not isinstance(value, (list, tuple)) or not all(isinstance(v, str) for v in value):
        raise MetadataError(f"{where} must be a list of strings, not {_shown(value)}")
    if len(value) > BUILD_REQUIRES_MAX:
        raise MetadataError(f"{where} lists {len(value)} requirements, more than the {BUILD_REQUIRES_MAX} accepted")
    return list(value)


def _pyproject_requires(text: str) -> list[str]:
    """``[build-system] requires`` of a pyproject.toml."""
    # tomllib is Python >= 3.11; pip (in every venv) vendors tomli, the same parser, for older ones.
    toml = _import_first("tomllib", "pip._vendor.tomli")
    if toml is None:
        raise MetadataError("no TOML parser here (Python < 3.11 without pip)")
    system = toml.loads(text).get("build-system", {})
    if not isinstance(system, dict):
        raise MetadataError(f"[build-system] must be a table, not {_shown(system)}")
    return _string_list(system.get("requires", []), "[build-system] requires")


def _setup_py_requires(text: str) -> list[str]:
    """Every literal ``setup_requires=[...]`` keyword in a setup.py, read and never run."""
    calls = [n for n in ast.walk(ast.parse(text)) if isinstance(n, ast.Call)]
    found: list[str] = []
    for keyword in (k for call in calls for k in call.keywords if k.arg == "setup_requires"):
        try:
            value = ast.literal_eval(keyword.value)
        except (ValueError, TypeError):  # computed at build time: what it holds cannot be known without running it
            raise MetadataError(f"setup_requires is computed ({_shown(ast.unparse(keyword.value))}), "
                                "not a literal list") from None
        found += _string_list(value, "setup_requires")
    return found


def _setup_cfg_requires(text: str) -> list[str]:
    """``[options] setup_requires`` of a setup.cfg: one requirement a line, ``#`` comments dropped (as setuptools)."""
    config = configparser.ConfigParser(interpolation=None)
    config.read_string(text)
    lines = (re.sub(r"(^|\s)#.*$", "", line).strip()
             for line in config.get("options", "setup_requires", fallback="").splitlines())
    return _string_list([line for line in lines if line], "[options] setup_requires")


# The top-level files of a source distribution that declare build requirements, in the order they are reported.
_METADATA_READERS = {"pyproject.toml": _pyproject_requires, "setup.py": _setup_py_requires,
                     "setup.cfg": _setup_cfg_requires}
# What malformed metadata can raise from the readers: ValueError covers MetadataError, TOMLDecodeError and NUL-holding
# text; over-deep nesting is a RecursionError in tomllib and ast.literal_eval, a MemoryError in the ast parser.
_PARSE_ERRORS = (ValueError, SyntaxError, RecursionError, MemoryError, configparser.Error)


def _metadata_files(archive: BinaryIO) -> dict[str, str]:
    """The top-level files of :data:`_METADATA_READERS` in a .tar.gz stream, by name, read as a stream: nothing else
    is kept, each file is capped at SDIST_MEMBER_MAX_BYTES, the download at SDIST_MAX_BYTES and everything unpacked
    (headers and skipped files included) at SDIST_UNPACKED_MAX_BYTES.

    Raises:
        MetadataError: a cap (or SDIST_MEMBERS_MAX) is exceeded. tarfile, gzip, zlib and OSError errors pass through.
    """
    # The archive is unpacked here rather than by tarfile's "r|gz", so the cap on unpacked bytes also bounds what
    # tarfile buffers for a header (a GNU long name or pax header is read whole, whatever size it claims).
    files: dict[str, str] = {}
    with gzip.GzipFile(fileobj=_CappedStream(archive, SDIST_MAX_BYTES, "the download"), mode="rb") as packed, \
            tarfile.open(fileobj=_CappedStream(packed, SDIST_UNPACKED_MAX_BYTES, "the unpacked archive"),
                         mode="r|") as tar:
        for count, member in enumerate(tar, 1):
            if count > SDIST_MEMBERS_MAX:  # tarfile keeps every member's header it has read
                raise MetadataError(f"the archive holds more than {SDIST_MEMBERS_MAX} files")
            parts = Path(member.name).parts
            if not (member.isfile() and len(parts) == 2 and parts[1] in _METADATA_READERS):
                continue
            if member.size > SDIST_MEMBER_MAX_BYTES:
                raise MetadataError(f"{parts[1]} is {member.size} bytes, over the {SDIST_MEMBER_MAX_BYTES >> 20} "
                                    "MiB this installer reads")
            files[parts[1]] = tar.extractfile(member).read().decode("utf-8", "replace")
    return files


def _nesting(text: str) -> int:
    """How many parentheses are open at once, at most, in ``text``."""
    depth = deepest = 0
    for char in text:
        depth += (char == "(") - (char == ")")
        deepest = max(deepest, depth)
    return deepest


def _usable_requirements(found: list[str], notes: list[str]) -> tuple[str, ...]:
    """The strings of ``found`` that parse as PEP 508 requirements by name, each as packaging writes it, without
    repeats; the rest (pip options such as ``--index-url=...`` or ``-e ...``, ``name @ URL`` references, anything
    that does not parse, over :data:`REQUIREMENT_MAX_CHARS` or nesting parentheses deeper than
    :data:`MARKER_NESTING_MAX`) are dropped with one line in ``notes``, since each string becomes one argument of pip.

    Raises:
        MetadataError: there is no PEP 508 parser to check them with.
    """
    # The installer starts on an interpreter's bare venv, where packaging is usually not installed yet; pip, which
    # every venv has and this installer drives, vendors it, so its copy is the fallback.
    pep508 = _import_first("packaging.requirements", "pip._vendor.packaging.requirements")
    if pep508 is None:
        raise MetadataError("neither packaging nor pip's copy of it imports here to check its requirements")
    kept, dropped = [], []
    for text in found:
        # Both bounds are ours, so the answer does not depend on the interpreter: pip 23's copy of packaging recurses
        # once per parenthesis, and whether it raises RecursionError depends on sys.getrecursionlimit(), which other
        # code raises (torch.compile sets it to at least 2000).
        try:
            usable = len(text) <= REQUIREMENT_MAX_CHARS and _nesting(text) <= MARKER_NESTING_MAX
            req = pep508.Requirement(text) if usable else None
        except (pep508.InvalidRequirement, RecursionError):
            req = None
        if req is None or req.url or text.lstrip().startswith("-"):
            dropped.append(text)
        else:
            kept.append(str(req))
    if dropped:
        notes.append(f"ignored {len(dropped)} build requirement(s) that are not PEP 508 requirements by name "
                     f"(options and URLs never reach pip): {', '.join(map(_shown, dropped[:3]))}"
                     + (", …" if len(dropped) > 3 else ""))
    return tuple(dict.fromkeys(kept))


def declared_build_requires(archive: BinaryIO, notes: list[str]) -> tuple[str, ...] | None:
    """The build requirements a source distribution (a .tar.gz stream, e.g. a download) declares: ``[build-system]
    requires`` of its pyproject.toml, every literal ``setup_requires=[...]`` of its setup.py and ``[options]
    setup_requires`` of its setup.cfg, read (streamed, with size caps) and never run. The archive is untrusted:
    only strings that parse as PEP 508 requirements by name are returned (see :func:`_usable_requirements`).

    None when it holds none of those files, or when anything about them is wrong (an unreadable archive, a file
    over its cap, malformed TOML or Python, a value that is not a list of strings, ...): then one line saying why
    goes to ``notes`` and the caller uses its own list. Never raises for what the archive holds.
    """
    try:
        files = _metadata_files(archive)
        found: list[str] = []
        for name, read in _METADATA_READERS.items():
            if name in files:
                try:
                    found += read(files[name])
                except _PARSE_ERRORS as e:
                    why = "nested too deeply" if isinstance(e, (RecursionError, MemoryError)) else _why(e)
                    raise MetadataError(f"{name}: {why}") from None
        return _usable_requirements(found, notes) if files else None
    except (MetadataError, tarfile.TarError, OSError, EOFError, zlib.error) as e:
        notes.append(f"its build metadata is not used ({_why(e)}); "
                     "install_dependencies.py's own list is used instead")
        return None


def _sdist_links(page_url: str) -> list[tuple[str, str]]:
    """``(file name, absolute URL)`` of every .tar.gz a PEP 503 project page (or a local find-links folder) lists."""
    if "://" not in page_url:
        folder = Path(page_url)
        return [(f.name, f.as_uri()) for f in folder.glob("*.tar.gz")] if folder.is_dir() else []
    if page_url.startswith("file:") and Path(unquote(urlparse(page_url).path)).is_dir():
        page_url = urljoin(page_url, "index.html")
    with urllib.request.urlopen(page_url, timeout=PROBE_TIMEOUT_S) as response:
        html = response.read(SDIST_MAX_BYTES).decode("utf-8", "replace")
    links = [urljoin(page_url, href.split("#")[0]) for href in re.findall(r'href="([^"]+)"', html)]
    return [(unquote(urlparse(url).path).rsplit("/", 1)[-1], url) for url in links if url.endswith(".tar.gz")]


def read_build_requires(req: Requirement, sources: PipSources) -> BuildRequires | None:
    """What ``req``'s build needs, read from the newest source distribution that ``sources`` offer for it (its index
    pages and find-links folders are read; the one archive is streamed, see :func:`declared_build_requires`); None
    when none is found or its metadata is not used. What is dropped or not used is printed, one ``note:`` line."""
    candidates = []
    for place in (*(f"{i.rstrip('/')}/{req.name}/" for i in sources.indexes), *sources.find_links):
        try:
            links = _sdist_links(place)
        except (OSError, ValueError):
            continue
        for filename, url in links:
            project, _, version = filename[:-len(".tar.gz")].rpartition("-")
            key = version_key(version)
            if normalize_name(project) == req.name and key is not None and satisfies(version, req.specs) is not False:
                candidates.append((key, filename, url))
    for _, filename, url in sorted(candidates, reverse=True)[:1]:
        notes: list[str] = []
        try:
            with urllib.request.urlopen(url, timeout=60) as response:
                declared = declared_build_requires(response, notes)
        except (OSError, ValueError, http.client.HTTPException) as e:  # e.g. a connection cut mid-download
            declared = None
            notes.append(f"cannot be downloaded ({_why(e)}); install_dependencies.py's own list is used instead")
        for note in notes:
            print(f"note: {filename}: {note}")
        if declared is not None:
            return BuildRequires(declared, f"declared in {filename}")
    return None


def probe_build_requires(info: PlatformInfo, reqs: RequirementSet) -> PlatformInfo:
    """``info`` with ``build_requires`` read for every CUDA extra that passes its preflight here (a real run on
    CUDA; see :func:`read_build_requires`)."""
    buildable = [r for r in reqs.cuda_extras if cuda_extra_preflight(info, r) is None]
    if info.kind != "cuda" or not buildable:
        return info
    print("Reading the build requirements of " + ", ".join(r.name for r in buildable), flush=True)
    configured = configured_sources(info.python)
    found = {r.name: read_build_requires(r, configured) for r in buildable}
    return replace(info, build_requires={name: b for name, b in found.items() if b is not None})


# --------------------------------------------------------------------------------------------------
# Planning: a pure function of (platform, requirements, installed versions) -> steps
# --------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class ExtraRule:
    """How to preflight and verify one optional CUDA extension."""

    min_cc: tuple[int, int]
    max_cc: tuple[int, int]
    verify: str          # Python run in the target interpreter; must exit 0


_ADAM_ATAN2_CHECK = """
import math, torch
import adam_atan2_backend  # the compiled kernel; a build without it installs silently but cannot run
from adam_atan2 import AdamATan2
p = torch.nn.Parameter(torch.ones(4, device="cuda"))
p.grad = torch.full_like(p, 0.5)
AdamATan2([p], lr=0.1, betas=(0.9, 0.99), weight_decay=0.0).step()
# one step by hand (docs/REFERENCE.md, AdamATan2): m = 0.05, v = 0.0025, bias corrections 0.1 and 0.01
want = 1 - 0.1 / 0.1 * math.atan2(0.05, math.sqrt(0.0025) / math.sqrt(0.01))
assert abs(p[0].item() - want) < 1e-5, (p[0].item(), want)
"""

_FLASH_ATTN_CHECK = """
import torch, torch.nn.functional as F
from flash_attn import flash_attn_func
q, k, v = (torch.randn(1, 16, 2, 64, device="cuda", dtype=torch.float16) for _ in range(3))  # [B, S, H, D]
out = flash_attn_func(q, k, v)
ref = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)).transpose(1, 2)
assert out.shape == q.shape and (out - ref).abs().max().item() < 1e-2
"""

EXTRA_RULES = {
    # adam-atan2 0.0.3 compiles kernels for sm_80..sm_90 only (docs/REFERENCE.md, AdamATan2).
    "adam-atan2": ExtraRule((8, 0), (9, 0), _ADAM_ATAN2_CHECK),
    # FlashAttention-2 supports Ampere, Ada and Hopper.
    "flash-attn": ExtraRule((8, 0), (9, 0), _FLASH_ATTN_CHECK),
}


def import_check(name: str) -> str:
    """Verification for an extra without a rule: its module (name with ``-`` -> ``_``) must import."""
    return f"import {name.replace('-', '_')}"


@dataclass
class Step:
    """One pip install. ``CONSTRAINTS`` in ``argv`` becomes the real constraints file at run time."""

    kind: str                         # "torch" (the torch/torchvision pair) | "base" | "build-tools" | "extra"
    name: str                         # "torch and torchvision", the base file, or the extra's name
    argv: list[str]
    env: dict[str, str] = field(default_factory=dict)
    verify: str | None = None         # extras: code that must exit 0 after installing
    installed: str | None = None      # extras: version already installed that meets the spec (verify only)


@dataclass
class Plan:
    """The ordered steps plus everything the user should read before they run."""

    steps: list[Step]
    torch_command: list[str] | None       # what a fresh torch/torchvision install runs; None: nothing safe here
    torch_note: str                       # where that pair comes from, or why it cannot be installed here
    pins: list[str]                       # the constraints file: the kept torch (and torchvision) builds
    satisfied: list[str]                  # base requirements already met: "numpy 2.1.0"
    skipped: dict[str, str]               # extra name -> why it is not attempted
    warnings: list[str]
    errors: list[str]
    build_notes: list[str] = field(default_factory=list)  # why each extra build requirement is installed


def max_jobs(ram_gb: float, cpu_count: int) -> int:
    """Parallel compile jobs for CUDA extensions: one per ``GB_PER_BUILD_JOB`` GB of RAM, capped by cores."""
    return max(1, min(cpu_count, int(ram_gb // GB_PER_BUILD_JOB)))


def _cc(text: str) -> tuple[int, int]:
    major, minor = text.split(".")
    return int(major), int(minor)


def cuda_extra_preflight(info: PlatformInfo, req: Requirement) -> str | None:
    """Why ``req`` (a CUDA extension) cannot be built here, or None when it can."""
    rule = EXTRA_RULES.get(req.name)
    if info.system != "Linux":
        return f"{info.system} is not Linux: the CUDA extensions build on Linux only"
    if not info.torch_cuda:
        return f"torch {info.torch_version} is not a CUDA build"
    if rule:
        if info.compute_capability is None:
            return "GPU compute capability unknown (nvidia-smi did not report compute_cap)"
        if not rule.min_cc <= _cc(info.compute_capability) <= rule.max_cc:
            return (f"compute capability {info.compute_capability} is outside the "
                    f"{'.'.join(map(str, rule.min_cc))}-{'.'.join(map(str, rule.max_cc))} range {req.name} supports")
    if not info.nvcc_path:
        return (f"nvcc not found: install the CUDA {info.torch_cuda} toolkit and put its bin/ on PATH "
                "(or set CUDA_HOME)")
    if not info.nvcc_version:
        return f"could not read the version of {info.nvcc_path}"
    if info.nvcc_version.split(".")[0] != info.torch_cuda.split(".")[0]:
        return (f"nvcc {info.nvcc_version} does not match torch's CUDA {info.torch_cuda} (major versions must "
                f"agree): install the CUDA {info.torch_cuda.split('.')[0]}.x toolkit or set CUDA_HOME to it")
    if not info.cuda_home:
        return f"CUDA_HOME is not set and no toolkit headers were found next to {info.nvcc_path}: export CUDA_HOME"
    return None


def build_env(info: PlatformInfo) -> dict[str, str]:
    """Environment for compiling CUDA extensions; values the user already set are kept."""
    env = {"MAX_JOBS": str(max_jobs(info.ram_gb, info.cpu_count))}
    if info.compute_capability:
        env["TORCH_CUDA_ARCH_LIST"] = info.compute_capability  # build for this GPU only: minutes, not hours
    if info.cuda_home:
        env["CUDA_HOME"] = info.cuda_home
    return {k: v for k, v in env.items() if k not in os.environ}


def pip_install(info: PlatformInfo) -> list[str]:
    """The start of a ``pip install`` command for the Python being set up."""
    return [info.python, "-m", "pip", "install"]


def pair_install(info: PlatformInfo, reqs: RequirementSet) -> tuple[list[str] | None, str]:
    """The one pip call that installs the pinned torch/torchvision pair on this platform, and a line saying where
    the builds come from; (None, what is missing and the command to run elsewhere) when no source is safe.

    Linux without an NVIDIA GPU must never download CUDA wheels (PyPI's Linux x86_64 torch is the CUDA build, with
    several GB of nvidia-* libraries). Its sources, best first, from what main() probed:
      1. the CPU builds (:func:`cpu_pair`) from pip's configured sources, as on a machine with a local copy;
      2. the CPU builds from the PyTorch CPU index: an extra index on x86_64 (the ``+cpu`` pins keep pip to the CPU
         build, and torch's dependencies still come from PyPI); the only index on aarch64;
      3. the plain pair as wheels on local disk (:func:`probe_local_pair`), given to pip by path so that it takes
         exactly those files: CUDA builds run on the CPU, they are only large.
    macOS (MPS), Windows and Linux with an NVIDIA GPU take PyPI's default builds.
    """
    t, v = reqs.pair
    pip = pip_install(info)
    if not (info.system == "Linux" and info.kind != "cuda"):
        return pip + [f"torch=={t}", f"torchvision=={v}"], ""
    builds = cpu_pair(info, reqs)
    where = {info.build_sources.get(b) for b in builds}
    cpu_index = ["--extra-index-url" if _is_x86(info) else "--index-url", PYTORCH_CPU_INDEX]
    if where == {"configured"}:
        return pip + builds, "the CPU builds, from pip's configured sources"
    if None not in where:
        return pip + builds + cpu_index, f"the CPU builds, from {PYTORCH_CPU_INDEX}"
    if info.local_pair:
        local = info.local_pair
        what = (f"CUDA builds, {local['gb']:.1f} GB with their CUDA libraries, that run on the CPU" if local["cuda"]
                else f"{local['gb']:.1f} GB")
        return pip + local["files"], (f"torch {t} and torchvision {v} from the local copy in "
                                      f"{', '.join(local['where'])}: {what} (no source offers {' '.join(builds)})")
    return None, (f"cannot install torch {t} and torchvision {v} here without downloading several GB of CUDA wheels: "
                  f"neither pip's configured sources nor {PYTORCH_CPU_INDEX} (unreachable?) offer the CPU builds, and "
                  f"pip has no local copy of the pair; where that index is reachable, run "
                  f"`{shlex.join(pip + builds + cpu_index)}`, then re-run this installer")


def _torchvision_for_kept_torch(info: PlatformInfo, plan: Plan) -> list[str]:
    """Keep a torchvision that matches the kept torch (pinning it), or return the pip arguments that install the
    matching one (``torchvision==0.28.0+cpu``, plus the index that serves it); errors go to ``plan``."""
    torch_version, have = info.torch_version, info.torchvision_version
    want = matching_torchvision(torch_version)
    if have and not info.torchvision_error and (want is None or same_build(have, want)):
        plan.satisfied.append(f"torchvision {have}")
        plan.pins.append(f"torchvision=={have}")
        if want is None:
            plan.warnings.append(f"keeping torchvision {have}: this installer does not know which torchvision "
                                 f"release pairs with torch {torch_version}")
        return []
    state = (f"fails to import ({info.torchvision_error})" if info.torchvision_error
             else f"is {have}, built for another torch" if have else "is not installed")
    if want is None:
        plan.errors.append(f"torchvision {state}, and this installer does not know which torchvision release pairs "
                           f"with torch {torch_version}: install the one built for it, then re-run")
        return []
    if have and not info.torchvision_error:
        plan.warnings.append(f"replacing torchvision {have} with {want}, the release built for torch {torch_version}")
    if local_label(want) is None:  # a plain build: pip's usual sources have it
        return [f"torchvision=={want}"]
    where, index = info.build_sources.get(f"torchvision=={want}"), label_index(want)
    if where is None:
        command = pip_install(info) + [f"torchvision=={want}", "--extra-index-url", str(index)]
        plan.errors.append(f"torchvision {state}, and {want}, the build that matches torch {torch_version}, is "
                           + (f"offered neither by pip's configured sources nor by {index}: where that index is "
                              f"reachable, run `{shlex.join(command)}`" if index else
                              "not on any index this installer knows: install it yourself")
                           + ", then re-run this installer")
        return []
    return [f"torchvision=={want}"] + ([] if where == "configured" else ["--extra-index-url", where])


def make_plan(info: PlatformInfo, reqs: RequirementSet, installed: dict[str, str],
              cuda_extras: bool = True) -> Plan:
    """Turn the platform and what is installed into the list of pip steps. Pure: runs nothing."""
    command, note = pair_install(info, reqs)
    plan = Plan(steps=[], torch_command=command, torch_note=note, pins=[], satisfied=[], skipped={}, warnings=[],
                errors=[])
    if info.rosetta:
        plan.warnings.append("this Python is x86_64 running under Rosetta, which hides the Apple GPU (MPS) and has "
                             "no torch wheels: install an arm64 Python (python.org universal2 or `arch -arm64 "
                             "brew install python`) and re-run with it")
    if info.nvidia_smi_error and info.kind == "cpu":
        plan.warnings.append(f"nvidia-smi is installed but failed ({info.nvidia_smi_error}), so this plan is for "
                             "the CPU; repair the NVIDIA driver (often a reboot after a driver update) and re-run")
    torchvision = _plan_torch(info, reqs, plan)
    _plan_base(info, reqs, installed, torchvision, plan)
    _plan_extras(info, reqs, installed, cuda_extras, plan)
    return plan


def _plan_torch(info: PlatformInfo, reqs: RequirementSet, plan: Plan) -> list[str]:
    """Keep a working torch (pinned, with warnings where it cannot serve this machine) or plan the pinned pair
    when there is none; returns the torchvision requirement a kept torch still needs (``[]`` if none)."""
    command, note = plan.torch_command, plan.torch_note
    if info.torch_error:
        plan.errors.append(f"torch is installed but `import torch` fails ({info.torch_error}); "
                           + (f"repair it with: {shlex.join(command + ['--force-reinstall'])}" if command else note))
        return []
    if info.torch_version is None:
        if info.rosetta:
            plan.errors.append("torch is not installed and cannot be under Rosetta: use an arm64 Python")
        elif command is None:
            plan.errors.append(note)
        else:
            plan.steps.append(Step("torch", "torch and torchvision", command))
        return []
    plan.pins.append(f"torch=={info.torch_version}")
    torchvision = _torchvision_for_kept_torch(info, plan)
    if satisfies(info.torch_version, reqs.torch.specs) is False:
        plan.warnings.append(f"keeping the working torch {info.torch_version}, which differs from the pinned "
                             f"{reqs.torch.text} the project is tested with")
    if info.kind == "cuda" and not info.torch_cuda:
        plan.warnings.append(f"torch {info.torch_version} is a CPU build on an NVIDIA machine, so training "
                             "will run on the CPU: reinstall torch with the --index-url for your CUDA version "
                             "from https://pytorch.org/get-started/locally/")
    elif info.kind == "cuda" and not info.torch_cuda_available:
        plan.warnings.append(f"torch {info.torch_version} (CUDA {info.torch_cuda}) cannot reach the GPU: driver "
                             f"{info.driver_version} may be older than CUDA {info.torch_cuda} needs")
    return torchvision


def _plan_base(info: PlatformInfo, reqs: RequirementSet, installed: dict[str, str], torchvision: list[str],
               plan: Plan) -> None:
    """The base requirements that are not met (and a kept torch's torchvision), in one pip call under the
    torch pin."""
    missing = []
    for r in reqs.base:
        if satisfies(installed.get(r.name), r.specs):
            plan.satisfied.append(f"{r.name} {installed[r.name]}")
        else:
            missing.append(r.text)
    if missing or torchvision:
        plan.steps.append(Step("base", reqs.base_file, pip_install(info) + torchvision[1:] + ["-c", CONSTRAINTS]
                               + torchvision[:1] + missing))


def _plan_extras(info: PlatformInfo, reqs: RequirementSet, installed: dict[str, str], cuda_extras: bool,
                 plan: Plan) -> None:
    """The optional extras, each on its own pip call so one failure cannot take the others down; the CUDA
    ones only where their preflight passes, after the build tools and build requirements they need."""
    pip = pip_install(info)
    extras, needs = [], {}
    for r in reqs.cuda_extras:
        needs[r.name] = info.build_requires.get(r.name) or known_build_requires(r.name)
        if not cuda_extras:
            plan.skipped[r.name] = "disabled by --no-cuda-extras"
        elif info.kind != "cuda":
            plan.skipped[r.name] = f"needs an NVIDIA GPU; platform is {info.kind}"
        elif info.torch_version is None:
            plan.skipped[r.name] = "decided after torch is installed; the preflight needs torch.version.cuda"
        elif why := cuda_extra_preflight(info, r):
            first = needs[r.name].packages
            plan.skipped[r.name] = why + (f"; where it builds, its build requirements go in first: {', '.join(first)} "
                                          f"({needs[r.name].source})" if first else "")
        else:
            rule = EXTRA_RULES.get(r.name)
            extras.append((r, build_env(info), rule.verify if rule else import_check(r.name)))
    building = [r for r, _, _ in extras if not satisfies(installed.get(r.name), r.specs)]
    tools = {t: "BUILD_TOOLS" for t in BUILD_TOOLS} if building else {}
    for r in building:
        for package in needs[r.name].packages:
            tools.setdefault(package, f"a build requirement of {r.name} ({needs[r.name].source})")
    missing = [t for t in tools if _requirement_name(t) not in installed]
    if missing:
        plan.steps.append(Step("build-tools", "build tools", pip + ["-c", CONSTRAINTS] + missing))
        plan.build_notes = [f"{t}: {tools[t]}" for t in missing if tools[t] != "BUILD_TOOLS"]
    extras += [(r, {}, import_check(r.name)) for r in reqs.optional]
    for r, env, verify in extras:
        have = installed.get(r.name)
        # --no-build-isolation: they import torch to build; an isolated build env has no (or another) torch.
        plan.steps.append(Step("extra", r.name, pip + ["--no-build-isolation", "-c", CONSTRAINTS, r.text], env,
                               verify, have if satisfies(have, r.specs) else None))


def _requirement_name(text: str) -> str:
    """The normalized project name of a requirement string (``setuptools_scm>=8`` -> ``setuptools-scm``)."""
    m = _NAME_RE.match(text.strip())
    return normalize_name(m.group(1)) if m else text


# --------------------------------------------------------------------------------------------------
# Execution
# --------------------------------------------------------------------------------------------------

def run_pip(argv: list[str], env: dict[str, str] | None, log: list[str]) -> tuple[int, str]:
    """Run a pip command that changes the environment, echoing its output and appending it to ``log``;
    returns (exit code, last lines of output)."""
    log.append(_show(argv, env))
    print(f"  $ {log[-1]}", flush=True)
    tail: list[str] = []
    with _child(argv, {**os.environ, **(env or {})}, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                text=True) as proc:
        for line in proc.stdout:
            print(f"    | {line.rstrip()}", flush=True)
            tail = (tail + [line.rstrip()])[-60:]  # a failed build's traceback sits above pip's summary
        return proc.wait(), "\n".join(tail)


def _show(argv: list[str], env: dict[str, str] | None = None) -> str:
    prefix = " ".join(f"{k}={v}" for k, v in (env or {}).items())
    return (prefix + " " if prefix else "") + shlex.join(argv)


def resolver_conflict(tail: str) -> str | None:
    """The two sides of a pip resolver conflict, from the block pip prints under "The conflict is caused by:"
    (pip 23.2.1 and 26.x alike: "swapper 1.0 depends on torch==2.12.0", "The user requested (constraint)
    torch==2.14.1"); None when pip printed no such block."""
    lines = [ln.strip(" |│╰─>×") for ln in tail.splitlines()]
    if "The conflict is caused by:" not in lines:
        return None
    start = lines.index("The conflict is caused by:") + 1
    end = lines.index("", start) if "" in lines[start:] else len(lines)
    return "; ".join(lines[start:end]) or None


def _pip_error(tail: str) -> str:
    """The telling part of a failed pip run: a resolver conflict's two sides, or pip's ``error: <kind>`` line
    plus the build's own exception."""
    conflict = resolver_conflict(tail)
    if conflict:
        return f"conflict: {conflict}"[:400]
    lines = [ln.strip(" |│╰─>×") for ln in tail.splitlines()]
    pip_err = [ln for ln in lines if ln.lower().startswith("error:")]
    exc = [ln for ln in lines if re.match(r"^[\w.]*(Error|Exception)\b[^:]*: ", ln)]
    picked = [x[-1] for x in (pip_err, exc) if x] or [ln for ln in lines if ln][-1:] or ["no output"]
    return "; ".join(picked)[:400]


def find_conflict(python: str, requested: list[str], pins: list[str]) -> str | None:
    """Which requested package requires another version of a pinned one (``pins``: ["torch==2.14.1", ...]), for a
    pip that said only ``ResolutionImpossible``: a dry run with ``--no-deps`` reads the metadata of each requested
    package (nothing is installed, the pinned packages are not fetched). Looks at direct requirements only."""
    pinned = dict(pin.split("==", 1) for pin in pins)
    with tempfile.TemporaryDirectory(prefix="hrm-install-") as tmp:
        report = Path(tmp, "report.json")
        out = _capture([python, "-m", "pip", "install", "--dry-run", "--no-deps", "--ignore-installed", "--quiet",
                        "--report", str(report), *requested], timeout=600)
        try:
            items = json.loads(report.read_text(encoding="utf-8"))["install"] if out and out[0] == 0 else []
        except (OSError, ValueError, KeyError):
            items = []
    for item in items:
        meta = item.get("metadata", {})
        for dependency in meta.get("requires_dist") or []:
            text, _, marker = dependency.partition(";")
            m = _NAME_RE.match(text.strip())
            if not m or "extra" in marker or normalize_name(m.group(1)) not in pinned:
                continue
            name, spec = normalize_name(m.group(1)), m.group(2).strip().strip("()").replace(" ", "")
            parts = [_SPEC_RE.match(x) for x in spec.split(",")] if spec else []
            if all(parts) and satisfies(pinned[name], tuple((x.group(1), x.group(2)) for x in parts)) is False:
                return (f"{meta.get('name')} {meta.get('version')} depends on {name}{spec}, but {name} is pinned "
                        f"to the installed {pinned[name]}")
    return None


def verify_extra(python: str, step: Step) -> str | None:
    """Run the extra's check in a fresh interpreter; None when it passes, else the error."""
    out = _capture([python, "-c", step.verify], timeout=600)
    if out is None:
        return f"cannot run {python}"
    return None if out[0] == 0 else _last_line(out[2] or out[1])


def ensure_extra(python: str, step: Step, constraints: str, log: list[str]) -> dict:
    """Install (if needed) and verify one optional extra; remove it again when it does not work."""
    result = {"name": step.name, "spec": step.argv[-1], "removed": False}
    if step.installed:
        why = verify_extra(python, step)
        if why is None:
            return result | {"status": "already-installed", "reason": f"{step.installed} verified"}
        print(f"  {step.name} {step.installed} is installed but fails its check ({why}); reinstalling")
        run_pip([python, "-m", "pip", "uninstall", "-y", step.name], None, log)
    rc, tail = run_pip([constraints if a == CONSTRAINTS else a for a in step.argv], step.env, log)
    why = f"pip install failed: {_pip_error(tail)}" if rc != 0 else None
    if why is None:
        check = verify_extra(python, step)
        why = None if check is None else f"installed but its check failed: {check}"
    if why is None:
        return result | {"status": "installed", "reason": "installed and verified"}
    if step.name in installed_versions(python):
        run_pip([python, "-m", "pip", "uninstall", "-y", step.name], None, log)
        result["removed"] = True
    return result | {"status": "failed", "reason": why}


def classify_pip_check(output: str, ours: set[str]) -> tuple[list[str], list[str]]:
    """Split `pip check` problem lines into those touching our packages (fatal) and the rest (warnings)."""
    mine, others = [], []
    for line in output.splitlines():
        if not line.strip() or line.startswith("No broken requirements"):
            continue
        words = {normalize_name(w) for w in re.findall(r"[A-Za-z0-9][A-Za-z0-9._-]*", line)}
        (mine if words & ours else others).append(line.strip())
    return mine, others


def training_backends(extras: list[dict], skipped: dict[str, str]) -> dict:
    """Which optimizer and attention implementations training will pick, and why."""
    status = {e["name"]: e for e in extras}

    def pick(pkg: str, native: str, fallback: str) -> dict:
        e = status.get(pkg)
        if e and e["status"] in ("installed", "already-installed"):
            return {"backend": native, "reason": f"{pkg} {e['reason']}"}
        why = e["reason"] if e else skipped.get(pkg, f"{pkg} is not in {CUDA_EXTRAS_FILE}")
        return {"backend": fallback, "reason": f"{pkg} not available: {why}"}

    return {"optimizer": pick("adam-atan2", "native adam-atan2 (CUDA kernel)",
                              "pure-PyTorch AdamATan2 (utils/optimizer_utils.py)"),
            "attention": pick("flash-attn", "flash_attn (FlashAttention-2)",
                              "torch SDPA (torch.nn.functional.scaled_dot_product_attention)")}


def execute(plan: Plan, info: PlatformInfo, reqs: RequirementSet, cuda_extras: bool) -> dict:
    """Run the plan and return the report (see :func:`main`). Stops early only when the base is broken."""
    report = {"ok": False, "platform": asdict(info), "torch": {"before": info.torch_version, "action": "kept"},
              "torchvision": {"before": info.torchvision_version},
              "base": {"file": reqs.base_file, "installed": [], "satisfied": plan.satisfied},
              "extras": [], "skipped": dict(plan.skipped), "warnings": list(plan.warnings),
              "errors": list(plan.errors), "commands": []}
    if report["errors"]:
        return report
    if any(s.kind == "torch" for s in plan.steps):
        info, plan = _install_torch(plan, info, reqs, cuda_extras, report)
        if report["errors"]:
            return report
    if not _run_steps(plan, info, report):
        return report
    _check_after(plan, info, reqs, report)
    report["training"] = training_backends(report["extras"], report["skipped"])
    report["ok"] = not report["errors"]
    return report


def _install_torch(plan: Plan, info: PlatformInfo, reqs: RequirementSet, cuda_extras: bool,
                   report: dict) -> tuple[PlatformInfo, Plan]:
    """Install the pinned torch/torchvision pair, then plan the rest again (the CUDA extras' preflight needs
    ``torch.version.cuda``); returns the platform and plan as they are now. A failure goes to ``report``."""
    step = next(s for s in plan.steps if s.kind == "torch")
    print("Installing torch and torchvision" + (f": {plan.torch_note}" if plan.torch_note else ""))
    rc, tail = run_pip(step.argv, None, report["commands"])
    info = with_torch(info, probe_torch(info.python))
    report["torch"]["action"] = "installed"
    if rc != 0 or info.torch_version is None or info.torchvision_version is None:
        why = _pip_error(tail) if rc else info.torch_error or info.torchvision_error or "torchvision is missing"
        report["errors"].append(f"torch and torchvision failed to install ({why}); command: {shlex.join(step.argv)}")
        return info, plan
    plan = make_plan(info, reqs, installed_versions(info.python), cuda_extras)
    report["skipped"], report["base"]["satisfied"] = dict(plan.skipped), plan.satisfied
    report["warnings"] += [w for w in plan.warnings if w not in report["warnings"]]
    report["errors"] += plan.errors
    return info, plan


def _run_steps(plan: Plan, info: PlatformInfo, report: dict) -> bool:
    """The base, build-tools and extra steps under a constraints file of the plan's pins; False when the base
    failed (the error is in ``report``), since nothing after it can work."""
    errors, log = report["errors"], report["commands"]
    with tempfile.TemporaryDirectory(prefix="hrm-install-") as tmp:
        constraints = str(Path(tmp, "constraints.txt"))
        Path(constraints).write_text("".join(f"{pin}\n" for pin in plan.pins), encoding="utf-8")
        for step in plan.steps:
            argv = [constraints if a == CONSTRAINTS else a for a in step.argv]
            if step.kind == "base":
                print(f"Installing missing base requirements from {step.name}")
                rc, tail = run_pip(argv, step.env, log)
                requested = argv[argv.index(constraints) + 1:]
                if rc != 0:
                    why = _pip_error(tail)
                    if not why.startswith("conflict:") and "ResolutionImpossible" in tail:
                        culprit = find_conflict(info.python, requested, plan.pins)
                        why += f"; conflict: {culprit}" if culprit else ""
                    errors.append(f"base requirements failed to install ({why}); command: {shlex.join(argv)}")
                    return False
                report["base"]["installed"] = requested
            elif step.kind == "build-tools":  # without them the extras fail, and say so; the base is fine
                print("Installing build tools for the CUDA extras")
                rc, tail = run_pip(argv, step.env, log)
                if rc != 0:
                    report["warnings"].append(f"build tools failed to install ({_pip_error(tail)}); "
                                              "the CUDA extras will likely fail to build")
            elif step.kind == "extra":
                print(f"Optional extra {step.name}")
                result = ensure_extra(info.python, step, constraints, log)
                print(f"  -> {result['status']}: {result['reason']}")
                report["extras"].append(result)
    return True


def _check_after(plan: Plan, info: PlatformInfo, reqs: RequirementSet, report: dict) -> None:
    """``pip check`` (only the project's packages' conflicts are errors), and, when anything was installed,
    that torch is the version it was and torchvision imports; the torch fields of ``report`` as they are now."""
    errors = report["errors"]
    out = _capture([info.python, "-m", "pip", "check"]) or (1, "", "pip not found")
    ours = {"torch", "torchvision"} | {r.name for r in reqs.base + reqs.cuda_extras + reqs.optional}
    mine, others = classify_pip_check(out[1] + out[2], ours)
    report["pip_check"] = {"ok": out[0] == 0, "output": (out[1] + out[2]).strip()}
    report["warnings"] += [f"pip check (not a project package): {ln}" for ln in others]
    errors += [f"pip check: {ln}" for ln in mine]

    now = {"torch_version": info.torch_version, "torchvision_version": info.torchvision_version}
    if report["commands"]:  # something was installed or removed: make sure torch survived it
        now = probe_torch(info.python)
        repair = shlex.join(plan.torch_command) if plan.torch_command else plan.torch_note
        if now["torch_version"] != info.torch_version:
            errors.append(f"torch changed from {info.torch_version} to {now['torch_version']} during the install: "
                          f"reinstall the pair with {repair}")
        elif now["torchvision_version"] is None:
            errors.append(f"torchvision does not import after the install ({now['torchvision_error'] or 'missing'}):"
                          f" install torchvision=={matching_torchvision(info.torch_version)}, the build that "
                          f"matches torch {info.torch_version}")
    report["platform"] = asdict(info)  # torch fields as they are now, after any install
    report["torch"] |= {"after": now["torch_version"], "cuda": info.torch_cuda}
    report["torchvision"]["after"] = now["torchvision_version"]


# --------------------------------------------------------------------------------------------------
# Output
# --------------------------------------------------------------------------------------------------

def describe_platform(info: PlatformInfo) -> list[str]:
    """Human-readable lines about the machine and its torch and torchvision."""
    torch = ("not installed" if info.torch_version is None and not info.torch_error
             else f"broken ({info.torch_error})" if info.torch_error
             else f"{info.torch_version} (" + (f"CUDA {info.torch_cuda}" if info.torch_cuda
                                               else "MPS build" if info.system == "Darwin" else "CPU build") + ")")
    torchvision = (f"broken ({info.torchvision_error})" if info.torchvision_error
                   else info.torchvision_version or "not installed")
    lines = [f"  OS          {info.system} {info.machine}, Python {info.python_version} ({info.python})",
             f"  platform    {info.kind}: {info.kind_reason}",
             f"  torch       {torch}",
             f"  torchvision {torchvision}",
             f"  machine     {info.ram_gb:.1f} GB RAM, {info.cpu_count} CPU cores"]
    if info.gpu_name:
        lines.append(f"  GPU         {info.gpu_count} x {info.gpu_name}, driver {info.driver_version}, "
                     f"compute capability {info.compute_capability or 'unknown'}")
    if info.nvcc_path:
        lines.append(f"  nvcc        {info.nvcc_version or '?'} at {info.nvcc_path} "
                     f"(CUDA_HOME {info.cuda_home or 'unset'})")
    return lines


def describe_plan(plan: Plan, info: PlatformInfo, show_fresh: bool = True) -> list[str]:
    """The plan as the numbered list --dry-run prints: every pip command, and why things are skipped.
    ``show_fresh`` adds the command a fresh torch/torchvision install would run when torch is kept."""
    lines, n = [], 0

    def item(text: str) -> None:
        nonlocal n
        n += 1
        lines.append(f"  {n}. {text}")

    steps = {s.kind: s for s in plan.steps}
    if "torch" in steps:
        item(f"install torch and torchvision: {shlex.join(plan.torch_command)}")
        if plan.torch_note:
            lines.append(f"     {plan.torch_note}")
    elif info.torch_version:
        fresh = (f"a fresh install would run: {shlex.join(plan.torch_command)}" if plan.torch_command
                 else "a fresh install is not possible here")
        item(f"keep torch {info.torch_version}" + (f" ({fresh})" if show_fresh else ""))
    if "base" in steps:
        item(f"install missing base requirements: {shlex.join(steps['base'].argv)}")
        pins = ", ".join(plan.pins) or "torch and torchvision as installed in step 1"
        lines.append(f"     {CONSTRAINTS} pins {pins}")
    if "build-tools" in steps:
        item(f"install build tools for the CUDA extras: {shlex.join(steps['build-tools'].argv)}")
        lines += [f"     {note}" for note in plan.build_notes]
    if plan.satisfied:
        item(f"already satisfied, no pip call: {', '.join(plan.satisfied)}")
    for s in (s for s in plan.steps if s.kind == "extra"):
        action = (f"verify the installed {s.installed}; if its check fails, reinstall with: " if s.installed
                  else "install, verify, and uninstall again if it fails: ")
        item(f"optional {s.name}: {action}{_show(s.argv, s.env)}")
    for name, why in plan.skipped.items():
        item(f"optional {name}: skipped ({why})")
    item(f"{shlex.join([info.python, '-m', 'pip', 'check'])}, then confirm torch is unchanged and torchvision imports")
    return lines


def describe_result(report: dict) -> list[str]:
    """The final summary printed after a real run."""
    t, tv = report["torch"], report["torchvision"]
    lines = [f"  torch       {t.get('after') or t['before']} ({t['action']})",
             f"  torchvision {tv.get('after') or tv['before']}",
             f"  base        {len(report['base']['satisfied'])} already satisfied, "
             f"{len(report['base']['installed'])} installed ({report['base']['file']})"]
    lines += [f"  {e['name']:<11} {e['status']}: {e['reason']}" + (" (removed)" if e["removed"] else "")
              for e in report["extras"]]
    lines += [f"  {name:<11} skipped: {why}" for name, why in report["skipped"].items()]
    if "pip_check" in report:
        lines.append(f"  pip check   {_last_line(report['pip_check']['output'])}")
    for key, value in report.get("training", {}).items():
        lines.append(f"  {key:<11} -> {value['backend']}: {value['reason']}")
    return lines


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    """Command-line options (see --help)."""
    p = Parser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter,
               epilog=__doc__.split("\n\n", 1)[1])
    p.add_argument("--dry-run", action="store_true", help="print the plan (every pip command) and change nothing")
    p.add_argument("--platform", choices=("auto",) + PLATFORMS, default="auto",
                   help="plan for this platform instead of the detected one (other platforms only with --dry-run; "
                        "'cpu' also works for real, e.g. to keep CUDA extras off an NVIDIA machine)")
    p.add_argument("--no-cuda-extras", action="store_true", help="do not try adam-atan2 / flash-attn")
    p.add_argument("--optional", type=Path, metavar="FILE",
                   help="extra optional requirements: each is installed on its own, verified by importing "
                        "its module, and removed again if it fails")
    p.add_argument("--requirements-dir", type=Path, default=REPO, metavar="DIR",
                   help="folder holding requirements*.txt (default: the repo root)")
    p.add_argument("--python", default=sys.executable,
                   help="interpreter (e.g. a venv's bin/python) to install into (default: this one)")
    p.add_argument("--report", type=Path, default=REPO / "install_report.json",
                   help="where to write the JSON report (default: install_report.json in the repo)")
    return p.parse_args(argv)


def check_arguments(args: argparse.Namespace) -> None:
    """Refuse, before any probe, a ``--requirements-dir`` that is not a folder holding requirements.txt, an
    ``--optional`` file that is not there, a ``--python`` that is no program, and a ``--report`` that is a folder or
    in a folder that is not there (tests/test_every_flag.py drives each).

    Raises:
        ArgumentError: naming the flag and what to give.
    """
    if not args.requirements_dir.is_dir():
        raise ArgumentError(f"--requirements-dir {args.requirements_dir} is not a folder: give the folder that holds "
                            "requirements*.txt (default: the repo root)")
    if not (args.requirements_dir / "requirements.txt").is_file():
        raise ArgumentError(f"requirements file {args.requirements_dir / 'requirements.txt'} not found: give "
                            "--requirements-dir the folder that holds requirements*.txt (default: the repo root)")
    if args.optional is not None and not args.optional.is_file():
        raise ArgumentError(f"--optional {args.optional} not found: give a requirements file")
    if shutil.which(args.python) is None:
        raise ArgumentError(f"cannot run {args.python}: pass an existing interpreter with --python")
    if args.report.is_dir() or not args.report.parent.is_dir():
        raise ArgumentError(f"--report {args.report}: give a file in an existing folder")


def main(argv: list[str] | None = None) -> int:
    """Entry point; returns the exit code (0 healthy, 1 broken base environment, 2 bad arguments, 130 Ctrl-C, 143
    SIGTERM)."""
    global _probe_cap_s
    args = parse_args(argv)
    _probe_cap_s = DRY_RUN_PROBE_TIMEOUT_S if args.dry_run else None
    try:
        with _stops_end_children():
            return _run(args)
    except KeyboardInterrupt as stop:
        signum = getattr(stop, "signum", signal.SIGINT)
        after = ("nothing was changed" if args.dry_run else
                 "the pip command running was ended: run python install_dependencies.py again to finish")
        print(f"stopped ({'SIGTERM' if signum == signal.SIGTERM else 'Ctrl-C'}); {after}", file=sys.stderr, flush=True)
        return 128 + signum
    finally:
        _probe_cap_s = None


def _run(args: argparse.Namespace) -> int:
    """:func:`main` after its command line: probe, plan, and (unless a dry run) install and report."""
    try:
        check_arguments(args)
        info = detect_platform(args.python)
        if args.platform != "auto":
            if not args.dry_run and args.platform not in (info.kind, "cpu"):
                print(f"error: --platform {args.platform} does not match this machine ({info.kind}); "
                      "preview it with --dry-run --platform " + args.platform, file=sys.stderr)
                return 2
            info = simulate_platform(info, args.platform)
        reqs = load_requirements(info.kind, args.requirements_dir, args.optional)
        info = probe_torch_and_sources(info, reqs, args.dry_run)
        if not (args.dry_run or args.no_cuda_extras):
            info = probe_build_requires(info, reqs)
        plan = make_plan(info, reqs, installed_versions(args.python), cuda_extras=not args.no_cuda_extras)
    except InstallError as e:
        print(f"error: {e}", file=sys.stderr)
        return e.exit_code

    print("Platform\n" + "\n".join(describe_platform(info)))
    print(("Plan (dry run: nothing will be changed)" if args.dry_run else "Plan") + "\n"
          + "\n".join(describe_plan(plan, info, show_fresh=args.dry_run)))
    for w in plan.warnings:
        print(f"warning: {w}")
    if args.dry_run:
        for e in plan.errors:
            print(f"error: {e}", file=sys.stderr)
        return 1 if plan.errors else 0

    report = execute(plan, info, reqs, cuda_extras=not args.no_cuda_extras)
    print("Result: " + ("OK, base environment healthy" if report["ok"] else "FAILED"))
    print("\n".join(describe_result(report)))
    for w in report["warnings"][len(plan.warnings):]:
        print(f"warning: {w}")
    for e in report["errors"]:
        print(f"error: {e}", file=sys.stderr)
    args.report.parent.mkdir(parents=True, exist_ok=True)
    args.report.write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
    print(f"Report written to {args.report}")
    return 0 if report["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
