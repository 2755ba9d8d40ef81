"""Training throughput against peers of the same size, on one backend.

    KERAS_BACKEND=jax python -m benchmarks.training [--configs tiny base]
        [--rounds 5] [--steps 2] [--with-mixed-bfloat16] [--dropout RATE]
        [--output FILE.json] [--smoke]

Contestants, all with the same sizes, dropout, Adam(0.9, 0.98, 1e-9) and
label-smoothed (0.1) cross entropy that ignores padding:

- ``ours``: `keras_transformer.Transformer` (`from_config_name`), compiled
  with `LabelSmoothedCrossEntropy` and our `training.Adam` (what
  `transformer_optimizer` and the recipes use), one `train_on_batch` per
  step.
- ``keras_hub``: the same architecture from `keras_hub.layers`
  (`TransformerEncoder`, `TransformerDecoder`, a tied `ReversibleEmbedding`
  shared by source, target and output, `SinePositionEncoding`), same
  loss, with `keras.optimizers.Adam`.
- ``keras_hub_keras_loss``: the same keras_hub model trained on the same
  objective with what Keras itself offers for it,
  `keras.losses.CategoricalCrossentropy(from_logits=True,
  label_smoothing=0.1)` on one-hot labels, weighted 0 on padding and
  averaged over all positions, Keras's default (Keras's sparse cross
  entropy has no label smoothing): the training step a
  keras_hub user gets without this package.
- ``torch``: `torch.nn.Transformer` (``batch_first``) with a shared tied
  embedding and sinusoids, `F.cross_entropy(label_smoothing=0.1,
  ignore_index=0)` (the same loss) and `torch.optim.Adam`; torch backend
  only.
- ``ours_keras_adam`` (torch, and TensorFlow without XLA): ours with
  `keras.optimizers.Adam` instead of our `training.Adam`, which has the
  same update but fused kernels there (on JAX and under XLA the two run
  the same code): the model alone, against keras_hub with the same
  optimizer.
- ``ours_mixed_bfloat16`` (with ``--with-mixed-bfloat16``): ours again
  under Keras's ``mixed_bfloat16`` policy (bfloat16 matmuls, float32
  variables and loss), against ``ours`` in float32: whether the policy
  pays on this machine, which needs bfloat16 units (AMX-BF16 or
  AVX512-BF16 in ``machine()["cpu_flags"]``) and a backend whose CPU
  kernels use them.

Every round times ``--steps`` steps of each contestant in alternating
order, plus a float32 matrix-multiply probe; throughput is real (non-
padding) source plus target tokens per second. Achieved FLOP/s counts the
matrix multiplies of a step analytically (`train_flops`) on the padded
shapes, and is reported as a fraction of the probe of the same round.
"""

import math
import statistics
import sys

from benchmarks import _common

# Batch shapes per configuration: (batch, source length, target length).
# Real lengths are drawn between 60% and 100% of the padded length.
SHAPES = {"tiny": (64, 32, 32), "base": (16, 32, 32), "smoke": (2, 8, 8)}
SMOKE_CONFIG = {
    "num_encoder_layers": 1,
    "num_decoder_layers": 1,
    "hidden_dim": 16,
    "num_heads": 2,
    "intermediate_dim": 32,
    "dropout": 0.1,
}


def model_config(name):
    if name == "smoke":
        return dict(SMOKE_CONFIG)
    from keras_transformer.models.configs import get_config

    return get_config(name)


def train_flops(config, batch, source_length, target_length, vocabulary):
    """Matrix-multiply FLOPs of one training step (forward + backward,
    3x the forward), on padded shapes.

    Forward, per layer: projections ``2 * tokens * params`` (attention
    4 d^2, feed-forward 2 d d_ff; the decoder's cross-attention projects
    keys and values from the source), attention ``4 * length_q *
    length_k * d`` per sequence (scores and weighted sum), and the output
    projection ``2 * d * vocabulary`` per target token.
    """
    d, d_ff = config["hidden_dim"], config["intermediate_dim"]
    s, t = batch * source_length, batch * target_length
    encoder = config["num_encoder_layers"] * (
        2 * s * (4 * d * d + 2 * d * d_ff) + 4 * batch * source_length**2 * d
    )
    decoder = config["num_decoder_layers"] * (
        2 * t * (4 * d * d + 2 * d * d + 2 * d * d_ff)
        + 2 * s * 2 * d * d
        + 4 * batch * target_length**2 * d
        + 4 * batch * target_length * source_length * d
    )
    output = 2 * t * d * vocabulary
    return 3 * (encoder + decoder + output)


