"""Distributed training on each backend's own engine (`keras_transformer.
distribute`), on simulated devices: 8 host devices for JAX, 2 logical
CPUs for TensorFlow's `MirroredStrategy`, 2 gloo processes under
`torchrun` for torch. Each engine runs in a subprocess whose environment
is set before Keras is imported (`tests/distribute/_worker.py`), in the CI
pass of its own backend; the others are skipped."""

import json
import os
import re
import socket
import subprocess
import sys

import keras
import numpy as np
import pytest

from keras_transformer import distribute
from keras_transformer.data.bucketing import BatchPlanner
from tests.conftest import REPO_ROOT
from tests.helpers import tiny_model

BACKEND = keras.backend.backend()
TIMEOUT = 900


def _only_on(backend):
    return pytest.mark.skipif(
        BACKEND != backend,
        reason=f"runs {backend}'s engine in a subprocess; the "
        f"KERAS_BACKEND={backend} pass of the suite covers it",
    )


def _environment(backend, **extra):
    env = dict(os.environ)
    env.update(
        KERAS_BACKEND=backend,
        PYTHONPATH=os.pathsep.join([str(REPO_ROOT), env.get("PYTHONPATH", "")]),
        TF_CPP_MIN_LOG_LEVEL="3",
        **extra,
    )
    return env


def _run(command, env, output):
    process = subprocess.run(
        command,
        cwd=REPO_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
    )
    assert process.returncode == 0, (
        process.stdout[-3000:] + process.stderr[-6000:]
    )
    with open(output) as f:
        return json.load(f)


def _worker(task, tmp_path, **env):
    """Runs `_worker.py TASK` (a backend, or ``jax-recipe``)."""
    output = tmp_path / f"{task}.json"
    return _run(
        [sys.executable, "-m", "tests.distribute._worker", task, output],
        _environment(task.split("-")[0], **env),
        output,
    )


def _assert_same_training(result, reference, rtol=1e-4, atol=1e-4):
    losses = np.asarray(result["losses"])
    weights = max(
        np.abs(np.subtract(got, want)).max()
        for got, want in zip(
            result["weights"], reference["weights"], strict=True
        )
    )
    # Shown with `pytest -s`: the measured agreement.
    print(
        f"losses {losses}, largest relative difference "
        f"{np.max(np.abs(losses / reference['losses'] - 1)):.2e}, largest "
        f"weight difference {weights:.2e}"
    )
    np.testing.assert_allclose(result["losses"], reference["losses"], rtol)
    for got, want in zip(result["weights"], reference["weights"], strict=True):
        np.testing.assert_allclose(got, want, rtol=0, atol=atol)


# --- Layouts (every backend: no devices needed) ---


def test_layout_regexes_match_every_sharded_weight_once():
    model = tiny_model(tie_output_embeddings=False)
    matched = {}
    for variable in model.weights:
        hits = [p for p in distribute.LAYOUTS if re.fullmatch(p, variable.path)]
        assert len(hits) <= 1, (variable.path, hits)
        if hits:
            axes = distribute.LAYOUTS[hits[0]]
            assert len(axes) == len(variable.shape), variable.path
            assert axes.count("model") == 1
            matched[variable.path] = axes
    # 2 encoder layers x 4 attention kernels and 3 biases, 2 decoder
    # layers x 2 attentions, feed-forward kernels and bias, embedding,
    # output projection.
    attention = [p for p in matched if "attention/" in p]
    assert len(attention) == (2 + 4) * 7
    assert len([p for p in matched if "feed_forward" in p]) == 4 * 3
    assert matched["token_embedding/embeddings"] == (None, "model")
    assert matched["output_projection/kernel"] == ("model", None)
    assert matched["decoder_layer_1/cross_attention/key/kernel"] == (
        None,
        "model",
        None,
    )
    assert matched[
        "encoder_layer_0/self_attention/attention_output/kernel"
    ] == ("model", None, None)
    # Layer norms and output biases stay replicated.
    assert not any("norm" in p for p in matched)
    assert "encoder_layer_0/feed_forward/output_dense/bias" not in matched


