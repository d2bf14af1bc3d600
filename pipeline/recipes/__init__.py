"""Recipes: multi-stage orchestration, one layer above `train/` and `index/` (each module's
docstring lists its stages, the files each writes and the config keys it reads).

    ance.py   ANCE: the trainer and the concurrent index refresher (pipeline train, loss.name ance)
    rcl.py    RCL: initial model, entropy models, regulators, final model (pipeline train, loss.name rcl);
              rcl_regulators.py: its stage 2
    arr.py    ARR: split, teacher, student, evaluation, table (pipeline authorship …, pipeline train)
    demo.py   the demo: ingest, zero-shot, DPR and DAR fine-tuning, one table (pipeline demo)

The per-step math lives in train/methods/ and the losses in losses/.
"""
