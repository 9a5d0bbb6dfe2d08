"""Draw puzzles (Sudoku, mazes, ARC) and saved predictions as PNG files (and, for per-segment outputs, GIFs)
with an index.html: a thin command line over :func:`utils.viz.puzzles.write_gallery`.

    python scripts/visualize.py --data-path data/maze-30x30-hard-1k --out pictures/maze
    python scripts/visualize.py --data-path data/maze-30x30-hard-1k --outputs checkpoints/.../step_1000_all_preds.0 \\
        --out pictures/maze-step1000
"""

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script: make the repo root importable

from utils.cli import ArgumentParser  # noqa: E402


def main(argv=None) -> int:
    parser = ArgumentParser(
        prog="visualize.py",
        description="Render examples of a puzzle dataset in the HRM format (Sudoku, maze or ARC, detected from its "
                    "metadata), or a model's saved predictions, to PNG files and an index.html that lists them.",
        epilog="pictures (each titled: task, puzzle, step, right or how many cells are wrong; a legend below):\n"
               "  Sudoku  givens black on grey, always the puzzle's digit (an orange corner: the model changed it);\n"
               "          filled-in digits blue; a wrong one red on pink, the true digit in its corner;\n"
               "          · = no digit predicted\n"
               "  maze    walls dark, open white, true path light blue, S green, G red (never painted over);\n"
               "          predicted path = dark-blue square; mistakes ringed: orange = predicted off the path,\n"
               "          magenta = path cell missed, teal = any other wrong cell\n"
               "  ARC     input, target and prediction in the ARC palette; wrong cells outlined in white\n"
               "  outputs with segment_preds [N, T, S] and segment_q_halt [N, T] also give, per row, the answer\n"
               "          after each ACT segment: output_<row>_segments.gif and output_<row>_segments_strip.png\n"
               "  puzzles without a name (every Sudoku and maze puzzle) are called 'puzzle <index>'\n"
               "examples:\n"
               "  python scripts/visualize.py --data-path data/maze-30x30-hard-1k --out pictures/maze --num 8\n"
               "  python scripts/visualize.py --data-path data/sudoku-extreme-1k-aug-1000 \\\n"
               "      --outputs checkpoints/run/step_1000_all_preds.0 checkpoints/run/step_1000_all_preds.1 \\\n"
               "      --out pictures/sudoku-step1000",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--data-path", required=True, help="dataset directory (identifiers.json, train/, test/)")
    parser.add_argument("--split", choices=("test", "train"), default="test",
                        help="split to draw, and the one the outputs were evaluated on (default: test)")
    parser.add_argument("--outputs", nargs="+", metavar="FILE",
                        help="saved predictions (step_<N>_all_preds.<rank>, one file per rank) to draw instead of "
                             "the dataset; each picture is titled right or wrong; with segment_preds and "
                             "segment_q_halt in the file, also a GIF and a strip of the answer after each segment")
    parser.add_argument("--out", required=True, help="directory for the PNG files and index.html (created if missing)")
    parser.add_argument("--num", type=int, default=16, help="number of pictures: the first example of each of the "
                        "first N groups, or the first N rows of the outputs (default: 16)")
    args = parser.parse_args(argv)
    # Imported after the parse: --help is answered without torch.
    from utils.run.main import cli_main
    from utils.viz.puzzles import write_gallery

    def draw() -> int:
        print(f"wrote {write_gallery(args.data_path, args.out, split=args.split, outputs=args.outputs, num=args.num)}")
        return 0
    return cli_main(draw)


if __name__ == "__main__":
    sys.exit(main())
