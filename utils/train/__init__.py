"""The puzzle trainer (HRM and TRM, called by ``pretrain.py``) and the ARC adaptation that drives it: the layer above
models, the run lifecycle, evaluation and pictures (tests/test_layers.py)."""
