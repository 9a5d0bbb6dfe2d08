"""Every output path is checked before any work starts, and every output is written whole or not at all.

An unwritable path (under /proc, under a regular file, a directory where a file goes) must end the command
with exit code 2 and one ``error:`` line before it generates, loads or evaluates anything; a write that
fails part-way (a full disk) must end with exit code 1 and one line naming the path and the bytes, and
leave no partial file. The checks must never touch a user's files.
"""

import errno
import os
import runpy
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

import evaluate
from utils.data import arc as arc_builder
from utils.data import common
from utils.data.builders import build_dataset
from utils.data.puzzle_dataset import DatasetError
from utils.eval.arc import write_json
from utils.outputs import (OutputPathError, OutputWriteError, check_writable_dir, check_writable_file,
                           write_atomically)
from utils.run.main import cli_main

REPO = Path(__file__).resolve().parent.parent
BUILDERS = {  # script -> arguments that would start a long build if the output path were not checked first
    "build_sudoku_dataset.py": ["--generate", "--train-size", "100000"],
    "build_maze_dataset.py": ["--generate", "--train-size", "100000"],
    "build_arc_dataset.py": ["--dataset", "arc-agi-1"],
}


@pytest.fixture
def no_work(monkeypatch):
    """Make any builder's work fail the test: the output check must come first."""
    def started(*args, **kwargs):
        raise AssertionError("the build started before its output path was checked")
    monkeypatch.setattr(common, "generate_train_test", started)
    monkeypatch.setattr(arc_builder, "load_subsets", started)


@pytest.fixture
def a_file(tmp_path):
    """A user's regular file (which no check may change)."""
    path = tmp_path / "notes.txt"
    path.write_text("keep me")
    return path


def unwritable(case: str, a_file: Path) -> tuple[Path, str]:
    """An output directory that cannot be created, and the ancestor the message must blame."""
    if case == "proc":
        return Path("/proc/x/y"), "/proc is not writable"
    return a_file / "ds", f"{a_file} is not a directory"


