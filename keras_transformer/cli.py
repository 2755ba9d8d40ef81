"""The ``keras-transformer`` command."""

import argparse
import contextlib
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
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")
    _add_translate(commands)
    return parser


def _add_translate(commands):
    parser = commands.add_parser(
        "translate",
        help="translate sentences, one per line, with a saved translator",
        description=(
            "Translates one sentence per line from a file or standard "
            "input with a translator saved by Translator.save, and writes "
            "one translation per line (empty lines stay empty). Defaults "
            "are the paper's: beam size 4, length penalty 0.6, at most "
            "input length + 50 tokens."
        ),
    )
    parser.add_argument(
        "--model", required=True, help="directory of a saved Translator"
    )
    parser.add_argument(
        "--input", default="-", help="input file (default: standard input)"
    )
    parser.add_argument(
        "--output", default="-", help="output file (default: standard output)"
    )
    parser.add_argument("--beam-size", type=int, default=None)
    parser.add_argument("--length-penalty", type=float, default=None)
    parser.add_argument(
        "--method", choices=("beam", "greedy", "sample"), default=None
    )
    parser.add_argument(
        "--max-length-offset",
        type=int,
        default=None,
        help="at most input length + this many tokens (50 in the paper)",
    )
    parser.add_argument("--batch-size", type=int, default=None)
    parser.add_argument(
        "--reference",
        default=None,
        help="reference translations: also print sacreBLEU to stderr",
    )
    parser.add_argument("--quiet", action="store_true", help="no progress bar")
    parser.set_defaults(handler=_translate)


def _read_lines(path):
    if path == "-":
        return [line.rstrip("\r\n") for line in sys.stdin]
    with open(path, encoding="utf-8") as f:
        return [line.rstrip("\r\n") for line in f]


def _translate(args):
    from keras_transformer.generation import Translator, corpus_bleu

    settings = {
        "beam_size": args.beam_size,
        "length_penalty": args.length_penalty,
        "method": args.method,
        "max_length_offset": args.max_length_offset,
        "batch_size": args.batch_size,
    }
    settings = {k: v for k, v in settings.items() if v is not None}
    translator = Translator.from_pretrained(args.model, **settings)
    sources = _read_lines(args.input)
    # The progress bar goes to stderr: stdout may carry the translations.
    with contextlib.redirect_stdout(sys.stderr):
        translations = translator.translate(
            sources, verbose=False if args.quiet else "auto"
        )
    text = "".join(f"{line}\n" for line in translations)
    if args.output == "-":
        sys.stdout.write(text)
        sys.stdout.flush()
    else:
        with open(args.output, "w", encoding="utf-8") as f:
            f.write(text)
    if args.reference is not None:
        references = _read_lines(args.reference)
        print(corpus_bleu(translations, references), file=sys.stderr)
    return 0


def main(argv=None):
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return 0
    try:
        return args.handler(args)
    except (FileNotFoundError, ValueError) as error:
        # Errors a user can cause (a missing file, a bad setting) read as
        # one line; anything else keeps its traceback.
        print(
            f"keras-transformer {args.command}: error: {error}", file=sys.stderr
        )
        return 1


if __name__ == "__main__":
    sys.exit(main())
