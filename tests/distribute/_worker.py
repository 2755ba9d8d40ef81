"""The engines' side of the distribution tests, run in subprocesses whose
environment (devices, backend) is set before Keras is imported:

    python -m tests.distribute._worker jax|tensorflow|torch OUTPUT.json

Each trains the tiny model for a few steps on the same global batches
with and without the engine and writes losses, weights and shardings.
"""

import json
import os
import sys

import numpy as np

STEPS = 3
GLOBAL_BATCH = 8


def batches():
    """Global batches of 8 rows; the real tokens fall unevenly on the rows
    (and so on the replicas), and one batch ends in two empty rows as the
    pipeline pads short batches."""
    from tests.helpers import random_batch

    rng = np.random.default_rng(1)
    out = []
    for step in range(STEPS):
        inputs = random_batch(rng, batch=GLOBAL_BATCH)
        mask = inputs["decoder_padding_mask"]
        labels = (rng.integers(4, 53, size=mask.shape) * mask).astype("int32")
        if step == 1:
            for name in inputs:
                inputs[name][-2:] = 0
            labels[-2:] = 0
        out.append((inputs, labels, (labels != 0).astype("float32")))
    return out


def build(initial=None):
    import keras

    from keras_transformer.training import LabelSmoothedCrossEntropy
    from tests.helpers import tiny_model

    keras.utils.set_random_seed(0)
    # One layer each: compilation dominates these tests.
    model = tiny_model(num_encoder_layers=1, num_decoder_layers=1)
    if initial is not None:
        model.set_weights(initial)
    return model, LabelSmoothedCrossEntropy(0.1)


def compile_model(model, loss):
    import keras

    # XLA compilation of TensorFlow's train step (and torch.compile)
    # costs more than it saves in three steps.
    jit = keras.backend.backend() == "jax"
    model.compile(
        optimizer=keras.optimizers.Adam(1e-2), loss=loss, jit_compile=jit
    )


def to_list(weights):
    return [np.asarray(w, "float64").ravel().tolist() for w in weights]


def run_jax():
    import keras

    from keras_transformer import distribute

    data = batches()
    model, loss = build()
    initial = model.get_weights()
    compile_model(model, loss)
    result = {
        "devices": len(keras.distribution.list_devices()),
        "single": {
            "losses": [float(model.train_on_batch(*b)) for b in data],
            "weights": to_list(model.get_weights()),
        },
    }
    for mode in ("data", "model"):
        engine = distribute.get_distribution(mode, divides=(4, 32, 64))
        with engine.scope():
            model, loss = build(initial)
            compile_model(model, engine.wrap_loss(loss))
            losses = [float(model.train_on_batch(*b)) for b in data]
        result[mode] = {
            "num_replicas": engine.num_replicas,
            "mesh": dict(
                zip(
                    engine.engine.device_mesh.axis_names,
                    engine.engine.device_mesh.shape,
                    strict=True,
                )
            ),
            "losses": losses,
            "weights": to_list(model.get_weights()),
            "specs": {
                k: list(v) for k, v in distribute.sharding_specs(model).items()
            },
            "num_shards": {
                w.path: len({str(s.index) for s in w.value.addressable_shards})
                for w in model.weights
            },
        }
    return result


def _fit(model, dataset):
    import keras

    losses = []
    model.fit(
        dataset,
        epochs=1,
        steps_per_epoch=STEPS,
        verbose=0,
        callbacks=[
            keras.callbacks.LambdaCallback(
                on_train_batch_end=lambda b, logs: losses.append(
                    float(logs["loss"])
                )
            )
        ],
    )
    return losses