def test_batch_multiple_keeps_the_token_budget_and_every_pair():
    rng = np.random.default_rng(0)
    source = rng.integers(2, 40, size=500)
    target = rng.integers(2, 40, size=500)
    shapes = [(10, 10), (20, 20), (40, 40)]
    plain = BatchPlanner(source, target, shapes, max_tokens=200)
    planner = BatchPlanner(
        source, target, shapes, max_tokens=200, batch_multiple=3
    )
    assert plain.batch_sizes == [20, 10, 5]
    assert planner.batch_sizes == [18, 9, 3]
    for size, (s, t) in zip(planner.batch_sizes, shapes, strict=True):
        assert size % 3 == 0 and size * max(s, t) <= 200
    seen = np.concatenate([i for _, i in planner.batches(0, True, 0)])
    assert sorted(seen.tolist()) == list(range(500))
    with pytest.raises(ValueError, match="batch_multiple=6"):
        BatchPlanner(source, target, shapes, max_tokens=200, batch_multiple=6)


def test_unknown_mode_and_model_parallel_off_jax():
    with pytest.raises(ValueError, match="'pipeline'"):
        distribute.get_distribution("pipeline")
    if BACKEND != "jax":
        with pytest.raises(ValueError, match="JAX backend only"):
            distribute.get_distribution("model")


@pytest.mark.skipif(BACKEND == "jax", reason="model parallel runs on JAX")
def test_train_command_says_model_parallelism_is_jaxs(tmp_path, capsys):
    from keras_transformer import cli
    from tests.conftest import MULTI30K

    output = tmp_path / "run"
    status = cli.main(
        [
            "train",
            "--recipe",
            "multi30k_en_de",
            "--data-dir",
            str(MULTI30K),
            "--output",
            str(output),
            "--distribute",
            "model",
        ]
    )
    lines = capsys.readouterr().err.strip().splitlines()
    name = {"torch": "torch", "tensorflow": "TensorFlow"}[BACKEND]
    assert status == 1
    assert lines == [
        "keras-transformer train: error: distribute='model' (model "
        "parallel) is available on the JAX backend only "
        "(keras.distribution.ModelParallel). Use KERAS_BACKEND=jax, or "
        f"distribute='data' on {name}."
    ]
    assert not output.exists()


@pytest.mark.parametrize("value", ["abc", "0", "-5", "nan"])
def test_a_bad_join_timeout_is_one_line(monkeypatch, value):
    monkeypatch.setenv("KERAS_TRANSFORMER_JOIN_TIMEOUT", value)
    with pytest.raises(ValueError) as error:
        distribute.join_timeout()
    assert str(error.value) == (
        f"KERAS_TRANSFORMER_JOIN_TIMEOUT={value!r} must be a positive "
        "number of seconds (default 240)."
    )
    monkeypatch.setenv("KERAS_TRANSFORMER_JOIN_TIMEOUT", "12.5")
    assert distribute.join_timeout() == 12.5


def test_train_command_takes_distribute():
    from keras_transformer import cli

    args = cli.build_parser().parse_args(
        [
            "train",
            "--recipe",
            "multi30k_en_de",
            "--distribute",
            "model",
            "--model-parallel",
            "2",
        ]
    )
    assert (args.distribute, args.model_parallel) == ("model", 2)
    with pytest.raises(SystemExit):
        cli.build_parser().parse_args(
            ["train", "--recipe", "multi30k_en_de", "--distribute", "x"]
        )


# --- JAX: DataParallel and ModelParallel on 8 host devices ---


@pytest.fixture(scope="module")
def jax_result(tmp_path_factory):
    return _worker(
        "jax",
        tmp_path_factory.mktemp("jax"),
        XLA_FLAGS="--xla_force_host_platform_device_count=8",
    )


@_only_on("jax")
def test_jax_data_parallel_matches_one_device(jax_result):
    assert jax_result["devices"] == 8
    result = jax_result["data"]
    assert result["num_replicas"] == 8 and result["mesh"] == {"batch": 8}
    _assert_same_training(result, jax_result["single"])
    # Weights replicated on every device.
    assert all(set(s) == {None} for s in result["specs"].values())


