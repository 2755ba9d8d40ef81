"""Decoding speed: cached versus uncached search, and Multi30k throughput.

    python -m benchmarks.decoding [--quick] [--output FILE.json]

1. Base model (Table 3, random weights, vocabulary 8000), 64 output tokens
   forced by banning the end token: the cached, compiled search against
   the same compiled search re-running the whole model (encoder and
   decoder) over the output buffer every step ("uncached", what decoders
   without a key/value cache do), greedy and beam 4. Contestants alternate
   in rounds; medians are reported after a warm-up call that compiles.
2. Sentences per second with beam 4 (alpha 0.6, input length + 50) on
   Multi30k test2016 (``/work/shared/data/multi30k/test.en``) with the tiny
   configuration and a tokenizer trained on the training set. Weights are
   random, so most outputs run to their length limit: a pessimistic
   number for a trained model, which stops at its end token.
"""

import argparse
import json
import os
import pathlib
import statistics
import sys
import time

import keras
import numpy as np

import keras_transformer as kt
from keras_transformer.generation import Generator, Translator

MULTI30K = pathlib.Path(__file__).resolve().parents[2] / "shared" / "data"
MULTI30K = MULTI30K / "multi30k"


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


def cached_versus_uncached(batch_sizes, rounds, source_length=20, steps=64):
    keras.utils.set_random_seed(0)
    model = kt.Transformer.from_config_name(
        "base", vocabulary_size=8000, max_sequence_length=256
    )
    # The end token is banned so that every run decodes exactly `steps`.
    generator = Generator(model, banned_ids=(0, 2, 3))
    rows = []
    for batch_size in batch_sizes:
        rng = np.random.default_rng(0)
        ids = rng.integers(4, 8000, (batch_size, source_length), "int32")
        ids[:, -1] = 3
        for method, beam in (("greedy", 1), ("beam", 4)):
            contestants = {
                use_cache: _decode_call(
                    generator, ids, method, beam, steps, use_cache
                )
                for use_cache in (True, False)
            }
            compile_s = {k: _time(fn) for k, fn in contestants.items()}
            times = {k: [] for k in contestants}
            for _ in range(rounds):
                for key, fn in contestants.items():
                    times[key].append(_time(fn))
            cached = statistics.median(times[True])
            uncached = statistics.median(times[False])
            row = {
                "batch_size": batch_size,
                "method": method if method == "greedy" else "beam4",
                "steps": steps,
                "cached_s": cached,
                "uncached_s": uncached,
                "speedup": uncached / cached,
                "cached_tokens_per_s": batch_size * steps / cached,
                "first_call_s": compile_s,
            }
            rows.append(row)
            print(
                f"  batch {batch_size:3d} {row['method']:6s} cached "
                f"{cached:7.3f}s  uncached {uncached:7.3f}s  "
                f"speedup {row['speedup']:5.1f}x",
                flush=True,
            )
    return rows


def multi30k_throughput(limit, beam_size=4, batch_size=32):
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
    parser.add_argument("--skip-base", action="store_true")
    parser.add_argument("--skip-multi30k", action="store_true")
    args = parser.parse_args(argv)
    rounds = args.rounds or (2 if args.quick else 5)
    batch_sizes = (1,) if args.quick else (1, 8)
    backend = keras.backend.backend()
    print(f"backend {backend}, {os.cpu_count()} CPUs, rounds {rounds}")
    report = {"backend": backend, "keras": keras.__version__}
    if not args.skip_base:
        print("cached versus uncached, base model, 64 tokens:")
        report["cached_vs_uncached"] = cached_versus_uncached(
            batch_sizes, rounds
        )
    if not args.skip_multi30k:
        print("Multi30k test2016, beam 4, tiny model:")
        report["multi30k"] = multi30k_throughput(256 if args.quick else None)
    if args.output:
        with open(args.output, "w") as f:
            json.dump(report, f, indent=2)
            f.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
