"""Decoding speed: cached versus uncached search, and Multi30k throughput.

    python -m benchmarks.decoding [--quick] [--smoke] [--threads N]
        [--batch-sizes 1 32] [--dtype mixed_bfloat16] [--output FILE.json]
        [--compare-cache-layouts]

1. Base model (Table 3, random weights, vocabulary 8000), 32 output tokens
   at batch 1 and 8 at batch 32 (``--steps``), forced by banning the end
   token: the cached, compiled search against the same compiled search
   without the key/value cache ("uncached": the encoder runs once, the
   decoder re-runs over the whole output buffer every step and only the
   current position is projected onto the vocabulary), greedy and beam 4.
   Contestants alternate in rounds; medians are reported after a warm-up
   call that compiles. ``--compare-cache-layouts`` adds the cached search
   with the other key/value cache layout than the backend's default
   (``Generator(cache_layout=...)``) as a third contestant.
2. Sentences per second with beam 4 (alpha 0.6, input length + 50) on
   Multi30k test2016 (``/work/shared/data/multi30k/test.en``) with the tiny
   configuration and a tokenizer trained on the training set. Weights are
   random, so most outputs run to their length limit: a pessimistic
   number for a trained model, which stops at its end token.
"""

import argparse
import os
import pathlib
import statistics
import sys
import time

from benchmarks import _common

MULTI30K = pathlib.Path(__file__).resolve().parents[2] / "shared" / "data"
MULTI30K = MULTI30K / "multi30k"
SMOKE_CONFIG = {
    "num_encoder_layers": 1,
    "num_decoder_layers": 1,
    "hidden_dim": 16,
    "num_heads": 2,
    "intermediate_dim": 32,
}


def _time(fn):
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def _decode_call(generator, ids, method, beam, steps, use_cache):
    def call():
        return generator.generate(
            ids,
            method=method,
            beam_size=beam,
            max_length=steps,
            use_cache=use_cache,
        )

    return call


def cached_versus_uncached(
    batch_sizes,
    rounds,
    source_length=20,
    steps=None,
    config="base",
    dtype=None,
    vocabulary_size=8000,
    compare_layouts=False,
):
    import keras
    import numpy as np

    import keras_transformer as kt
    from keras_transformer.generation import Generator

    steps = steps or {}
    keras.utils.set_random_seed(0)
    overrides = {} if config != "smoke" else SMOKE_CONFIG
    model = kt.Transformer.from_config_name(
        "tiny" if config == "smoke" else config,
        vocabulary_size=vocabulary_size,
        max_sequence_length=256,
        dtype=dtype,
        **overrides,
    )
    # The end token is banned so that every run decodes exactly `steps`.
    generator = Generator(model, banned_ids=(0, 2, 3))
    other = None
    if compare_layouts:
        layout = "stacked" if generator.cache_layout == "split" else "split"
        other = Generator(model, banned_ids=(0, 2, 3), cache_layout=layout)
    rows = []
    for batch_size in batch_sizes:
        batch_steps = steps.get(batch_size, 32 if batch_size < 8 else 8)
        rng = np.random.default_rng(0)
        ids = rng.integers(
            4, vocabulary_size, (batch_size, source_length), "int32"
        )
        ids[:, -1] = 3
        for method, beam in (("greedy", 1), ("beam", 4)):
            contestants = {
                use_cache: _decode_call(
                    generator, ids, method, beam, batch_steps, use_cache
                )
                for use_cache in (True, False)
            }
            if other is not None:
                contestants["other_layout"] = _decode_call(
                    other, ids, method, beam, batch_steps, True
                )
            compile_s = {k: _time(fn) for k, fn in contestants.items()}
            times = _common.interleaved(contestants, rounds, _time)
            cached = statistics.median(times[True])
            uncached = statistics.median(times[False])
            row = {
                "batch_size": batch_size,
                "method": method if method == "greedy" else "beam4",
                "steps": batch_steps,
                "dtype": dtype or "float32",
                "cached_s": cached,
                "uncached_s": uncached,
                "cached_s_per_round": times[True],
                "uncached_s_per_round": times[False],
                "speedup": uncached / cached,
                "speedup_per_round": _common.ratios(times, False, True)[
                    "per_round"
                ],
                "cached_tokens_per_s": batch_size * batch_steps / cached,
                "cache_layout": generator.cache_layout,
                "first_call_s": compile_s,
            }
            layout_note = ""
            if other is not None:
                row["other_layout"] = other.cache_layout
                row["other_layout_s"] = statistics.median(times["other_layout"])
                row["other_layout_s_per_round"] = times["other_layout"]
                row["layout_speedup"] = _common.ratios(
                    times, "other_layout", True
                )
                layout_note = (
                    f"  {other.cache_layout} cache "
                    f"{row['other_layout_s']:7.3f}s "
                    f"({row['layout_speedup']['median']:4.2f}x)"
                )
            rows.append(row)
            print(
                f"  batch {batch_size:3d} {row['method']:6s} "
                f"{batch_steps} tokens  cached "
                f"{cached:7.3f}s  uncached {uncached:7.3f}s  "
                f"speedup {row['speedup']:5.1f}x{layout_note}",
                flush=True,
            )
    return rows


