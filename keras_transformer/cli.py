"""The ``keras-transformer`` command."""

import argparse
import contextlib
import dataclasses
import functools
import itertools
import os
import sys
import time

from keras_transformer._import_hooks import ImportHook
from keras_transformer._recipe_names import RECIPE_NAMES
from keras_transformer.version import __version__


def build_parser():
    parser = argparse.ArgumentParser(
        prog="keras-transformer",
        description=(
            "The Transformer of 'Attention Is All You Need' for Keras 3: "
            "train, evaluate, average checkpoints, translate, score "
            "given translations, export for serving, and share on the "
            "Hugging Face Hub (push, pull)."
        ),
    )
    parser.add_argument(
        "--version", action="version", version=f"%(prog)s {__version__}"
    )
    _add_global_flags(parser, default=False)
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")
    _add_train(commands)
    _add_evaluate(commands)
    _add_average(commands)
    _add_translate(commands)
    _add_score(commands)
    _add_export(commands)
    _add_plot_training(commands)
    _add_push(commands)
    _add_pull(commands)
    for command in commands.choices.values():
        # Also after the command; the global value stays unless given.
        _add_global_flags(command, default=argparse.SUPPRESS)
    return parser


def _add_global_flags(parser, default):
    parser.add_argument(
        "--verbose",
        action="store_true",
        default=default,
        help="keep the messages of TensorFlow, absl, oneDNN, CUDA and "
        "sentencepiece, and Python warnings (hidden by default)",
    )
    parser.add_argument(
        "--debug",
        action="store_true",
        default=default,
        help="show the full traceback of an error instead of one line",
    )


def _add_train(commands):
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
    parser.add_argument("--recipe", required=True, choices=RECIPE_NAMES)
    parser.add_argument(
        "--init",
        default=None,
        metavar="MODEL",
        help="fine-tune this model instead of training a new one: a "
        "translator directory, a Marian/OPUS-MT checkpoint directory or "
        "hf://owner/name; its tokenizer, model settings and generation "
        "settings are kept (see the multi30k_en_de_finetune recipe)",
    )
    parser.add_argument(
        "--data-dir",
        default=None,
        help="local directory with the corpus files (default: download)",
    )
    parser.add_argument(
        "--output", default=None, help="run directory (default runs/RECIPE)"
    )
    parser.add_argument(
        "--overwrite",
        action="store_true",
        help="replace the run or translator in --output (which is otherwise "
        "resumed only by a run of the same recipe and settings)",
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
    with a JSON object replaces them all; with ``--init``, whose model
    gives the others, it is passed alone), and ``max_steps`` is the same
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
        base = {} if args.init else get_recipe(args.recipe).model
        model = overrides.get("model", base)
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
        overwrite=args.overwrite,
        max_minutes=args.max_minutes,
        max_steps=max_steps,
        seed=args.seed,
        evaluate=not args.no_evaluate,
        test_limit=args.test_limit,
        verbose=_fit_verbosity(args.quiet, sys.stdout.isatty()),
        distribute=args.distribute,
        model_parallel=args.model_parallel,
        init=args.init,
        **overrides,
    )
    print(summary)
    return 0


def _fit_verbosity(quiet, terminal):
    """Keras's `fit` verbosity: a progress bar on a terminal, else one
    plain line per epoch (``2``: no carriage returns or escape codes in
    a redirected log)."""
    if quiet:
        return 0
    return "auto" if terminal else 2


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
    _add_engine_arguments(parser)
    parser.add_argument("--quiet", action="store_true")
    parser.set_defaults(
        handler=_evaluate, check=functools.partial(_check_engine, parser)
    )


# Help of the generation settings: None stands for the saved value.
SAVED_SETTING = "default: the translator's saved generation settings"


def _add_search_arguments(parser):
    """Generation settings that override those saved with the model."""
    parser.add_argument(
        "--beam-size",
        type=_positive_int,
        default=None,
        help=f"beams of the beam search ({SAVED_SETTING})",
    )
    _add_length_penalty_argument(parser)


def _add_length_penalty_argument(parser):
    parser.add_argument(
        "--length-penalty",
        type=float,
        default=None,
        help="alpha of the length normalization ((5 + |Y|) / 6) ** alpha "
        f"({SAVED_SETTING}: a recipe saves the value it chose on its "
        "validation split)",
    )


