"""Distributed training on each backend's own engine, behind one switch.

`get_distribution` (``--distribute data|model`` of ``keras-transformer
train``) puts the Transformer on:

- JAX: `keras.distribution.DataParallel`, or `keras.distribution.
  ModelParallel` with `layout_map`, which shards the attention,
  feed-forward and embedding weights over the ``model`` axis of a
  ``(batch, model)`` device mesh. Several hosts join through
  `keras.distribution.initialize` (``KERAS_DISTRIBUTION_*`` variables).
- TensorFlow: `tf.distribute.MirroredStrategy`, or
  `tf.distribute.MultiWorkerMirroredStrategy` when ``TF_CONFIG`` names
  several workers.
- PyTorch: `torch.distributed` in processes started by ``torchrun``:
  weights are broadcast from rank 0 and every gradient is all-reduced
  (averaged) as soon as backward has accumulated it, what
  `DistributedDataParallel` does, but under Keras' own ``model.fit``.

The global batch is the same on any number of devices: the pipeline
makes each batch size a multiple of `Distribution.num_replicas` within
the same token budget (``batch_multiple``) and every process reads its
own rows of each global batch (`Distribution.shard_dataset`), so one
optimizer step is one global batch and the schedule's step counts hold.
On TensorFlow and PyTorch each replica computes its loss on its rows;
`Distribution.wrap_loss` divides it by the real tokens of the whole
global batch, so the gradients are those of one device (JAX computes the
global batch in one program and needs no such care).
"""

import contextlib
import logging
import math
import os
import sys
import weakref

import keras
import numpy as np

logger = logging.getLogger(__name__)

MODES = ("data", "model")
# How long a process waits for the others of a run to join before it
# stops, in seconds (JAX's own limit is 300 s).
JOIN_TIMEOUT_VARIABLE = "KERAS_TRANSFORMER_JOIN_TIMEOUT"
DEFAULT_JOIN_TIMEOUT = 240

# Weight paths (regular expressions that `LayoutMap` matches against the
# whole `Variable.path`) and their
# sharding over the device mesh's ("batch", "model") axes. EinsumDense
# kernels of attention are (hidden_dim, heads, head_dim) for query, key and
# value and (heads, head_dim, hidden_dim) for the output: heads are split
# over "model" (Megatron-style). Feed-forward: the intermediate dimension.
# Embeddings (vocabulary, hidden_dim): the hidden dimension, which the
# number of heads always divides (the vocabulary need not).
LAYOUTS = {
    r".*attention/(query|key|value)/kernel": (None, "model", None),
    r".*attention/(query|key|value)/bias": ("model", None),
    r".*attention/attention_output/kernel": ("model", None, None),
    r".*feed_forward/intermediate_dense/kernel": (None, "model"),
    r".*feed_forward/intermediate_dense/bias": ("model",),
    r".*feed_forward/output_dense/kernel": ("model", None),
    r".*token_embedding/embeddings": (None, "model"),
    r".*output_projection/kernel": ("model", None),
}


def layout_map(device_mesh):
    """The `keras.distribution.LayoutMap` of `LAYOUTS` on ``device_mesh``
    (whose axes are ``("batch", "model")``); other weights (layer norms,
    biases of the outputs) are replicated."""
    layouts = keras.distribution.LayoutMap(device_mesh)
    for pattern, axes in LAYOUTS.items():
        layouts[pattern] = axes
    return layouts


