"""Fill numba's cache of the Sudoku searches once, before the tests need it.

Numba compiles utils/data/sudoku's searches (jit, tdoku, grids: ``cache=True``) on their first call and keeps the
machine code beside them in utils/data/sudoku/__pycache__. On a fresh clone that cache is empty, so every process that
calls a search before one of them has written it compiles it again: about 20 s of CPU for all of them, in each
worker and in each trainer a test starts. tests/conftest.py runs this module in the background as a session starts
(``python -m tests.numba_cache``), while the pytest-xdist workers collect; later processes load the code in well
under a second. Each call below is one the builders and raters make, with the argument types they pass.
"""

import numpy as np

from utils.data.sudoku import grids as sudoku_grids
from utils.data.sudoku import rating as sudoku_rating

PUZZLE = "...3...9.2....9..1...5...3...94...151....8...6.4...7.8..2.64....9..3.4...8..5...."  # the README's


def main() -> None:
    cells = [0 if c == "." else int(c) for c in PUZZLE]
    answer = np.array([sudoku_rating.search(cells, limit=2).solution])
    sudoku_rating.search(cells, limit=1, exclude=(0, 1))
    sudoku_rating.search(cells, limit=2, scale="tdoku")
    sudoku_rating.left_open(cells, "tdoku")
    sudoku_rating.singles_left(cells)
    sudoku_grids.canonical_puzzles(np.array([cells]), answer)


if __name__ == "__main__":
    main()