def _load_translator(args, *names, quantize=True):
    """--model's translator; the settings ``names`` given on the command
    line replace the saved ones, and --quantize, where the command has
    it (and ``quantize``), quantizes its weights. With ``--engine
    ctranslate2``, a `CTranslate2Translator` of --model: an export read
    as it is, or a saved translator exported for this run."""
    from keras_transformer.generation import Translator

    settings = {
        name: getattr(args, name)
        for name in ("beam_size", "length_penalty", *names)
        if getattr(args, name, None) is not None
    }
    if getattr(args, "engine", None) == "ctranslate2":
        return _ctranslate2_translator(args, settings)
    translator = Translator.from_pretrained(args.model, **settings)
    if quantize and getattr(args, "quantize", None):
        translator.quantize(args.quantize)
    return translator


def _ctranslate2_translator(args, settings):
    """``--engine ctranslate2``'s translator; --quantize is CTranslate2's
    compute type."""
    import atexit
    import shutil
    import tempfile

    from keras_transformer import ctranslate2_engine
    from keras_transformer.generation import Translator

    directory = args.model
    if not ctranslate2_engine.is_export(directory):
        translator = Translator.from_pretrained(directory)
        directory = tempfile.mkdtemp(prefix="keras-transformer-ctranslate2-")
        atexit.register(shutil.rmtree, directory, ignore_errors=True)
        ctranslate2_engine.export_ctranslate2(translator, directory)
    return ctranslate2_engine.CTranslate2Translator(
        directory, compute_type=args.quantize or "default", **settings
    )


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
            # A progress bar on a terminal only: none of its carriage
            # returns and escape codes in a redirected log.
            verbose="auto" if sys.stderr.isatty() and not args.quiet else False,
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
        "--last",
        type=_positive_int,
        default=5,
        help="average the newest N (default 5)",
    )
    parser.set_defaults(handler=_average)


def _average(args):
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
            "one translation per line (empty lines stay empty). The input "
            "is read and translated in chunks of --chunk-size lines, each "
            "written and flushed before the next is read: memory stays "
            "flat on inputs of any length, and a pipe gets its first "
            "translations early. Search settings that are not given "
            "(--beam-size, --length-penalty, --method, ...) are the "
            "translator's saved generation settings "
            "(task.json)."
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
        "--method",
        choices=("beam", "greedy", "sample"),
        default=None,
        help=f"search ({SAVED_SETTING})",
    )
    _add_sampling_arguments(parser)
    parser.add_argument(
        "--n-best",
        type=_positive_int,
        default=None,
        metavar="K",
        help="print the K best translations of each line (K samples with "
        "--sample) as 'INDEX ||| TRANSLATION ||| SCORE', INDEX the 0-based "
        "input line, best first; beam search needs --beam-size >= K",
    )
    parser.add_argument(
        "--max-length-offset",
        type=int,
        default=None,
        help=f"at most input length + this many tokens ({SAVED_SETTING})",
    )
    parser.add_argument(
        "--batch-size",
        type=_positive_int,
        default=None,
        help=f"sentences per batch ({SAVED_SETTING})",
    )
    parser.add_argument(
        "--chunk-size",
        type=_positive_int,
        default=None,
        metavar="LINES",
        help="lines read, sorted by length, translated and written at a "
        f"time (default {CHUNK_SIZE}; 1 when the input is a terminal)",
    )
    _add_engine_arguments(parser)
    parser.add_argument(
        "--reference",
        default=None,
        help="reference translations: also print sacreBLEU to stderr",
    )
    _add_attention_arguments(parser)
    _add_progress_arguments(parser)
    parser.set_defaults(
        handler=_translate, check=functools.partial(_check_translate, parser)
    )


def _add_attention_arguments(parser):
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


# Lines read and translated at a time: a few dozen batches, so that
# sorting by length still groups similar sentences, while memory holds
# one chunk whatever the input's length.
CHUNK_SIZE = 1024
# The weight quantizations `--quantize` offers (`Translator.quantize`).
QUANTIZE_MODES = ("int8",)


