"""Named configurations of the Transformer.

``base`` and ``big`` are the two models of Table 3 of the paper (the
WMT 2014 recipes of `keras_transformer.training.RECIPES` train them);
``tiny`` is small enough for unit tests and quick CPU runs.
"""

CONFIGS = {
    "tiny": {
        "num_encoder_layers": 2,
        "num_decoder_layers": 2,
        "hidden_dim": 64,
        "num_heads": 4,
        "intermediate_dim": 256,
        "dropout": 0.1,
    },
    "base": {
        "num_encoder_layers": 6,
        "num_decoder_layers": 6,
        "hidden_dim": 512,
        "num_heads": 8,
        "intermediate_dim": 2048,
        "dropout": 0.1,
    },
    "big": {
        "num_encoder_layers": 6,
        "num_decoder_layers": 6,
        "hidden_dim": 1024,
        "num_heads": 16,
        "intermediate_dim": 4096,
        "dropout": 0.3,
    },
}


def get_config(name):
    """Returns a copy of the named configuration's arguments."""
    if name not in CONFIGS:
        raise ValueError(
            f"Unknown configuration name {name!r}. Choose one of "
            f"{sorted(CONFIGS)}."
        )
    return dict(CONFIGS[name])
