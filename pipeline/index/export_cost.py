"""When a model's OpenVINO conversion pays back its cost on a CPU: the counts of passages from which
validation inside training (index/validate.py) and `pipeline encode` (index/encode.backend_by_cost) convert the
model instead of running torch. Plain numbers, no imports: both read them from here."""

# validation.backend=auto uses OpenVINO from this many passages per worker on, encode.backend=auto makes the
# export from this many passages to encode (index/encode.backend_by_cost). The model being trained is converted at the
# first validation (~1.7 s for MiniLM on one thread, with seeded random weights so that each weight's constant
# is found by its values), and its weights are written in and compiled at every validation (~0.3 s on one
# thread, the check on short probe texts included); the graph is kept in the export cache by architecture,
# so a later run of it (the next trial of a sweep) converts nothing (the _CACHED thresholds). In bf16 on an
# AVX512-BF16 CPU OpenVINO encodes MiniLM ~1.25x torch on one thread; in fp32 (and on AVX2, where bf16 is not
# native) ~1.05x with a costlier conversion (bench/encode.py), so it waits for larger corpora. Measured:
# `python bench/batching.py --skip-encoders --skip-st --threads 1 --dev-sizes 176,400,800` (docs/performance.md).
OPENVINO_MIN_PASSAGES = 250
OPENVINO_MIN_PASSAGES_FP32 = 1000
OPENVINO_MIN_PASSAGES_CACHED = 64
OPENVINO_MIN_PASSAGES_FP32_CACHED = 250
