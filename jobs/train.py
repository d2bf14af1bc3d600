"""Ray job entrypoint for `pipeline train` (thin: parse, call the library).

    ray job submit --working-dir . -- python jobs/train.py --config jobs/configs/<cfg>.yaml [key=value ...]
"""

import sys

from pipeline.cli import main

if __name__ == "__main__":
    sys.exit(main(["train", *sys.argv[1:]]))
