"""The ``keras-transformer`` command."""

import argparse
import sys

from keras_transformer.version import __version__


def build_parser():
    parser = argparse.ArgumentParser(
        prog="keras-transformer",
        description=(
            "The Transformer of 'Attention Is All You Need' for Keras 3: "
            "train, evaluate, average checkpoints and translate."
        ),
    )
    parser.add_argument(
        "--version", action="version", version=f"%(prog)s {__version__}"
    )
    parser.add_subparsers(dest="command", metavar="COMMAND")
    return parser


def main(argv=None):
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return 0
    return 0


if __name__ == "__main__":
    sys.exit(main())
