"""Recipe `wmt14_en_de_big`, defined in
`keras_transformer.training.RECIPES["wmt14_en_de_big"]`.

    python recipes/wmt14_en_de_big.py [--data-dir DIR] [--output DIR]
                         [--max-minutes M] [--max-steps N] [--set KEY=VALUE]
                         [--distribute data|model]

The same as `keras-transformer train --recipe wmt14_en_de_big ...`.
"""

import sys

from keras_transformer import cli

if __name__ == "__main__":
    sys.exit(cli.main(["train", "--recipe", "wmt14_en_de_big", *sys.argv[1:]]))
