#!/usr/bin/env bash
# The GPU check (scripts/gpu_check.py): one command on the first lent GPU machine (torch, transformers and
# sentence-transformers there; no Ray, no faiss), under 8 minutes; `--device cpu` runs the same code path small
# (CI does, to keep it working). Nothing is downloaded: every model is built from a config.
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-}"
if [ -z "$PY" ]; then
  if [ -x .venv/bin/python ]; then PY=.venv/bin/python; else PY=python3; fi
fi
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 HF_DATASETS_OFFLINE=1
exec "$PY" scripts/gpu_check.py "$@"