def run_tensorflow():
    import tensorflow as tf

    cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(
        cpu, [tf.config.LogicalDeviceConfiguration()] * 2
    )
    from keras_transformer import distribute

    def dataset():
        data = batches()
        return tf.data.Dataset.from_generator(
            lambda: iter(data),
            output_signature=tf.nest.map_structure(
                lambda a: tf.TensorSpec(a.shape, a.dtype), data[0]
            ),
        )

    model, loss = build()
    initial = model.get_weights()
    compile_model(model, loss)
    result = {
        "single": {
            "losses": _fit(model, dataset()),
            "weights": to_list(model.get_weights()),
        }
    }
    engine = distribute.get_distribution("data")
    with engine.scope():
        model, loss = build(initial)
        compile_model(model, engine.wrap_loss(loss))
        losses = _fit(model, engine.shard_dataset(dataset()))
    result["data"] = {
        "num_replicas": engine.num_replicas,
        "strategy": type(engine.engine).__name__,
        "variable": type(model.weights[0].value).__name__,
        "losses": losses,
        "weights": to_list(model.get_weights()),
    }
    return result


def run_torch():
    """One rank of `torchrun`, or the single process when WORLD_SIZE is
    unset; rank 0 gathers every rank's results."""
    import tensorflow as tf
    import torch
    import torch.distributed as dist

    from keras_transformer import distribute

    distributed = int(os.environ.get("WORLD_SIZE", "1")) > 1
    engine = distribute.get_distribution("data") if distributed else None
    data = batches()
    dataset = tf.data.Dataset.from_generator(
        lambda: iter(data),
        output_signature=tf.nest.map_structure(
            lambda a: tf.TensorSpec(a.shape, a.dtype), data[0]
        ),
    )
    model, loss = build()
    if engine is not None:
        # Each rank starts from different weights: prepare() must copy
        # rank 0's.
        model.set_weights(
            [w + engine.process_index for w in model.get_weights()]
        )
        dataset = engine.shard_dataset(dataset)
        loss = engine.wrap_loss(loss)
    compile_model(model, loss)
    if engine is not None:
        model.optimizer.build(model.trainable_variables)
        engine.prepare(model)
    losses = _fit(model, dataset)
    result = {
        "losses": losses,
        "rows": int(next(iter(dataset))[1].shape[0]),
        "checksum": distribute.weights_checksum(model),
        "weights": to_list(model.get_weights()),
    }
    if engine is None:
        return result
    gathered = [None] * engine.num_processes
    dist.all_gather_object(gathered, result)
    dist.barrier()
    dist.destroy_process_group()
    del torch
    return {"ranks": gathered} if engine.is_chief else None


def run_jax_recipe(output):
    """`keras-transformer train --distribute model` on Multi30k, two steps
    of a tiny model on the 8 devices."""
    import keras

    from keras_transformer import cli
    from keras_transformer.distribute import get_distribution
    from tests.conftest import MULTI30K
    from tests.helpers import (
        TINY_PARALLEL_MODEL,
        set_arguments,
        tiny_recipe_settings,
    )

    settings = tiny_recipe_settings(model=TINY_PARALLEL_MODEL)
    status = cli.main(
        [
            "train",
            "--recipe",
            "multi30k_en_de",
            "--data-dir",
            str(MULTI30K),
            "--output",
            output,
            "--max-steps",
            "2",
            "--no-evaluate",
            "--quiet",
            "--distribute",
            "model",
            *set_arguments(settings),
        ]
    )
    distribution = keras.distribution.distribution()
    return {
        "status": status,
        "distribution": type(distribution).__name__,
        "mesh": list(distribution.device_mesh.shape),
        "engine": repr(get_distribution("model", divides=(4, 32, 64))),
    }


if __name__ == "__main__":
    backend, output = sys.argv[1], sys.argv[2]
    if backend == "jax-recipe":
        result = run_jax_recipe(os.path.dirname(output))
    else:
        result = {
            "jax": run_jax,
            "tensorflow": run_tensorflow,
            "torch": run_torch,
        }[backend]()
    if result is not None:
        with open(output, "w") as f:
            json.dump(result, f)
