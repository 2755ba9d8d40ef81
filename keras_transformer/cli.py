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
    _add_train(commands)
    _add_evaluate(commands)
    _add_average(commands)
    _add_translate(commands)
    return parser


def _add_train(commands):
    from keras_transformer.training.recipes import RECIPES

    parser = commands.add_parser(
        "train",
        help="train a recipe end to end and save a translator",
        description=(
            "Trains a recipe (tokenizer, tf.data pipeline, model.fit with "
            "the paper's schedule and label smoothing, checkpoint "
            "averaging), evaluates sacreBLEU on the test set and saves a "
            "complete translator in --output. Run again with the same "
            "--output to resume an interrupted run."
        ),
    )
    parser.add_argument("--recipe", required=True, choices=sorted(RECIPES))
    parser.add_argument(
        "--data-dir",
        default=None,
        help="local directory with the corpus files (default: download)",
    )
    parser.add_argument(
        "--output", default=None, help="run directory (default runs/RECIPE)"
    )
    parser.add_argument("--max-minutes", type=float, default=None)
    parser.add_argument("--max-steps", type=int, default=None)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--mixed-precision",
        action="store_true",
        help="train under the mixed_bfloat16 policy",
    )
    parser.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override a recipe setting; VALUE is JSON, e.g. "
        "--set max_tokens=2048 --set 'model={\"hidden_dim\": 128}'",
    )
    parser.add_argument(
        "--test-limit",
        type=int,
        default=None,
        help="evaluate on the first N test sentences only",
    )
    parser.add_argument(
        "--no-evaluate", action="store_true", help="skip the test BLEU"
    )
    parser.add_argument("--quiet", action="store_true")
    parser.set_defaults(handler=_train)


def _parse_overrides(items):
    import json

    overrides = {}
    for item in items:
        key, separator, value = item.partition("=")
        if not separator:
            raise ValueError(f"--set {item!r}: expected KEY=VALUE.")
        try:
            overrides[key] = json.loads(value)
        except json.JSONDecodeError:
            overrides[key] = value
    return overrides


def _train(args):
    from keras_transformer.training import run_recipe

    overrides = _parse_overrides(args.set)
    if args.mixed_precision:
        overrides["dtype"] = "mixed_bfloat16"
    summary = run_recipe(
        args.recipe,
        data_dir=args.data_dir,
        output=args.output,
        max_minutes=args.max_minutes,
        max_steps=args.max_steps,
        seed=args.seed,
        evaluate=not args.no_evaluate,
        test_limit=args.test_limit,
        verbose=0 if args.quiet else "auto",
        **overrides,
    )
    print(summary)
    return 0


def _add_evaluate(commands):
    parser = commands.add_parser(
        "evaluate",
        help="translate a test set and report sacreBLEU",
        description=(
            "Translates a test set with a saved translator and prints "
            "sacreBLEU with its signature: either a catalogued dataset "
            "split (--dataset, --split, --data-dir) or --source and "
            "--reference files."
        ),
    )
    parser.add_argument("--model", required=True)
    parser.add_argument("--dataset", default="multi30k")
    parser.add_argument("--split", default="test2016")
    parser.add_argument("--data-dir", default=None)
    parser.add_argument("--source", default=None)
    parser.add_argument("--reference", default=None)
    parser.add_argument("--limit", type=int, default=None)
    parser.add_argument("--beam-size", type=int, default=None)
    parser.add_argument("--length-penalty", type=float, default=None)
    parser.add_argument("--quiet", action="store_true")
    parser.set_defaults(handler=_evaluate)


def _evaluate(args):
    from keras_transformer import data
    from keras_transformer.generation import Translator, evaluate_bleu

    if (args.source is None) != (args.reference is None):
        raise ValueError("Pass --source and --reference together.")
    if args.source is not None:
        pairs, _ = data.read_parallel_corpus(args.source, args.reference)
    else:
        pairs, _ = data.load_pairs(args.dataset, args.split, args.data_dir)
    if args.limit:
        pairs = pairs[: args.limit]
    settings = {
        "beam_size": args.beam_size,
        "length_penalty": args.length_penalty,
    }
    translator = Translator.from_pretrained(
        args.model, **{k: v for k, v in settings.items() if v is not None}
    )
    with _progress_to_stderr():
        result = evaluate_bleu(
            translator,
            [s for s, _ in pairs],
            [t for _, t in pairs],
            verbose=False if args.quiet else "auto",
        )
    print(f"{result}  ({len(pairs)} sentences)")
    return 0


def _add_average(commands):
    parser = commands.add_parser(
        "average",
        help="average checkpoints into a new translator",
        description=(
            "Averages the weights of checkpoints (the paper averages the "
            "last 5 or 20) and saves the result as a translator in "
            "--output. By default the checkpoints of --model's run "
            "directory (checkpoints/step-*.weights.h5)."
        ),
    )
    parser.add_argument(
        "--model", required=True, help="a saved translator (its run directory)"
    )
    parser.add_argument("--output", required=True)
    parser.add_argument(
        "--checkpoints", nargs="*", default=None, help="weights files"
    )
    parser.add_argument(
        "--last", type=int, default=5, help="average the newest N (default 5)"
    )
    parser.set_defaults(handler=_average)


def _average(args):
    import os

    from keras_transformer.generation import Translator
    from keras_transformer.training import average_checkpoints, list_checkpoints

    paths = args.checkpoints
    if not paths:
        paths = list_checkpoints(os.path.join(args.model, "checkpoints"))[
            -args.last :
        ]
        if not paths:
            raise FileNotFoundError(
                f"No checkpoints in {args.model}/checkpoints; pass them with "
                "--checkpoints."
            )
    translator = Translator.from_pretrained(args.model)
    average_checkpoints(translator.model, paths)
    translator.save(args.output)
    print(
        f"Averaged {len(paths)} checkpoints into {args.output}: "
        + ", ".join(os.path.basename(p) for p in paths)
    )
    return 0


def _progress_to_stderr():
    # Progress bars go to stderr: stdout may carry results.
    return contextlib.redirect_stdout(sys.stderr)


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
    with _progress_to_stderr():
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
