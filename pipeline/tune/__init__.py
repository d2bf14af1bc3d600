"""Ray Tune sweeps over the trainers (`pipeline tune`): space.py (the sweep file), runner.py
(Tuner, per-trial driver, schedulers, resume), results.py (table, best config, plots)."""
