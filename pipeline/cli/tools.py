"""`pipeline config show` and `pipeline info`."""

from __future__ import annotations

import json

from .common import add_config_args

def cmd_config_show(args) -> None:
    """The resolved config as YAML: a pipeline config, a training job config or a Tune sweep file."""
    import yaml

    from ..config import dump_config, load_config, merge_overrides, read_yaml, to_dict
    from ..confdoc import config_kind

    data = merge_overrides(read_yaml(args.config), list(args.overrides))
    kind = args.kind or config_kind(data)
    if kind == "train":
        from ..train.config import dump_job, load_train_config

        text = dump_job(load_train_config(args.config, list(args.overrides)))
    elif kind == "sweep":
        from ..train.config import job_to_dict
        from ..tune.space import load_job, load_sweep_config

        sweep = load_sweep_config(args.config, list(args.overrides))
        text = yaml.safe_dump({"base": job_to_dict(load_job(sweep.base_data(), "base")),
                               "base_source": sweep.base_source, "overrides": list(sweep.overrides),
                               "space": sweep.raw.get("space"), "search": to_dict(sweep.search),
                               "output": sweep.output}, sort_keys=False)
    else:
        text = dump_config(load_config(args.config, list(args.overrides)))
    print(f"# {kind} config" + (f" from {args.config}" if args.config else " (defaults)")
          + (f" with {' '.join(args.overrides)}" if args.overrides else ""))
    print(text, end="")


def cmd_info(args) -> None:
    from ..info import describe, info

    if args.json:
        print(json.dumps(describe(args.path), indent=2))
        return
    print(info(args.path))


def add_parsers(sub) -> None:
    """The config, info verbs."""
    p = sub.add_parser("config", help="config tools: `pipeline config show --config X.yaml [key=value ...]`")
    csub = p.add_subparsers(dest="config_command", required=True)
    p = csub.add_parser("show", help="print the resolved config (file + overrides + defaults) as YAML; a training "
                                     "job config (train/data/optim/loss sections) or a sweep file is detected")
    p.add_argument("--kind", choices=("pipeline", "train", "sweep"), help="force the config kind (default: detected)")
    add_config_args(p)
    p.set_defaults(func=cmd_config_show)

    p = sub.add_parser("info", help="summarise a project folder or file: corpus, embeddings, index, run, qrels, "
                                    "training run, checkpoint, sweep, model, metrics JSON")
    p.add_argument("path", metavar="PATH", help="a folder or file this tool wrote (or a project folder)")
    p.add_argument("--json", action="store_true", help="print the summary as JSON")
    p.set_defaults(func=cmd_info)