def multi30k_throughput(limit, beam_size=4, batch_size=32):
    import keras

    import keras_transformer as kt
    from keras_transformer.generation import Translator

    source = MULTI30K / "test.en"
    if not source.exists():
        print(f"  skipped: {source} not found")
        return None
    from keras_transformer.data import train_tokenizer

    sentences = source.read_text(encoding="utf-8").splitlines()
    if limit:
        sentences = sentences[:limit]
    tokenizer = train_tokenizer(
        [str(MULTI30K / "train.en"), str(MULTI30K / "train.de")], 8000
    )
    keras.utils.set_random_seed(0)
    model = kt.Transformer.from_config_name(
        "tiny", vocabulary_size=tokenizer.vocabulary_size
    )
    translator = Translator(
        model, tokenizer, beam_size=beam_size, batch_size=batch_size
    )
    first = _time(lambda: translator.translate(sentences, verbose=False))
    warm = _time(lambda: translator.translate(sentences, verbose=False))
    result = {
        "sentences": len(sentences),
        "beam_size": beam_size,
        "batch_size": batch_size,
        "first_call_s": first,
        "warm_s": warm,
        "sentences_per_s": len(sentences) / warm,
        "compiled_programs": len(translator.generator._functions),
    }
    print(
        f"  {len(sentences)} sentences, beam {beam_size}: "
        f"{result['sentences_per_s']:.1f} sentences/s warm "
        f"(first call {first:.1f}s, "
        f"{result['compiled_programs']} compiled programs)",
        flush=True,
    )
    return result


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--output", default=None)
    parser.add_argument("--rounds", type=int, default=None)
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=None)
    parser.add_argument(
        "--steps",
        type=int,
        default=None,
        help="output tokens (default: 32 at batch < 8, else 8)",
    )
    parser.add_argument(
        "--dtype", default="float32", choices=("float32", "mixed_bfloat16")
    )
    parser.add_argument("--threads", type=int, default=os.cpu_count())
    parser.add_argument("--skip-base", action="store_true")
    parser.add_argument(
        "--compare-cache-layouts",
        action="store_true",
        help="also time the cached search with the other cache layout",
    )
    parser.add_argument("--skip-multi30k", action="store_true")
    parser.add_argument(
        "--smoke",
        action="store_true",
        help="a one-layer model, 4 tokens, batch 1, one round",
    )
    args = parser.parse_args(argv)
    _common.pin_threads(args.threads)
    import keras

    _common.pin_frameworks(args.threads)
    rounds = args.rounds or (1 if args.smoke else 2 if args.quick else 5)
    batch_sizes = args.batch_sizes or (
        (1,) if args.quick or args.smoke else (1, 32)
    )
    steps = {b: args.steps for b in batch_sizes} if args.steps else {}
    config = "base"
    if args.smoke:
        config, steps = "smoke", dict.fromkeys(batch_sizes, 4)
        args.skip_multi30k = True
    dtype = None if args.dtype == "float32" else args.dtype
    backend = keras.backend.backend()
    print(
        f"backend {backend}, {args.threads} threads, rounds {rounds}, "
        f"{args.dtype}"
    )
    report = {
        "benchmark": "decoding",
        "backend": backend,
        "keras": keras.__version__,
        "machine": _common.machine(),
        "threads": args.threads,
        "rounds": rounds,
    }
    if not args.skip_base:
        print(f"cached versus uncached, {config} model:")
        report["cached_vs_uncached"] = cached_versus_uncached(
            batch_sizes,
            rounds,
            steps=steps,
            config=config,
            dtype=dtype,
            vocabulary_size=64 if args.smoke else 8000,
            compare_layouts=args.compare_cache_layouts,
        )
    if not args.skip_multi30k:
        print("Multi30k test2016, beam 4, tiny model:")
        report["multi30k"] = multi30k_throughput(256 if args.quick else None)
    _common.write_json(args.output, report)
    return report


if __name__ == "__main__":
    main()
    sys.exit(0)
