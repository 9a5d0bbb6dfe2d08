"""No two modules import each other (issue 51: utils/data/sudoku.py and utils/data/sudoku_expert.py did), anywhere in
the project's packages; device=cpu, the imports are read with ``ast`` (tests/test_layers.py), nothing is imported."""

from tests.test_layers import ROOT, imported, module_name


def pairs_importing_each_other() -> list[tuple[str, str]]:
    """Each pair of project modules that import each other (also inside functions), as dotted names."""
    paths = [*ROOT.glob("utils/**/*.py"), *ROOT.glob("models/**/*.py")]
    imports = {module_name(path): imported(path) for path in paths}
    return sorted({tuple(sorted((a, b))) for a, names in imports.items() for b in names
                   if b != a and a in imports.get(b, ())})


def test_no_two_modules_import_each_other():
    assert pairs_importing_each_other() == []