class Distribution:
    """One backend's distribution engine, as `get_distribution` sets it up.

    Attributes:
        mode: ``"data"`` or ``"model"``.
        backend: the Keras backend.
        num_replicas: data-parallel replicas in all (batch sizes must be
            multiples of it: the pipeline's ``batch_multiple``).
        num_processes, process_index: the processes taking part (hosts,
            workers or ``torchrun`` ranks) and this one's index.
        engine: the backend object (a `keras.distribution.Distribution`,
            a `tf.distribute.Strategy`, or None on torch).
        data_slices: the parts each global batch is cut into, one per
            process unless the processes share a part (JAX
            ``distribute='model'``, whose devices of one batch index
            span several processes), and ``data_slice``, this
            process's.
    """

    def __init__(
        self,
        mode,
        num_replicas,
        num_processes=1,
        process_index=0,
        engine=None,
        data_slices=None,
        data_slice=None,
    ):
        self.mode = mode
        self.backend = keras.backend.backend()
        self.num_replicas = int(num_replicas)
        self.num_processes = int(num_processes)
        self.process_index = int(process_index)
        self.engine = engine
        self.data_slices = int(
            num_processes if data_slices is None else data_slices
        )
        self.data_slice = int(
            process_index if data_slice is None else data_slice
        )

    @property
    def is_chief(self):
        """Whether this process writes the run's files."""
        return self.process_index == 0

    def __repr__(self):
        return (
            f"Distribution(mode={self.mode!r}, backend={self.backend!r}, "
            f"num_replicas={self.num_replicas}, "
            f"num_processes={self.num_processes})"
        )

    def scope(self):
        """Create and compile the model inside this scope: its weights and
        optimizer variables are made on the engine's devices (sharded by
        `layout_map`, or mirrored)."""
        if self.engine is None:
            return contextlib.nullcontext()
        return self.engine.scope()

    def shard_dataset(self, dataset):
        """This process's rows of each global batch of a tf.data dataset of
        ``(inputs, labels, sample_weight)`` (all of it in one process)."""
        if self.data_slices == 1:
            return dataset
        import tensorflow as tf

        processes, index = self.data_slices, self.data_slice

        def rows(x):
            size = tf.shape(x)[0] // processes
            return x[index * size : (index + 1) * size]

        dataset = dataset.map(lambda *batch: tf.nest.map_structure(rows, batch))
        if self.backend == "tensorflow":
            # The rows are this worker's already: no further sharding.
            options = tf.data.Options()
            options.experimental_distribute.auto_shard_policy = (
                tf.data.experimental.AutoShardPolicy.OFF
            )
            dataset = dataset.with_options(options)
        return dataset

    def fit_input(self, dataset):
        """What `fit` reads for a dataset of this process's rows
        (`shard_dataset`): on TensorFlow with several workers, the rows go
        to this worker's replicas as they are, without the split of each
        worker's batch into one per replica of all workers that `fit`
        would apply to a `tf.data.Dataset`; the dataset itself elsewhere."""
        if self.backend != "tensorflow" or self.num_processes == 1:
            return dataset
        return self.engine.distribute_datasets_from_function(
            lambda context: dataset
        )

    def wrap_loss(self, loss):
        """``loss`` averaged over the real tokens of the global batch, not
        of each replica's rows (TensorFlow and PyTorch); as is on JAX."""
        if self.backend == "jax" or self.num_replicas == 1:
            return loss
        return GlobalTokenMean(loss, self)

    def prepare(self, model):
        """After `compile`: on torch, copies rank 0's weights to every rank,
        all-reduces each gradient during backward, and makes the logged
        loss and metrics those of the global batch (`global_metrics`)."""
        if self.backend != "torch" or self.num_processes == 1:
            return model
        import torch
        import torch.distributed as dist

        world = float(self.num_processes)
        with torch.no_grad():
            for variable in model.variables:
                value = variable.value
                if isinstance(value, torch.Tensor):
                    dist.broadcast(value.data, src=0)

        def all_reduce(parameter):
            dist.all_reduce(parameter.grad)
            parameter.grad.div_(world)

        for variable in model.trainable_variables:
            if not getattr(variable, "_kt_all_reduce", False):
                variable.value.register_post_accumulate_grad_hook(all_reduce)
                variable._kt_all_reduce = True
        model.get_metrics_result = global_metrics(model)
        return model

    def all_reduce_sum(self, value):
        """Sums a (non-differentiated) tensor over all replicas."""
        if self.backend == "tensorflow":
            import tensorflow as tf

            context = tf.distribute.get_replica_context()
            if context is None or context.num_replicas_in_sync == 1:
                return value
            return context.all_reduce(tf.distribute.ReduceOp.SUM, value)
        if self.backend == "torch" and self.num_processes > 1:
            import torch.distributed as dist

            value = value.detach().clone()
            dist.all_reduce(value)
            return value
        return value

    def stop_together(self):
        """A callback, placed after those that may stop training (a time
        limit), that stops every process at the same step when any one
        stops: a process left waiting for the others' gradients would
        hang."""
        return _StopTogether(self)

    def any_process(self, flag):
        """Whether ``flag`` is true in any process."""
        if self.num_processes == 1:
            return bool(flag)
        if self.backend == "torch":
            import torch
            import torch.distributed as dist

            value = torch.tensor([float(flag)])
            if dist.get_backend() == "nccl":
                value = value.cuda()
            dist.all_reduce(value, op=dist.ReduceOp.MAX)
            return bool(value.item() > 0)
        if self.backend == "jax":
            from jax.experimental import multihost_utils

            flags = multihost_utils.process_allgather(np.array([flag]))
            return bool(np.any(flags))
        import tensorflow as tf

        per_replica = self.engine.run(lambda: tf.constant(float(flag)))
        total = self.engine.reduce(
            tf.distribute.ReduceOp.SUM, per_replica, axis=None
        )
        return bool(total.numpy() > 0)

    def all_equal(self, value):
        """Whether the integer ``value`` is the same in every process."""
        if self.num_processes == 1:
            return True
        # Over n values, n * sum(v^2) == sum(v)^2 only if all are equal.
        sums = self._sum_over_processes([1.0, value, value * value])
        count, total, squares = (float(x) for x in sums)
        return count * squares == total * total

    def _sum_over_processes(self, values):
        """``values`` (floats) summed over the processes (over the
        replicas on TensorFlow, where each holds its process's)."""
        values = np.asarray(values, "float64")
        if self.backend == "torch":
            import torch
            import torch.distributed as dist

            tensor = torch.tensor(values)
            if dist.get_backend() == "nccl":
                tensor = tensor.cuda()
            dist.all_reduce(tensor)
            return tensor.cpu().numpy()
        if self.backend == "jax":
            from jax.experimental import multihost_utils

            return np.sum(multihost_utils.process_allgather(values), axis=0)
        import tensorflow as tf

        per_replica = self.engine.run(lambda: tf.constant(values))
        total = self.engine.reduce(
            tf.distribute.ReduceOp.SUM, per_replica, axis=None
        )
        return total.numpy()

    def barrier(self):
        """Waits until every process gets here."""
        if self.num_processes == 1:
            return
        if self.backend == "torch":
            import torch.distributed as dist

            dist.barrier()
        elif self.backend == "jax":
            from jax.experimental import multihost_utils

            multihost_utils.sync_global_devices("keras_transformer")
        else:
            import tensorflow as tf

            self.engine.run(
                lambda: tf.distribute.get_replica_context().all_reduce(
                    tf.distribute.ReduceOp.SUM, tf.constant(1.0)
                )
            )


