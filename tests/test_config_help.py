"""``pretrain.py --help`` lists every setting of PretrainConfig with its type, default and meaning, taken from the
dataclass itself."""

import dataclasses
import subprocess
import sys
from pathlib import Path

import yaml

from utils.config import PretrainConfig, describe_keys, valid_keys

REPO_ROOT = Path(__file__).resolve().parent.parent


def test_every_setting_has_a_one_line_meaning():
    for f in dataclasses.fields(PretrainConfig):
        meaning = f.metadata.get("help", "")
        assert meaning.strip() and "\n" not in meaning, f"{f.name} has no one-line help"


def test_help_lists_every_setting_with_its_type_default_and_meaning():
    out = subprocess.run([sys.executable, "pretrain.py", "--help"], cwd=REPO_ROOT, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    rows = {line.split()[0]: line.split(maxsplit=3) for line in out.stdout.splitlines() if line.strip()}
    defaults = PretrainConfig()
    for f in dataclasses.fields(PretrainConfig):
        key = "arch.*" if f.name == "arch" else f.name
        assert key in rows, f"{key} is missing from pretrain.py --help"
        _, type_name, default, meaning = rows[key]
        assert type_name and meaning == f.metadata["help"]
        expected = defaults.arch["name"] if f.name == "arch" else getattr(defaults, f.name)
        assert yaml.safe_load(default) == expected, f"{key}: --help shows default {default!r}, the dataclass {expected!r}"


def test_describe_keys_has_a_header_and_one_line_per_valid_key():
    header, *lines = describe_keys()
    assert header.split() == ["key", "type", "default", "meaning"]
    assert [line.split()[0] for line in lines] == valid_keys()
    meanings = [f.metadata["help"] for f in dataclasses.fields(PretrainConfig)]
    assert all(line.endswith(meaning) for line, meaning in zip(lines, meanings))
    starts = {len(line) - len(meaning) for line, meaning in zip(lines, meanings)} | {header.index("meaning")}
    assert len(starts) == 1  # the meanings form one column
