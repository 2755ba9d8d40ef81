"""Several hosts, as two processes on 127.0.0.1: the README's multi-host
command of each engine against one process with the same global
batches."""

import contextlib
import csv
import json
import os
import re
import signal
import socket
import subprocess
import sys

import h5py
import keras
import numpy as np
import pytest

from tests.conftest import MULTI30K, REPO_ROOT
from tests.helpers import (
    TINY_PARALLEL_MODEL,
    set_arguments,
    tiny_recipe_settings,
)

BACKEND = keras.backend.backend()
# The line Keras prints at the end of an epoch when the output is not a
# terminal: "2/2 - 1s - 0.5s/step - learning_rate: ... - loss: ...".
EPOCH_LINE = re.compile(r"\d+/\d+ - .*loss: ")
TIMEOUT = 900
DEVICES = "--xla_force_host_platform_device_count={}"
# Two steps at a learning rate of 0.01 (no cool-down), so that the
# weights move.
SETTINGS = tiny_recipe_settings(
    warmup_steps=2,
    cooldown_steps=0,
    learning_rate_scale=0.1,
    model=TINY_PARALLEL_MODEL,
)


# `keras-transformer` in a process whose CPU TensorFlow splits into two
# logical devices (what two GPUs would be).
TWO_LOGICAL_CPUS = """
import sys
import tensorflow as tf
cpu = tf.config.list_physical_devices("CPU")[0]
tf.config.set_logical_device_configuration(
    cpu, [tf.config.LogicalDeviceConfiguration()] * 2
)
from keras_transformer import cli
sys.exit(cli.main(sys.argv[1:]))
"""


# `run_recipe`, as `keras-transformer train` calls it, with a callback that
# writes where each weight is when training begins: the processes whose
# devices hold its parts, the shape of one of this process's parts, and
# its whole shape.
SHARDINGS_REPORTED = """
import json, sys
import keras
from keras_transformer.training import run_recipe

class Report(keras.callbacks.Callback):
    def on_train_begin(self, logs=None):
        report = {
            v.path: {
                "processes": sorted(
                    {d.process_index for d in v.value.sharding.device_set}
                ),
                "part": list(v.value.addressable_shards[0].data.shape),
                "shape": list(v.shape),
            }
            for v in self.model.weights
        }
        with open(sys.argv[1], "w") as file:
            json.dump(report, file)

run_recipe(callbacks=[Report()], **json.loads(sys.argv[2]))
"""


def _train_command(
    output, start=None, distribute=True, mode="data", **settings
):
    """The README's command after ``start`` (by default
    ``python -m keras_transformer.cli``); with ``distribute=False`` and
    ``settings``, one process's."""
    if start is None:
        start = [sys.executable, "-m", "keras_transformer.cli"]
    return [
        *start,
        "train",
        "--recipe",
        "multi30k_en_de",
        "--data-dir",
        str(MULTI30K),
        "--output",
        str(output),
        "--max-steps",
        "2",
        "--no-evaluate",
        "--quiet",
        *(["--distribute", mode] if distribute else []),
        *set_arguments({**SETTINGS, **settings}),
    ]


def _environment(**extra):
    environment = dict(os.environ)
    environment.update(
        KERAS_BACKEND=BACKEND,
        PYTHONPATH=os.pathsep.join(
            [str(REPO_ROOT), environment.get("PYTHONPATH", "")]
        ),
        TF_CPP_MIN_LOG_LEVEL="3",
        **extra,
    )
    return environment


def _jax_environment(addresses, index, **extra):
    """Process ``index`` of two JAX processes at ``addresses``, with two
    simulated CPU devices each."""
    return _environment(
        XLA_FLAGS=DEVICES.format(2),
        KERAS_DISTRIBUTION_JOB_ADDRESSES=addresses,
        KERAS_DISTRIBUTION_NUM_PROCESSES="2",
        KERAS_DISTRIBUTION_PROCESS_ID=str(index),
        **extra,
    )


def _free_ports(count):
    sockets = [socket.socket() for _ in range(count)]
    for s in sockets:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in sockets]
    for s in sockets:
        s.close()
    return ports