def _add_sampling_arguments(parser):
    parser.add_argument(
        "--sample",
        action="store_true",
        help="sample instead of searching (the same as --method sample)",
    )
    parser.add_argument(
        "--top-k",
        type=_positive_int,
        default=None,
        help="sample among the K most probable tokens only",
    )
    parser.add_argument(
        "--top-p",
        type=_probability,
        default=None,
        help="sample among the most probable tokens whose probabilities "
        "add up to P (nucleus sampling), 0 < P <= 1",
    )
    parser.add_argument(
        "--temperature",
        type=_positive_float,
        default=None,
        help="divide the logits by T before sampling, T > 0",
    )
    parser.add_argument(
        "--seed",
        type=int,
        default=None,
        help="sampling seed: the same seed and --chunk-size give the same "
        "output",
    )


ENGINES = ("keras", "ctranslate2")


def _add_engine_arguments(parser):
    parser.add_argument(
        "--engine",
        choices=ENGINES,
        default="keras",
        help="decode with this package's search on the Keras backend "
        "(keras), or with CTranslate2 (ctranslate2: --model is a "
        "CTranslate2 export of keras-transformer export --format "
        "ctranslate2, or a saved translator, exported for this run; "
        'needs pip install "keras-transformer[ctranslate2]")',
    )
    parser.add_argument(
        "--quantize",
        default=None,
        metavar="TYPE",
        help="keras: quantize the weights after loading "
        "(Translator.quantize; int8); ctranslate2: CTranslate2's compute "
        "type (int8, int8_float32, int16, float16, bfloat16, float32)",
    )


def _check_engine(parser, args, owner=None):
    """--engine and --quantize, checked before any model is loaded: a
    missing ctranslate2 package or an unknown weight type fail in one
    line (exit status 2). ``owner`` names the flag that chose the
    engine (``--engine ...`` by default)."""
    owner = owner or f"--engine {args.engine}"
    if args.engine == "ctranslate2":
        from keras_transformer import ctranslate2_engine

        try:
            ctranslate2_engine.require_ctranslate2()
        except ctranslate2_engine.MissingDependencyError as error:
            parser.error(f"{owner}: {error}")
        types = ctranslate2_engine.QUANTIZATIONS
    else:
        types = QUANTIZE_MODES
    if args.quantize is not None and args.quantize not in types:
        parser.error(
            f"--quantize {args.quantize}: {owner} quantizes to "
            f"{', '.join(types)}; pass one of them."
        )
    if args.engine == "ctranslate2" and getattr(args, "plot_attention", None):
        parser.error(
            "--plot-attention needs the model's attention weights, which "
            "--engine ctranslate2 does not give; drop --engine ctranslate2 "
            "to draw them."
        )


def _add_progress_arguments(parser):
    shown = parser.add_mutually_exclusive_group()
    shown.add_argument(
        "--progress",
        action="store_true",
        help="report progress on stderr even when it is not a terminal "
        "(then one plain line per chunk)",
    )
    shown.add_argument("--quiet", action="store_true", help="no progress")


def _positive_int(text):
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a positive integer; pass 1 or more."
        )
    return value


def _positive_float(text):
    try:
        value = float(text)
    except ValueError:
        value = 0.0
    if not value > 0:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a number above 0; pass e.g. 0.7 (below 1 "
            "sharpens the distribution, above 1 flattens it)."
        )
    return value


def _probability(text):
    try:
        value = float(text)
    except ValueError:
        value = 0.0
    if not 0 < value <= 1:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not in (0, 1]; pass e.g. 0.9."
        )
    return value


def _check_translate(parser, args):
    """Settings that only make sense together, checked before any model
    is loaded; calls ``parser.error`` (exit status 2)."""
    if args.sample:
        if args.method not in (None, "sample"):
            parser.error(
                f"--sample and --method {args.method} disagree; give one."
            )
        args.method = "sample"
    if args.method != "sample":
        for flag in ("top_k", "top_p", "temperature", "seed"):
            if getattr(args, flag) is not None:
                name = "--" + flag.replace("_", "-")
                parser.error(
                    f"{name} {getattr(args, flag)} applies to sampling "
                    "only; add --sample."
                )
    problem = _n_best_problem(args.n_best, args.method, args.beam_size)
    if problem:
        parser.error(problem)
    _check_engine(parser, args)


