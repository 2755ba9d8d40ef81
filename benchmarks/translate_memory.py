"""Peak memory of `keras-transformer translate` on one sentence with the
multi30k_en_de recipe's model.

    python -m benchmarks.translate_memory [--backends torch jax]
        [--data DIR] [--code DIR] [--imports] [--smoke] [--output FILE.json]

Saves a translator of the recipe's model size (3 + 3 layers, d_model
256, 4 heads, d_ff 512, its 8,000-id vocabulary and sequence length, the
recipe's generation settings) with random weights and a SentencePiece
tokenizer trained on Multi30k (``--data``, default
``../shared/data/multi30k``; generated sentences where it is absent),
then runs ``/usr/bin/time -v python -m keras_transformer.cli translate``
on one sentence in a child process per backend and reads its "Maximum
resident set size". Untrained weights decode up to the length limit, the
most work one sentence can ask for.

``--code DIR`` runs the children on another checkout of the package
(e.g. ``git worktree add /tmp/tm-before <commit>``), to measure older
code on the same saved translator. ``--imports`` also records whether
the child imported TensorFlow (``python -X importtime``). ``--smoke``
trains a 400-id tokenizer on generated sentences instead (the model keeps
the recipe's size).
"""

import argparse
import os
import re
import subprocess
import sys
import tempfile

from benchmarks import _common

RECIPE = "multi30k_en_de"
SENTENCE = "A man in an orange hat starring at something."
DEFAULT_DATA = os.path.join(
    os.path.dirname(__file__), "..", "..", "shared", "data", "multi30k"
)
_PEAK = re.compile(r"Maximum resident set size \(kbytes\): (\d+)")


def _tokenizer_text(data, directory, smoke):
    """Training text of the tokenizer: Multi30k's training sides, or
    generated sentences where the data is absent or for ``smoke``."""
    files = [os.path.join(data, f"train.{lang}") for lang in ("en", "de")]
    if not smoke and all(os.path.isfile(path) for path in files):
        return files, "multi30k"
    from benchmarks.cli_memory import write_sentences

    path = os.path.join(directory, "sentences.txt")
    count, words = (2000, 300) if smoke else (20_000, 3000)
    write_sentences(path, count, seed=7, vocabulary=words)
    return [path], "generated"


def save_translator(directory, data, smoke=False):
    """Saves the recipe's translator with random weights; returns its
    directory and where the tokenizer's text came from."""
    import keras

    import keras_transformer as kt
    from keras_transformer.data import train_tokenizer
    from keras_transformer.training.recipes import RECIPES

    recipe = RECIPES[RECIPE]
    files, source = _tokenizer_text(data, directory, smoke)
    size = 400 if smoke else recipe.vocabulary_size
    tokenizer = train_tokenizer(files, vocabulary_size=size)
    keras.utils.set_random_seed(0)
    model = kt.Transformer(
        vocabulary_size=tokenizer.vocabulary_size,
        max_sequence_length=recipe.max_length,
        **recipe.model,
    )
    translator = kt.Translator(
        model, tokenizer, length_penalty=recipe.length_penalty
    )
    path = os.path.join(directory, "translator")
    translator.save(path)
    return path, source


def measure(model, backend, code, directory, imports=False):
    """Runs ``translate`` on one sentence under ``/usr/bin/time -v`` in a
    child process; returns its peak RSS, the translation and, with
    ``imports``, whether it imported TensorFlow."""
    source = os.path.join(directory, "input.txt")
    output = os.path.join(directory, f"output_{backend}.txt")
    with open(source, "w", encoding="utf-8") as f:
        f.write(SENTENCE + "\n")
    python = [sys.executable] + (["-X", "importtime"] if imports else [])
    command = ["/usr/bin/time", "-v", *python, "-m", "keras_transformer.cli"]
    command += ["translate", "--model", model, "--input", source]
    command += ["--output", output, "--quiet"]
    env = dict(os.environ, KERAS_BACKEND=backend, TF_CPP_MIN_LOG_LEVEL="3")
    if code:
        env["PYTHONPATH"] = os.path.abspath(code)
    process = subprocess.run(
        command,
        env=env,
        cwd=os.path.abspath(code) if code else None,
        capture_output=True,
        text=True,
    )
    if process.returncode != 0:
        raise RuntimeError(
            f"{' '.join(command)} failed ({process.returncode}):\n"
            + process.stderr[-3000:]
        )
    peak = _PEAK.search(process.stderr)
    with open(output, encoding="utf-8") as f:
        translation = f.read().strip()
    run = {
        "backend": backend,
        "peak_rss_mb": int(peak.group(1)) / 1024,
        "output_words": len(translation.split()),
    }
    if imports:
        imported = re.findall(r"\|\s+(\S+)$", process.stderr, re.MULTILINE)
        run["imports_tensorflow"] = any(
            name.split(".")[0] == "tensorflow" for name in imported
        )
    return run


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--backends", nargs="+", default=["torch"])
    parser.add_argument("--data", default=DEFAULT_DATA)
    parser.add_argument(
        "--code", default=None, help="a checkout whose package the children run"
    )
    parser.add_argument("--imports", action="store_true")
    parser.add_argument("--smoke", action="store_true")
    parser.add_argument("--output", default=None)
    args = parser.parse_args(argv)
    report = {
        "benchmark": "translate_memory",
        "recipe": RECIPE,
        "machine": _common.machine(),
        "sentence": SENTENCE,
        "code": args.code or "this checkout",
        "runs": [],
    }
    with tempfile.TemporaryDirectory() as directory:
        model, report["tokenizer_text"] = save_translator(
            directory, args.data, args.smoke
        )
        for backend in args.backends:
            run = measure(model, backend, args.code, directory, args.imports)
            report["runs"].append(run)
            print(
                f"{backend}: peak RSS {run['peak_rss_mb']:.0f} MB"
                + (
                    f", imports tensorflow: {run['imports_tensorflow']}"
                    if args.imports
                    else ""
                )
            )
    _common.write_json(args.output, report)
    return report


if __name__ == "__main__":
    main()