def _run_processes(commands_and_environments):
    processes = [
        subprocess.Popen(
            command,
            cwd=REPO_ROOT,
            env=environment,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for command, environment in commands_and_environments
    ]
    outputs = [p.communicate(timeout=TIMEOUT)[0] for p in processes]
    for process, output in zip(processes, outputs, strict=True):
        assert process.returncode == 0, output[-4000:]


def _weights(directory):
    weights = {}
    with h5py.File(directory / "model.weights.h5") as file:
        file.visititems(
            lambda name, item: (
                weights.__setitem__(name, item[()])
                if isinstance(item, h5py.Dataset)
                else None
            )
        )
    return weights


def _logs(directory):
    """The logged training and validation loss and token accuracy of
    each epoch."""
    names = ("loss", "token_accuracy", "val_loss", "val_token_accuracy")
    with open(directory / "logs" / "training.csv") as file:
        return [[float(row[n]) for n in names] for row in csv.DictReader(file)]


def _assert_same_training(run, reference):
    np.testing.assert_allclose(_logs(run), _logs(reference), rtol=1e-5)
    got, want = _weights(run), _weights(reference)
    assert got.keys() == want.keys()
    largest = {}
    for name in want:
        difference = float(np.abs(got[name] - want[name]).max())
        # A key projection's bias adds one constant to every score of a
        # query, which the softmax removes (section 3.2.1): its gradient
        # is zero up to rounding, and Adam's epsilon of 1e-9 turns that
        # rounding into steps of up to the learning rate.
        bound = 2 * 0.0103 if "key_dense/vars/1" in name else 1e-4
        assert difference <= bound, (name, difference)
        largest[name] = difference
    # Shown with `pytest -s`: the measured agreement.
    others = [d for n, d in largest.items() if "key_dense/vars/1" not in n]
    print(
        f"largest weight difference {max(others):.2e}, key biases "
        f"{max(largest.values()):.2e}"
    )


@pytest.mark.slow
@pytest.mark.skipif(BACKEND != "jax", reason="JAX's multi-process engine")
def test_jax_two_processes_match_one_process(tmp_path):
    if not (MULTI30K / "train.en").exists():
        pytest.skip(f"Multi30k not found at {MULTI30K}")
    ports = _free_ports(2)
    addresses = ",".join(f"127.0.0.1:{port}" for port in ports)
    two = tmp_path / "two"
    _run_processes(
        [
            (
                _train_command(two),
                _jax_environment(addresses, index),
            )
            for index in range(2)
        ]
    )
    one = tmp_path / "one"
    _run_processes(
        [
            (
                _train_command(one),
                _environment(XLA_FLAGS=DEVICES.format(4)),
            )
        ]
    )
    # The chief writes the run directory.
    assert (two / "model.weights.h5").is_file()
    _assert_same_training(two, one)


def _torchrun(port, nodes, node_rank, processes):
    """``torchrun`` of the command for ``nodes`` hosts on 127.0.0.1, of
    ``processes`` each."""
    return [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nnodes",
        str(nodes),
        "--node_rank",
        str(node_rank),
        "--nproc_per_node",
        str(processes),
        "--master_addr",
        "127.0.0.1",
        "--master_port",
        str(port),
        "-m",
        "keras_transformer.cli",
    ]


@pytest.fixture(scope="module")
def torch_one_process(tmp_path_factory):
    """One process on the global batches of two replicas
    (``batch_multiple=2``): the reference of the torch runs."""
    if not (MULTI30K / "train.en").exists():
        pytest.skip(f"Multi30k not found at {MULTI30K}")
    one = tmp_path_factory.mktemp("torch") / "one"
    command = _train_command(one, distribute=False, batch_multiple=2)
    _run_processes([(command, _environment(OMP_NUM_THREADS="1"))])
    return one


@pytest.mark.slow
@pytest.mark.skipif(BACKEND != "torch", reason="torch.distributed")
def test_torch_two_hosts_match_one_process(tmp_path, torch_one_process):
    """``torchrun --nnodes 2 --node_rank 0|1`` on 127.0.0.1, one process
    per host, as docs/distributed.md gives it."""
    (port,) = _free_ports(1)
    two = tmp_path / "two"
    _run_processes(
        [
            (
                _train_command(two, _torchrun(port, 2, rank, 1)),
                _environment(OMP_NUM_THREADS="1"),
            )
            for rank in range(2)
        ]
    )
    assert (two / "model.weights.h5").is_file()
    # The other rank writes its own directory inside the run's, and holds
    # the same weights.
    other = _weights(two / "worker-1")
    for name, value in _weights(two).items():
        np.testing.assert_array_equal(other[name], value)
    _assert_same_training(two, torch_one_process)


@pytest.mark.slow
@pytest.mark.skipif(BACKEND != "torch", reason="torch.distributed")
def test_torch_one_host_two_processes_match_one_process(
    tmp_path, torch_one_process
):
    """``torchrun --nproc_per_node 2``: two gloo processes on one host."""
    (port,) = _free_ports(1)
    run = tmp_path / "run"
    command = _train_command(run, _torchrun(port, 1, 0, 2))
    _run_processes([(command, _environment(OMP_NUM_THREADS="1"))])
    _assert_same_training(run, torch_one_process)


@pytest.mark.slow
@pytest.mark.skipif(BACKEND != "tensorflow", reason="tf.distribute")
def test_tensorflow_two_workers_match_one_process(tmp_path):
    """Two `MultiWorkerMirroredStrategy` workers (``TF_CONFIG`` of two
    localhost ports, a CPU each) against one process whose
    `MirroredStrategy` has two logical CPUs, and that against one device
    (``batch_multiple=2``): the same global batches, started from the
    same weights."""
    if not (MULTI30K / "train.en").exists():
        pytest.skip(f"Multi30k not found at {MULTI30K}")
    workers = [f"127.0.0.1:{port}" for port in _free_ports(2)]
    two = tmp_path / "two"
    _run_processes(
        [
            (
                _train_command(two),
                _environment(
                    TF_CONFIG=json.dumps(
                        {
                            "cluster": {"worker": workers},
                            "task": {"type": "worker", "index": index},
                        }
                    )
                ),
            )
            for index in range(2)
        ]
    )
    one = tmp_path / "one"
    start = [sys.executable, "-c", TWO_LOGICAL_CPUS]
    _run_processes([(_train_command(one, start), _environment())])
    assert (two / "model.weights.h5").is_file()
    other = _weights(two / "worker-1")
    for name, value in _weights(two).items():
        np.testing.assert_array_equal(other[name], value)
    _assert_same_training(two, one)
    # And the command on one host's two logical CPUs trains as one device
    # does on the same global batches (the strategy of one device, which
    # initializes the weights as the strategy of two does).
    single = tmp_path / "single"
    command = _train_command(single, batch_multiple=2)
    _run_processes([(command, _environment())])
    _assert_same_training(one, single)


def _kill_after_first_epochs(commands_and_environments, logs):
    """Starts the commands (the processes of one run) and kills them and
    everything they started once the first has printed two epoch lines:
    by then it has saved the first epoch's training state (the processes
    step together, and each prints after saving). The others write to
    files in ``logs``. Returns the first's output."""
    processes = []
    for index, (command, environment) in enumerate(commands_and_environments):
        output = subprocess.PIPE
        if index:
            output = open(logs / f"process-{index}.log", "w")  # noqa: SIM115
        processes.append(
            subprocess.Popen(
                command,
                cwd=REPO_ROOT,
                env=environment,
                stdout=output,
                stderr=subprocess.STDOUT,
                text=True,
                start_new_session=True,
            )
        )
        if index:
            output.close()
    lines = []
    try:
        for line in processes[0].stdout:
            lines.append(line)
            if sum(bool(EPOCH_LINE.match(x)) for x in lines) >= 2:
                break
    finally:
        # torchrun starts the ranks in sessions of their own.
        for process in processes:
            for pid in [process.pid, *_descendants(process.pid)]:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            process.communicate(timeout=TIMEOUT)
    return "".join(lines)


def _descendants(pid):
    """The processes started by ``pid`` and by them, from /proc."""
    children = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            with contextlib.suppress(OSError), open(f"/proc/{entry}/stat") as f:
                stat = f.read()
                # The parent's id follows the command name in parentheses.
                parent = int(stat.rsplit(")", 1)[1].split()[1])
                children.setdefault(parent, []).append(int(entry))
    found, queue = [], [pid]
    while queue:
        for child in children.get(queue.pop(), []):
            found.append(child)
            queue.append(child)
    return found


def _two_processes(output, max_steps, **settings):
    """The README's multi-host command of this backend's engine for two
    processes on this host, as (command, environment) pairs, with each
    line printed as it comes: on JAX with ``--distribute model`` over a
    mesh that spans both processes (two devices each), so that its
    sharded weights are saved whole and restored across processes."""
    printed = {"PYTHONUNBUFFERED": "1"}

    def command(start=None, mode="data"):
        arguments = _train_command(output, start, mode=mode, **settings)
        arguments[arguments.index("--max-steps") + 1] = str(max_steps)
        arguments.remove("--quiet")
        return arguments

    if BACKEND == "torch":
        start = _torchrun(_free_ports(1)[0], 1, 0, 2)
        return [(command(start), _environment(OMP_NUM_THREADS="1", **printed))]
    if BACKEND == "jax":
        addresses = ",".join(f"127.0.0.1:{p}" for p in _free_ports(2))
        return [
            (
                command(mode="model"),
                _jax_environment(addresses, index, **printed),
            )
            for index in range(2)
        ]
    workers = [f"127.0.0.1:{port}" for port in _free_ports(2)]
    return [
        (
            command(),
            _environment(
                TF_CONFIG=json.dumps(
                    {
                        "cluster": {"worker": workers},
                        "task": {"type": "worker", "index": index},
                    }
                ),
                **printed,
            ),
        )
        for index in range(2)
    ]


@pytest.mark.slow
def test_two_processes_killed_and_resumed_end_as_uninterrupted(tmp_path):
    """A two-process run killed (SIGKILL, every process) after its first
    epoch's training state, then started again with the same command,
    ends with the weights of an uninterrupted two-process run."""
    if not (MULTI30K / "train.en").exists():
        pytest.skip(f"Multi30k not found at {MULTI30K}")
    steps = {"steps_per_epoch": 2, "checkpoint_every": 2, "average_last": 2}
    steps["max_steps"] = 6
    whole = tmp_path / "whole"
    _run_processes(_two_processes(whole, **steps))
    run = tmp_path / "run"
    output = _kill_after_first_epochs(_two_processes(run, **steps), tmp_path)
    saved = json.loads((run / "state" / "training_state.json").read_text())
    assert 1 <= saved["epoch"] < 3, output[-2000:]
    assert not (run / "model.weights.h5").exists()
    _run_processes(_two_processes(run, **steps))
    got, want = _weights(run), _weights(whole)
    assert got.keys() == want.keys()
    for name in want:
        np.testing.assert_allclose(got[name], want[name], rtol=0, atol=1e-5)
    # Shown with `pytest -s`.
    print(
        f"resumed from epoch {saved['epoch']} of 3; largest weight "
        f"difference {max(np.abs(got[n] - want[n]).max() for n in want):.2e}"
    )


def _alone(port, other_port):
    """The environment of process 0 of two whose peer never starts."""
    if BACKEND == "jax":
        return {
            "XLA_FLAGS": DEVICES.format(2),
            "KERAS_DISTRIBUTION_JOB_ADDRESSES": (
                f"127.0.0.1:{port},127.0.0.1:{other_port}"
            ),
            "KERAS_DISTRIBUTION_NUM_PROCESSES": "2",
            "KERAS_DISTRIBUTION_PROCESS_ID": "0",
        }
    if BACKEND == "tensorflow":
        workers = [f"127.0.0.1:{port}", f"127.0.0.1:{other_port}"]
        return {
            "TF_CONFIG": json.dumps(
                {
                    "cluster": {"worker": workers},
                    "task": {"type": "worker", "index": 0},
                }
            )
        }
    # The variables torchrun sets, as other launchers (srun) do.
    return {
        "RANK": "0",
        "LOCAL_RANK": "0",
        "WORLD_SIZE": "2",
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(port),
    }


@pytest.mark.slow
def test_a_process_whose_peer_never_starts_stops_in_one_line(tmp_path):
    """Process 0 of two, started alone, stops after the join timeout with
    one line naming the missing process, the timeout and the fix, instead
    of waiting forever (TensorFlow), aborting with a stack trace (JAX) or
    waiting half an hour (torch)."""
    if not (MULTI30K / "train.en").exists():
        pytest.skip(f"Multi30k not found at {MULTI30K}")
    port, other = _free_ports(2)
    output = tmp_path / "run"
    process = subprocess.run(
        _train_command(output),
        cwd=REPO_ROOT,
        env=_environment(
            KERAS_TRANSFORMER_JOIN_TIMEOUT="5", **_alone(port, other)
        ),
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
    )
    # The watchdog stops it as a kill would (exit status 137 in a shell).
    assert process.returncode == -signal.SIGKILL, process.stderr[-3000:]
    where = {
        "jax": f"127.0.0.1:{port}",
        "tensorflow": f"127.0.0.1:{port}, 127.0.0.1:{other}",
        "torch": f"127.0.0.1:{port}",
    }[BACKEND]
    how = {
        "jax": "the command with KERAS_DISTRIBUTION_PROCESS_ID=1",
        "tensorflow": "the same command with the TF_CONFIG of process 1",
        "torch": "RANK=1, or torchrun's --node_rank",
    }[BACKEND]
    assert process.stderr.strip().splitlines()[-1] == (
        f"Process 0 of 2 waited 5 s at {where} for process 1, which did "
        f"not join: start it ({how}), or wait longer with "
        "KERAS_TRANSFORMER_JOIN_TIMEOUT=SECONDS."
    )
    # Stopped before any work: nothing written.
    assert not output.exists()


def _recipe_with_shardings_reported(output, report):
    """`run_recipe` of `_train_command`'s settings with ``--distribute
    model``, writing the weights' placement to ``report``."""
    arguments = {
        "name": "multi30k_en_de",
        "data_dir": str(MULTI30K),
        "output": str(output),
        "max_steps": 2,
        "test_limit": 6,
        "verbose": 0,
        "distribute": "model",
        **SETTINGS,
    }
    return [
        sys.executable,
        "-c",
        SHARDINGS_REPORTED,
        str(report),
        json.dumps(arguments),
    ]


@pytest.mark.slow
@pytest.mark.skipif(BACKEND != "jax", reason="JAX's model parallelism")
def test_jax_model_parallel_across_two_processes_matches_one_process(
    tmp_path,
):
    """A (batch 1, model 4) mesh over two processes of two devices each:
    every sharded weight has a quarter on each device, two of them on
    each process; both processes read every row of each batch, and the
    run trains as one process on four devices does."""
    from keras_transformer.distribute import LAYOUTS

    if not (MULTI30K / "train.en").exists():
        pytest.skip(f"Multi30k not found at {MULTI30K}")
    addresses = ",".join(f"127.0.0.1:{port}" for port in _free_ports(2))
    two = tmp_path / "two"
    _run_processes(
        [
            (
                _recipe_with_shardings_reported(
                    two, tmp_path / f"shardings-{index}.json"
                ),
                _jax_environment(addresses, index),
            )
            for index in range(2)
        ]
    )
    one = tmp_path / "one"
    _run_processes(
        [
            (
                _recipe_with_shardings_reported(
                    one, tmp_path / "shardings-one.json"
                ),
                _environment(XLA_FLAGS=DEVICES.format(4)),
            )
        ]
    )
    alone = json.loads((tmp_path / "shardings-one.json").read_text())
    for index in range(2):
        report = json.loads((tmp_path / f"shardings-{index}.json").read_text())
        assert report.keys() == alone.keys()
        sharded = {
            name: axes
            for name in report
            for pattern, axes in LAYOUTS.items()
            if re.fullmatch(pattern, name)
        }
        # In each of the three attention layers: query, key and value
        # kernels and biases and the output kernel; two feed-forward
        # kernels and a bias in each of the two layers; the embeddings.
        assert len(sharded) >= 3 * 7 + 2 * 3 + 1, sorted(report)
        for name, placement in report.items():
            assert placement["processes"] == [0, 1], (name, placement)
            # The same four-way split as on one process's four devices.
            assert placement["part"] == alone[name]["part"], name
        for name, axes in sharded.items():
            expected = [
                size // 4 if axis == "model" else size
                for size, axis in zip(report[name]["shape"], axes, strict=True)
            ]
            assert report[name]["part"] == expected, (name, report[name])
    assert (two / "model.weights.h5").is_file()
    _assert_same_training(two, one)
    # Each process evaluates on its whole copy of the weights: the same
    # translations as the saved translator gives in this process.
    from keras_transformer.generation import Translator

    sources = (MULTI30K / "test.en").read_text().splitlines()[:6]
    expected = Translator.from_pretrained(two).translate(sources)
    for directory in (two, two / "worker-1"):
        translations = (directory / "test_translations.txt").read_text()
        assert translations.splitlines() == expected, directory
