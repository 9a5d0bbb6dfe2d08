"""Train HRM or TRM on a puzzle dataset (Sudoku, mazes, ARC) on CUDA, Apple Silicon or CPU.

    python pretrain.py --config-name=cfg_pretrain_cpu
    python pretrain.py --config-name=cfg_pretrain_apple_silicon lr=1e-4 arch.halt_max_steps=8
    torchrun --nproc-per-node 8 pretrain.py --config-name=cfg_pretrain data_path=data/sudoku-extreme-1k-aug-1000

``python pretrain.py --help`` lists every setting. The trainer is utils/train/puzzle_trainer.py, which the ARC
adaptation of solve.py calls too.
"""

import sys
from typing import Optional

from utils.train.command_line import build_parser


def main(argv: Optional[list[str]] = None) -> int:
    """Train as the command line (default: ``sys.argv``) says; the exit code. ``--help`` and a command line argparse
    refuses are answered before the trainer, and torch with it, is loaded."""
    argv = sys.argv[1:] if argv is None else argv
    build_parser().parse_args(argv)
    from utils.train.puzzle_trainer import main as train

    return train(argv)


if __name__ == "__main__":
    sys.exit(main())