def whole_copy(model, optimizer=False):
    """``model`` itself, or, where its weights are split over the devices
    of several processes (JAX ``distribute='model'`` across hosts), a
    copy of it on this process's default device holding them whole,
    with a copy of its optimizer's state when ``optimizer`` is True:
    what saving, averaging and translating work on. JAX fetches no part
    of an array that another process holds.

    Every process of such a run must call it at the same point, as it
    gathers the parts from all of them. The copy is made once per model
    and refilled on each call.
    """
    if not _split_over_processes(model):
        return model
    from jax.experimental import multihost_utils

    with on_this_process():
        copy = _WHOLE_COPIES.get(model)
        if copy is None or (optimizer and copy.optimizer is None):
            copy = model.__class__.from_config(model.get_config())
            if optimizer:
                config = model.optimizer.get_config()
                copy.compile(optimizer=model.optimizer.from_config(config))
                copy.optimizer.build(copy.trainable_variables)
            _WHOLE_COPIES[model] = copy
        pairs = list(zip(model.variables, copy.variables, strict=True))
        if optimizer:
            pairs += zip(
                model.optimizer.variables,
                copy.optimizer.variables,
                strict=True,
            )
        for source, target in pairs:
            value = source.value
            if _held_elsewhere(value):
                value = multihost_utils.process_allgather(value, tiled=True)
            target.assign(np.asarray(value))
    return copy