def make_batch(batch, source_length, target_length, vocabulary, seed=0):
    import numpy as np

    rng = np.random.default_rng(seed)

    def side(length):
        lengths = rng.integers(int(0.6 * length), length + 1, batch)
        mask = (np.arange(length)[None, :] < lengths[:, None]).astype("int32")
        ids = rng.integers(4, vocabulary, (batch, length)).astype("int32")
        return ids * mask, mask

    source, source_mask = side(source_length)
    # One array of target_length + 1 tokens: inputs and shifted labels.
    target, target_mask = side(target_length + 1)
    inputs = {
        "encoder_token_ids": source,
        "encoder_padding_mask": source_mask,
        "decoder_token_ids": target[:, :-1],
        "decoder_padding_mask": target_mask[:, :-1],
    }
    labels = target[:, 1:] * target_mask[:, 1:]
    real_tokens = int(source_mask.sum() + target_mask[:, :-1].sum())
    return inputs, labels, real_tokens


def optimizer(learning_rate=1e-4, ours=False):
    """Adam(0.9, 0.98, 1e-9): Keras's, or ours (`training.Adam`, the
    same update, faster on TensorFlow and torch)."""
    import keras

    from keras_transformer import training

    adam = training.Adam if ours else keras.optimizers.Adam
    return adam(learning_rate, beta_1=0.9, beta_2=0.98, epsilon=1e-9)


def build_ours(config, vocabulary, dtype=None):
    import keras_transformer as kt

    return kt.Transformer(
        vocabulary_size=vocabulary,
        max_sequence_length=256,
        dtype=dtype,
        **config,
    )


def build_keras_hub(config, vocabulary, dtype=None):
    """The same architecture from keras_hub's layers: post-norm layers,
    one scaled embedding matrix tied to the output projection,
    sinusoidal positions. keras_hub's layers also apply ``dropout`` to
    the attention weights (their attention dropout is not separate)."""
    import keras
    import keras_hub

    d = config["hidden_dim"]
    embedding = keras_hub.layers.ReversibleEmbedding(
        vocabulary,
        d,
        tie_weights=True,
        embeddings_initializer=keras.initializers.RandomNormal(stddev=d**-0.5),
        dtype=dtype,
        name="token_embedding",
    )
    positions = keras_hub.layers.SinePositionEncoding(dtype=dtype)
    dropout = config["dropout"]

    def embed(ids, side):
        x = embedding(ids) * math.sqrt(d)
        x = x + positions(x)
        return keras.layers.Dropout(dropout, dtype=dtype, name=f"{side}_drop")(
            x
        )

    names = (
        "encoder_token_ids",
        "encoder_padding_mask",
        "decoder_token_ids",
        "decoder_padding_mask",
    )
    inputs = {
        name: keras.Input((None,), dtype="int32", name=name) for name in names
    }
    x = embed(inputs["encoder_token_ids"], "encoder")
    for i in range(config["num_encoder_layers"]):
        x = keras_hub.layers.TransformerEncoder(
            config["intermediate_dim"],
            config["num_heads"],
            dropout=dropout,
            dtype=dtype,
            name=f"encoder_{i}",
        )(x, padding_mask=inputs["encoder_padding_mask"])
    encoded = x
    y = embed(inputs["decoder_token_ids"], "decoder")
    for i in range(config["num_decoder_layers"]):
        y = keras_hub.layers.TransformerDecoder(
            config["intermediate_dim"],
            config["num_heads"],
            dropout=dropout,
            dtype=dtype,
            name=f"decoder_{i}",
        )(
            y,
            encoded,
            decoder_padding_mask=inputs["decoder_padding_mask"],
            encoder_padding_mask=inputs["encoder_padding_mask"],
        )
    logits = embedding(y, reverse=True)
    logits = keras.layers.Activation("linear", dtype="float32")(logits)
    return keras.Model(inputs, logits, name="keras_hub_transformer")


