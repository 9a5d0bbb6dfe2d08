""".ci/run does what a newcomer does: a fresh venv with the interpreter's own pip, then the README's commands.

The script is run for real with a stand-in interpreter (``PYTHON=``) whose ``-m venv`` makes a venv of stand-ins
that record how they are called, so the test takes a second instead of the real install's minutes.
"""

import os
import re
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent

# Stand-in for python3: `-m venv DIR` builds DIR/bin/{activate,python}; that python records its arguments.
FAKE_PYTHON = r"""#!/usr/bin/env bash
echo "base $*" >> "$CI_LOG"
[ "$1 $2" = "-m venv" ] || exit 3
mkdir -p "$3/bin"
printf 'export VIRTUAL_ENV=%s\nexport PATH="%s/bin:$PATH"\n' "$3" "$3" > "$3/bin/activate"
printf '#!/usr/bin/env bash\necho "venv $VIRTUAL_ENV $PWD $*" >> "$CI_LOG"\n' > "$3/bin/python"
chmod +x "$3/bin/python"
"""


def readme_commands() -> dict[str, str]:
    """The README's set-up and test commands, from its quickstart block."""
    text = (REPO / "README.md").read_text(encoding="utf-8")
    setup = re.search(r"^(python install_dependencies\.py)\s", text, re.M)
    test = re.search(r"^(python -m pytest -q)\s", text, re.M)
    assert setup and test, "the README no longer shows `python install_dependencies.py` and `python -m pytest -q`"
    return {"setup": setup.group(1), "test": test.group(1)}


def test_ci_runs_the_readme_commands_in_a_fresh_venv_and_removes_it(tmp_path):
    fake, log = tmp_path / "python3", tmp_path / "calls.log"
    fake.write_text(FAKE_PYTHON)
    fake.chmod(0o755)
    env = {k: v for k, v in os.environ.items() if k != "VIRTUAL_ENV"} | {"PYTHON": str(fake), "CI_LOG": str(log)}
    done = subprocess.run(["bash", str(REPO / ".ci" / "run")], env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr

    (create, setup, test) = [line.split() for line in log.read_text().splitlines()]
    assert create[:4] == ["base", "-m", "venv", create[3]] and len(create) == 4  # no --upgrade-deps, no pip upgrade
    venv = create[3]
    commands = readme_commands()
    assert setup == ["venv", venv, str(REPO), *commands["setup"].split()[1:]]
    assert test == ["venv", venv, str(REPO), *commands["test"].split()[1:]]
    assert not Path(venv).exists(), "the throw-away venv was left behind"
