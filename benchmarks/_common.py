"""Shared helpers of the benchmarks: command-line options, thread
pinning, machine description, interleaved rounds, the matrix-multiply
probe and JSON output.

`pin_threads` must run before the backend framework is imported (the
XLA flag is read once, at start-up), so the benchmark modules call it at
import time of `main`, before importing `keras`.
"""

import argparse
import importlib.metadata
import json
import os
import platform
import statistics
import subprocess
import time


def argument_parser(doc, rounds, smoke_help=None):
    """The options of a benchmark timed per model configuration:
    ``--configs``, ``--rounds`` (default ``rounds``), ``--threads``,
    ``--output`` and ``--smoke``; the benchmark adds its own."""
    parser = argparse.ArgumentParser(description=doc.split("\n")[0])
    parser.add_argument("--configs", nargs="+", default=["tiny", "base"])
    parser.add_argument("--rounds", type=int, default=rounds)
    parser.add_argument("--threads", type=int, default=os.cpu_count())
    parser.add_argument("--output", default=None)
    parser.add_argument("--smoke", action="store_true", help=smoke_help)
    return parser


def pin_threads(threads):
    """Asks every framework for ``threads`` intra-op threads.

    Sets the environment for XLA (JAX and TensorFlow's XLA), OpenMP and
    MKL, which must happen before they are imported; `pin_frameworks`
    does the rest once they are. ``threads=0`` leaves everything as is.
    """
    if not threads:
        return
    threads = str(int(threads))
    os.environ.setdefault("OMP_NUM_THREADS", threads)
    os.environ.setdefault("MKL_NUM_THREADS", threads)
    flags = os.environ.get("XLA_FLAGS", "")
    if "intra_op_parallelism_threads" not in flags:
        os.environ["XLA_FLAGS"] = (
            f"{flags} --xla_cpu_multi_thread_eigen=true "
            f"intra_op_parallelism_threads={threads}"
        ).strip()


def pin_frameworks(threads):
    """Thread settings that need the framework imported."""
    if not threads:
        return
    import keras

    backend = keras.backend.backend()
    if backend == "torch":
        import torch

        torch.set_num_threads(int(threads))
    if backend == "tensorflow":
        import tensorflow as tf

        try:
            tf.config.threading.set_intra_op_parallelism_threads(int(threads))
            tf.config.threading.set_inter_op_parallelism_threads(1)
        except RuntimeError:  # already initialized: keep its settings
            pass


def machine():
    """The CPU, its relevant flags and the library versions."""
    info = {
        "cpu_count": os.cpu_count(),
        "python": platform.python_version(),
    }
    try:
        lscpu = subprocess.run(
            ["lscpu"], capture_output=True, text=True, check=False
        ).stdout
    except OSError:
        lscpu = ""
    for line in lscpu.splitlines():
        key, _, value = line.partition(":")
        if key.strip() == "Model name":
            info["cpu"] = value.strip()
        if key.strip() == "Flags":
            flags = value.split()
            info["cpu_flags"] = sorted(
                f
                for f in flags
                if f.startswith(("avx512", "amx", "avx2", "fma"))
                or f in ("avx_vnni", "avx512_bf16")
            )
    import keras

    info["keras"] = keras.__version__
    info["backend"] = keras.backend.backend()
    # From the installed metadata: importing the other frameworks would
    # start their thread pools inside the process being measured.
    distributions = {
        "jax": ("jax",),
        "tensorflow": ("tensorflow", "tensorflow-cpu"),
        "torch": ("torch",),
        "keras_hub": ("keras-hub",),
        "numpy": ("numpy",),
    }
    for name, candidates in distributions.items():
        for distribution in candidates:
            try:
                info[name] = importlib.metadata.version(distribution)
                break
            except importlib.metadata.PackageNotFoundError:
                pass
    return info


def interleaved(contestants, rounds, measure):
    """Runs ``measure(fn)`` for each contestant in alternating rounds.

    The order alternates each round (ABC, CBA, ...) so that slow drifts
    of a shared machine hit every contestant alike. Returns
    ``{name: [value per round]}``.
    """
    names = list(contestants)
    values = {name: [] for name in names}
    for r in range(rounds):
        order = names if r % 2 == 0 else names[::-1]
        for name in order:
            values[name].append(measure(contestants[name]))
    return values


def ratios(values, numerator, denominator):
    """Per-round ratios and their median."""
    per_round = [
        a / b
        for a, b in zip(values[numerator], values[denominator], strict=True)
    ]
    return {"per_round": per_round, "median": statistics.median(per_round)}


def timed(fn):
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def matmul_probe(size=2048, repeats=3, dtype="float32"):
    """FLOP/s of a ``size`` square matrix multiply in ``dtype`` on the
    backend, the best of ``repeats`` after a warm-up."""
    import keras
    import ml_dtypes
    import numpy as np

    backend = keras.backend.backend()
    rng = np.random.default_rng(0)
    a = rng.standard_normal((size, size), dtype="float32")
    b = rng.standard_normal((size, size), dtype="float32")
    if dtype == "bfloat16":
        a, b = a.astype(ml_dtypes.bfloat16), b.astype(ml_dtypes.bfloat16)
    if backend == "jax":
        import jax

        a, b = jax.device_put(a), jax.device_put(b)
        mm = jax.jit(lambda x, y: x @ y)

        def run():
            mm(a, b).block_until_ready()

    elif backend == "tensorflow":
        import tensorflow as tf

        a, b = tf.constant(a), tf.constant(b)

        def run():
            tf.linalg.matmul(a, b).numpy()

    elif backend == "torch":
        import torch

        # Keras's torch backend puts tensors on the GPU when there is one;
        # the probe multiplies where the model computes.
        device = "cuda" if torch.cuda.is_available() else "cpu"
        a, b = (
            torch.from_numpy(x.astype("float32"))
            .to(device)
            .to(getattr(torch, dtype))
            for x in (a, b)
        )

        def run():
            torch.mm(a, b)
            if device == "cuda":
                torch.cuda.synchronize()

    else:
        raise NotImplementedError(backend)
    run()
    best = min(timed(run) for _ in range(repeats))
    return 2.0 * size**3 / best


def write_json(path, report):
    if path:
        with open(path, "w") as f:
            json.dump(report, f, indent=2)
            f.write("\n")


def table(rows, columns):
    """A plain text table of dict rows."""
    widths = [
        max(len(title), *(len(_fmt(r.get(key))) for r in rows))
        for title, key in columns
    ]
    lines = [
        "  ".join(t.ljust(w) for (t, _), w in zip(columns, widths, strict=True))
    ]
    for row in rows:
        lines.append(
            "  ".join(
                _fmt(row.get(key)).ljust(w)
                for (_, key), w in zip(columns, widths, strict=True)
            )
        )
    return "\n".join(lines)


def _fmt(value):
    if isinstance(value, float):
        if abs(value) >= 100:
            return f"{value:,.0f}"
        return f"{value:.3g}"
    return "-" if value is None else str(value)
