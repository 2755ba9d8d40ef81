"""The names of the training recipes, without importing Keras.

`keras_transformer.training.recipes.RECIPES` defines the recipes; the
command line offers their names as ``--recipe`` choices from here, so
that ``keras-transformer --help`` runs without importing Keras or a
backend. tests/test_cli_quiet.py checks that both lists agree.
"""

RECIPE_NAMES = (
    "multi30k_en_de",
    "multi30k_en_de_finetune",
    "wmt14_en_de_base",
    "wmt14_en_de_big",
)