def keras_step(model, inputs, labels, jit_compile="auto", our_adam=False):
    from keras_transformer.training import LabelSmoothedCrossEntropy

    model.compile(
        optimizer=optimizer(ours=our_adam),
        loss=LabelSmoothedCrossEntropy(0.1),
        jit_compile=jit_compile,
    )

    def step():
        return model.train_on_batch(inputs, labels)

    return step


def keras_loss_step(model, inputs, labels, vocabulary, jit_compile="auto"):
    """The label-smoothed objective with Keras's own loss: one-hot labels
    and padding weights, as Keras's categorical cross entropy needs."""
    import keras
    import numpy as np

    model.compile(
        optimizer=optimizer(),
        loss=keras.losses.CategoricalCrossentropy(
            from_logits=True, label_smoothing=0.1
        ),
        jit_compile=jit_compile,
    )
    one_hot = np.eye(vocabulary, dtype="float32")[labels]
    weights = (labels != 0).astype("float32")

    def step():
        return model.train_on_batch(inputs, one_hot, sample_weight=weights)

    return step


def build_torch(config, vocabulary, bfloat16=False):
    """`torch.nn.Transformer` with a tied, shared, scaled embedding and
    sinusoidal positions; returns ``(module, step_factory)``."""
    import torch
    import torch.nn.functional as F
    from torch import nn

    d = config["hidden_dim"]

    class TorchTransformer(nn.Module):
        def __init__(self):
            super().__init__()
            self.embedding = nn.Embedding(vocabulary, d)
            nn.init.normal_(self.embedding.weight, std=d**-0.5)
            self.transformer = nn.Transformer(
                d_model=d,
                nhead=config["num_heads"],
                num_encoder_layers=config["num_encoder_layers"],
                num_decoder_layers=config["num_decoder_layers"],
                dim_feedforward=config["intermediate_dim"],
                dropout=config["dropout"],
                batch_first=True,
            )
            position = torch.arange(256.0)[:, None]
            rate = torch.exp(torch.arange(0, d, 2.0) * (-math.log(1e4) / d))
            encoding = torch.zeros(256, d)
            encoding[:, 0::2] = torch.sin(position * rate)
            encoding[:, 1::2] = torch.cos(position * rate)
            self.register_buffer("positions", encoding)
            self.dropout = nn.Dropout(config["dropout"])

        def embed(self, ids):
            x = self.embedding(ids) * math.sqrt(d)
            return self.dropout(x + self.positions[: ids.shape[1]])

        def forward(self, src, src_mask, tgt, tgt_mask):
            causal = nn.Transformer.generate_square_subsequent_mask(
                tgt.shape[1], dtype=torch.bool
            )
            y = self.transformer(
                self.embed(src),
                self.embed(tgt),
                tgt_mask=causal,
                src_key_padding_mask=~src_mask,
                tgt_key_padding_mask=~tgt_mask,
                memory_key_padding_mask=~src_mask,
                tgt_is_causal=True,
            )
            return F.linear(y, self.embedding.weight)

    module = TorchTransformer()

    def step_factory(inputs, labels):
        adam = torch.optim.Adam(
            module.parameters(), lr=1e-4, betas=(0.9, 0.98), eps=1e-9
        )
        src = torch.from_numpy(inputs["encoder_token_ids"]).long()
        src_mask = torch.from_numpy(inputs["encoder_padding_mask"]).bool()
        tgt = torch.from_numpy(inputs["decoder_token_ids"]).long()
        tgt_mask = torch.from_numpy(inputs["decoder_padding_mask"]).bool()
        target = torch.from_numpy(labels).long()
        module.train()

        def step():
            adam.zero_grad(set_to_none=True)
            with torch.autocast("cpu", torch.bfloat16, enabled=bfloat16):
                logits = module(src, src_mask, tgt, tgt_mask)
            loss = F.cross_entropy(
                logits.float().reshape(-1, vocabulary),
                target.reshape(-1),
                ignore_index=0,
                label_smoothing=0.1,
            )
            loss.backward()
            adam.step()
            return loss.item()

        return step

    return module, step_factory


