"""The packages import downwards only: no module imports from a layer above its own, nor from a sibling room of its
own layer (device=cpu; the imports are read with ``ast``, nothing is imported).

Layers, bottom to top (../shared/STYLE.md, "Where the layout is heading"); a room is a package (or one module), and a
module belongs to the most specific room that holds it:
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

LAYERS = [
    ["utils"],                                      # the floor: errors, device, config, outputs, distributed, hub
    ["utils.data"],                                 # formats, builders, the outputs-file format; sudoku/, cape/
    ["models"],                                     # the arch registry, shared blocks, hrm/, trm/, cape/
    ["utils.run"],                                  # the run lifecycle, shared by both trainers (knows no model)
    ["utils.eval", "utils.viz"],                    # the papers' protocols, the rollout mechanics; pictures
    ["utils.solve"],                                # a user's solve: search, anytime rounds, answers.csv, the API
    ["utils.train", "models.train_cape_episodic"],  # the trainers, and the ARC adaptation that drives one
    ["utils.serve"],                                # the page of solve.py --serve
]
ROOMS = {room: level for level, rooms in enumerate(LAYERS) for room in rooms}


def room_of(module: str) -> str | None:
    """The most specific room holding ``module`` (a dotted name), or None outside the layered packages."""
    parts = module.split(".")
    for n in range(len(parts), 0, -1):
        if ".".join(parts[:n]) in ROOMS:
            return ".".join(parts[:n])
    return None


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported(path: Path) -> set[str]:
    """The project modules ``path`` imports, anywhere in it (also inside functions), as dotted names."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names |= {node.module} | {f"{node.module}.{alias.name}" for alias in node.names}
    return {n for n in names if n.split(".")[0] in ("utils", "models")}


def violations() -> list[str]:
    """``module -> imported (room level -> room level)`` for each import that points up or sideways."""
    found = []
    for path in sorted([*ROOT.glob("utils/**/*.py"), *ROOT.glob("models/**/*.py")]):
        module = module_name(path)
        here = room_of(module)
        for name in sorted(imported(path)):
            there = room_of(name)
            if there is None or there == here or ROOMS[there] < ROOMS[here]:
                continue
            found.append(f"{module} (layer {ROOMS[here]}, {here}) imports {name} (layer {ROOMS[there]}, {there})")
    return found


def test_no_import_points_up_or_sideways():
    assert violations() == []


def test_each_package_docstring_names_its_layer():
    """The one-line docstring at the top of each layered package says what it holds and what it may import."""
    for room in ("utils.eval", "utils.solve", "utils.serve"):
        text = (ROOT / room.replace(".", "/") / "__init__.py").read_text(encoding="utf-8")
        assert text.startswith('"""') and "layer" in text.split('"""')[1], room


def test_every_package_has_a_layer():
    packages = {module_name(p.parent / "__init__.py") for p in [*ROOT.glob("utils/**/__init__.py"),
                                                                 *ROOT.glob("models/*/__init__.py")]}
    assert {p for p in packages if room_of(p) is None} == set()


def test_the_check_sees_an_upward_import(tmp_path, monkeypatch):
    fake = tmp_path / "utils" / "data" / "x.py"
    fake.parent.mkdir(parents=True)
    fake.write_text("def f():\n    from utils.eval.load import load_trained\n")
    assert imported(fake) == {"utils.eval.load", "utils.eval.load.load_trained"}
    assert room_of("utils.eval.load.load_trained") == "utils.eval" and room_of("utils.data.x") == "utils.data"
    monkeypatch.setattr(f"{__name__}.ROOT", tmp_path)
    assert violations() == ["utils.data.x (layer 1, utils.data) imports utils.eval.load (layer 4, utils.eval)",
                            "utils.data.x (layer 1, utils.data) imports utils.eval.load.load_trained "
                            "(layer 4, utils.eval)"]


# Each task family's data modules live in their own house inside utils.data (issue 64), not side by side at its top.
HOUSES = {"sudoku": "utils/data/sudoku", "mp100": "utils/data/cape", "synthetic_cape": "utils/data/cape"}


def test_each_data_family_lives_in_its_house():
    top = [p.stem for p in (ROOT / "utils" / "data").glob("*.py")]
    assert [name for name in top if any(name.startswith(prefix) for prefix in HOUSES)] == []
    for house in set(HOUSES.values()):
        assert (ROOT / house / "__init__.py").is_file() and room_of(module_name(ROOT / house / "x.py")) == "utils.data"
