"""Each backend fast path against the plain Keras path, as a user sees it.

    python -m benchmarks.fast_paths [--rounds 3] [--sentences 64]
        [--paths NAME ...] [--smoke] [--output FILE.json]

For the current Keras backend, every fast path that serves it (see
`keras_transformer.backends.FAST_PATHS`) is timed on and off in one
process, contestants alternating in rounds, at the base size (Table 3,
random weights, a tokenizer of 8000 pieces trained on Multi30k):

- ``fused_adam``, ``fused_loss``, ``jax_train_options``: a training step
  (`train_on_batch`, 32 pairs of 32 tokens, the paper's optimizer and
  label-smoothed loss, dropout 0.1);
- ``torch_decoder``, ``onednn_matmul``, ``onednn_int8``,
  ``tensorflow_filler_row``: `Translator.translate` of one Multi30k
  test2016 sentence (beam 4, and greedy), and of the first
  ``--sentences`` sentences of test2016 (beam 4, batch 32); for
  ``onednn_int8`` after `Translator.quantize("int8")`.
  Weights are random, so outputs run to their length limit (input + 50).

Medians of the rounds are reported with the gain, off time over on time.
"""

import argparse
import json
import pathlib
import statistics
import tempfile
import time

from benchmarks import _common

MULTI30K = pathlib.Path(__file__).resolve().parents[2] / "shared" / "data"
MULTI30K = MULTI30K / "multi30k"
TRAINING_PATHS = ("fused_adam", "fused_loss", "jax_train_options")
DECODING_PATHS = (
    "torch_decoder",
    "onednn_matmul",
    "onednn_int8",
    "tensorflow_filler_row",
)
# Decoding paths that serve int8 models: timed on a quantized translator.
INT8_PATHS = ("onednn_int8",)


def _median_seconds(fn, rounds, repeats):
    times = []
    for _ in range(rounds):
        start = time.perf_counter()
        for _ in range(repeats):
            fn()
        times.append((time.perf_counter() - start) / repeats)
    return statistics.median(times)


def _training_step(config, smoke):
    """A function running one training step of a fresh model, built
    and compiled in the current fast-path setting."""
    import keras
    import numpy as np

    import keras_transformer as kt

    keras.utils.set_random_seed(0)
    model = kt.Transformer.from_config_name(
        config, vocabulary_size=8000, **(_SMOKE if smoke else {})
    )
    model.compile(
        optimizer=kt.training.transformer_optimizer(model.hidden_dim),
        loss=kt.training.LabelSmoothedCrossEntropy(0.1),
    )
    rng = np.random.default_rng(0)
    ids = rng.integers(4, 8000, (32, 32)).astype("int32")
    inputs = {
        "encoder_token_ids": ids,
        "encoder_padding_mask": np.ones_like(ids),
        "decoder_token_ids": ids,
        "decoder_padding_mask": np.ones_like(ids),
    }
    model.train_on_batch(inputs, ids)  # compiles
    return lambda: model.train_on_batch(inputs, ids)


_SMOKE = {
    "num_encoder_layers": 1,
    "num_decoder_layers": 1,
    "hidden_dim": 16,
    "num_heads": 2,
    "intermediate_dim": 32,
}


def _translator(config, tokenizer, smoke):
    import keras

    import keras_transformer as kt

    keras.utils.set_random_seed(0)
    model = kt.Transformer.from_config_name(
        config,
        vocabulary_size=tokenizer.vocabulary_size,
        dropout=0.0,
        **(_SMOKE if smoke else {}),
    )
    return kt.Translator(model, tokenizer)


def _decoding_calls(translator, sentences):
    """The user-level calls a decoding fast path is timed on."""
    return {
        "translate 1 sentence, beam 4": lambda: translator.translate(
            sentences[:1], verbose=0
        ),
        "translate 1 sentence, greedy": lambda: translator.translate(
            sentences[:1], method="greedy", verbose=0
        ),
        f"translate {len(sentences)} test2016 sentences, beam 4": (
            lambda: translator.translate(sentences, batch_size=32, verbose=0)
        ),
    }


def _compare(name, build_on, build_off, rounds, repeats):
    """Times the calls ``build_*()`` returns (a dict of name: fn), the
    fast path on and off, alternating; returns rows."""
    from keras_transformer import backends

    on = build_on()
    with backends.disabled(name):
        off = build_off()
    rows = []
    for level in on:
        on_times, off_times = [], []
        for _ in range(rounds):
            on_times.append(_median_seconds(on[level], 1, repeats))
            with backends.disabled(name):
                off_times.append(_median_seconds(off[level], 1, repeats))
        on_s, off_s = statistics.median(on_times), statistics.median(off_times)
        rows.append(
            {
                "fast_path": name,
                "level": level,
                "on_s": round(on_s, 4),
                "off_s": round(off_s, 4),
                "gain": round(off_s / on_s, 3),
                "rounds_on_s": [round(t, 4) for t in on_times],
                "rounds_off_s": [round(t, 4) for t in off_times],
            }
        )
        print(json.dumps(rows[-1]), flush=True)
    return rows


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--config", default="base")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--sentences", type=int, default=64)
    parser.add_argument(
        "--paths", nargs="+", default=None, help="only these fast paths"
    )
    parser.add_argument("--smoke", action="store_true")
    parser.add_argument("--output", default=None)
    args = parser.parse_args(argv)
    import keras

    from keras_transformer import backends, data

    backend = keras.backend.backend()
    serving = [n for n, p in backends.FAST_PATHS.items() if p.runs_here()]
    if args.paths:
        serving = [name for name in serving if name in args.paths]
    rows = []
    training = [n for n in serving if n in TRAINING_PATHS]
    repeats = 1 if args.smoke else 3
    for name in training:

        def build():
            return {"training step": _training_step(args.config, args.smoke)}

        rows += _compare(name, build, build, args.rounds, repeats)
    decoding = [n for n in serving if n in DECODING_PATHS]
    if decoding:
        sentences = (MULTI30K / "test.en").read_text("utf-8").splitlines()
        sentences = sentences[: 4 if args.smoke else args.sentences]
        with tempfile.TemporaryDirectory():
            tokenizer = data.train_tokenizer(
                [MULTI30K / "train.en", MULTI30K / "train.de"],
                vocabulary_size=500 if args.smoke else 8000,
                max_sentences=2000 if args.smoke else 2_000_000,
            )
        for name in decoding:

            def build(name=name):
                translator = _translator(args.config, tokenizer, args.smoke)
                if name in INT8_PATHS:
                    translator.quantize("int8")
                calls = _decoding_calls(translator, sentences)
                for call in calls.values():
                    call()  # compiles
                return calls

            rows += _compare(name, build, build, args.rounds, 1)
    result = {
        "benchmark": "fast_paths",
        "backend": backend,
        "config": args.config,
        "machine": _common.machine(),
        "rows": rows,
    }
    if args.output:
        pathlib.Path(args.output).write_text(json.dumps(result, indent=1))
    return result


if __name__ == "__main__":
    main()
