"""Tests for install_dependencies.py.

Plans for every platform are checked by simulation (the planner is a pure function of a PlatformInfo).
The real pip paths run against a throw-away venv that sees this environment's packages
(``--system-site-packages``), with ``PIP_NO_INDEX`` so nothing touches the network, and the test
checks this environment is left exactly as it was.
"""

import base64
import hashlib
import importlib.metadata
import io
import json
import os
import shutil
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest
import torch

import install_dependencies as inst

REPO = Path(inst.__file__).resolve().parent
PY = "/venv/bin/python"
ALL_BASE = {"numpy": "2.1.0", "omegaconf": "2.3.0", "tqdm": "4.67.1", "tensorboard": "2.18.0",
            "pillow": "11.0.0", "pytest": "8.3.4"}
CUDA_OK = dict(kind="cuda", gpu_name="NVIDIA GeForce RTX 4090", gpu_count=1, driver_version="570.86.10",
               compute_capability="8.9", nvcc_path="/usr/local/cuda/bin/nvcc", nvcc_version="12.8",
               cuda_home="/usr/local/cuda", torch_version="2.13.0+cu128", torch_cuda="12.8", torch_cuda_available=True)


def make_info(**overrides) -> inst.PlatformInfo:
    fields = dict(python=PY, python_version="3.11.7", system="Linux", machine="x86_64", kind="cpu",
                  kind_reason="simulated", torch_version="2.13.0+cpu", ram_gb=64.0, cpu_count=16)
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


@pytest.mark.parametrize("torch_line", ["torch>=2.13", "torch", "torch==2.*"])
def test_torch_must_be_pinned_exactly(tmp_path, torch_line):
    (tmp_path / "requirements.txt").write_text(f"{torch_line}\nnumpy\n")
    (tmp_path / "requirements-cuda.txt").write_text("")
    with pytest.raises(inst.InstallError, match=r"must pin torch exactly"):
        inst.load_requirements("cpu", tmp_path)


def test_repo_requirement_files_split_into_torch_base_and_cuda_extras():
    cpu, mac = inst.load_requirements("cpu"), inst.load_requirements("apple-silicon")
    assert cpu.torch.text == "torch==2.13.0" and mac.torch == cpu.torch
    assert [r.name for r in mac.base] == [r.name for r in cpu.base] == list(ALL_BASE)
    assert mac.base_file == "requirements-apple-silicon.txt"
    assert [r.name for r in cpu.cuda_extras] == ["adam-atan2", "flash-attn"]


# ---- plans, by simulation -------------------------------------------------------------------------

def test_linux_cpu_never_asks_pip_for_a_cuda_torch():
    local = plan_for(make_info(torch_version=None, cpu_torch_in_sources=True))
    assert pip_installs(local)[0] == [PY, "-m", "pip", "install", "torch==2.13.0+cpu"]
    remote = plan_for(make_info(torch_version=None, cpu_torch_in_sources=False))
    assert pip_installs(remote)[0] == [PY, "-m", "pip", "install", "torch==2.13.0+cpu",
                                       "--extra-index-url", inst.PYTORCH_CPU_INDEX]
    arm = plan_for(make_info(torch_version=None, machine="aarch64"))
    assert pip_installs(arm)[0] == [PY, "-m", "pip", "install", "torch==2.13.0", "--index-url",
                                    inst.PYTORCH_CPU_INDEX]
    assert set(local.skipped) == {"adam-atan2", "flash-attn"} and all("NVIDIA" in w for w in local.skipped.values())


def test_base_requirements_install_only_what_is_missing_under_the_torch_constraint():
    plan = plan_for(make_info(), installed={k: v for k, v in ALL_BASE.items() if k != "tqdm"} | {"numpy": "1.20"})
    assert pip_installs(plan) == [[PY, "-m", "pip", "install", "-c", inst.CONSTRAINTS, "numpy>=1.24,<3",
                                   "tqdm>=4.66,<5"]]
    assert not any("torch" in a for a in pip_installs(plan)[0])


def test_rerun_with_everything_in_place_plans_no_pip_install():
    plan = plan_for(make_info())
    assert plan.steps == [] and plan.errors == [] and len(plan.satisfied) == len(ALL_BASE)


def test_apple_silicon_plan_uses_the_pypi_mps_build_and_no_cuda_extras():
    plan = plan_for(make_info(system="Darwin", machine="arm64", kind="apple-silicon", torch_version=None),
                    installed={})
    torch_step, base_step = plan.steps
    assert torch_step.argv == [PY, "-m", "pip", "install", "torch==2.13.0"]
    assert base_step.name == "requirements-apple-silicon.txt" and "numpy>=1.24,<3" in base_step.argv
    assert all("NVIDIA" in why for why in plan.skipped.values()) and not plan.warnings


