"""Input pipeline benchmark on Multi30k train.

Reports the padding fraction with learned length buckets and with
fixed-length padding, the number of distinct batch shapes, the pipeline's
throughput, and the throughput of the ``tiny`` Transformer training with
``model.fit`` on the current Keras backend, in real (unpadded) source plus
target tokens per second, and their ratio (the goal is at least 10x: the
pipeline must never be what training waits for).

Usage:
    KERAS_BACKEND=jax python -m benchmarks.pipeline [--output FILE.json]
"""

import argparse
import json
import os
import pathlib
import time

import keras

import keras_transformer as kt

SHARED_MULTI30K = (
    pathlib.Path(__file__).resolve().parents[1].parent / "shared/data/multi30k"
)


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--output", help="write the results as JSON here")
    parser.add_argument(
        "--data-dir",
        default=str(SHARED_MULTI30K) if SHARED_MULTI30K.is_dir() else None,
        help="directory with Multi30k train.en/train.de (default: the "
        "shared copy, else download)",
    )
    parser.add_argument("--vocabulary-size", type=int, default=8000)
    parser.add_argument("--max-tokens", type=int, default=4096)
    parser.add_argument(
        "--pipeline-epochs", type=int, default=3, help="epochs timed"
    )
    parser.add_argument(
        "--model-steps",
        type=int,
        default=None,
        help="training steps timed (default: one epoch)",
    )
    return parser.parse_args(argv)


def pipeline_throughput(dataset, epochs):
    """Real tokens per second of iterating the dataset to numpy."""
    tokens = 0
    for _ in dataset.as_numpy_iterator():  # warm-up epoch
        pass
    start = time.perf_counter()
    for _ in range(epochs):
        for inputs, _, _ in dataset.as_numpy_iterator():
            tokens += int(inputs["encoder_padding_mask"].sum())
            tokens += int(inputs["decoder_padding_mask"].sum())
    return tokens / (time.perf_counter() - start)


class _EpochTimer(keras.callbacks.Callback):
    def on_epoch_begin(self, epoch, logs=None):
        self.start = time.perf_counter()

    def on_epoch_end(self, epoch, logs=None):
        self.seconds = time.perf_counter() - self.start


def model_throughput(dataset, vocabulary_size, steps):
    """Real tokens per second of `fit` on the tiny model, timed on the
    second epoch, once every batch shape has been compiled."""
    model = kt.Transformer.from_config_name(
        "tiny", vocabulary_size=vocabulary_size
    )
    model.compile(
        optimizer="adam",
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
    )
    steps = steps or dataset.planner.num_batches
    data = dataset.take(steps)
    timer = _EpochTimer()
    model.fit(data, epochs=2, verbose=0, callbacks=[timer])
    # Every epoch holds every pair once: the same real tokens as the timed
    # one (exactly so when the whole epoch is timed).
    tokens = 0
    for inputs, _, _ in data.as_numpy_iterator():
        tokens += int(inputs["encoder_padding_mask"].sum())
        tokens += int(inputs["decoder_padding_mask"].sum())
    return tokens / timer.seconds, steps


def main(argv=None):
    args = parse_args(argv)
    source, target = kt.data.load_dataset(
        "multi30k", "train", data_dir=args.data_dir
    )
    start = time.perf_counter()
    tokenizer = kt.data.train_tokenizer(
        [source, target], vocabulary_size=args.vocabulary_size
    )
    tokenizer_seconds = time.perf_counter() - start

    start = time.perf_counter()
    buckets = kt.data.translation_dataset(
        source, target, tokenizer, max_tokens=args.max_tokens, seed=0
    )
    build_seconds = time.perf_counter() - start
    longest = max(max(shape[1:]) for shape in buckets.batch_shapes)
    fixed = kt.data.translation_dataset(
        source,
        target,
        tokenizer,
        max_tokens=args.max_tokens,
        seed=0,
        bucket_boundaries=[longest],
    )
    bucket_stats = kt.data.batch_statistics(buckets)
    fixed_stats = kt.data.batch_statistics(fixed)
    pipeline_tps = pipeline_throughput(buckets, args.pipeline_epochs)
    model_tps, steps = model_throughput(
        buckets, tokenizer.vocabulary_size, args.model_steps
    )
    results = {
        "backend": keras.backend.backend(),
        "cpu_count": os.cpu_count(),
        "pairs": buckets.corpus_stats.kept,
        "vocabulary_size": tokenizer.vocabulary_size,
        "max_tokens": args.max_tokens,
        "tokenizer_training_seconds": round(tokenizer_seconds, 2),
        "dataset_build_seconds": round(build_seconds, 2),
        "batches_per_epoch": bucket_stats.num_batches,
        "padding_fraction_buckets": round(bucket_stats.padding_fraction, 4),
        "padding_fraction_fixed": round(fixed_stats.padding_fraction, 4),
        "fixed_length": longest,
        "distinct_shapes": bucket_stats.num_shapes,
        "max_batch_tokens": bucket_stats.max_batch_tokens,
        "pipeline_tokens_per_second": round(pipeline_tps),
        "model_tokens_per_second": round(model_tps),
        "model_steps_timed": steps,
        "ratio": round(pipeline_tps / model_tps, 1),
    }
    width = max(len(k) for k in results)
    for key, value in results.items():
        print(f"{key:<{width}}  {value}")
    if args.output:
        with open(args.output, "w") as f:
            json.dump(results, f, indent=2)
            f.write("\n")
    return results


if __name__ == "__main__":
    main()