def run_config(name, args, backend):
    import keras

    config = model_config(name)
    if args.dropout is not None:
        config["dropout"] = args.dropout
    batch, source_length, target_length = SHAPES[name]
    if args.batch_size:
        batch = args.batch_size
    vocabulary = args.vocabulary_size
    inputs, labels, real_tokens = make_batch(
        batch, source_length, target_length, vocabulary
    )
    dtype = None if args.dtype == "float32" else args.dtype
    keras.utils.set_random_seed(0)
    contestants, params, policies, optimizers = {}, {}, {}, {}
    models = {
        "ours": build_ours(config, vocabulary, dtype),
    }
    if backend == "torch" or (
        backend == "tensorflow" and args.jit_compile is not True
    ):
        # Where our Adam runs other code than Keras's (`training.Adam`).
        models["ours_keras_adam"] = build_ours(config, vocabulary, dtype)
    if args.with_mixed_bfloat16:
        models["ours_mixed_bfloat16"] = build_ours(
            config, vocabulary, "mixed_bfloat16"
        )
    if not args.skip_keras_hub:
        models["keras_hub"] = build_keras_hub(config, vocabulary, dtype)
        models["keras_hub_keras_loss"] = build_keras_hub(
            config, vocabulary, dtype
        )
    for key, model in models.items():
        if key == "keras_hub_keras_loss":
            contestants[key] = keras_loss_step(
                model, inputs, labels, vocabulary, args.jit_compile
            )
        else:
            our_adam = key in ("ours", "ours_mixed_bfloat16")
            contestants[key] = keras_step(
                model, inputs, labels, args.jit_compile, our_adam
            )
        params[key] = model.count_params()
        policies[key] = model.dtype_policy.name
        optimizers[key] = type(model.optimizer).__module__.split(".")[0]
    if backend == "torch" and not args.skip_torch:
        import torch

        torch.manual_seed(0)
        module, factory = build_torch(
            config, vocabulary, bfloat16=args.dtype == "mixed_bfloat16"
        )
        contestants["torch"] = factory(inputs, labels)
        params["torch"] = sum(p.numel() for p in module.parameters())
        policies["torch"] = args.dtype
        optimizers["torch"] = "torch"

    flops = train_flops(config, batch, source_length, target_length, vocabulary)
    # Warm-up: compiles (JAX, TensorFlow) and allocates.
    first_step_s, jit_compile = {}, {}
    for key, step in contestants.items():
        first_step_s[key] = _common.timed(step)
        jit_compile[key] = getattr(models.get(key), "jit_compile", False)
        step()

    def measure(step):
        if step == "probe":
            return _common.matmul_probe(args.probe_size, repeats=2)
        seconds = _common.timed(lambda: [step() for _ in range(args.steps)])
        return seconds / args.steps

    if not args.skip_probe:
        contestants["probe"] = "probe"
    times = _common.interleaved(contestants, args.rounds, measure)
    probe = times.pop("probe", None)
    row_base = {
        "config": name,
        "batch": batch,
        "source_length": source_length,
        "target_length": target_length,
        "real_tokens_per_step": real_tokens,
        "flops_per_step": flops,
    }
    rows = []
    tokens = {k: [real_tokens / s for s in v] for k, v in times.items()}
    for key, per_round in times.items():
        step_s = statistics.median(per_round)
        row = dict(
            row_base,
            contestant=key,
            parameters=params[key],
            dtype_policy=policies[key],
            optimizer=optimizers[key],
        )
        row["step_s"] = step_s
        row["step_s_per_round"] = per_round
        row["tokens_per_s"] = real_tokens / step_s
        row["tflops"] = flops / step_s / 1e12
        row["first_step_s"] = first_step_s[key]
        row["jit_compile"] = jit_compile[key]
        if probe:
            fractions = [
                flops / s / p for s, p in zip(per_round, probe, strict=True)
            ]
            row["probe_fraction"] = statistics.median(fractions)
            row["probe_fraction_per_round"] = fractions
        if key != "ours":
            row["ours_speedup"] = _common.ratios(tokens, "ours", key)
        if key == "ours_mixed_bfloat16":
            row["speedup_over_float32"] = _common.ratios(tokens, key, "ours")
        rows.append(row)
    result = {"dropout": config["dropout"], "rows": rows}
    if probe:
        result["probe_tflops_per_round"] = [p / 1e12 for p in probe]
        result["probe_tflops"] = statistics.median(probe) / 1e12
    return result


