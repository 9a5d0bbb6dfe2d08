"""Train HRM or TRM on a puzzle dataset (Sudoku, mazes, ARC) on CUDA, Apple Silicon or CPU.

    python pretrain.py --config-name=cfg_pretrain_cpu
    python pretrain.py --config-name=cfg_pretrain_apple_silicon lr=1e-4 arch.halt_max_steps=8
    torchrun --nproc-per-node 8 pretrain.py --config-name=cfg_pretrain data_path=data/sudoku-extreme-1k-aug-1000

``python pretrain.py --help`` lists every setting. The trainer is utils/train/puzzle_trainer.py, which the ARC
adaptation of solve.py calls too.
"""

import sys

from utils.train.puzzle_trainer import main

if __name__ == "__main__":
    sys.exit(main())