def test_rosetta_python_gets_a_warning_and_cannot_install_torch():
    kept = plan_for(make_info(system="Darwin", machine="x86_64", kind="apple-silicon", rosetta=True))
    assert kept.errors == [] and any("Rosetta" in w and "arm64 Python" in w for w in kept.warnings)
    fresh = plan_for(make_info(system="Darwin", machine="x86_64", kind="apple-silicon", rosetta=True,
                               torch_version=None))
    assert fresh.steps == [] and any("arm64 Python" in e for e in fresh.errors)


def test_cuda_plan_builds_each_extra_alone_without_build_isolation():
    plan = plan_for(make_info(**CUDA_OK), installed=ALL_BASE | {"setuptools": "80.0", "packaging": "25.0"})
    assert [s.name for s in plan.steps] == ["build tools", "adam-atan2", "flash-attn"] and plan.skipped == {}
    assert plan.steps[0].argv == [PY, "-m", "pip", "install", "-c", inst.CONSTRAINTS, "wheel", "ninja"]
    for step in plan.steps[1:]:
        assert step.argv[:5] == [PY, "-m", "pip", "install", "--no-build-isolation"]
        assert step.argv[5:7] == ["-c", inst.CONSTRAINTS]
        assert step.env == {"MAX_JOBS": "16", "TORCH_CUDA_ARCH_LIST": "8.9", "CUDA_HOME": "/usr/local/cuda"}
        compile(step.verify, step.name, "exec")  # the check scripts must at least be valid Python
    assert "import adam_atan2_backend" in plan.steps[1].verify and "flash_attn_func(q, k, v)" in plan.steps[2].verify


def test_cuda_extra_already_installed_is_only_verified():
    tools = {t: "1.0" for t in inst.BUILD_TOOLS}
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
    ({"nvcc_version": "11.8"}, "nvcc 11.8 does not match torch's CUDA 12.8"),
    ({"nvcc_path": None, "nvcc_version": None}, "nvcc not found"),
    ({"compute_capability": None}, "compute capability unknown"),
    ({"cuda_home": None}, "CUDA_HOME is not set"),
    ({"torch_cuda": None, "torch_version": "2.13.0+cpu"}, "is not a CUDA build"),
    ({"system": "Windows"}, "not Linux"),
])
def test_cuda_extras_preflight_failures_are_reported_not_attempted(change, reason):
    plan = plan_for(make_info(**CUDA_OK | change))
    assert plan.steps == [] and set(plan.skipped) == {"adam-atan2", "flash-attn"}
    assert all(reason in why for why in plan.skipped.values()), plan.skipped


def test_cpu_torch_on_an_nvidia_machine_is_kept_with_a_warning():
    plan = plan_for(make_info(**CUDA_OK | {"torch_cuda": None, "torch_version": "2.13.0+cpu",
                                          "torch_cuda_available": False}))
    assert plan.steps == [] and any("CPU build on an NVIDIA machine" in w for w in plan.warnings)


def test_broken_nvidia_driver_is_called_out():
    plan = plan_for(make_info(nvidia_smi_error="Failed to initialize NVML: Driver/library version mismatch"))
    assert any("repair the NVIDIA driver" in w and "version mismatch" in w for w in plan.warnings)


def test_no_cuda_extras_flag_and_extras_deferred_until_torch_exists():
    assert set(plan_for(make_info(**CUDA_OK), cuda_extras=False).skipped.values()) == {"disabled by --no-cuda-extras"}
    fresh = plan_for(make_info(**CUDA_OK | {"torch_version": None, "torch_cuda": None}))
    assert fresh.steps[0].argv == [PY, "-m", "pip", "install", "torch==2.13.0"]
    assert all("after torch is installed" in why for why in fresh.skipped.values())


def test_broken_or_off_pin_torch():
    broken = plan_for(make_info(torch_version=None, torch_error="OSError: libtorch_cpu.so: cannot open"))
    assert broken.steps == [] and "--force-reinstall" in broken.errors[0] and "libtorch_cpu" in broken.errors[0]
    old = plan_for(make_info(torch_version="2.12.1+cpu"))
    assert old.steps == [] and any("differs from the pinned torch==2.13.0" in w for w in old.warnings)


@pytest.mark.parametrize("ram,cpus,jobs", [(64, 16, 16), (16, 32, 4), (256, 8, 8), (2, 8, 1), (0, 1, 1)])
def test_max_jobs_from_ram_capped_by_cores(ram, cpus, jobs):
    assert inst.max_jobs(ram, cpus) == jobs


def test_simulated_platforms_keep_detected_facts():
    mac = inst.simulate_platform(make_info(), "apple-silicon")
    assert (mac.system, mac.machine, mac.kind, mac.torch_version) == ("Darwin", "arm64", "apple-silicon", "2.13.0+cpu")
    assert "forced by --platform" in mac.kind_reason