def _n_best_problem(n_best, method, beam_size):
    """Why ``n_best`` translations cannot come from this search, or
    None; ``method`` and ``beam_size`` may be None (not known yet)."""
    if n_best is None or method == "sample":
        return None
    if method == "greedy" and n_best > 1:
        return (
            f"--n-best {n_best}: greedy search gives one translation per "
            "line; use --method beam with --beam-size "
            f"{n_best}, or --sample."
        )
    if method in (None, "beam") and beam_size is not None:
        if beam_size < n_best:
            return (
                f"--n-best {n_best} needs a beam of at least {n_best}, "
                f"but the beam size is {beam_size}; pass --beam-size "
                f"{n_best} (or more)."
            )
    return None


@contextlib.contextmanager
def _open_lines(path, flag):
    """The lines of ``path`` (standard input for ``"-"``) without their
    line ends, read lazily and decoded as strict UTF-8: an invalid line
    raises a ValueError naming its number."""
    if path == "-":
        # The binary stream reads a pipe line by line as data arrives.
        stream = getattr(sys.stdin, "buffer", sys.stdin)
        yield _decoded_lines(stream, f"{flag} (standard input)")
        return
    with open(path, "rb") as f:
        yield _decoded_lines(f, f"{flag} {path}")


def _decoded_lines(stream, name):
    for number, line in enumerate(stream, start=1):
        if isinstance(line, bytes):
            try:
                line = line.decode("utf-8", errors="strict")
            except UnicodeDecodeError as error:
                raise ValueError(
                    f"{name}: line {number} is not valid UTF-8 ({error.reason}"
                    f" at byte {error.start + 1} of the line); convert the "
                    "file to UTF-8, e.g. iconv -f latin1 -t utf-8."
                ) from None
        yield line.rstrip("\r\n")


def _read_lines(path, flag):
    with _open_lines(path, flag) as lines:
        return list(lines)


@contextlib.contextmanager
def _open_output(path):
    if path == "-":
        yield sys.stdout
        return
    with open(path, "w", encoding="utf-8") as f:
        yield f


def _chunks(items, size):
    """``(index of the first item, list of at most size items)`` pairs;
    never reads an item past the chunk it returns."""
    items = iter(items)
    first = 0
    while chunk := list(itertools.islice(items, size)):
        yield first, chunk
        first += len(chunk)


@dataclasses.dataclass
class _Progress:
    """Lines done and lines per second, on stderr: one line rewritten in
    place on a terminal, else one plain line per update."""

    stream: object
    in_place: bool
    start: float = dataclasses.field(default_factory=time.perf_counter)
    done: int = 0
    width: int = 0

    def update(self, count):
        self.done += count
        elapsed = max(time.perf_counter() - self.start, 1e-9)
        text = (
            f"{self.done} sentences translated, "
            f"{self.done / elapsed:.1f} sentences/s"
        )
        if self.in_place:
            self.stream.write("\r" + text.ljust(self.width))
            self.width = len(text)
        else:
            self.stream.write(text + "\n")
        self.stream.flush()

    def close(self):
        if self.in_place and self.done:
            self.stream.write("\n")
            self.stream.flush()


def _progress(args):
    """A `_Progress` on stderr, or None with --quiet or when stderr is
    not a terminal and --progress was not given."""
    terminal = sys.stderr.isatty()
    if args.quiet or not (terminal or args.progress):
        return None
    return _Progress(sys.stderr, in_place=terminal)


def _format_chunk(first, hypotheses, n_best):
    """The output lines of one chunk: translations, or with ``n_best``
    the fairseq / Moses n-best lines ``INDEX ||| TEXT ||| SCORE``."""
    if n_best is None:
        return "".join(f"{row[0].text}\n" for row in hypotheses)
    lines = []
    for index, row in enumerate(hypotheses, start=first):
        # Samples come in the order drawn; beams already best first.
        for hypothesis in sorted(row, key=lambda h: -h.score):
            lines.append(
                f"{index} ||| {hypothesis.text} ||| {hypothesis.score:.6f}\n"
            )
    return "".join(lines)


