"""Ray job entrypoint for `pipeline index`: embedding shards -> FAISS index.

    ray job submit --working-dir . -- python jobs/build_index.py --embeddings /shared/wiki/emb --out /shared/wiki/index [--factory "IVF65536,PQ64"] [key=value ...]
    python jobs/build_index.py --smoke-test [--out DIR] [key=value ...]     # tiny model + bundled FAQ, ~1 min on CPU

Arguments are `pipeline index`'s (see `pipeline index --help`); jobs/smoke.py holds the smoke test.
"""

import sys

from smoke import run, smoke_index

if __name__ == "__main__":
    sys.exit(run("index", smoke=smoke_index))
