"""Recipe `wmt14_en_de_base`, defined in
`keras_transformer.training.RECIPES["wmt14_en_de_base"]`.

    python recipes/wmt14_en_de_base.py [--data-dir DIR] [--output DIR]
                         [--max-minutes M] [--max-steps N] [--set KEY=VALUE]
                         [--distribute data|model]

The same as `keras-transformer train --recipe wmt14_en_de_base ...`.
"""

import sys

from keras_transformer import cli

if __name__ == "__main__":
    sys.exit(cli.main(["train", "--recipe", "wmt14_en_de_base", *sys.argv[1:]]))
