"""Ray job entrypoint for `pipeline train`: ANCE: training with an index refresher beside it (a config whose loss.name is ance or ance_dar).

    ray job submit --working-dir . -- python jobs/ance.py --config jobs/configs/ance.yaml train.storage_path=/shared/train [key=value ...]
    python jobs/ance.py --smoke-test [--out DIR] [key=value ...]     # tiny model + bundled FAQ, ~1 min on CPU

The ANCE orchestration is `pipeline train` itself (pipeline/recipes/ance.py): the config's `loss.name`
must be `ance` or `ance_dar`, else this entrypoint refuses to start (use jobs/train.py).

Arguments are `pipeline train`'s (see `pipeline train --help`); jobs/smoke.py holds the smoke test.
"""

import sys

from smoke import run, smoke_ance


def _check_ance(argv: list[str]) -> None:
    """Refuse a config whose loss is not ANCE's (it would run a plain training, silently)."""
    from pipeline.errors import PipelineError
    from pipeline.train.config import load_train_config

    p_config = argv[argv.index("--config") + 1] if "--config" in argv[:-1] else None
    overrides = [a for a in argv if "=" in a and not a.startswith("-")]
    job = load_train_config(p_config, overrides)
    if job.loss.name not in ("ance", "ance_dar"):
        raise PipelineError(f"jobs/ance.py needs loss.name ance or ance_dar (got {job.loss.name!r}); "
                            "use jobs/train.py for other methods")


def main(argv: list[str] | None = None) -> int:
    from pipeline.errors import PipelineError

    argv = list(sys.argv[1:] if argv is None else argv)
    if "--smoke-test" not in argv:
        try:
            _check_ance(argv)
        except PipelineError as e:
            print(f"error: {e}", file=sys.stderr)
            return 2
    return run("train", argv, smoke=smoke_ance)


if __name__ == "__main__":
    sys.exit(main())
