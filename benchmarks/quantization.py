"""BLEU and speed of a saved translator in float32 and int8.

    python -m benchmarks.quantization --model DIR [--split test2016]
        [--data-dir DIR | --source FILE --reference FILE] [--limit N]
        [--method beam] [--beam-size 4] [--length-penalty A]
        [--speed-sentences 256] [--rounds 3] [--threads N]
        [--embedding-int8] [--output FILE.json]

Loads the translator twice in one process: as saved (float32), and
quantized with `Translator.quantize("int8")`. Both translate the split
(Multi30k test2016 by default) with the same search settings (beam 4
and the length penalty saved with the translator, which the recipe
chose, unless given) and are scored with sacreBLEU; the fraction of
identical translations is reported too (with ``--embedding-int8``,
also the BLEU with the token embedding rounded to int8). Then
`translate` of the first ``--speed-sentences`` sentences of the split,
and of its first sentence alone, is timed with float32 and int8
alternating in rounds (both searches are compiled by the BLEU runs);
medians of the rounds. Writes
``benchmarks/results/quantization_<backend>.json`` unless ``--output``
says otherwise.
"""

import argparse
import os
import pathlib
import statistics
import tempfile
import time

from benchmarks import _common

ROOT = pathlib.Path(__file__).resolve().parents[1]
MULTI30K = ROOT.parent / "shared" / "data" / "multi30k"


def _arguments(argv):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", required=True, help="translator dir")
    parser.add_argument("--dataset", default="multi30k")
    parser.add_argument("--split", default="test2016")
    parser.add_argument("--data-dir", default=str(MULTI30K))
    parser.add_argument("--source", default=None)
    parser.add_argument("--reference", default=None)
    parser.add_argument("--limit", type=int, default=None)
    parser.add_argument("--method", default="beam")
    parser.add_argument("--beam-size", type=int, default=4)
    parser.add_argument("--length-penalty", type=float, default=None)
    parser.add_argument("--speed-sentences", type=int, default=256)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=os.cpu_count())
    parser.add_argument(
        "--embedding-int8",
        action="store_true",
        help="also score the int8 translator with its token embedding "
        "rounded to int8 per row and back (quality only)",
    )
    parser.add_argument("--output", default=None)
    args = parser.parse_args(argv)
    if (args.source is None) != (args.reference is None):
        parser.error("pass --source and --reference together")
    return args


def _pairs(args):
    from keras_transformer import data

    if args.source is not None:
        pairs, _ = data.read_parallel_corpus(args.source, args.reference)
    else:
        pairs, _ = data.load_pairs(args.dataset, args.split, args.data_dir)
    return pairs[: args.limit] if args.limit else pairs


def _weights_bytes(translator):
    """Bytes of the model's variables, and of its saved weights file."""
    import keras

    in_memory = sum(
        keras.ops.convert_to_numpy(v).nbytes for v in translator.model.weights
    )
    with tempfile.TemporaryDirectory() as directory:
        path = os.path.join(directory, "model.weights.h5")
        translator.model.save_weights(path)
        return in_memory, os.path.getsize(path)


def _round_embedding_to_int8(translator):
    """Rounds the token embedding to int8 with a float scale per token
    (Keras's quantizer, as Keras's ``Embedding`` quantizes) and stores
    the values back as float: the quality of an int8 embedding, which
    is also the tied output projection (section 3.4), without its
    storage or speed."""
    import keras

    for layer in {
        id(layer): layer
        for layer in (
            translator.model.encoder_token_embedding,
            translator.model.decoder_token_embedding,
        )
    }.values():
        values, scale = keras.quantizers.abs_max_quantize(
            layer.embeddings, axis=-1
        )
        layer.embeddings.assign(
            keras.ops.divide(keras.ops.cast(values, "float32"), scale)
        )
    return translator


def _bleu(translators, pairs):
    from keras_transformer.generation import evaluate_bleu

    sources = [s for s, _ in pairs]
    references = [t for _, t in pairs]
    results = {}
    for name, translator in translators.items():
        start = time.perf_counter()
        result = evaluate_bleu(translator, sources, references, verbose=False)
        seconds = time.perf_counter() - start
        in_memory, on_disk = _weights_bytes(translator)
        results[name] = {
            "bleu": round(result.score, 2),
            "signature": result.signature,
            "first_pass_s": round(seconds, 2),
            "weights_bytes": in_memory,
            "weights_file_bytes": on_disk,
            "hypotheses": result.hypotheses,
        }
        print(f"{name}: {result}", flush=True)
    return results


def _speed(translators, sentences, rounds):
    """Seconds per call, float32 and int8 alternating in rounds."""
    levels = {
        f"{len(sentences)} sentences": sentences,
        "1 sentence": sentences[:1],
    }
    rows = []
    for level, batch in levels.items():
        calls = {
            name: lambda t=translator, b=batch: t.translate(b, verbose=False)
            for name, translator in translators.items()
        }
        times = _common.interleaved(calls, rounds, _common.timed)
        medians = {name: statistics.median(t) for name, t in times.items()}
        rows.append(
            {
                "level": level,
                "sentences_per_s": {
                    name: round(len(batch) / s, 2)
                    for name, s in medians.items()
                },
                "median_s": {n: round(s, 4) for n, s in medians.items()},
                "rounds_s": {
                    n: [round(s, 4) for s in t] for n, t in times.items()
                },
                "int8_speedup": round(medians["float32"] / medians["int8"], 3),
            }
        )
        print(rows[-1], flush=True)
    return rows


def main(argv=None):
    args = _arguments(argv)
    _common.pin_threads(args.threads)
    import keras

    from keras_transformer.generation import Translator

    _common.pin_frameworks(args.threads)
    pairs = _pairs(args)
    settings = {"method": args.method, "beam_size": args.beam_size}
    if args.length_penalty is not None:
        settings["length_penalty"] = args.length_penalty
    translators = {
        "float32": Translator.from_pretrained(args.model, **settings),
        "int8": Translator.from_pretrained(args.model, **settings).quantize(
            "int8"
        ),
    }
    scored = dict(translators)
    if args.embedding_int8:
        scored["int8_embedding_rounded"] = _round_embedding_to_int8(
            Translator.from_pretrained(args.model, **settings).quantize("int8")
        )
    bleu = _bleu(scored, pairs)
    hypotheses = {name: row.pop("hypotheses") for name, row in bleu.items()}
    float_h, int8_h = hypotheses["float32"], hypotheses["int8"]
    same = sum(a == b for a, b in zip(float_h, int8_h, strict=True))
    sentences = [s for s, _ in pairs[: args.speed_sentences]]
    backend = keras.backend.backend()
    report = {
        "benchmark": "quantization",
        "backend": backend,
        "model": os.path.abspath(args.model),
        "split": args.split if args.source is None else args.source,
        "sentences": len(pairs),
        "generation": translators["float32"].generation_config.to_dict(),
        "machine": _common.machine(),
        "bleu": bleu,
        "bleu_drop": round(bleu["float32"]["bleu"] - bleu["int8"]["bleu"], 2),
        "identical_translations": round(same / len(pairs), 4),
        "speed": _speed(translators, sentences, args.rounds),
    }
    output = args.output or ROOT / "benchmarks" / "results" / (
        f"quantization_{backend}.json"
    )
    _common.write_json(output, report)
    return report


if __name__ == "__main__":
    main()
