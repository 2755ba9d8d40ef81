"""The paper's training recipe (section 5) for `model.fit`."""

from keras_transformer.training.checkpoints import (
    KeepLastCheckpoints,
    ResumableCheckpoint,
    average_checkpoints,
    fit_resumable,
    list_checkpoints,
    restore_training_state,
)
from keras_transformer.training.losses import LabelSmoothedCrossEntropy
from keras_transformer.training.metrics import MaskedAccuracy, Perplexity
from keras_transformer.training.optimizers import Adam
from keras_transformer.training.schedule import (
    TransformerSchedule,
    fit_schedule,
    transformer_optimizer,
)

__all__ = [
    "Adam",
    "KeepLastCheckpoints",
    "LabelSmoothedCrossEntropy",
    "MaskedAccuracy",
    "Perplexity",
    "ResumableCheckpoint",
    "TransformerSchedule",
    "average_checkpoints",
    "fit_resumable",
    "fit_schedule",
    "list_checkpoints",
    "restore_training_state",
    "transformer_optimizer",
]

from keras_transformer.training.callbacks import BleuCallback, TimeLimit
from keras_transformer.training.recipes import (
    RECIPES,
    Recipe,
    RunSummary,
    get_recipe,
    run_recipe,
)
from keras_transformer.training.run_directory import RunInterrupted

__all__ += [
    "RECIPES",
    "BleuCallback",
    "Recipe",
    "RunInterrupted",
    "RunSummary",
    "TimeLimit",
    "get_recipe",
    "run_recipe",
]
