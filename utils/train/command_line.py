"""``pretrain.py``'s command line, apart from the trainer's imports: ``pretrain.py`` answers ``--help`` and a command
line argparse refuses before the trainer, and torch with it, is loaded (seconds on a small machine)."""

import argparse

from utils.cli import ArgumentParser
from utils.config import describe_keys


def build_parser() -> ArgumentParser:
    """The parser of ``pretrain.py``: ``--config-name`` and ``key=value`` overrides; ``--help`` lists every setting
    with its type, default and meaning (:func:`utils.config.describe_keys`)."""
    parser = ArgumentParser(
        prog="pretrain.py",
        description="Train HRM or TRM on a puzzle dataset. Settings come from config/<NAME>.yaml and key=value "
                    "overrides, merged in the order: defaults, hardware profile, the YAML recipe, the command line.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="settings, each set with key=value (arch.key=value for the architecture's own keys):\n  "
               + "\n  ".join(describe_keys())
               + "\n\nexamples:\n  python pretrain.py --config-name=cfg_pretrain_cpu epochs=2000 eval_interval=500\n"
                 "  python pretrain.py --config-name=cfg_pretrain_apple_silicon device=cpu forward_dtype=float32\n"
                 "  python pretrain.py --config-name=cfg_pretrain_cpu resume=auto      # continue the newest matching run",
    )
    parser.add_argument("--config-name", default="cfg_pretrain", help="config/<NAME>.yaml to load (default: cfg_pretrain)")
    parser.add_argument("overrides", nargs="*", metavar="key=value", help="config overrides, e.g. lr=1e-4 arch.hidden_size=256")
    return parser