def parse_args(argv=None):
    parser = _common.argument_parser(
        __doc__,
        rounds=5,
        smoke_help="a one-layer, 16-wide model, one round of one step",
    )
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=None)
    parser.add_argument("--vocabulary-size", type=int, default=8000)
    parser.add_argument(
        "--dtype", default="float32", choices=("float32", "mixed_bfloat16")
    )
    parser.add_argument(
        "--with-mixed-bfloat16",
        action="store_true",
        help="also time ours under the mixed_bfloat16 policy, against "
        "ours in float32 (needs --dtype float32)",
    )
    parser.add_argument(
        "--jit-compile",
        default="auto",
        choices=("auto", "true", "false"),
        help="`compile(jit_compile=...)` of every Keras contestant: auto "
        "(Keras's choice: XLA on JAX, not on TensorFlow without a GPU, "
        "eager torch), true or false",
    )
    parser.add_argument(
        "--dropout",
        type=float,
        default=None,
        help="dropout rate of every contestant instead of the "
        "configuration's (0.1 in tiny and base); 0 times the models "
        "without drawing dropout masks",
    )
    parser.add_argument("--probe-size", type=int, default=2048)
    parser.add_argument("--skip-keras-hub", action="store_true")
    parser.add_argument("--skip-torch", action="store_true")
    parser.add_argument("--skip-probe", action="store_true")
    args = parser.parse_args(argv)
    args.jit_compile = {"true": True, "false": False}.get(
        args.jit_compile, args.jit_compile
    )
    if args.with_mixed_bfloat16 and args.dtype != "float32":
        parser.error(
            f"--with-mixed-bfloat16 compares against float32; --dtype is "
            f"{args.dtype!r}. Drop one of the two."
        )
    if args.smoke:
        args.configs, args.rounds, args.steps = ["smoke"], 1, 1
        args.vocabulary_size, args.probe_size = 64, 128
    for name in args.configs:
        if name not in SHAPES:
            parser.error(f"--configs {name!r} is not one of {sorted(SHAPES)}.")
    return args


def main(argv=None):
    args = parse_args(argv)
    _common.pin_threads(args.threads)
    import keras

    _common.pin_frameworks(args.threads)
    backend = keras.backend.backend()
    report = {
        "benchmark": "training",
        "machine": _common.machine(),
        "threads": args.threads,
        "dtype": args.dtype,
        "jit_compile": args.jit_compile,
        "rounds": args.rounds,
        "steps_per_round": args.steps,
        "configs": {},
    }
    print(
        f"backend {backend}, threads {args.threads}, dtype {args.dtype}, "
        f"jit_compile {args.jit_compile}"
    )
    for name in args.configs:
        result = run_config(name, args, backend)
        report["configs"][name] = result
        print(f"\n{name}: probe {result.get('probe_tflops', 0):.3f} TFLOP/s")
        print(
            _common.table(
                [
                    dict(
                        r,
                        vs=(r.get("ours_speedup") or {}).get("median"),
                        tflops_=r["tflops"],
                    )
                    for r in result["rows"]
                ],
                [
                    ("contestant", "contestant"),
                    ("params", "parameters"),
                    ("step s", "step_s"),
                    ("tokens/s", "tokens_per_s"),
                    ("TFLOP/s", "tflops_"),
                    ("of probe", "probe_fraction"),
                    ("ours/this", "vs"),
                ],
            ),
            flush=True,
        )
    _common.write_json(args.output, report)
    return report


if __name__ == "__main__":
    main()
    sys.exit(0)
