"""Ray Train trainers (DPR, DAR, …): the per-worker loop, checkpoints and resume."""
