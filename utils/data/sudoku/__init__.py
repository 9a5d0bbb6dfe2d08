"""Sudoku data: the dataset builder (build), the solvers and ratings (jit, tdoku, rating), the expert generator
(expert), canonical grids and symmetries (grids, symmetry) and the outside yardstick (outside)."""