@_only_on("jax")
def test_jax_model_parallel_matches_one_device_and_shards(jax_result):
    result = jax_result["model"]
    # 4 heads on 8 devices: a (batch 2, model 4) mesh.
    assert result["mesh"] == {"batch": 2, "model": 4}
    assert result["num_replicas"] == 2
    _assert_same_training(result, jax_result["single"])
    specs, shards = result["specs"], result["num_shards"]
    expected = {
        "encoder_layer_0/self_attention/query/kernel": [None, "model", None],
        "decoder_layer_0/cross_attention/value/bias": ["model", None],
        "decoder_layer_0/self_attention/attention_output/kernel": [
            "model",
            None,
            None,
        ],
        "encoder_layer_0/feed_forward/intermediate_dense/kernel": [
            None,
            "model",
        ],
        "decoder_layer_0/feed_forward/output_dense/kernel": ["model", None],
        "token_embedding/embeddings": [None, "model"],
        "encoder_layer_0/self_attention_norm/gamma": [None],
    }
    for path, spec in expected.items():
        assert specs[path] == spec, path
        assert shards[path] == (4 if "model" in spec else 1), path
    sharded = [p for p, s in specs.items() if "model" in s]
    assert len(sharded) == 1 + 3 * 7 + 2 * 3


# --- TensorFlow: MirroredStrategy on 2 logical CPUs ---


@_only_on("tensorflow")
def test_tensorflow_mirrored_strategy_matches_one_device(tmp_path):
    result = _worker("tensorflow", tmp_path)
    data = result["data"]
    assert data["strategy"] == "MirroredStrategy"
    assert data["num_replicas"] == 2
    assert data["variable"] == "MirroredVariable"
    _assert_same_training(data, result["single"])


# --- torch: DDP-style all-reduce in 2 gloo processes under torchrun ---


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@_only_on("torch")
def test_torchrun_two_processes_match_one_process(tmp_path):
    from tests.distribute import _worker as worker

    output = tmp_path / "torch.json"
    result = _run(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--nproc_per_node",
            "2",
            "--master_addr",
            "127.0.0.1",
            "--master_port",
            str(_free_port()),
            "tests/distribute/_worker.py",
            "torch",
            str(output),
        ],
        _environment("torch", OMP_NUM_THREADS="1"),
        output,
    )
    reference = worker.run_torch()
    ranks = result["ranks"]
    assert len(ranks) == 2
    # Each rank read half of each global batch of 8 rows.
    assert [r["rows"] for r in ranks] == [4, 4]
    assert reference["rows"] == 8
    # The ranks started from different weights; after the steps they hold
    # the same ones, those of one process on the whole batches.
    assert ranks[0]["checksum"] == ranks[1]["checksum"]
    np.testing.assert_allclose(
        ranks[0]["checksum"], reference["checksum"], rtol=1e-5
    )
    # Each rank logs the loss of the whole global batch, as one process
    # does, not that of its own rows.
    for rank in ranks:
        _assert_same_training(rank, reference)


@pytest.mark.slow
@_only_on("jax")
def test_train_command_distribute_model_on_8_devices(tmp_path):
    """The whole recipe path (tokenizer, pipeline with ``batch_multiple``,
    `run_recipe`, checkpoints, averaging, saved translator) on a
    (batch 2, model 4) mesh."""
    from tests.conftest import MULTI30K

    if not (MULTI30K / "train.en").exists():
        pytest.skip(f"Multi30k not found at {MULTI30K}")
    result = _worker(
        "jax-recipe",
        tmp_path,
        XLA_FLAGS="--xla_force_host_platform_device_count=8",
    )
    assert result["status"] == 0
    assert result["distribution"] == "ModelParallel"
    assert result["mesh"] == [2, 4]
    with open(tmp_path / "results.json") as f:
        summary = json.load(f)
    assert summary["steps"] == 2
    assert summary["recipe_settings"]["max_tokens"] == 512
    assert (tmp_path / "model.weights.h5").exists()
