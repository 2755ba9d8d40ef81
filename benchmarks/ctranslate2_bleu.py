"""Test-set BLEU of a saved translator through this package's search and
through its CTranslate2 export, with the paper's length penalty and
with CTranslate2's.

    python -m benchmarks.ctranslate2_bleu --model runs/multi30k_en_de
        --data-dir ../shared/data/multi30k [--split test2016]
        [--limit N] [--threads 2] [--output FILE.json]

The translator's saved beam size and alpha, in these rows:

- ``keras float32 gnmt``: `Translator.translate` as saved: the paper's
  GNMT penalty ``((5 + |Y|) / 6) ** alpha`` and its search;
- ``keras float32 hf``: the same model and alpha with
  ``length_penalty_style="hf"`` (``|Y| ** alpha``) and
  ``early_stopping=True``: the search CTranslate2 runs;
- ``ctranslate2 float32 gnmt`` and ``ctranslate2 float32 hf``: the
  translator exported with ``Translator.export(format="ctranslate2")``
  and decoded by `CTranslate2Translator` with either style asked for
  (CTranslate2 has no GNMT penalty: it ranks by ``|Y| ** alpha`` for
  both, which the rows show);
- ``ctranslate2 int8 hf``: the same export with ``compute_type="int8"``;
- ``keras int8 gnmt``: ``Translator.quantize("int8")`` as saved.

Each row gives sacreBLEU, the seconds it took to translate the split,
and how many translations equal those of ``keras float32 hf``.
"""

import argparse
import os
import sys
import tempfile
import time
import warnings

from benchmarks import _common

# (engine, weights, length penalty style) of each row, in order.
ROWS = (
    ("keras", "float32", "gnmt"),
    ("keras", "float32", "hf"),
    ("ctranslate2", "float32", "gnmt"),
    ("ctranslate2", "float32", "hf"),
    ("ctranslate2", "int8", "hf"),
    ("keras", "int8", "gnmt"),
)
REFERENCE = "keras float32 hf"


def _arguments(argv):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", required=True)
    parser.add_argument("--data-dir", default=None)
    parser.add_argument("--dataset", default="multi30k")
    parser.add_argument("--split", default="test2016")
    parser.add_argument("--limit", type=int, default=None)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--output", default=None)
    args = parser.parse_args(argv)
    if args.limit is not None and args.limit < 1:
        parser.error(f"--limit={args.limit} must be at least 1.")
    return args


def _translators(args, export):
    """``({row name: translate(sources)}, the saved GenerationConfig)``
    of `ROWS`."""
    import keras_transformer as kt
    from keras_transformer.ctranslate2_engine import CTranslate2Translator

    keras_float = kt.Translator.from_pretrained(args.model)
    keras_float.export(export, format="ctranslate2")
    hf = dict(length_penalty_style="hf", early_stopping=True)
    styles = {"gnmt": {}, "hf": hf}
    served = {
        weights: CTranslate2Translator(
            export, compute_type=weights, intra_threads=args.threads
        )
        for weights in ("float32", "int8")
    }
    keras_int8 = kt.Translator.from_pretrained(args.model).quantize("int8")
    engines = {
        ("keras", "float32"): keras_float,
        ("keras", "int8"): keras_int8,
        ("ctranslate2", "float32"): served["float32"],
        ("ctranslate2", "int8"): served["int8"],
    }

    def translate(translator, settings):
        return lambda sources: translator.translate(
            sources, verbose=False, **settings
        )

    translators = {
        f"{engine} {weights} {style}": translate(
            engines[engine, weights], styles[style]
        )
        for engine, weights, style in ROWS
    }
    return translators, keras_float.generation_config


def main(argv=None):
    """Translates the split with every row's translator; prints the
    table and returns the report."""
    args = _arguments(argv)
    _common.pin_threads(args.threads)

    from keras_transformer import data
    from keras_transformer.generation import corpus_bleu

    _common.pin_frameworks(args.threads)
    pairs, _ = data.load_pairs(args.dataset, args.split, args.data_dir)
    pairs = pairs[: args.limit]
    sources = [s for s, _ in pairs]
    references = [t for _, t in pairs]
    rows, translations = [], {}
    with tempfile.TemporaryDirectory() as directory:
        translators, config = _translators(
            args, os.path.join(directory, "export")
        )
        for name, translate in translators.items():
            start = time.perf_counter()
            with warnings.catch_warnings():
                # The GNMT and truncation warnings are what the rows show.
                warnings.simplefilter("ignore", UserWarning)
                translations[name] = translate(sources)
            seconds = time.perf_counter() - start
            bleu = corpus_bleu(translations[name], references)
            rows.append(
                {
                    "row": name,
                    "bleu": round(bleu.score, 2),
                    "seconds": round(seconds, 1),
                }
            )
    reference = translations[REFERENCE]
    for row in rows:
        row["same_as_keras_float32_hf"] = sum(
            a == b
            for a, b in zip(translations[row["row"]], reference, strict=True)
        )
    report = _report(args, len(sources), rows, bleu.signature, config)
    _common.write_json(args.output, report)
    print(
        _common.table(
            rows,
            [
                ("row", "row"),
                ("BLEU", "bleu"),
                ("seconds", "seconds"),
                ("same as keras float32 hf", "same_as_keras_float32_hf"),
            ],
        )
    )
    return report


def _report(args, count, rows, signature, config):
    import keras

    return {
        "benchmark": "ctranslate2_bleu",
        "backend": keras.backend.backend(),
        "model": os.path.abspath(args.model),
        "split": args.split,
        "sentences": count,
        "beam_size": config.beam_size,
        "length_penalty": config.length_penalty,
        "signature": signature,
        "rows": rows,
        "machine": _common.machine(),
    }


if __name__ == "__main__":
    main(sys.argv[1:])
