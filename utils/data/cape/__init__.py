"""CAPE data: MP-100 (its annotations, splits and episodes: mp100) and the generated stand-in for tests and
quickstarts (synthetic)."""
