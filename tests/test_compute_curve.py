"""scripts/compute_curve.py on hand-written metrics.jsonl files (device=cpu, nothing trained): what it does with
evaluations that logged NaN or Infinity, and how it treats the --picture it is given. The comparison of two real runs:
tests/test_curriculum.py."""

import logging

import pytest
from PIL import Image

from scripts import compute_curve
from tests.test_bad_inputs import assert_one_line


def run_dir(folder, *lines: str):
    folder.mkdir()
    (folder / "metrics.jsonl").write_text("".join(f"{line}\n" for line in lines))
    return folder


@pytest.fixture
def runs(tmp_path):
    """A baseline, and a run whose evaluations at steps 2 and 3 logged NaN and Infinity (as JSON writes them)."""
    base = run_dir(tmp_path / "base", '{"step": 1, "eval/train_pflop": 1.0, "eval/exact_accuracy": 0.2}',
                   '{"step": 2, "eval/train_pflop": 2.0, "eval/exact_accuracy": 0.5}')
    other = run_dir(tmp_path / "other", '{"step": 1, "eval/train_pflop": 0.5, "eval/exact_accuracy": 0.3}',
                    '{"step": 2, "eval/train_pflop": NaN, "eval/exact_accuracy": 0.9}',
                    '{"step": 3, "eval/train_pflop": 1.5, "eval/exact_accuracy": Infinity}',
                    '{"step": 4, "eval/train_pflop": 1.8, "eval/exact_accuracy": 0.6}')
    return base, other


def test_campaign5_p19_nan_and_infinity_are_left_out_and_said(runs, tmp_path, capsys, caplog):
    base, other = runs
    picture = tmp_path / "curve.png"
    with caplog.at_level(logging.WARNING):
        assert compute_curve.main(["--run", f"base={base}", "--run", f"other={other}", "--picture", str(picture)]) == 0
    printed = capsys.readouterr()
    table = [line for line in printed.out.splitlines() if line.startswith("| other |")]
    assert "Traceback" not in printed.err and len(table) == 2 and not any("nan" in t or "inf" in t for t in table)
    assert "| other | 4 | 1.8 | 0.6000 |" in printed.out and "| other | 2 |" not in printed.out
    # reached by step 4's finite 0.6, not by step 3's Infinity
    assert "other: reached 0.5000 at step 4 after 1.8 PFLOP = 0.90x the base's training FLOPs" in printed.out
    assert f"{other / 'metrics.jsonl'}: left out 2 evaluation(s)" in caplog.text and "steps: 2, 3" in caplog.text
    assert Image.open(picture).size == (880, 520)
    # A run with nothing finite to draw is one line.
    nothing = run_dir(tmp_path / "nothing", '{"step": 1, "eval/train_pflop": NaN, "eval/exact_accuracy": NaN}')
    assert_one_line(capsys, compute_curve.main(["--run", f"nothing={nothing}"]),
                    "no evaluation logged eval/train_pflop and eval/exact_accuracy as finite numbers")


def test_a_run_that_never_reaches_the_baseline_names_where_its_best_was(runs, tmp_path, capsys):
    """The restart run of issue 64 peaked before its last evaluation: the line gives the peak's PFLOP, not the end's."""
    base, _ = runs
    peaked = run_dir(tmp_path / "peaked", '{"step": 1, "eval/train_pflop": 0.5, "eval/exact_accuracy": 0.4}',
                     '{"step": 2, "eval/train_pflop": 1.0, "eval/exact_accuracy": 0.3}')
    assert compute_curve.main(["--run", f"base={base}", "--run", f"peaked={peaked}"]) == 0
    assert "peaked: never reached 0.5000 (best 0.4000 at 0.5 PFLOP, of 1 in all)" in capsys.readouterr().out


def test_campaign5_p19_a_picture_name_without_png_is_one_line_before_any_work(runs, tmp_path, capsys):
    base, _ = runs
    for name in ("curve", "curve.jpeg"):
        assert_one_line(capsys, compute_curve.main(["--run", f"base={base}", "--picture", str(tmp_path / name)]),
                        f"--picture {tmp_path / name}: the picture is a PNG; give a file name ending in .png")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["base", "other"]


def test_campaign5_p03_an_existing_picture_is_replaced_only_with_a_word_and_whole(runs, tmp_path, capsys, caplog,
                                                                                   monkeypatch):
    base, _ = runs
    picture = tmp_path / "curve.png"
    picture.write_bytes(b"the user's picture")
    with caplog.at_level(logging.WARNING):
        assert compute_curve.main(["--run", f"base={base}", "--picture", str(picture)]) == 0
    assert f"--picture {picture} exists: replacing it, as named" in caplog.text
    assert Image.open(picture).size == (880, 520)
    # A picture that cannot be written in full leaves the previous one as it was.
    before = picture.read_bytes()
    monkeypatch.setattr(Image.Image, "save", lambda *args, **kwargs: (_ for _ in ()).throw(OSError(28, "No space")))
    assert compute_curve.main(["--run", f"base={base}", "--picture", str(picture)]) == 1
    assert f"could not write picture {picture}" in capsys.readouterr().err
    assert picture.read_bytes() == before and sorted(p.name for p in tmp_path.iterdir()) == ["base", "curve.png",
                                                                                              "other"]


def test_a_baseline_that_spent_no_flops_is_compared_without_a_ratio(tmp_path, capsys):
    """A baseline whose last evaluation came before any training step (0 PFLOP: a model evaluated as it was
    loaded) used to end the comparison in a ZeroDivisionError."""
    loaded = run_dir(tmp_path / "loaded", '{"step": 0, "eval/train_pflop": 0.0, "eval/exact_accuracy": 0.2}')
    tuned = run_dir(tmp_path / "tuned", '{"step": 5, "eval/train_pflop": 0.01, "eval/exact_accuracy": 0.25}')
    assert compute_curve.main(["--run", f"loaded={loaded}", "--run", f"tuned={tuned}"]) == 0
    printed = capsys.readouterr()
    assert "loaded: final eval/exact_accuracy 0.2000 after 0 PFLOP" in printed.out
    assert "tuned: reached 0.2000 at step 5 after 0.01 PFLOP (the loaded spent no training FLOPs: no ratio)" in \
        printed.out and "Traceback" not in printed.err