_WHOLE_COPIES = weakref.WeakKeyDictionary()


def _split_over_processes(model):
    """Whether some weight of ``model`` has parts on other processes."""
    if keras.backend.backend() != "jax":
        return False
    import jax

    if jax.process_count() == 1:
        return False
    return any(_held_elsewhere(v.value) for v in model.variables)


def _held_elsewhere(value):
    """Whether parts of a JAX array live only on other processes."""
    return not (value.is_fully_addressable or value.is_fully_replicated)


@contextlib.contextmanager
def on_this_process():
    """Variables made within it live on this process's default device,
    outside Keras's global distribution (`keras.distribution.
    set_distribution`), which is put back on leaving."""
    engine = keras.distribution.distribution()
    keras.distribution.set_distribution(None)
    try:
        yield
    finally:
        keras.distribution.set_distribution(engine)


def global_metrics(model):
    """A `get_metrics_result` for ``model`` on torch ranks that reads each
    metric over every rank's rows, as one process reads it over the whole
    batch.

    Every metric here keeps sums (of values and of weights), so the
    ranks' states are summed in one all-reduce, read, and put back: each
    rank goes on accumulating its own rows. Keras reads the metrics after
    every train and test step, which every rank runs in step.
    """
    import torch
    import torch.distributed as dist

    local_result = model.get_metrics_result

    def result():
        variables = [v for metric in model.metrics for v in metric.variables]
        if not variables:
            return local_result()
        saved = [v.value.detach().clone() for v in variables]
        summed = torch.cat([s.reshape(-1).double() for s in saved])
        dist.all_reduce(summed)
        offset = 0
        for variable, value in zip(variables, saved, strict=True):
            part = summed[offset : offset + value.numel()]
            variable.assign(part.reshape(value.shape).to(value.dtype))
            offset += value.numel()
        try:
            return local_result()
        finally:
            for variable, value in zip(variables, saved, strict=True):
                variable.assign(value)

    return result


class _StopTogether(keras.callbacks.Callback):
    def __init__(self, distribution):
        super().__init__()
        self.distribution = distribution

    def on_train_batch_end(self, batch, logs=None):
        if self.distribution.any_process(self.model.stop_training):
            self.model.stop_training = True


class GlobalTokenMean(keras.losses.Loss):
    """A padding-aware loss averaged over the real tokens of the global
    batch: each replica returns ``sum(weights * loss) / global_tokens``
    (times the replica count on torch, whose gradients are averaged), so
    that the summed (TensorFlow) or averaged (torch) gradients equal one
    device's on the whole batch, however the real tokens fall on replicas.
    """

    def __init__(self, loss, distribution):
        super().__init__(name=loss.name, reduction="sum")
        self.loss = loss
        self.distribution = distribution

    def __call__(self, y_true, y_pred, sample_weight=None):
        from keras import ops

        weights = ops.ones(ops.shape(y_true), "float32")
        if sample_weight is not None:
            weights = weights * ops.cast(sample_weight, "float32")
        pad_id = getattr(self.loss, "pad_id", None)
        if pad_id is not None:
            weights = weights * ops.cast(
                ops.not_equal(y_true, pad_id), "float32"
            )
        values = ops.cast(self.loss.call(y_true, y_pred), "float32")
        local = ops.sum(values * weights)
        tokens = self.distribution.all_reduce_sum(ops.sum(weights))
        loss = local / ops.maximum(tokens, 1.0)
        if self.distribution.backend == "torch":
            loss = loss * float(self.distribution.num_processes)
        return loss

    def call(self, y_true, y_pred):
        return self.loss.call(y_true, y_pred)