def test_pip_check_problems_in_project_packages_are_fatal_others_are_not():
    out = ("torch 2.13.0+cpu requires sympy, which is not installed.\n"
           "somepkg 1.0 has requirement otherpkg>=2, but you have otherpkg 1.0.\n")
    mine, others = inst.classify_pip_check(out, {"torch", "numpy"})
    assert mine == ["torch 2.13.0+cpu requires sympy, which is not installed."] and len(others) == 1
    assert inst.classify_pip_check("No broken requirements found.\n", {"torch"}) == ([], [])


def test_pip_error_names_pip_error_kind_and_the_build_exception():
    tail = ("      RuntimeError: CUDA_HOME environment variable is not set\n      [end of output]\n"
            "  note: This error originates from a subprocess\nerror: metadata-generation-failed\n")
    assert inst._pip_error(tail) == "error: metadata-generation-failed; RuntimeError: CUDA_HOME environment variable is not set"


def test_training_backends_follow_the_extras():
    ok = inst.training_backends([
        {"name": "adam-atan2", "status": "installed", "reason": "installed and verified"},
        {"name": "flash-attn", "status": "failed", "reason": "pip install failed: x"}], {})
    assert ok["optimizer"]["backend"].startswith("native adam-atan2")
    assert ok["attention"]["backend"].startswith("torch SDPA") and "pip install failed" in ok["attention"]["reason"]


# ---- execution with pip stubbed out (logic only; nothing is installed) ----------------------------

def test_execute_reports_torch_swapped_during_install(monkeypatch):
    info = make_info()
    reqs = inst.load_requirements("cpu")
    plan = inst.make_plan(info, reqs, {})
    monkeypatch.setattr(inst, "run_pip", lambda argv, env, log: (log.append(" ".join(argv)), (0, ""))[1])
    monkeypatch.setattr(inst, "probe_torch", lambda python: {"torch_version": "2.12.0+cu121"})
    monkeypatch.setattr(inst, "_capture", lambda argv, **kw: (0, "No broken requirements found.\n", ""))
    report = inst.execute(plan, info, reqs, cuda_extras=True)
    assert not report["ok"] and any("torch changed from 2.13.0+cpu to 2.12.0+cu121" in e for e in report["errors"])
    assert len(report["commands"]) == 1 and "-c" in report["commands"][0]


def test_execute_stops_when_base_requirements_fail(monkeypatch):
    info, reqs = make_info(), inst.load_requirements("cpu")
    monkeypatch.setattr(inst, "run_pip", lambda argv, env, log: (log.append("x"), (1, "error: resolution-impossible"))[1])
    report = inst.execute(inst.make_plan(info, reqs, {}), info, reqs, cuda_extras=True)
    assert not report["ok"] and "base requirements failed to install (error: resolution-impossible)" in report["errors"][0]


# ---- the real environment: read-only runs --------------------------------------------------------

@pytest.fixture
def forbid_changes(monkeypatch):
    def refuse(argv, env, log):
        raise AssertionError(f"installer tried to change the environment: {argv}")
    monkeypatch.setattr(inst, "run_pip", refuse)


def test_rerun_here_changes_nothing_and_reports_fallback_backends(forbid_changes, tmp_path, capsys):
    report_path = tmp_path / "report.json"
    assert inst.main(["--no-cuda-extras", "--report", str(report_path)]) == 0
    report = json.loads(report_path.read_text())
    assert report["ok"] and report["commands"] == [] and report["torch"]["after"] == torch.__version__
    assert report["pip_check"]["ok"] and len(report["base"]["satisfied"]) == len(ALL_BASE)
    if not torch.cuda.is_available():
        assert report["training"]["optimizer"]["backend"].startswith("pure-PyTorch AdamATan2")
        assert report["training"]["attention"]["backend"].startswith("torch SDPA")
    assert "Result: OK" in capsys.readouterr().out


def test_dry_run_prints_every_command_and_writes_nothing(forbid_changes, tmp_path, capsys):
    report_path = tmp_path / "report.json"
    assert inst.main(["--dry-run", "--platform", "cuda", "--report", str(report_path)]) == 0
    out = capsys.readouterr().out
    assert "dry run" in out and f"{sys.executable} -m pip install torch==2.13.0" in out and "pip check" in out
    assert not report_path.exists()


def test_forcing_another_platform_for_real_is_refused(forbid_changes, monkeypatch, capsys):
    monkeypatch.setattr(inst, "detect_platform", lambda python: make_info(python=python))
    assert inst.main(["--platform", "apple-silicon"]) == 2
    assert "preview it with --dry-run --platform apple-silicon" in capsys.readouterr().err


# ---- real pip runs in a throw-away venv ----------------------------------------------------------

