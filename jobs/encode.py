"""Former name of jobs/encode_corpus.py (`pipeline encode`), kept for existing commands."""

import sys

from smoke import run, smoke_encode

if __name__ == "__main__":
    sys.exit(run("encode", smoke=smoke_encode))
