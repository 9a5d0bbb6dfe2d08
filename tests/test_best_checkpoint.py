"""best.pt: every evaluation compares the headline metric with the best so far; best.pt holds the better model,
is recorded in run.json, never pruned and never resumed from; evaluate.py RUN_DIR evaluates it."""

import json

import pytest

import evaluate
import pretrain
from tests.test_resume import TINY
from utils.train import puzzle_trainer
from utils.checkpoint import safe_load


@pytest.mark.slow
def test_best_pt_holds_the_better_evaluation_and_evaluate_uses_it(sudoku_dir, tmp_path, monkeypatch, capsys, caplog):
    real, scores = puzzle_trainer.evaluate, iter([0.5, 0.25, 0.375])  # improves, does not, does not

    def scripted(*args, **kwargs):
        results = real(*args, **kwargs)
        results["exact_accuracy"] = next(scores)
        return results

    monkeypatch.setattr(puzzle_trainer, "evaluate", scripted)
    run = tmp_path / "run"
    argv = ["--config-name=cfg_pretrain_cpu", f"data_path={sudoku_dir}", f"checkpoint_path={run}", *TINY, "epochs=6",
            "eval_interval=2", "keep_last_checkpoints=1"]
    assert pretrain.main(argv) == 0
    record = json.loads((run / "run.json").read_text())
    assert record["best"] == "best.pt" and record["checkpoints"] == ["step_24.pt"]
    assert record["best_metric"] == {"metric": "exact_accuracy", "value": 0.5, "step": 8}
    best = safe_load(run / "best.pt")
    assert best["step"] == 8 and best["best"]["value"] == 0.5

    monkeypatch.undo()
    caplog.set_level("INFO")
    assert pretrain.main(argv + ["resume=auto", "epochs=8"]) == 0  # resumes from step_24.pt, never from best.pt
    assert f"resumed from {run / 'step_24.pt'}" in caplog.text
    capsys.readouterr()
    assert evaluate.main(["--device", "cpu", str(run), "--json"]) == 0
    assert "the run's best checkpoint best.pt (exact_accuracy 0.5000 at step 8)" in caplog.text
    assert "exact_accuracy" in json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    caplog.clear()
    capsys.readouterr()
    assert evaluate.main(["--device", "cpu", str(tmp_path), "--json"]) == 0  # a folder of runs: its newest
    assert f"the newest run in {tmp_path}, run: the run's best checkpoint best.pt" in caplog.text
