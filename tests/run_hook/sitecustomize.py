"""Arms the tests' hook ``RUN_SIGNAL_AT`` (tests/signal_hook.py) in a process a test starts: tests/conftest.py
``child_env`` puts this folder on PYTHONPATH, so Python imports this module as the process starts (site's
``sitecustomize``). Nothing else puts it there: in a user's environment the variable does nothing."""

import os
import sys
from pathlib import Path

if os.environ.get("RUN_SIGNAL_AT"):
    sys.path.append(str(Path(__file__).resolve().parents[2]))  # the repository, after the process's own paths
    from tests.signal_hook import install

    install()
