"""The reproduction matrix (`repro/*.yaml`): published figures (and the project's own) with the exact commands that
reach them, and the effects experiment's cells.

    matrix.py   the matrix read and checked (`load_matrix`, `Cell`, `Matrix`)
    status.py   a cell's newest result, checked to be that cell's, and its status line
    run.py      running a cell's commands (`pipeline reproduce run`)
    page.py     docs/reproductions.md (`pipeline reproduce report`)

The effects experiment (repro/effects.yaml) is pipeline/effects/: its cells are made here from its spec.
"""

from .matrix import Cell, Matrix, load_matrix, matrix_dir, placeholders  # noqa: F401
from .page import render_report  # noqa: F401
from .status import _status_text, cell_status, dig, judge, read_result, results_dir  # noqa: F401