def _translate(args):
    from keras_transformer.generation import corpus_bleu

    _check_translate_paths(args)
    translator = _load_translator(
        args,
        "method",
        "max_length_offset",
        "batch_size",
        "top_k",
        "top_p",
        "temperature",
        "seed",
    )
    config = translator.generation_config
    problem = _n_best_problem(args.n_best, config.method, config.beam_size)
    if problem:
        raise ValueError(problem)
    settings = {"num_return_sequences": args.n_best or 1}
    chunk_size = args.chunk_size or _default_chunk_size(args.input)
    # Only --reference and --plot-attention need what was translated.
    translations, attention = [], []
    progress = _progress(args)
    with (
        _open_lines(args.input, "--input") as lines,
        _open_output(args.output) as out,
    ):
        for first, chunk in _chunks(lines, chunk_size):
            hypotheses = translator.translate_with_scores(
                chunk, verbose=False, **settings
            )
            out.write(_format_chunk(first, hypotheses, args.n_best))
            out.flush()
            if progress is not None:
                progress.update(len(chunk))
            if args.reference is not None:
                translations += [row[0].text for row in hypotheses]
            if args.plot_attention:
                attention += _chunk_attention(
                    translator, first, chunk, hypotheses
                )
    if progress is not None:
        progress.close()
    if args.reference is not None:
        references = _read_lines(args.reference, "--reference")
        print(corpus_bleu(translations, references), file=sys.stderr)
    if args.plot_attention:
        _plot_attention(args, attention)
    return 0


def _check_translate_paths(args):
    """Refuses unreadable inputs and unwritable outputs before the model
    loads and anything is translated."""
    _check_readable(args.input, "--input")
    if args.reference is not None:
        _check_readable(args.reference, "--reference")
    _check_writable(args.output, "--output")
    if args.plot_attention:
        _check_writable(args.plot_attention, "--plot-attention")


def _check_readable(path, flag):
    if path == "-":
        return
    if os.path.isdir(path):
        raise IsADirectoryError(
            f"{flag} {path} is a directory; pass a file, one sentence per line."
        )
    with open(path, "rb"):
        pass


def _check_writable(path, flag):
    if path == "-":
        return
    if os.path.isdir(path):
        raise IsADirectoryError(
            f"{flag} {path} is a directory; pass a file name."
        )
    parent = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(parent):
        raise FileNotFoundError(
            f"{flag} {path}: the directory {parent} does not exist; create "
            "it first or pass another path."
        )
    target = path if os.path.exists(path) else parent
    if not os.access(target, os.W_OK):
        raise PermissionError(
            f"{flag} {path}: {target} is not writable; pass another path."
        )


def _default_chunk_size(path):
    # Someone typing at a terminal gets each translation as they enter
    # the line.
    interactive = path == "-" and sys.stdin.isatty()
    return 1 if interactive else CHUNK_SIZE


def _chunk_attention(translator, first, chunk, hypotheses):
    """``(line index, SentenceAttention, written translation)`` for each
    non-empty line of a chunk."""
    lines = [i for i, source in enumerate(chunk) if source.strip()]
    if not lines:
        return []
    # `Translator.attention` searches again with the same settings and
    # keeps the generated token ids: the written text tokenized again can
    # split into other pieces (or many more, for pieces that do not
    # decode to text), which are not the tokens the model chose. Beam
    # and greedy search find the same translation again.
    attention = translator.attention([chunk[i] for i in lines])
    return [
        (first + i, sentence, hypotheses[i][0].text)
        for i, sentence in zip(lines, attention, strict=True)
    ]


def _plot_attention(args, attention):
    from keras_transformer.plotting import plot_attention

    if not attention:
        raise ValueError("--plot-attention: the input has no sentence.")
    stem, suffix = os.path.splitext(args.plot_attention)
    for line, sentence, written in attention:
        path = args.plot_attention
        if len(attention) > 1:
            path = f"{stem}-{line + 1}{suffix or '.png'}"
        plot_attention(
            sentence,
            path,
            kind=args.attention_kind,
            layer=args.attention_layer,
        )
        note = ""
        if sentence.translation != written:
            note = f"; drawn for another sample: {sentence.translation!r}"
        print(
            f"Attention of line {line + 1}: {path} "
            f"({len(sentence.output_tokens)} target by "
            f"{len(sentence.source_tokens)} source tokens{note})",
            file=sys.stderr,
        )