def join_timeout():
    """Seconds a process waits for the others to join: the
    ``KERAS_TRANSFORMER_JOIN_TIMEOUT`` variable, else 240."""
    value = os.environ.get(JOIN_TIMEOUT_VARIABLE, "").strip()
    if not value:
        return DEFAULT_JOIN_TIMEOUT
    try:
        seconds = float(value)
    except ValueError:
        seconds = math.nan
    if not math.isfinite(seconds) or seconds <= 0:
        raise ValueError(
            f"{JOIN_TIMEOUT_VARIABLE}={value!r} must be a positive number "
            f"of seconds (default {DEFAULT_JOIN_TIMEOUT})."
        )
    return seconds


# Run in a process of its own: TensorFlow waits for the other workers
# inside a call that holds Python's lock, where no thread of the waiting
# process would run. It stops the waiting process (its parent, while it
# still is) after the timeout, with the message.
_WATCHDOG = """
import os, signal, sys, time
parent, seconds, message = int(sys.argv[1]), float(sys.argv[2]), sys.argv[3]
time.sleep(seconds)
if os.getppid() == parent:
    sys.stderr.write(message + "\\n")
    sys.stderr.flush()
    os.kill(parent, signal.SIGKILL)
"""


@contextlib.contextmanager
def _joining(index, count, where, how):
    """Stops the process with one line on stderr when the processes of
    the run have not all joined within `join_timeout`: the engines would
    wait forever (TensorFlow), abort with a trace (JAX) or wait half an
    hour (torch). ``how(i)`` says how process ``i`` is started."""
    import subprocess

    timeout = join_timeout()
    others = [i for i in range(count) if i != index]
    missing = (
        f"process {others[0]}"
        if len(others) == 1
        else f"one of processes {', '.join(map(str, others))}"
    )
    message = (
        f"Process {index} of {count} waited {timeout:g} s at {where} for "
        f"{missing}, which did not join: start it ({how(others[0])}"
        f"{' and so on' if len(others) > 1 else ''}), or wait longer with "
        f"{JOIN_TIMEOUT_VARIABLE}=SECONDS."
    )
    watchdog = subprocess.Popen(
        [sys.executable, "-c", _WATCHDOG, str(os.getpid()), str(timeout)]
        + [message],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
    )
    try:
        yield
    finally:
        watchdog.kill()
        watchdog.wait()


def _check_mode(mode):
    if mode not in MODES:
        raise ValueError(
            f"distribute={mode!r} is not a distribution mode; choose one of "
            f"{list(MODES)} (or None for one device)."
        )


def _model_axis_size(num_devices, model_parallel, divides):
    if model_parallel is None:
        model_parallel = math.gcd(num_devices, *[int(d) for d in divides])
    if num_devices % model_parallel:
        raise ValueError(
            f"model_parallel={model_parallel} must divide the {num_devices} "
            "devices. Pick a divisor of the device count."
        )
    for size in divides:
        if int(size) % model_parallel:
            raise ValueError(
                f"model_parallel={model_parallel} must divide the sharded "
                f"sizes {list(divides)} (heads, hidden, feed-forward); "
                f"{size} is not a multiple. Pick a common divisor."
            )
    return model_parallel


