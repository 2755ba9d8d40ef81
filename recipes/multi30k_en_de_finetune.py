"""Recipe `multi30k_en_de_finetune`, defined in
`keras_transformer.training.RECIPES["multi30k_en_de_finetune"]`: fine-tunes
a trained model (a translator directory, a Marian/OPUS-MT checkpoint or
hf://owner/name) on Multi30k, keeping its tokenizer.

    python recipes/multi30k_en_de_finetune.py --init MODEL [--data-dir DIR]
                         [--output DIR] [--max-steps N] [--set KEY=VALUE]

The same as `keras-transformer train --recipe multi30k_en_de_finetune ...`.
"""

import sys

from keras_transformer import cli

if __name__ == "__main__":
    sys.exit(
        cli.main(
            ["train", "--recipe", "multi30k_en_de_finetune", *sys.argv[1:]]
        )
    )