def _add_score(commands):
    parser = commands.add_parser(
        "score",
        help="score given translations with a saved translator",
        description=(
            "Scores each target line as the translation of the source "
            "line beside it, teacher-forced (Translator.score), and "
            "prints per pair the length-normalized score (the beam "
            "search's, with --length-penalty) and the total "
            "log-probability of the target and its end token, separated "
            "by a tab. Both files are read in chunks of --chunk-size "
            "pairs."
        ),
    )
    parser.add_argument(
        "--model", required=True, help="directory of a saved Translator"
    )
    parser.add_argument("--source", required=True, help="source sentences")
    parser.add_argument(
        "--target", required=True, help="their translations, line by line"
    )
    parser.add_argument(
        "--output", default="-", help="output file (default: standard output)"
    )
    _add_length_penalty_argument(parser)
    parser.add_argument(
        "--batch-size",
        type=_positive_int,
        default=None,
        help=f"pairs per batch ({SAVED_SETTING})",
    )
    parser.add_argument(
        "--chunk-size", type=_positive_int, default=CHUNK_SIZE, metavar="LINES"
    )
    _add_engine_arguments(parser)
    parser.set_defaults(
        handler=_score, check=functools.partial(_check_engine, parser)
    )


def _count_lines(path, flag):
    with _open_lines(path, flag) as lines:
        return sum(1 for _ in lines)


def _score(args):
    # Counted (and decoded) first: a mismatch fails before the model
    # loads, not after the first chunks were written.
    counts = [
        _count_lines(args.source, "--source"),
        _count_lines(args.target, "--target"),
    ]
    if counts[0] != counts[1]:
        raise ValueError(
            f"--source {args.source} has {counts[0]} lines but --target "
            f"{args.target} has {counts[1]}; they must align line by line."
        )
    translator = _load_translator(args, "batch_size")
    with (
        _open_lines(args.source, "--source") as sources,
        _open_lines(args.target, "--target") as targets,
        _open_output(args.output) as out,
    ):
        pairs = zip(sources, targets, strict=True)
        for _, chunk in _chunks(pairs, args.chunk_size):
            scores = translator.score(
                [source for source, _ in chunk], [target for _, target in chunk]
            )
            out.write(
                "".join(
                    f"{score:.6f}\t{log_prob:.6f}\n"
                    for score, log_prob in scores
                )
            )
            out.flush()
    return 0


EXPORT_FORMATS = ("savedmodel", "ctranslate2")


def _add_export(commands):
    parser = commands.add_parser(
        "export",
        help="export a saved translator for serving (SavedModel or "
        "CTranslate2)",
        description=(
            "Writes a saved translator for serving (Translator.export). "
            "--format savedmodel (the default): a TensorFlow SavedModel "
            "whose serving_default signature takes a batch of sentences "
            "and returns their translations and scores, with "
            "tokenization, the search of the translator's generation "
            "settings (--beam-size, --length-penalty override them) and "
            "detokenization in the graph, for TF Serving. --format "
            "ctranslate2: a CTranslate2 model directory with the "
            "tokenizer and the generation settings beside it, for fast "
            "CPU decoding (translate --engine ctranslate2 --model "
            "OUTPUT)."
        ),
    )
    parser.add_argument(
        "--model", required=True, help="directory of a saved Translator"
    )
    parser.add_argument(
        "--output", required=True, help="the export directory to write"
    )
    parser.add_argument(
        "--format", choices=EXPORT_FORMATS, default="savedmodel"
    )
    parser.add_argument(
        "--overwrite",
        action="store_true",
        help="replace --output if it exists and is not empty",
    )
    _add_search_arguments(parser)
    parser.add_argument(
        "--quantize",
        default=None,
        metavar="TYPE",
        help="savedmodel: quantize the weights after loading "
        "(Translator.quantize; int8); ctranslate2: the stored weight "
        "type (int8, int8_float32, int8_float16, int8_bfloat16, int16, "
        "float16, bfloat16, float32; default float32, int8 for an int8 "
        "translator)",
    )
    parser.set_defaults(
        handler=_export, check=functools.partial(_check_export, parser)
    )


