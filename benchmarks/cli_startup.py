"""Start-up time of the `keras-transformer` command.

    python -m benchmarks.cli_startup [--runs 5] [--output FILE.json]

Runs ``keras-transformer --help``, ``keras-transformer translate --help``
and ``keras-transformer --version`` in child processes, ``--runs`` times
each in alternating order, and reports the median wall time of each with
the modules the child had imported (none of Keras, TensorFlow, JAX or
torch, since the package loads its submodules on first use). For
comparison, ``import keras_transformer.training.recipes``: what the
command's parser imported before, Keras and the backend included.
"""

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import time

from benchmarks import _common

FRAMEWORKS = ("keras", "tensorflow", "jax", "torch")
# Runs the command's main in the child and lists the frameworks it
# imported on stderr, as the console script would run it.
PROBE = (
    "import sys\n"
    "from keras_transformer import cli\n"
    "try:\n"
    "    cli.main(sys.argv[1:])\n"
    "except SystemExit:\n"
    "    pass\n"
    f"loaded = [m for m in {FRAMEWORKS!r} if m in sys.modules]\n"
    "print('LOADED', ','.join(loaded), file=sys.stderr)\n"
)
COMMANDS = {
    "help": ["--help"],
    "translate_help": ["translate", "--help"],
    "version": ["--version"],
}
BEFORE = "import keras_transformer.training.recipes"


def _run(argv):
    """``(seconds, frameworks imported)`` of one child process."""
    start = time.perf_counter()
    result = subprocess.run(
        argv, capture_output=True, text=True, check=True, timeout=600
    )
    seconds = time.perf_counter() - start
    loaded = ""
    for line in result.stderr.splitlines():
        if line.startswith("LOADED"):
            loaded = line.partition(" ")[2]
    return seconds, [name for name in loaded.split(",") if name]


def _contestants():
    contestants = {
        name: [sys.executable, "-c", PROBE, *argv]
        for name, argv in COMMANDS.items()
    }
    contestants["before_import_recipes"] = [sys.executable, "-c", BEFORE]
    script = shutil.which("keras-transformer")
    if script:
        contestants["console_script_help"] = [script, "--help"]
    return contestants


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--output", default=None)
    args = parser.parse_args(argv)
    contestants = _contestants()
    # Other work on the machine slows every child alike: say how much
    # there was.
    load = [round(value, 2) for value in os.getloadavg()]
    measured = {name: [] for name in contestants}
    loaded = {}
    for r in range(args.runs):
        names = list(contestants)
        for name in names if r % 2 == 0 else reversed(names):
            seconds, loaded[name] = _run(contestants[name])
            measured[name].append(seconds)
    report = {
        "machine": _common.machine(),
        "backend": os.environ.get("KERAS_BACKEND", "default"),
        "runs": args.runs,
        "load_average_1_5_15_min": load,
        "median_seconds": {
            name: round(statistics.median(values), 3)
            for name, values in measured.items()
        },
        "seconds": {
            name: [round(v, 3) for v in values]
            for name, values in measured.items()
        },
        "frameworks_imported": {
            name: loaded[name] for name in COMMANDS if name in loaded
        },
    }
    for name, value in report["median_seconds"].items():
        print(f"{name:24s} {value:7.3f} s")
    _common.write_json(args.output, report)
    return report


if __name__ == "__main__":
    main()