def _jax(mode, model_parallel, divides):
    import jax

    count = int(os.environ.get("KERAS_DISTRIBUTION_NUM_PROCESSES", "1"))
    if count > 1:
        addresses = os.environ.get("KERAS_DISTRIBUTION_JOB_ADDRESSES", "")
        with _joining(
            int(os.environ.get("KERAS_DISTRIBUTION_PROCESS_ID", "0")),
            count,
            addresses.split(",")[0] or "the coordinator",
            lambda i: f"the command with KERAS_DISTRIBUTION_PROCESS_ID={i}",
        ):
            # Reads KERAS_DISTRIBUTION_JOB_ADDRESSES and _PROCESS_ID too.
            keras.distribution.initialize()
    devices = keras.distribution.list_devices()
    # Each process reads its own rows of every global batch
    # (`Distribution.shard_dataset`), so Keras is not to shard the
    # dataset again; it assembles the global batch from the processes'
    # rows.
    if mode == "data":
        engine = keras.distribution.DataParallel(
            devices=devices, auto_shard_dataset=False
        )
        replicas = len(devices)
    else:
        model = _model_axis_size(len(devices), model_parallel, divides)
        mesh = keras.distribution.DeviceMesh(
            shape=(len(devices) // model, model),
            axis_names=("batch", "model"),
            devices=devices,
        )
        engine = keras.distribution.ModelParallel(
            layout_map=layout_map(mesh),
            batch_dim_name="batch",
            auto_shard_dataset=False,
        )
        replicas = len(devices) // model
    # Global, not only in `scope`: `fit` lays out each batch with it.
    keras.distribution.set_distribution(engine)
    grid = np.array(jax.devices()).reshape(replicas, -1)
    return Distribution(
        mode,
        replicas,
        jax.process_count(),
        jax.process_index(),
        engine,
        *_data_slices(grid, jax.process_index()),
    )


def _data_slices(grid, process):
    """How many parts of each global batch the processes read, and which
    part ``process`` reads, on a ``(batch, model)`` grid of JAX devices:
    a process reads the rows of the batch indices its devices hold (all
    of them when one batch index spans every process)."""
    rows = [
        b
        for b in range(grid.shape[0])
        if any(device.process_index == process for device in grid[b])
    ]
    if rows != list(range(rows[0], rows[0] + len(rows))) or (
        grid.shape[0] % len(rows)
    ):
        raise ValueError(
            f"Process {process} holds batch indices {rows} of the "
            f"{grid.shape[0]} of the device mesh: each process must hold "
            "an equal run of them. Give every process the same number of "
            "devices."
        )
    return grid.shape[0] // len(rows), rows[0] // len(rows)


def _tensorflow(mode):
    import json

    import tensorflow as tf

    if mode == "model":
        raise ValueError(
            "distribute='model' (model parallel) is available on the JAX "
            "backend only (keras.distribution.ModelParallel). Use "
            "KERAS_BACKEND=jax, or distribute='data' on TensorFlow."
        )
    config = json.loads(os.environ.get("TF_CONFIG", "{}"))
    cluster, task = config.get("cluster", {}), config.get("task", {})
    hosts = cluster.get("chief", []) + cluster.get("worker", [])
    workers = len(hosts)
    if workers > 1:
        # The chief, when the cluster names one, is process 0.
        index = int(task.get("index", 0))
        if task.get("type") == "worker" and "chief" in cluster:
            index += 1
        with _joining(
            index,
            workers,
            ", ".join(hosts),
            lambda i: f"the same command with the TF_CONFIG of process {i}",
        ):
            strategy = _multi_worker_strategy()
        return Distribution(
            mode, strategy.num_replicas_in_sync, workers, index, strategy
        )
    devices = [d.name for d in tf.config.list_logical_devices("GPU")]
    if not devices:
        devices = [d.name for d in tf.config.list_logical_devices("CPU")]
    strategy = tf.distribute.MirroredStrategy(devices)
    return Distribution(mode, strategy.num_replicas_in_sync, 1, 0, strategy)


def _multi_worker_strategy():
    """`tf.distribute.MultiWorkerMirroredStrategy` whose `reduce` takes
    what Keras's `fit` gives it on several workers: a nested structure (the
    first batch, a tuple holding a dict of inputs, reduced to learn its
    shapes), which `MirroredStrategy`'s `reduce` takes and this strategy's
    cannot convert; and scalar metrics reduced over ``axis=0``, which for
    a scalar is the mean over the replicas alone."""
    import tensorflow as tf

    class Strategy(tf.distribute.MultiWorkerMirroredStrategy):
        def reduce(self, reduce_op, value, axis=None):
            def one(leaf):
                local = self.experimental_local_results(leaf)[0]
                scalar = getattr(local, "shape", None) == ()
                return super(Strategy, self).reduce(
                    reduce_op, leaf, None if scalar else axis
                )

            return tf.nest.map_structure(one, value)

    return Strategy()


def _torch(mode):
    import torch
    import torch.distributed as dist

    if mode == "model":
        raise ValueError(
            "distribute='model' (model parallel) is available on the JAX "
            "backend only (keras.distribution.ModelParallel). Use "
            "KERAS_BACKEND=jax, or distribute='data' on torch."
        )
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world == 1:
        logger.warning(
            "distribute='data' on torch runs one process per device: "
            "launch with `torchrun --nproc_per_node N ...`. Training on "
            "one device."
        )
        return Distribution(mode, 1)
    if not dist.is_initialized():
        if torch.cuda.is_available():
            torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
        address = (
            f"{os.environ.get('MASTER_ADDR')}:{os.environ.get('MASTER_PORT')}"
        )
        with _joining(
            int(os.environ.get("RANK", "0")),
            world,
            address,
            lambda i: f"RANK={i}, or torchrun's --node_rank",
        ):
            dist.init_process_group(
                "nccl" if torch.cuda.is_available() else "gloo"
            )
    return Distribution(
        mode, dist.get_world_size(), dist.get_world_size(), dist.get_rank()
    )


def get_distribution(mode, model_parallel=None, divides=()):
    """Sets up the backend's distribution engine on every device it sees.

    On JAX the engine also becomes Keras' global distribution
    (`keras.distribution.set_distribution`), which ``fit`` reads to lay
    out each batch; on torch, processes started by ``torchrun`` join the
    process group (gloo on CPU, NCCL on GPU).

    Args:
        mode: ``"data"`` (data parallel, every backend) or ``"model"``
            (data and model parallel, JAX only).
        model_parallel: devices on the ``model`` axis (JAX, ``"model"``);
            None: the greatest common divisor of the device count and
            ``divides``.
        divides: sizes split over the ``model`` axis, e.g. ``(num_heads,
            hidden_dim, intermediate_dim)``; each must be a multiple of
            ``model_parallel``.

    Returns:
        A `Distribution`: build, compile and fit the model in its
        `scope`; pass its ``num_replicas`` as the pipeline's
        ``batch_multiple``; `shard_dataset`, `wrap_loss` and `prepare`.
    """
    _check_mode(mode)
    backend = keras.backend.backend()
    if backend == "jax":
        return _jax(mode, model_parallel, divides)
    if backend == "tensorflow":
        return _tensorflow(mode)
    if backend == "torch":
        return _torch(mode)
    raise ValueError(
        f"No distribution engine for the {backend!r} backend; use jax, "
        "tensorflow or torch."
    )


def sharding_specs(model):
    """``{variable path: partition spec tuple}`` of a JAX model's weights,
    as the arrays are actually laid out on the devices."""
    specs = {}
    for variable in model.weights:
        sharding = variable.value.sharding
        spec = getattr(sharding, "spec", None)
        specs[variable.path] = (
            tuple(spec) + (None,) * (len(variable.shape) - len(spec))
            if spec is not None
            else (None,) * len(variable.shape)
        )
    return specs


def weights_checksum(model):
    """A float64 sum of every weight's absolute values, to compare the
    replicas of a model across processes."""
    return float(
        sum(
            np.abs(keras.ops.convert_to_numpy(w).astype("float64")).sum()
            for w in model.weights
        )
    )


__all__ = [
    "LAYOUTS",
    "MODES",
    "Distribution",
    "GlobalTokenMean",
    "get_distribution",
    "layout_map",
    "sharding_specs",
    "on_this_process",
    "weights_checksum",
    "whole_copy",
]