def _check_export(parser, args):
    args.engine = "ctranslate2" if args.format == "ctranslate2" else "keras"
    _check_engine(parser, args, owner=f"--format {args.format}")


def _export(args):
    from keras_transformer.generation.translator import check_export_directory

    # Refused before the model loads.
    check_export_directory(args.output, args.overwrite)
    if args.format == "ctranslate2":
        args.engine = "keras"
        translator = _load_translator(args, quantize=False)
        translator.export(
            args.output,
            overwrite=args.overwrite,
            format="ctranslate2",
            quantization=args.quantize,
        )
    else:
        translator = _load_translator(args)
        translator.export(args.output, overwrite=args.overwrite)
    print(args.output)
    return 0


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
    if not args.verbose:
        _quiet()
    if hasattr(args, "check"):
        args.check(args)
    if args.debug:
        return args.handler(args)
    try:
        return args.handler(args)
    except KeyboardInterrupt as error:
        # Ctrl-C: the training run says which epoch a rerun resumes from.
        _fail(args, str(error) or "interrupted")
        return 130
    except BrokenPipeError:
        # Whoever read standard output stopped (`... | head`): no
        # traceback, and nothing more to flush into the closed pipe.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1
    except (OSError, ValueError) as error:
        # Errors a user can cause (a missing, unreadable or unwritable
        # file, a bad setting) read as one line; anything else keeps its
        # traceback.
        message = _user_error(error)
        if message is None:
            raise
        _fail(args, message)
        return 1


def _user_error(error):
    """The one-line message of an error a user can cause, or None."""
    if isinstance(error, UnicodeDecodeError):
        return (
            f"the input is not valid UTF-8 ({error.reason} at byte "
            f"{error.start}); convert it to UTF-8."
        )
    if isinstance(error, (ValueError, FileNotFoundError, FileExistsError)):
        return str(error)
    if isinstance(error, OSError) and error.filename is not None:
        # PermissionError, IsADirectoryError, a full disk, ...
        return f"{error.filename}: {error.strerror or error}."
    if isinstance(error, OSError) and type(error) is not OSError:
        return str(error)
    return None


# Settings that keep TensorFlow's C++ logging quiet (its info lines,
# and on a machine without a GPU the error-level "failed call to
# cuInit"), set before anything imports TensorFlow unless the user set
# them.
QUIET_ENVIRONMENT = {"TF_CPP_MIN_LOG_LEVEL": "3", "GRPC_VERBOSITY": "ERROR"}
# Python warnings that say nothing a user of the command can act on:
# the input pipeline is a tf.data.Dataset shuffled by the library.
QUIET_WARNINGS = (r"`shuffle=True` was passed, but will be ignored",)


def _quiet():
    """Hides the messages of libraries that a user of the command cannot
    act on (``--verbose`` keeps them)."""
    import warnings

    for name, value in QUIET_ENVIRONMENT.items():
        os.environ.setdefault(name, value)
    for message in QUIET_WARNINGS:
        warnings.filterwarnings("ignore", message=message)
    if "tensorflow" not in sys.modules:
        _QUIET_TENSORFLOW.remove()
        _QUIET_TENSORFLOW.install()


@contextlib.contextmanager
def _stderr_to_null(name):
    """Points file descriptor 2 at the null device while TensorFlow is
    imported: the absl logging of its native libraries (oneDNN, cudart,
    "All log messages before absl::InitializeLog()") writes while they
    load, before TF_CPP_MIN_LOG_LEVEL applies. Then turns absl's Python
    logger down to errors."""
    import logging

    sys.stderr.flush()
    saved = os.dup(2)
    null = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(null, 2)
        yield
    finally:
        sys.stderr.flush()
        os.dup2(saved, 2)
        os.close(saved)
        os.close(null)
    _QUIET_TENSORFLOW.remove()
    logging.getLogger("absl").setLevel(logging.ERROR)


_QUIET_TENSORFLOW = ImportHook(
    lambda name: name == "tensorflow", _stderr_to_null
)


def _fail(args, message):
    # One line, however the message was written.
    message = " ".join(str(message).split())
    print(
        f"keras-transformer {args.command}: error: {message}", file=sys.stderr
    )


if __name__ == "__main__":
    sys.exit(main())
