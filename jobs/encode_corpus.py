"""Ray job entrypoint for `pipeline encode`: Parquet corpus -> embedding shards (Ray Data encoder actors on every node; resumable).

    ray job submit --working-dir . -- python jobs/encode_corpus.py --corpus runs/wiki --out /shared/wiki/emb [--model DIR] [--config F] [key=value ...]
    python jobs/encode_corpus.py --smoke-test [--out DIR] [key=value ...]     # tiny model + bundled FAQ, ~1 min on CPU

Arguments are `pipeline encode`'s (see `pipeline encode --help`); jobs/smoke.py holds the smoke test.
"""

import sys

from smoke import run, smoke_encode

if __name__ == "__main__":
    sys.exit(run("encode", smoke=smoke_encode))
