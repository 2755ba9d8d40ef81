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
            "train, evaluate, average checkpoints, translate, and share "
            "on the Hugging Face Hub (push, pull)."
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
    _add_plot_training(commands)
    _add_push(commands)
    _add_pull(commands)
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
        "--set max_tokens=2048 --set model.intermediate_dim=512 (one "
        "argument of the recipe's model; model={...} replaces them all)",
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
    parser.add_argument(
        "--distribute",
        choices=("data", "model"),
        default=None,
        help="train on every device the backend sees through its own "
        "engine: data parallel (all backends; torch under torchrun) or "
        "data and model parallel (JAX); the global batch stays the same",
    )
    parser.add_argument(
        "--model-parallel",
        type=int,
        default=None,
        metavar="N",
        help="devices on the model axis with --distribute model "
        "(default: as many as the heads and devices allow)",
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


def _recipe_overrides(args):
    """The ``--set`` items as ``(max_steps, settings)``: ``model.KEY=VALUE``
    changes one `Transformer` argument of the recipe's model (``model=``
    with a JSON object replaces them all), and ``max_steps`` is the same
    as ``--max-steps``."""
    from keras_transformer.training import get_recipe

    overrides = _parse_overrides(args.set)
    for key in [key for key in overrides if "." in key]:
        field, _, argument = key.partition(".")
        if field != "model":
            raise ValueError(
                f"--set {key}=...: only the model's arguments take a "
                f"dotted key (model.KEY=VALUE); set {field!r} whole."
            )
        model = overrides.get("model", get_recipe(args.recipe).model)
        overrides["model"] = {**model, argument: overrides.pop(key)}
    max_steps = args.max_steps
    if "max_steps" in overrides:
        if max_steps is not None:
            raise ValueError(
                f"--max-steps {args.max_steps} and --set "
                f"max_steps={overrides['max_steps']} both set the number "
                "of steps; give one."
            )
        max_steps = overrides.pop("max_steps")
    if args.mixed_precision:
        overrides["dtype"] = "mixed_bfloat16"
    return max_steps, overrides


def _train(args):
    from keras_transformer.training import run_recipe

    max_steps, overrides = _recipe_overrides(args)
    summary = run_recipe(
        args.recipe,
        data_dir=args.data_dir,
        output=args.output,
        max_minutes=args.max_minutes,
        max_steps=max_steps,
        seed=args.seed,
        evaluate=not args.no_evaluate,
        test_limit=args.test_limit,
        verbose=0 if args.quiet else "auto",
        distribute=args.distribute,
        model_parallel=args.model_parallel,
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
    _add_search_arguments(parser)
    parser.add_argument("--quiet", action="store_true")
    parser.set_defaults(handler=_evaluate)


def _add_search_arguments(parser):
    """Generation settings that override those saved with the model."""
    parser.add_argument("--beam-size", type=int, default=None)
    parser.add_argument("--length-penalty", type=float, default=None)


def _load_translator(args, *names):
    """--model's translator; the settings ``names`` given on the command
    line replace the saved ones."""
    from keras_transformer.generation import Translator

    settings = {
        name: getattr(args, name)
        for name in ("beam_size", "length_penalty", *names)
        if getattr(args, name) is not None
    }
    return Translator.from_pretrained(args.model, **settings)


def _evaluate(args):
    from keras_transformer import data
    from keras_transformer.generation import evaluate_bleu

    if (args.source is None) != (args.reference is None):
        raise ValueError("Pass --source and --reference together.")
    if args.source is not None:
        pairs, _ = data.read_parallel_corpus(args.source, args.reference)
    else:
        pairs, _ = data.load_pairs(args.dataset, args.split, args.data_dir)
    if args.limit:
        pairs = pairs[: args.limit]
    translator = _load_translator(args)
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
    _add_search_arguments(parser)
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
    parser.add_argument(
        "--plot-attention",
        default=None,
        metavar="PNG",
        help="also draw each translation's attention heatmaps into PNG "
        "(PNG-LINE.png for several input lines)",
    )
    parser.add_argument(
        "--attention-kind",
        default="cross_attention",
        choices=(
            "cross_attention",
            "encoder_self_attention",
            "decoder_self_attention",
        ),
    )
    parser.add_argument(
        "--attention-layer",
        type=int,
        default=None,
        help="draw only this layer (default: all layers by all heads)",
    )
    parser.add_argument("--quiet", action="store_true", help="no progress bar")
    parser.set_defaults(handler=_translate)


def _read_lines(path):
    if path == "-":
        return [line.rstrip("\r\n") for line in sys.stdin]
    with open(path, encoding="utf-8") as f:
        return [line.rstrip("\r\n") for line in f]


def _translate(args):
    from keras_transformer.generation import corpus_bleu

    translator = _load_translator(
        args, "method", "max_length_offset", "batch_size"
    )
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
    if args.plot_attention:
        _plot_attention(args, translator, sources, translations)
    return 0


def _plot_attention(args, translator, sources, translations):
    import os

    from keras_transformer.plotting import plot_attention

    lines = [i for i, source in enumerate(sources) if source.strip()]
    if not lines:
        raise ValueError("--plot-attention: the input has no sentence.")
    attention = translator.attention(
        [sources[i] for i in lines], [translations[i] for i in lines]
    )
    stem, suffix = os.path.splitext(args.plot_attention)
    for line, sentence in zip(lines, attention, strict=True):
        path = args.plot_attention
        if len(lines) > 1:
            path = f"{stem}-{line + 1}{suffix or '.png'}"
        plot_attention(
            sentence,
            path,
            kind=args.attention_kind,
            layer=args.attention_layer,
        )
        print(f"Attention of line {line + 1}: {path}", file=sys.stderr)


def _add_push(commands):
    parser = commands.add_parser(
        "push",
        help="upload a saved translator to the Hugging Face Hub",
        description=(
            "Uploads a saved translator to the Hugging Face Hub in one "
            "commit: model, weights (.weights.h5 and .safetensors), "
            "tokenizer, generation settings, sha256 manifest and a model "
            "card. A training run's directory contributes its "
            "results.json (BLEU, recipe) to the card. Prints the commit id."
        ),
    )
    parser.add_argument("model", help="directory of a saved translator")
    parser.add_argument("repo_id", help="OWNER/NAME on the Hub")
    parser.add_argument("--revision", default="main", help="branch")
    parser.add_argument("--message", default=None, help="commit message")
    parser.add_argument(
        "--private",
        action="store_true",
        default=None,
        help="create the repository private",
    )
    parser.add_argument(
        "--create-pr",
        action="store_true",
        help="open a pull request instead of committing to --revision",
    )
    parser.add_argument("--tag", default=None, help="tag the commit")
    parser.add_argument(
        "--results",
        default=None,
        help="training results.json (default: MODEL/results.json if any)",
    )
    parser.add_argument(
        "--card",
        default=None,
        help="model card settings, JSON (default: the recipe's, "
        "keras_transformer/hub_settings/RECIPE.json)",
    )
    parser.add_argument(
        "--token", default=None, help="Hub token (default: the logged-in one)"
    )
    parser.set_defaults(handler=_push)


def _push(args):
    import os

    from keras_transformer import hub
    from keras_transformer.generation import Translator

    results = args.results
    if results is None and os.path.isfile(
        os.path.join(args.model, hub.RESULTS_FILE)
    ):
        results = args.model
    translator = Translator.from_pretrained(args.model)
    commit = hub.push_to_hub(
        translator,
        args.repo_id,
        revision=args.revision,
        commit_message=args.message,
        private=args.private,
        create_pr=args.create_pr,
        token=args.token,
        results=results,
        card=args.card,
        tag=args.tag,
    )
    print(commit)
    return 0


def _add_pull(commands):
    parser = commands.add_parser(
        "pull",
        help="download and verify a translator from the Hugging Face Hub",
        description=(
            "Downloads hf://OWNER/NAME[@REVISION] into the Hugging Face "
            "cache (or finds it there), checks every file against its "
            "sha256 manifest and prints the local directory, which "
            "`translate --model` and `evaluate --model` accept."
        ),
    )
    parser.add_argument("reference", help="hf://OWNER/NAME[@REVISION]")
    parser.add_argument("--revision", default=None)
    parser.add_argument("--token", default=None)
    parser.add_argument(
        "--offline", action="store_true", help="use the cache only"
    )
    parser.add_argument(
        "--output", default=None, help="also copy the files into this folder"
    )
    parser.set_defaults(handler=_pull)


def _pull(args):
    import shutil

    from keras_transformer import hub

    reference = args.reference
    if not hub.is_hub_reference(reference):
        reference = hub.HF_PREFIX + reference
    directory = hub.resolve_directory(
        reference, args.revision, args.token, args.offline
    )
    if args.output:
        shutil.copytree(directory, args.output, dirs_exist_ok=True)
        directory = args.output
    print(directory)
    return 0


def _add_plot_training(commands):
    parser = commands.add_parser(
        "plot-training",
        help="draw a run's loss, learning rate and BLEU curves",
        description=(
            "Reads a training run's CSV log (LOGDIR/logs/training.csv, "
            "written by `train`) and draws loss, learning rate and "
            "validation BLEU by epoch into a PNG."
        ),
    )
    parser.add_argument(
        "log", help="run directory, its logs/ directory or the CSV file"
    )
    parser.add_argument(
        "--output",
        default=None,
        help="PNG file (default: training.png next to the CSV log)",
    )
    parser.add_argument("--dpi", type=int, default=100)
    parser.set_defaults(handler=_plot_training)


def _plot_training(args):
    import os

    from keras_transformer.plotting import find_training_log, plot_training

    path = args.output or os.path.join(
        os.path.dirname(find_training_log(args.log)), "training.png"
    )
    plot_training(args.log, path, dpi=args.dpi)
    print(path)
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
