"""Ray job entrypoint for `pipeline retrieve`: queries -> TREC run.

    ray job submit --working-dir . -- python jobs/retrieve.py --index /shared/wiki/index --queries Q.tsv --out /shared/wiki/run.trec [--top-k 1000]
    python jobs/retrieve.py --smoke-test [--out DIR] [key=value ...]     # tiny model + bundled FAQ, ~1 min on CPU

Arguments are `pipeline retrieve`'s (see `pipeline retrieve --help`); jobs/smoke.py holds the smoke test.
"""

import sys

from smoke import run, smoke_retrieve

if __name__ == "__main__":
    sys.exit(run("retrieve", smoke=smoke_retrieve))
