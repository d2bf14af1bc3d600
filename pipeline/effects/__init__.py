"""The effects experiment: does each method beat its baseline beyond noise (repro/effects.yaml).

    spec.py     the experiment as data: datasets, seeds, arms, comparisons (the `experiment:` block)
    runner.py   every arm and seed on one dataset, resumable (`pipeline reproduce run --family`)
    stats.py    an effect over seeds and queries: interval, paired test, verdict (pure functions)
    record.py   the result as tables, one record merged across machines and sessions
    report.py   the page section and the figure (`pipeline reproduce report`)
"""
