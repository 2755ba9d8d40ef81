"""End to end on Multi30k: tf.data pipeline plus `model.fit`, with
token-budget buckets against fixed-length padding.

    KERAS_BACKEND=jax python -m benchmarks.end_to_end [--steps 30]
        [--rounds 3] [--config tiny] [--output FILE.json] [--smoke]

Both contestants read Multi30k train (29,000 pairs, 8k BPE) through
`keras_transformer.data.translation_dataset` with the same token budget
(``--max-tokens``, per side): ``buckets`` with the learned bucket shapes
(the default), ``fixed`` with ``bucket_boundaries=[n]``, every pair padded
to the longest bucket length n. A whole epoch takes minutes per contestant
on a 2-core CPU, so each round runs `fit` over the first ``--steps``
batches of the (seeded, deterministic) epoch, and the rounds alternate
between the contestants. The batches are first read once through the
pipeline into a cache (that time is reported as the pipeline's); every
round then trains on the very same batches. The first round compiles (one
program per batch shape), the later ("steady") rounds do not. The epoch
time is projected from the steady real-token throughput: the epoch's real
tokens are the same for both, the padding is not.
"""

import argparse
import os
import pathlib
import statistics

from benchmarks import _common

SHARED_MULTI30K = (
    pathlib.Path(__file__).resolve().parents[1].parent / "shared/data/multi30k"
)
SMOKE_CONFIG = {
    "num_encoder_layers": 1,
    "num_decoder_layers": 1,
    "hidden_dim": 16,
    "num_heads": 2,
    "intermediate_dim": 32,
    "dropout": 0.1,
}


def smoke_corpus(n=200, seed=0):
    """Short synthetic sentence pairs, for a quick run without Multi30k."""
    import numpy as np

    rng = np.random.default_rng(seed)
    words = "a man woman dog runs walks in the park with red ball".split()
    source, target = [], []
    for _ in range(n):
        sentence = rng.choice(words, rng.integers(2, 12))
        source.append(" ".join(sentence))
        target.append(" ".join(sentence[::-1]))
    return source, target


def real_tokens(dataset):
    tokens = 0
    padded = 0
    for inputs, _, _ in dataset.as_numpy_iterator():
        for side in ("encoder", "decoder"):
            mask = inputs[f"{side}_padding_mask"]
            tokens += int(mask.sum())
            padded += mask.size
    return tokens, padded


class _Timer:
    """Seconds of the `fit` epoch (data pipeline included)."""

    def __new__(cls):
        import keras

        class Timer(keras.callbacks.Callback):
            def on_epoch_begin(self, epoch, logs=None):
                self.start = _now()

            def on_epoch_end(self, epoch, logs=None):
                self.seconds = _now() - self.start

        return Timer()


def _now():
    import time

    return time.perf_counter()


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--data-dir",
        default=str(SHARED_MULTI30K) if SHARED_MULTI30K.is_dir() else None,
        help="directory with Multi30k train.en/train.de (default: the "
        "shared copy, else download)",
    )
    parser.add_argument("--config", default="tiny")
    parser.add_argument("--vocabulary-size", type=int, default=8000)
    parser.add_argument("--max-tokens", type=int, default=4096)
    parser.add_argument(
        "--steps", type=int, default=30, help="batches per timed round"
    )
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--num-buckets", type=int, default=16)
    parser.add_argument("--threads", type=int, default=os.cpu_count())
    parser.add_argument("--output", default=None)
    parser.add_argument(
        "--smoke",
        action="store_true",
        help="200 synthetic pairs, a one-layer model, 2 steps, 1 round",
    )
    args = parser.parse_args(argv)
    if args.smoke:
        args.steps, args.rounds, args.num_buckets = 2, 1, 2
        args.vocabulary_size, args.max_tokens = 300, 256
    return args


