"""Ray job entrypoint for `pipeline evaluate`: TREC run + qrels (or DPR QA answers) -> metrics.

    ray job submit --working-dir . -- python jobs/evaluate.py --run /shared/wiki/run.trec --qrels qrels.trec --json /shared/wiki/metrics.json
    python jobs/evaluate.py --smoke-test [--out DIR] [key=value ...]     # tiny model + bundled FAQ, ~1 min on CPU

Arguments are `pipeline evaluate`'s (see `pipeline evaluate --help`); jobs/smoke.py holds the smoke test.
"""

import sys

from smoke import run, smoke_evaluate

if __name__ == "__main__":
    sys.exit(run("evaluate", smoke=smoke_evaluate))
