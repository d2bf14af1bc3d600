"""Ray job entrypoint for `pipeline encode` (thin: parse, call the library).

    ray job submit --working-dir . -- python jobs/encode.py --config jobs/configs/<cfg>.yaml [key=value ...]
"""

import sys

from pipeline.cli import main

if __name__ == "__main__":
    sys.exit(main(["encode", *sys.argv[1:]]))
