"""Recipe `multi30k_en_de`, defined in
`keras_transformer.training.RECIPES["multi30k_en_de"]`.

    python recipes/multi30k_en_de.py [--data-dir DIR] [--output DIR]
                         [--max-minutes M] [--max-steps N] [--set KEY=VALUE]
                         [--distribute data|model]

The same as `keras-transformer train --recipe multi30k_en_de ...`.
"""

import sys

from keras_transformer import cli

if __name__ == "__main__":
    sys.exit(cli.main(["train", "--recipe", "multi30k_en_de", *sys.argv[1:]]))
