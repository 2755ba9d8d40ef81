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
from tests.helpers import set_arguments

BACKEND = keras.backend.backend()
# The line Keras prints at the end of an epoch when the output is not a
# terminal: "2/2 - 1s - 0.5s/step - learning_rate: ... - loss: ...".
EPOCH_LINE = re.compile(r"\d+/\d+ - .*loss: ")
TIMEOUT = 900
MODEL = {
    "num_encoder_layers": 1,
    "num_decoder_layers": 1,
    "hidden_dim": 32,
    "num_heads": 4,
    "intermediate_dim": 64,
    "dropout": 0.0,
}
# Two steps at a learning rate of 0.01 (no cool-down), so that the
# weights move.
SETTINGS = {
    "steps_per_epoch": 2,
    "checkpoint_every": 1,
    "average_last": 2,
    "vocabulary_size": 600,
    "max_tokens": 512,
    "bleu_subset": 0,
    "warmup_steps": 2,
    "cooldown_steps": 0,
    "learning_rate_scale": 0.1,
    "model": MODEL,
}


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
                _environment(
                    XLA_FLAGS="--xla_force_host_platform_device_count=2",
                    KERAS_DISTRIBUTION_JOB_ADDRESSES=addresses,
                    KERAS_DISTRIBUTION_NUM_PROCESSES="2",
                    KERAS_DISTRIBUTION_PROCESS_ID=str(index),
                ),
            )
            for index in range(2)
        ]
    )
    one = tmp_path / "one"
    _run_processes(
        [
            (
                _train_command(one),
                _environment(
                    XLA_FLAGS="--xla_force_host_platform_device_count=4"
                ),
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
    `MirroredStrategy` has two logical CPUs: the same global batches on
    two replicas, started from the same weights."""
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


def _kill_after_first_epochs(command, environment):
    """Starts ``command`` (both ranks under one ``torchrun``) and kills it
    and everything it started once two epoch lines are printed: by then
    the first process has saved the first epoch's training state (the
    ranks step together, and each prints after saving)."""
    process = subprocess.Popen(
        command,
        cwd=REPO_ROOT,
        env=environment,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    lines = []
    try:
        for line in process.stdout:
            lines.append(line)
            if sum(bool(EPOCH_LINE.match(x)) for x in lines) >= 2:
                break
    finally:
        # torchrun starts the ranks in sessions of their own.
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


@pytest.mark.slow
@pytest.mark.skipif(BACKEND != "torch", reason="torch.distributed")
def test_torch_two_processes_killed_and_resumed_end_as_uninterrupted(
    tmp_path,
):
    if not (MULTI30K / "train.en").exists():
        pytest.skip(f"Multi30k not found at {MULTI30K}")
    # Each line as it is printed.
    environment = _environment(OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    steps = {"steps_per_epoch": 2, "checkpoint_every": 2, "average_last": 2}

    def command(output, port):
        arguments = _train_command(output, _torchrun(port, 1, 0, 2), **steps)
        arguments[arguments.index("--max-steps") + 1] = "6"
        arguments.remove("--quiet")
        return arguments

    whole = tmp_path / "whole"
    _run_processes([(command(whole, _free_ports(1)[0]), environment)])
    run = tmp_path / "run"
    output = _kill_after_first_epochs(
        command(run, _free_ports(1)[0]), environment
    )
    saved = json.loads((run / "state" / "training_state.json").read_text())
    assert 1 <= saved["epoch"] < 3, output[-2000:]
    assert not (run / "model.weights.h5").exists()
    _run_processes([(command(run, _free_ports(1)[0]), environment)])
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
            "XLA_FLAGS": "--xla_force_host_platform_device_count=2",
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


@pytest.mark.slow
@pytest.mark.skipif(BACKEND != "jax", reason="JAX's multi-process engine")
def test_jax_model_parallel_across_processes_is_refused_in_one_line(
    tmp_path,
):
    """``--distribute model`` spans one process's devices: across two, the
    sharded weights could not be saved, so both processes stop before any
    work, with one line."""
    if not (MULTI30K / "train.en").exists():
        pytest.skip(f"Multi30k not found at {MULTI30K}")
    addresses = ",".join(f"127.0.0.1:{port}" for port in _free_ports(2))
    output = tmp_path / "run"
    processes = [
        subprocess.Popen(
            _train_command(output, mode="model"),
            cwd=REPO_ROOT,
            env=_environment(
                XLA_FLAGS="--xla_force_host_platform_device_count=2",
                KERAS_DISTRIBUTION_JOB_ADDRESSES=addresses,
                KERAS_DISTRIBUTION_NUM_PROCESSES="2",
                KERAS_DISTRIBUTION_PROCESS_ID=str(index),
            ),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        for index in range(2)
    ]
    for process in processes:
        errors = process.communicate(timeout=TIMEOUT)[1]
        assert process.returncode == 1, errors[-3000:]
        assert errors.strip().splitlines()[-1] == (
            "keras-transformer train: error: distribute='model' runs on the "
            "devices of one process here: across several processes its "
            "checkpoints would need the weights sharded on the other "
            "processes' devices, which are not gathered yet. Use "
            "distribute='data' across processes, or 'model' on one host's "
            "devices."
        )
    assert not output.exists()
