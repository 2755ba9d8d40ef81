"""A training step of this checkout against the same step at an earlier
commit, interleaved in time.

    KERAS_BACKEND=torch python -m benchmarks.before_after --ref 7facd7b
        [--rounds 16] [--steps 2] [--dropout RATE] [--output FILE.json]
        [--smoke]

On a shared machine the speed of one process drifts by tens of percent
within minutes, so two benchmark runs one after the other compare the
machine's moods as much as the code. Here each version runs in its own
worker process (the earlier one from a ``git worktree`` of ``--ref``),
both build and warm up the base model (Table 3, ``benchmarks.training``'s
batch and optimizer) first, and then they take turns: each round times
``--steps`` steps of one, then of the other, alternating which goes
first. The result is the median of the per-round ratios, after over
before (below 1: this checkout is faster). ``--smoke`` runs a tiny
model for one round.
"""

import argparse
import json
import os
import pathlib
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]
SHAPES = {"base": (16, 32, 32), "smoke": (2, 8, 8)}


def _worker(dropout, config_name):
    """Build, warm up, then time ``n`` steps per line of stdin."""
    sys.path.insert(0, os.getcwd())  # the tree this worker measures
    import keras

    from benchmarks.training import (
        build_ours,
        make_batch,
        model_config,
        optimizer,
    )
    from keras_transformer.training import LabelSmoothedCrossEntropy

    keras.utils.set_random_seed(0)
    config = model_config(config_name)
    config["dropout"] = dropout
    model = build_ours(config, 8000)
    model.compile(
        optimizer=optimizer(ours=True), loss=LabelSmoothedCrossEntropy(0.1)
    )
    inputs, labels, _ = make_batch(*SHAPES[config_name], 8000)
    for _ in range(3):
        model.train_on_batch(inputs, labels)
    print("ready", flush=True)
    for line in sys.stdin:
        steps = int(line)
        start = time.perf_counter()
        for _ in range(steps):
            model.train_on_batch(inputs, labels)
        print((time.perf_counter() - start) / steps, flush=True)


def _start(tree, dropout, config_name):
    command = [sys.executable, __file__, "--worker", "--dropout", str(dropout)]
    process = subprocess.Popen(
        command + (["--smoke"] if config_name == "smoke" else []),
        cwd=tree,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    line = process.stdout.readline().strip()
    if line != "ready":
        raise RuntimeError(f"The worker in {tree} failed to start.")
    return process


def _time(process, steps):
    process.stdin.write(f"{steps}\n")
    process.stdin.flush()
    return float(process.stdout.readline())


def compare(before_tree, rounds, steps, dropout, config_name="base"):
    """Per-round step times of both trees and their ratios."""
    workers = {
        "before": _start(before_tree, dropout, config_name),
        "after": _start(ROOT, dropout, config_name),
    }
    times = {"before": [], "after": []}
    try:
        for index in range(rounds):
            order = (
                ["before", "after"] if index % 2 == 0 else ["after", "before"]
            )
            for name in order:
                times[name].append(_time(workers[name], steps))
    finally:
        for process in workers.values():
            process.stdin.close()
            process.wait()
    ratios = [
        a / b for a, b in zip(times["after"], times["before"], strict=True)
    ]
    return {
        "before_step_s": statistics.median(times["before"]),
        "after_step_s": statistics.median(times["after"]),
        "after_over_before": statistics.median(ratios),
        "ratios_per_round": ratios,
    }


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ref", help="the earlier commit")
    parser.add_argument("--rounds", type=int, default=16)
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--dropout", type=float, default=0.1)
    parser.add_argument("--output")
    parser.add_argument("--smoke", action="store_true")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    config_name = "smoke" if args.smoke else "base"
    if args.worker:
        return _worker(args.dropout, config_name)
    if not args.ref:
        parser.error("--ref is required")
    if args.smoke:
        args.rounds, args.steps = 1, 1
    with tempfile.TemporaryDirectory() as scratch:
        tree = pathlib.Path(scratch) / f"before-{os.getpid()}"
        subprocess.run(
            ["git", "worktree", "add", "--detach", str(tree), args.ref],
            cwd=ROOT,
            check=True,
            capture_output=True,
        )
        try:
            result = compare(
                tree, args.rounds, args.steps, args.dropout, config_name
            )
        finally:
            subprocess.run(
                ["git", "worktree", "remove", "--force", str(tree)],
                cwd=ROOT,
                check=False,
                capture_output=True,
            )
    from benchmarks import _common

    result = {
        "benchmark": "before_after",
        "machine": _common.machine(),
        "ref": args.ref,
        "rounds": args.rounds,
        "steps_per_round": args.steps,
        "dropout": args.dropout,
        "config": config_name,
        **result,
    }
    text = json.dumps(result, indent=1)
    print(text)
    if args.output:
        pathlib.Path(args.output).write_text(text + "\n")
    return result


if __name__ == "__main__":
    main()
