"""Ray job entrypoint for `pipeline train`: Ray Train bi-encoder training (DPR, DAR, RCL, ARR, ...).

    ray job submit --working-dir . -- python jobs/train.py --config jobs/configs/dar.yaml train.storage_path=/shared/train train.num_workers=4 train.use_gpu=true
    python jobs/train.py --smoke-test [--out DIR] [key=value ...]     # tiny model + bundled FAQ, ~1 min on CPU

Arguments are `pipeline train`'s (see `pipeline train --help`); jobs/smoke.py holds the smoke test.
"""

import sys

from smoke import run, smoke_train

if __name__ == "__main__":
    sys.exit(run("train", smoke=smoke_train))
