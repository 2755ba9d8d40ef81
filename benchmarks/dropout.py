"""Dropout masks: `layers.Dropout` against `keras.layers.Dropout`.

    KERAS_BACKEND=jax python -m benchmarks.dropout [--configs tiny base]
        [--rounds 7] [--threads N] [--output FILE.json] [--smoke]

One compiled function per contestant applies 32 dropout layers (the
residual and embedding dropout sites of a 6 + 6 layer Transformer: 2 per
encoder layer, 3 per decoder layer, 2 embeddings) at rate 0.1 to one
``(batch, length, hidden_dim)`` activation in training mode and sums the
results, as a training step's forward pass draws its masks. The layers
are unseeded, as the model's are (on torch Keras then calls
`torch.nn.functional.dropout`). Shapes are those of
`benchmarks.training`'s batches: tiny (64 x 32 x 64) and base (16 x 32 x
512). Compiled as decoding compiles (`backends.compile_search`): `jax.jit` on
JAX, `tf.function` with XLA on TensorFlow, eager on torch. On TensorFlow
and torch `layers.Dropout` runs Keras's own code, so the two contestants
should tie there.
"""

import statistics

from benchmarks import _common

SITES = 32
SHAPES = {"tiny": (64, 32, 64), "base": (16, 32, 512), "smoke": (2, 4, 8)}


def build(dropout_class, shape, rate=0.1):
    import keras

    inputs = keras.Input(shape[1:], batch_size=shape[0])
    outputs = keras.layers.Add()(
        [dropout_class(rate)(inputs) for _ in range(SITES)]
    )
    return keras.Model(inputs, outputs)


def compiled_step(model):
    from keras_transformer import backends

    return backends.compile_search(lambda x: model(x, training=True), model)


def main(argv=None):
    parser = _common.argument_parser(__doc__, rounds=7)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args(argv)
    if args.smoke:
        args.configs, args.rounds, args.repeats = ["smoke"], 1, 1
    _common.pin_threads(args.threads)
    import keras
    import numpy as np

    from keras_transformer import layers

    _common.pin_frameworks(args.threads)
    report = {
        "benchmark": "dropout",
        "machine": _common.machine(),
        "threads": args.threads,
        "sites": SITES,
        "rate": 0.1,
        "configs": {},
    }
    print(f"backend {keras.backend.backend()}, {args.threads} threads")
    for name in args.configs:
        shape = SHAPES[name]
        x = keras.ops.convert_to_tensor(
            np.random.default_rng(0).normal(size=shape).astype("float32")
        )
        contestants = {}
        for label, cls in (
            ("ours", layers.Dropout),
            ("keras", keras.layers.Dropout),
        ):
            step = compiled_step(build(cls, shape))
            keras.ops.convert_to_numpy(step(x))  # compile

            def run(step=step, x=x):
                for _ in range(args.repeats):
                    y = step(x)
                keras.ops.convert_to_numpy(y)

            contestants[label] = run
        times = _common.interleaved(
            contestants,
            args.rounds,
            lambda fn: _common.timed(fn) / args.repeats,
        )
        speedup = _common.ratios(times, "keras", "ours")
        rows = [
            {
                "contestant": label,
                "ms": 1e3 * statistics.median(values),
                "per_round_ms": [1e3 * v for v in values],
            }
            for label, values in times.items()
        ]
        report["configs"][name] = {
            "shape": list(shape),
            "rows": rows,
            "ours_speedup": speedup,
        }
        print(f"\n{name} {shape}, {SITES} sites:")
        print(_common.table(rows, [("contestant", "contestant"), ("ms", "ms")]))
        low, high = min(speedup["per_round"]), max(speedup["per_round"])
        print(
            f"ours {speedup['median']:.2f}x keras.layers.Dropout "
            f"(rounds {low:.2f} to {high:.2f})"
        )
    _common.write_json(args.output, report)
    return report


if __name__ == "__main__":
    main()
