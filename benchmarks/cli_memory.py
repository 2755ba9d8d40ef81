"""Peak memory of `keras-transformer translate` on a short and a long input.

    python -m benchmarks.cli_memory [--lines 1000 100000] [--batch-size 256]
        [--threads N] [--smoke] [--output FILE.json]

Saves an untrained translator of the "tiny" configuration, with a
tokenizer trained on generated sentences, writes inputs of generated
sentences (4 to 12 words of a made-up vocabulary) and runs
``python -m keras_transformer.cli translate`` on each input in a child
process: greedy search, at most input length + 8 tokens, output to a
file. Each child's peak resident set size comes from ``os.wait4``. The
command reads, translates and writes one chunk of lines at a time, so
the long input's peak should stay within 10% of the short one's
(``peak_ratio``, long over short).
"""

import argparse
import os
import subprocess
import sys
import tempfile
import time

import numpy as np

from benchmarks import _common

SYLLABLES = "ka lo mi ne ru sa te vo bi da fe gu".split()
# --smoke: one layer each side, and sentences of two or three words,
# which fit one length bucket: each run compiles one search.
SMOKE_MODEL = {"num_encoder_layers": 1, "num_decoder_layers": 1}
SMOKE_WORDS = (2, 3)


def _words(rng, count):
    """``count`` made-up words of two or three syllables."""
    sizes = rng.integers(2, 4, size=count)
    return ["".join(rng.choice(SYLLABLES, size=int(size))) for size in sizes]


def write_sentences(path, count, seed=0, words=(4, 12), vocabulary=300):
    """Writes ``count`` generated sentences of ``words`` (fewest, most)
    words, one per line, without holding them in memory."""
    rng = np.random.default_rng(seed)
    vocabulary = _words(np.random.default_rng(1234), vocabulary)
    with open(path, "w", encoding="utf-8") as f:
        for _ in range(count):
            length = int(rng.integers(words[0], words[1] + 1))
            f.write(" ".join(rng.choice(vocabulary, size=length)) + ".\n")


def save_translator(directory, batch_size, smoke):
    import keras

    import keras_transformer as kt
    from keras_transformer.data import train_tokenizer

    sample = os.path.join(directory, "tokenizer_sentences.txt")
    write_sentences(sample, 2000, seed=99)
    tokenizer = train_tokenizer(
        [sample], vocabulary_size=256, byte_fallback=False
    )
    keras.utils.set_random_seed(0)
    model = kt.Transformer.from_config_name(
        "tiny",
        vocabulary_size=tokenizer.vocabulary_size,
        max_sequence_length=64,
        **(SMOKE_MODEL if smoke else {}),
    )
    translator = kt.Translator(
        model,
        tokenizer,
        method="greedy",
        max_length_offset=8,
        batch_size=batch_size,
    )
    path = os.path.join(directory, "translator")
    translator.save(path)
    return path


def measure(model, source, output, chunk_size):
    """Runs the command on ``source`` in a child process; returns its
    peak resident set size, wall time and output line count."""
    command = [
        sys.executable,
        "-m",
        "keras_transformer.cli",
        "translate",
        "--model",
        model,
        "--input",
        source,
        "--output",
        output,
        "--quiet",
    ]
    if chunk_size:
        command += ["--chunk-size", str(chunk_size)]
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
    start = time.perf_counter()
    with tempfile.TemporaryFile() as stderr:
        process = subprocess.Popen(command, stderr=stderr, env=env)
        # wait4 gives this child's own resource usage, unlike
        # getrusage(RUSAGE_CHILDREN), the maximum over all children.
        _, status, usage = os.wait4(process.pid, 0)
        process.returncode = os.waitstatus_to_exitcode(status)
        seconds = time.perf_counter() - start
        if process.returncode != 0:
            stderr.seek(0)
            raise RuntimeError(
                f"{' '.join(command)} failed ({process.returncode}):\n"
                + stderr.read().decode(errors="replace")[-3000:]
            )
    with open(output, "rb") as f:
        output_lines = sum(1 for _ in f)
    # ru_maxrss is in kilobytes on Linux.
    return {
        "peak_rss_mb": usage.ru_maxrss / 1024,
        "seconds": seconds,
        "output_lines": output_lines,
    }


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--lines", type=int, nargs=2, default=[1000, 100_000])
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument(
        "--chunk-size", type=int, default=None, help="the command's default"
    )
    parser.add_argument("--threads", type=int, default=os.cpu_count())
    parser.add_argument("--output", default=None)
    parser.add_argument(
        "--smoke",
        action="store_true",
        help="24 and 240 lines, batches of 8, chunks of 16",
    )
    args = parser.parse_args(argv)
    if args.smoke:
        args.lines, args.batch_size, args.chunk_size = [24, 240], 8, 16
    # Inherited by the children, which import the frameworks.
    _common.pin_threads(args.threads)
    import keras

    report = {
        "benchmark": "cli_memory",
        "backend": keras.backend.backend(),
        "machine": _common.machine(),
        "threads": args.threads,
        "batch_size": args.batch_size,
        "chunk_size": args.chunk_size,
        "method": "greedy",
        "runs": [],
    }
    with tempfile.TemporaryDirectory() as directory:
        model = save_translator(directory, args.batch_size, args.smoke)
        for count in args.lines:
            source = os.path.join(directory, f"input_{count}.txt")
            write_sentences(
                source, count, words=SMOKE_WORDS if args.smoke else (4, 12)
            )
            run = measure(
                model,
                source,
                os.path.join(directory, "out.txt"),
                args.chunk_size,
            )
            run = {"lines": count, **run}
            run["sentences_per_s"] = count / run["seconds"]
            report["runs"].append(run)
            print(
                f"{count} lines: peak RSS {run['peak_rss_mb']:.1f} MB, "
                f"{run['seconds']:.1f} s ({run['sentences_per_s']:.0f} "
                "sentences/s, start-up included)"
            )
    short, long = report["runs"]
    report["peak_ratio"] = long["peak_rss_mb"] / short["peak_rss_mb"]
    print(f"peak ratio, long over short: {report['peak_ratio']:.3f}")
    _common.write_json(args.output, report)
    return report


if __name__ == "__main__":
    main()
