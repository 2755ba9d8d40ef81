"""Training throughput of the base model in bfloat16 on one accelerator.

    KERAS_BACKEND=jax python -m benchmarks.gpu [--peak-tflops 989]
        [--batch-size 128] [--length 64] [--steps 50] [--output FILE.json]
    python -m benchmarks.gpu --smoke      # a quick check on CPU

For a machine with a GPU (one run takes about a minute there): the
``base`` Transformer (Table 3) under the ``mixed_bfloat16`` policy, one
`train_on_batch` per step with `LabelSmoothedCrossEntropy` and the
paper's Adam, on a fixed synthetic batch (``--batch-size`` pairs of
``--length`` tokens per side, 60-100% of them real). It reports real
tokens per second and the achieved matrix-multiply FLOP/s
(`benchmarks.training.train_flops`) as a fraction of the chip's dense
bfloat16 peak (``--peak-tflops``, or looked up in `PEAK_TFLOPS` from the
device name) and of a ``--probe-size`` square matrix multiply in the
compute dtype, timed on the same device in the same process.
"""

import argparse
import os
import statistics
import time

from benchmarks import _common
from benchmarks.training import make_batch, model_config, train_flops

# Dense (no sparsity) bfloat16 tensor-core peaks, TFLOP/s, from the
# vendors' data sheets (SXM parts; PCIe H100 is 756).
PEAK_TFLOPS = {
    "H200": 989.0,
    "H100": 989.0,
    "A100": 312.0,
}


def device_name():
    """The first accelerator's name on the current backend, or "cpu"."""
    import keras

    backend = keras.backend.backend()
    try:
        if backend == "jax":
            import jax

            device = jax.devices()[0]
            return device.device_kind if device.platform != "cpu" else "cpu"
        if backend == "torch":
            import torch

            if torch.cuda.is_available():
                return torch.cuda.get_device_name(0)
        if backend == "tensorflow":
            import tensorflow as tf

            gpus = tf.config.list_physical_devices("GPU")
            if gpus:
                details = tf.config.experimental.get_device_details(gpus[0])
                return details.get("device_name", "GPU")
    except Exception as error:  # noqa: BLE001 - report, do not fail
        return f"unknown ({error})"
    return "cpu"


def peak_for(name, peak_tflops=None, compute_dtype="bfloat16"):
    """The peak to divide by: the argument, else (for bfloat16 compute,
    the only dtype the table's peaks are for) the table's entry whose key
    is in the device name, else None."""
    if peak_tflops:
        return float(peak_tflops)
    if compute_dtype != "bfloat16":
        return None
    for key, value in PEAK_TFLOPS.items():
        if key.lower() in name.lower():
            return value
    return None


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--config", default="base")
    parser.add_argument("--dtype", default="mixed_bfloat16")
    parser.add_argument("--batch-size", type=int, default=128)
    parser.add_argument("--length", type=int, default=64)
    parser.add_argument("--vocabulary-size", type=int, default=37000)
    parser.add_argument("--steps", type=int, default=50)
    parser.add_argument("--warmup-steps", type=int, default=3)
    parser.add_argument(
        "--max-seconds",
        type=float,
        default=300.0,
        help="stop timing after this long, whatever --steps says",
    )
    parser.add_argument(
        "--peak-tflops",
        type=float,
        default=None,
        help="the chip's peak for the compute dtype (default, for "
        f"bfloat16 only: {PEAK_TFLOPS} by name)",
    )
    parser.add_argument(
        "--probe-size",
        type=int,
        default=8192,
        help="side of the square matrix multiply timed as the achievable "
        "peak (0 skips it)",
    )
    parser.add_argument("--output", default=None)
    parser.add_argument(
        "--smoke",
        action="store_true",
        help="a one-layer model, batch 2, 2 steps (runs on CPU)",
    )
    args = parser.parse_args(argv)
    if args.smoke:
        args.config, args.batch_size, args.length = "smoke", 2, 8
        args.vocabulary_size, args.steps, args.warmup_steps = 64, 2, 1
        args.probe_size = min(args.probe_size, 64)
    return args


def main(argv=None):
    args = parse_args(argv)
    import keras

    import keras_transformer as kt

    name = device_name()
    compute_dtype = keras.dtype_policies.get(args.dtype).compute_dtype
    peak = peak_for(name, args.peak_tflops, compute_dtype)
    probe = (
        _common.matmul_probe(args.probe_size, 10, compute_dtype) / 1e12
        if args.probe_size
        else None
    )
    config = model_config(args.config)
    inputs, labels, tokens = make_batch(
        args.batch_size, args.length, args.length, args.vocabulary_size
    )
    flops = train_flops(
        config, args.batch_size, args.length, args.length, args.vocabulary_size
    )
    keras.utils.set_random_seed(0)
    model = kt.Transformer(
        vocabulary_size=args.vocabulary_size,
        max_sequence_length=256,
        dtype=args.dtype,
        **config,
    )
    model.compile(
        optimizer=kt.training.transformer_optimizer(config["hidden_dim"]),
        loss=kt.training.LabelSmoothedCrossEntropy(0.1),
    )
    start = time.perf_counter()
    for _ in range(args.warmup_steps):
        model.train_on_batch(inputs, labels)
    warmup_s = time.perf_counter() - start
    step_s = []
    deadline = time.perf_counter() + args.max_seconds
    for _ in range(args.steps):
        # train_on_batch returns the loss as a number: it waits for the
        # device, so each step is timed whole.
        step_s.append(
            _common.timed(lambda: model.train_on_batch(inputs, labels))
        )
        if time.perf_counter() > deadline:
            break
    median = statistics.median(step_s)
    achieved = flops / median / 1e12
    report = {
        "benchmark": "gpu",
        "machine": _common.machine(),
        "device": name,
        "config": args.config,
        "dtype": args.dtype,
        "parameters": model.count_params(),
        "batch_size": args.batch_size,
        "length": args.length,
        "real_tokens_per_step": tokens,
        "flops_per_step": flops,
        "warmup_s": warmup_s,
        "steps_timed": len(step_s),
        "step_s": median,
        "step_s_all": step_s,
        "tokens_per_s": tokens / median,
        "achieved_tflops": achieved,
        "peak_tflops": peak,
        "peak_fraction": achieved / peak if peak else None,
        "probe_size": args.probe_size,
        "probe_tflops": probe,
        "probe_fraction": achieved / probe if probe else None,
    }
    for key in (
        "device",
        "config",
        "dtype",
        "parameters",
        "steps_timed",
        "step_s",
        "tokens_per_s",
        "achieved_tflops",
        "peak_tflops",
        "peak_fraction",
        "probe_tflops",
        "probe_fraction",
    ):
        value = report[key]
        print(f"{key:<16} {_common._fmt(value)}")
    _common.write_json(args.output, report)
    return report


if __name__ == "__main__":
    os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "true")
    main()