def _wheel(dist: Path, name: str, version: str, module: str, requires: str = "") -> None:
    """A minimal pure-Python wheel, written by hand so the test needs no build backend."""
    info = f"{name}-{version}.dist-info"
    files = {f"{name}.py": module,
             f"{info}/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n{requires}",
             f"{info}/WHEEL": "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n"}
    digest = lambda text: base64.urlsafe_b64encode(hashlib.sha256(text.encode()).digest()).rstrip(b"=").decode()
    record = "".join(f"{p},sha256={digest(c)},{len(c.encode())}\n" for p, c in files.items()) + f"{info}/RECORD,,\n"
    with zipfile.ZipFile(dist / f"{name}-{version}-py3-none-any.whl", "w") as z:
        for path, text in files.items() | {f"{info}/RECORD": record}.items():
            z.writestr(path, text)


def _failing_sdist(dist: Path, name: str) -> None:
    """An sdist whose build fails the way adam-atan2's does without a CUDA toolkit."""
    files = {f"{name}-0.1/setup.py": "raise RuntimeError('CUDA_HOME environment variable is not set')\n",
             f"{name}-0.1/PKG-INFO": f"Metadata-Version: 1.0\nName: {name}\nVersion: 0.1\n"}
    with tarfile.open(dist / f"{name}-0.1.tar.gz", "w:gz") as tar:
        for path, text in files.items():
            entry = tarfile.TarInfo(path)
            entry.size = len(text.encode())
            tar.addfile(entry, io.BytesIO(text.encode()))


def _environment() -> dict[str, str]:
    return {d.metadata["Name"]: d.version for d in importlib.metadata.distributions()}


@pytest.fixture(scope="module")
def sandbox(tmp_path_factory):
    """A venv that sees this environment's packages, local-only pip sources, and requirement folders."""
    root = tmp_path_factory.mktemp("installer")
    before = _environment()
    subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", "--without-pip", str(root / "venv")],
                   check=True)
    dist = root / "dist"
    dist.mkdir()
    _wheel(dist, "goodext", "1.0", "VALUE = 1\n")
    _wheel(dist, "brokenext", "1.0", "raise ImportError('backend kernel missing')\n")
    _wheel(dist, "swapper", "1.0", "", "Requires-Dist: torch==2.12.0\n")
    _wheel(dist, "torch", "2.12.0", "")  # bait: only the constraints file keeps pip from taking it
    _failing_sdist(dist, "failext")
    for name, extra in {"ok": "goodext==1.0\n", "swap": "swapper==1.0\n"}.items():
        (root / name).mkdir()
        (root / name / "requirements.txt").write_text("torch==2.13.0\nnumpy>=1.24,<3\n" + extra)
        shutil.copy(REPO / "requirements-cuda.txt", root / name)
    (root / "optional.txt").write_text("failext\nbrokenext>=1\n")
    yield root
    assert _environment() == before, "the installer changed the real environment"


def _run(sandbox: Path, *args: str) -> tuple[int, str, dict]:
    env = os.environ | {"PIP_NO_INDEX": "1", "PIP_FIND_LINKS": str(sandbox / "dist")}
    p = subprocess.run([sys.executable, str(REPO / "install_dependencies.py"), "--python",
                        str(sandbox / "venv" / "bin" / "python"), "--report", str(sandbox / "report.json"), *args],
                       capture_output=True, text=True, env=env, timeout=300)
    return p.returncode, p.stdout + p.stderr, json.loads((sandbox / "report.json").read_text())


def _venv_packages(sandbox: Path) -> set[str]:
    site = next((sandbox / "venv" / "lib").glob("python3*/site-packages"))
    return {p.name for p in site.iterdir() if p.name != "__pycache__"}


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
    assert _venv_packages(sandbox) == {"goodext.py", "goodext-1.0.dist-info"}  # nothing else touched
    venv_torch = subprocess.run([str(sandbox / "venv" / "bin" / "python"), "-c", "import torch; print(torch.__version__)"],
                                capture_output=True, text=True, check=True).stdout.strip()
    assert venv_torch == report["torch"]["after"] == torch.__version__

    rc, out, report = _run(sandbox, "--requirements-dir", str(sandbox / "ok"))  # the re-run changes nothing
    assert rc == 0 and report["commands"] == [] and "goodext 1.0" in report["base"]["satisfied"], out


@pytest.mark.slow
def test_real_install_cannot_swap_torch_out(sandbox):
    rc, out, report = _run(sandbox, "--requirements-dir", str(sandbox / "swap"))
    assert rc == 1 and not report["ok"], out
    assert "base requirements failed to install" in report["errors"][0]
    assert "conflict: swapper 1.0 depends on torch==2.12.0; The user requested (constraint) torch==2.13.0" \
        in report["errors"][0]
    assert not any(name.startswith(("torch", "swapper")) for name in _venv_packages(sandbox))
