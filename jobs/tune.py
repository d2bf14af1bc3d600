"""Ray job entrypoint for `pipeline tune`: Ray Tune sweep whose trials are `pipeline train` runs.

    ray job submit --working-dir . -- python jobs/tune.py --config jobs/configs/tune_dar.yaml output=/shared/tune/dar [--resume]
    python jobs/tune.py --smoke-test [--out DIR] [key=value ...]     # tiny model + bundled FAQ, ~1 min on CPU

Arguments are `pipeline tune`'s (see `pipeline tune --help`); jobs/smoke.py holds the smoke test.
"""

import sys

from smoke import run, smoke_tune

if __name__ == "__main__":
    sys.exit(run("tune", smoke=smoke_tune))