def one_error_line(err: str) -> str:
    errors = [line for line in err.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "Traceback" not in err, err
    return errors[0]


def run_script(script: str, argv: list[str], monkeypatch) -> int:
    monkeypatch.setattr(sys, "argv", [script, *argv])
    try:
        runpy.run_path(str(REPO / "scripts" / script), run_name="__main__")
    except SystemExit as e:
        return e.code
    raise AssertionError(f"{script} did not exit")


@pytest.mark.parametrize("case", ["proc", "under_a_file"])
@pytest.mark.parametrize("script", BUILDERS)
def test_builder_refuses_an_unwritable_output_dir_before_building(script, case, a_file, no_work, capsys, monkeypatch):
    output_dir, blamed = unwritable(case, a_file)
    code = run_script(script, [*BUILDERS[script], "--output-dir", str(output_dir)], monkeypatch)
    captured = capsys.readouterr()
    assert code == 2, captured.err
    line = one_error_line(captured.err)
    assert f"--output-dir {output_dir} cannot be created: " in line and blamed in line, line
    assert a_file.read_text() == "keep me"


def test_builder_script_process_fails_before_generating():
    # The real process, with a training set that would take hours: it must end at the check, with no progress bar.
    result = subprocess.run([sys.executable, "scripts/build_sudoku_dataset.py", "--generate", "--train-size", "10000000",
                             "--output-dir", "/proc/x/y"], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert result.returncode == 2, result.stderr
    assert one_error_line(result.stderr).startswith("error: --output-dir /proc/x/y cannot be created: /proc is not writable")
    assert "generate" not in result.stderr and result.stdout == ""


@pytest.mark.parametrize("kind,options", [("sudoku", {"generate": True}), ("maze", {"generate": True}), ("arc", {})])
def test_pretrain_build_data_checks_the_data_path_first(kind, options, no_work):
    # pretrain.py data_paths=[/proc/x/y] build_data=true builds through utils.data.builders.build_dataset.
    with pytest.raises(DatasetError, match=r"--output-dir /proc/x/y cannot be created: /proc is not writable"):
        build_dataset("/proc/x/y", {"kind": kind, **options})


def test_an_existing_output_dir_needs_a_writable_parent(tmp_path, no_work, monkeypatch):
    # The build is staged beside an existing (empty) --output-dir, so its parent is checked too.
    out = tmp_path / "mine"
    out.mkdir()
    real_mkdtemp = tempfile.mkdtemp

    def mkdtemp(prefix=None, dir=None):
        if Path(dir) == tmp_path:
            raise PermissionError(errno.EACCES, os.strerror(errno.EACCES))
        return real_mkdtemp(prefix=prefix, dir=dir)
    monkeypatch.setattr(tempfile, "mkdtemp", mkdtemp)
    with pytest.raises(DatasetError, match=rf"--output-dir's parent {tmp_path} cannot be written: {tmp_path} is not "
                                           r"writable \(Permission denied\)"):
        build_dataset(out, {"kind": "sudoku", "generate": True})
    assert list(out.iterdir()) == []


@pytest.mark.parametrize("flags,message", [
    (["--save-outputs", "/proc/x/out"], "--save-outputs /proc/x/out cannot be created: /proc is not writable"),
    (["--save-outputs", "{file}/out"], "--save-outputs {file}/out cannot be created: {file} is not a directory"),
    (["--submission", "/proc/x/submission.json"], "--submission /proc/x/submission.json cannot be created: /proc is"),
    (["--submission", "{file}/submission.json"], "--submission {file}/submission.json cannot be created: {file} is not"),
    (["--submission", "{dir}"], "--submission {dir} is a directory; give the path of a file"),
    (["--report", "/proc/x/report.json"], "--report /proc/x/report.json cannot be created: /proc is not writable"),
])
def test_evaluate_checks_output_paths_before_loading_the_checkpoint(flags, message, tmp_path, a_file, capsys):
    # The checkpoint does not exist: the error must be about the output path, found first.
    values = dict(file=a_file, dir=tmp_path)
    argv = ["--checkpoint", str(tmp_path / "missing.pt"), *[f.format(**values) for f in flags]]
    assert evaluate.main(argv) == 2
    assert message.format(**values) in one_error_line(capsys.readouterr().err)
    assert a_file.read_text() == "keep me"


def test_evaluate_checks_the_default_save_outputs_dir_and_the_outputs_mode(tmp_path, capsys):
    # --save-outputs without DIR writes next to the checkpoint: eval_<checkpoint name>.
    assert evaluate.main(["--device", "cpu", "--checkpoint", "/proc/x/step_8.pt", "--save-outputs"]) == 2
    assert "--save-outputs /proc/x/eval_step_8 cannot be created" in one_error_line(capsys.readouterr().err)
    # Scoring saved outputs: the report path is checked before the outputs files are read.
    argv = ["--outputs", str(tmp_path / "missing.0"), "--data-path", str(tmp_path), "--report", "/proc/x/r.json"]
    assert evaluate.main(argv) == 2
    assert "--report /proc/x/r.json cannot be created" in one_error_line(capsys.readouterr().err)


def test_checks_create_nothing_and_touch_no_user_file(tmp_path, a_file):
    before = sorted(p.name for p in tmp_path.iterdir())
    check_writable_dir(tmp_path, "--output-dir")
    check_writable_dir(tmp_path / "new" / "deeper", "--output-dir")
    check_writable_file(tmp_path / "new" / "report.json", "--report")
    check_writable_file(a_file, "--report")  # an existing file may be replaced
    assert sorted(p.name for p in tmp_path.iterdir()) == before
    assert a_file.read_text() == "keep me"


def test_check_errors_are_user_errors_naming_what_and_where(a_file):
    with pytest.raises(OutputPathError, match=rf"^--out {a_file} cannot be written: {a_file} is not a directory; "):
        check_writable_dir(a_file, "--out")
    with pytest.raises(OutputPathError, match=r"^--out /proc/a/b\.json cannot be created: /proc is not writable \("):
        check_writable_file("/proc/a/b.json", "--out")
    assert OutputPathError("x").exit_code == 2 and OutputWriteError("x").exit_code == 1


def test_write_atomically_writes_and_replaces(tmp_path, a_file):
    target = tmp_path / "sub" / "out.bin"
    assert write_atomically(target, lambda f: f.write(b"first"), "test output") == target
    write_atomically(target, lambda f: f.write(b"second"), "test output")
    assert target.read_bytes() == b"second"
    assert sorted(p.name for p in target.parent.iterdir()) == ["out.bin"]
    assert a_file.read_text() == "keep me"


@pytest.mark.parametrize("umask,mode", [(0o022, 0o644), (0o002, 0o664), (0o077, 0o600)])
def test_write_atomically_gives_the_mode_the_umask_asks_not_mkstemps_0600(tmp_path, umask, mode):
    target = tmp_path / "out.bin"
    code = (f"import os; os.umask({umask}); from utils.outputs import write_atomically; "
            f"write_atomically({str(target)!r}, lambda f: f.write(b'x'), 'test output')")
    subprocess.run([sys.executable, "-c", code], check=True, cwd=REPO, timeout=120)
    assert target.stat().st_mode & 0o777 == mode


def full_disk_after(limit: int):
    """A writer that writes ``limit`` bytes, then fails as a full disk does."""
    def write(f):
        f.write(b"x" * limit)
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
    return write


def test_a_full_disk_leaves_no_partial_file_and_says_what_was_written(tmp_path, a_file):
    target = tmp_path / "out.bin"
    with pytest.raises(OutputWriteError) as failure:
        write_atomically(target, full_disk_after(5000), "test output")
    message = str(failure.value)
    assert message.startswith(f"could not write test output {target} (No space left on device) after 5,000 bytes, ")
    assert f"MiB free in {tmp_path}" in message and "\n" not in message
    assert sorted(p.name for p in tmp_path.iterdir()) == [a_file.name]  # no temporary or partial file
    # A previous file at the path stays as it was.
    target.write_bytes(b"old")
    with pytest.raises(OutputWriteError):
        write_atomically(target, full_disk_after(10), "test output")
    assert target.read_bytes() == b"old" and sorted(p.name for p in tmp_path.iterdir()) == [a_file.name, "out.bin"]


def test_other_errors_keep_their_type_and_leave_no_file(tmp_path):
    def bug(f):
        f.write(b"x")
        raise ValueError("a bug in the writer")
    with pytest.raises(ValueError, match="a bug in the writer"):
        write_atomically(tmp_path / "out.bin", bug, "test output")
    assert list(tmp_path.iterdir()) == []


def test_json_outputs_on_a_full_disk_are_one_line(tmp_path, monkeypatch, capsys):
    def full(path, write, what, _real=write_atomically):
        return _real(path, lambda f: (write(f), full_disk_after(0)(f)), what)
    monkeypatch.setattr("utils.eval.arc.write_atomically", full)
    assert cli_main(lambda: write_json(tmp_path / "submission.json", {"task": []}, "ARC submission")) == 1
    line = one_error_line(capsys.readouterr().err)
    assert f"could not write ARC submission {tmp_path / 'submission.json'} (No space left on device) after" in line
    assert list(tmp_path.iterdir()) == []


def test_saved_outputs_on_a_full_disk_are_one_line(tmp_path):
    # A real write failure inside torch.save (which reports it as a RuntimeError): the process may write
    # files of at most 64 KiB, so the 400 KB outputs file fails part-way with EFBIG.
    code = ("import resource, signal, sys, torch\n"
            "from utils.data.saved_outputs import OutputsCollector\n"
            "from utils.run.main import cli_main\n"
            "signal.signal(signal.SIGXFSZ, signal.SIG_IGN)\n"
            "resource.setrlimit(resource.RLIMIT_FSIZE, (65536, resource.RLIM_INFINITY))\n"
            "collector = OutputsCollector(keys=('preds',))\n"
            "collector.update_batch({}, {'preds': torch.zeros(100000, dtype=torch.int32)})\n"
            f"sys.exit(cli_main(lambda: collector.save({str(tmp_path)!r}, 8, 0)))\n")
    result = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert result.returncode == 1, result.stderr
    line = one_error_line(result.stderr)
    assert f"could not write saved outputs {tmp_path / 'step_8_all_preds.0'} (File too large) after 65,536 bytes" in line
    assert list(tmp_path.iterdir()) == []


def test_ctrl_c_in_a_command_ends_it_with_one_line_and_status_130(capsys):
    def interrupted():
        raise KeyboardInterrupt

    assert cli_main(interrupted) == 130
    err = capsys.readouterr().err
    assert err == "stopped (Ctrl-C)\n"