def main(argv=None):
    args = parse_args(argv)
    _common.pin_threads(args.threads)
    import keras

    _common.pin_frameworks(args.threads)
    import keras_transformer as kt

    if args.smoke:
        source, target = smoke_corpus()
        config = dict(SMOKE_CONFIG)
    else:
        source, target = kt.data.load_dataset(
            "multi30k", "train", data_dir=args.data_dir
        )
        config = kt.models.configs.get_config(args.config)
    tokenizer = kt.data.train_tokenizer(
        [source, target] if not args.smoke else None,
        vocabulary_size=args.vocabulary_size,
        sentences=(source + target) if args.smoke else None,
    )

    def dataset(boundaries):
        return kt.data.translation_dataset(
            source,
            target,
            tokenizer,
            max_tokens=args.max_tokens,
            seed=0,
            deterministic=True,
            bucket_boundaries=boundaries,
            num_buckets=args.num_buckets,
        )

    buckets = dataset(None)
    longest = max(max(shape[1:]) for shape in buckets.batch_shapes)
    datasets = {"buckets": buckets, "fixed": dataset([longest])}
    report = {
        "benchmark": "end_to_end",
        "machine": _common.machine(),
        "threads": args.threads,
        "config": args.config if not args.smoke else "smoke",
        "max_tokens": args.max_tokens,
        "fixed_length": longest,
        "steps_per_round": args.steps,
        "rounds": args.rounds,
        "contestants": {},
    }
    contestants, stats = {}, {}
    for name, data in datasets.items():
        epoch = data.planner.num_batches
        epoch_tokens, _ = real_tokens(data)
        # The batches are read once through the pipeline (timed) into a
        # cache; every round then trains on the very same batches.
        timed = data.take(args.steps).cache()
        start = _now()
        tokens, padded = real_tokens(timed)
        pipeline_s = _now() - start
        shapes = {
            x["encoder_token_ids"].shape + x["decoder_token_ids"].shape
            for x, _, _ in timed.as_numpy_iterator()
        }
        keras.utils.set_random_seed(0)
        model = kt.Transformer(
            vocabulary_size=tokenizer.vocabulary_size,
            max_sequence_length=256,
            **config,
        )
        model.compile(
            optimizer=kt.training.transformer_optimizer(
                config["hidden_dim"], warmup_steps=4000
            ),
            loss=kt.training.LabelSmoothedCrossEntropy(0.1),
        )
        stats[name] = {
            "batches_per_epoch": epoch,
            "distinct_shapes": len(data.batch_shapes),
            "epoch_real_tokens": epoch_tokens,
            "timed_real_tokens": tokens,
            "timed_padding_fraction": 1 - tokens / padded,
            "timed_shapes": len(shapes),
            "pipeline_s": pipeline_s,
            "pipeline_real_tokens_per_s": tokens / pipeline_s,
        }

        def fit(model=model, timed=timed):
            timer = _Timer()
            model.fit(
                timed,
                epochs=1,
                steps_per_epoch=args.steps,
                verbose=0,
                callbacks=[timer],
            )
            return timer.seconds

        contestants[name] = (fit, timed)
    seconds = _common.interleaved(
        contestants, args.rounds + 1, lambda pair: pair[0]()
    )
    print(
        f"backend {keras.backend.backend()}, {args.threads} threads, "
        f"{args.steps} steps per round, fixed length {longest}"
    )
    rows = []
    for name, per_round in seconds.items():
        first, steady = per_round[0], per_round[1:]
        s = stats[name]
        median = statistics.median(steady)
        tokens_per_s = s["timed_real_tokens"] / median
        row = dict(
            s,
            contestant=name,
            first_round_s=first,
            steady_round_s=median,
            steady_round_s_per_round=steady,
            real_tokens_per_s=tokens_per_s,
            projected_epoch_s=s["epoch_real_tokens"] / tokens_per_s,
            pipeline_share=s["pipeline_s"] / (s["pipeline_s"] + median),
        )
        rows.append(row)
        report["contestants"][name] = row
    throughput = {
        name: [stats[name]["timed_real_tokens"] / s for s in per_round[1:]]
        for name, per_round in seconds.items()
    }
    report["buckets_speedup"] = _common.ratios(throughput, "buckets", "fixed")
    print(
        _common.table(
            rows,
            [
                ("padding", "contestant"),
                ("shapes", "distinct_shapes"),
                ("timed shapes", "timed_shapes"),
                ("padded %", "timed_padding_fraction"),
                ("pipeline s", "pipeline_s"),
                ("first round s", "first_round_s"),
                ("round s", "steady_round_s"),
                ("real tokens/s", "real_tokens_per_s"),
                ("epoch s (projected)", "projected_epoch_s"),
            ],
        )
    )
    print(
        "buckets / fixed real tokens/s: "
        f"{report['buckets_speedup']['median']:.2f}x"
    )
    _common.write_json(args.output, report)
    return report


if __name__ == "__main__":
    main()
