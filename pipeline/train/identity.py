"""A run's identity: what a checkpoint must share with a run to be resumed at its exact data position
and go on computing what the run computed.

Every checkpoint records it (`state.json`: `identity`). The driver compares it before anything is
written (`check_identity`), the loop again on the checkpoint it loads (`identity_diff`), where the
precision the workers train in is known for certain. Keys that joined the identity after checkpoints
were written without them are filled from what such a checkpoint did record (`stored_identity`), so
an older run still resumes when it trained as this one would.
"""

from __future__ import annotations

import hashlib
import json

from ..config import to_dict
from ..errors import PipelineError
from ..models.checkpoint import read_state

# keys that may be unknown on one side (a checkpoint that did not record them, or a driver whose workers
# run elsewhere): compared only when both sides know them
MAY_BE_UNKNOWN = ("amp", "attention")
PRECISIONS = ("fp32", "bf16", "fp16")


def loss_settings(job) -> dict:
    """What a step computes with beyond `train.*`: the `loss:` block and the method's sections, less each
    section's OPERATIONAL keys (where and how its helpers run: resources, polling, retries, failure rules),
    which a run may change between resumes: an ANCE run trained with its refresher beside it resumes with
    `ance.start_refresher=false` and the refresher as its own job."""
    out = {"loss": to_dict(job.loss)}
    for name, section in job.sections.items():
        values = to_dict(section)
        for key in getattr(type(section), "OPERATIONAL", ()):
            values.pop(key, None)
        out[name] = values
    return out


# the model keys that change what a step computes: how texts are cut and prefixed and how vectors are pooled
MODEL_STEP_KEYS = ("pooling", "normalize", "query_prefix", "doc_prefix", "query_max_length", "doc_max_length")


def step_settings(job) -> dict:
    """What a step computes with beyond the loss and method settings (#60): the optimizer and its schedule
    (every `optim.*` key, and the schedule's length, `train.epochs` and `train.max_steps`: the learning
    rate a step takes is warm-up and linear decay over the total), the model's text handling and pooling
    (MODEL_STEP_KEYS), and how examples become a step's rows (`data.shuffle_window`, `data.hard_negatives`).
    A resume with other values would train on with the checkpoint's optimizer state under a schedule and
    inputs the checkpoint never had, while config.yaml and summary.json named only the new values; it is
    refused, naming each key (an intended continuation is a new train.name with train.init_from)."""
    return {"optim": to_dict(job.optim),
            "train": {"epochs": job.train.epochs, "max_steps": job.train.max_steps,
                      **({"grad_cache": [job.train.grad_cache_query_chunk, job.train.grad_cache_doc_chunk]}
                         if job.train.grad_cache else {})},
            "model": {k: getattr(job.model, k) for k in MODEL_STEP_KEYS},
            "data": {"shuffle_window": job.data.shuffle_window, "hard_negatives": job.data.hard_negatives}}


def _settings_sha(settings: dict) -> str:
    return hashlib.sha256(json.dumps(settings, sort_keys=True).encode()).hexdigest()[:16]


def run_identity(job, meta: dict, digest: str, world: int, spe: int, amp: str | None = None) -> dict:
    """What a checkpoint must share with this run to be resumed. `amp` is the precision the run trains in
    (`train.amp` resolved on the workers' device: loop.resolve_amp), None where the driver cannot know it.
    `length_group_rows` changes what a step computes in training (dropout draws its masks per group)."""
    out = {"method": job.loss.name, "loss_config_sha256": _settings_sha(loss_settings(job)),
           "examples_sha256": digest[:16], "examples": meta["examples"], "world_size": world,
           "steps_per_epoch": spe, "batch_per_worker": job.train.batch_size, "seed": job.train.seed,
           "length_group_rows": job.train.length_group_rows,
           "attention_regularizers": {"attention_dropout": job.train.attention_dropout, "drophead": job.train.drophead},
           "step_settings_sha256": _settings_sha(step_settings(job)), "init_from": job.train.init_from}
    if amp is not None:
        out["amp"] = amp
    return out


def stored_identity(ckpt, state: dict) -> dict | None:
    """The identity a checkpoint records (None: it records none), with the keys that joined later filled
    from what it did record:
      length_group_rows  the value in its config.yaml; a config.yaml without the key predates
                         train.length_group_rows, when each tower's batch was one padded batch (= 0);
                         an unreadable config.yaml leaves it unknown (absent), which a diff refuses
      attention_regularizers  none (train.attention_dropout / drophead came later: such a run trained
                         without them)
      amp                its state.json's `precision` (what the loop trained in); a checkpoint without
                         that records no precision, so the precision it trained in is unknown and
                         any train.amp is accepted (MAY_BE_UNKNOWN)
      attention          the attention implementation the loop trained with (`train.attention` resolved on
                         the workers, models/attention.py); a checkpoint made before it records none: it
                         trained with the towers' own, which `auto` keeps on resume; any explicit value is
                         accepted (MAY_BE_UNKNOWN)
      init_from          none (train.init_from came later: such a run started from model.name_or_path)
    and `loss_config_sha256` computed again from its config.yaml by today's rule (`loss_settings`: a
    checkpoint made before a section named its OPERATIONAL keys hashed them too), `step_settings_sha256`
    likewise (`step_settings`; a checkpoint made before the key joined is judged by what its config.yaml
    records, so an older run resumes when its optimizer, schedule and lengths are this run's); the recorded
    settings themselves are kept under `loss_settings` and `step_settings` (not compared; `describe_diff`
    names the keys that differ).
    """
    then = state.get("identity")
    if then is None:
        return None
    then = dict(then)
    job = _recorded_job(ckpt)
    if job is not None:
        then["loss_settings"] = recorded = loss_settings(job)
        then["loss_config_sha256"] = _settings_sha(recorded)
        then["step_settings"] = steps = step_settings(job)
        then["step_settings_sha256"] = _settings_sha(steps)
    then.setdefault("init_from", None)
    if "length_group_rows" not in then:
        rows = _recorded_length_group_rows(ckpt)
        if rows is not None:
            then["length_group_rows"] = rows
    if "attention_regularizers" not in then:  # made before train.attention_dropout / drophead: trained without
        then["attention_regularizers"] = {"attention_dropout": None, "drophead": 0.0}
    if "amp" not in then and state.get("precision") in PRECISIONS:
        then["amp"] = state["precision"]
    return then


def _recorded_length_group_rows(ckpt) -> int | None:
    import yaml

    try:
        cfg = yaml.safe_load((ckpt / "config.yaml").read_text())
        return int((cfg.get("train") or {}).get("length_group_rows", 0))
    except (OSError, ValueError, TypeError, AttributeError, yaml.YAMLError):
        return None


def _recorded_job(ckpt):
    """The job a checkpoint's config.yaml records; None where it cannot be read as a job of this version
    (then the recorded loss hash stands, and the step settings are unknown: a resume is refused)."""
    import yaml

    from ..errors import ConfigError
    from .config import job_from_dict

    try:
        return job_from_dict(yaml.safe_load((ckpt / "config.yaml").read_text()) or {})
    except (OSError, ValueError, TypeError, AttributeError, KeyError, ConfigError, yaml.YAMLError):
        return None


def _flat(d, prefix: str = "") -> dict:
    if not isinstance(d, dict):
        return {prefix.rstrip("."): d}
    out = {}
    for k, v in d.items():
        out.update(_flat(v, f"{prefix}{k}."))
    return out


def settings_diff(then: dict, now: dict) -> str:
    """The settings that differ, as "loss.tau (0.05 in the checkpoint, 0.1 now)", dotted as they are set."""
    a, b = _flat(then), _flat(now)
    return ", ".join(f"{k} ({a.get(k)!r} in the checkpoint, {b.get(k)!r} now)"
                     for k in sorted(set(a) | set(b)) if a.get(k) != b.get(k))


def identity_diff(then: dict, now: dict) -> dict:
    """{key: (in the checkpoint, now)} for every key that differs; a MAY_BE_UNKNOWN key missing on either
    side is not compared."""
    return {k: (then.get(k), v) for k, v in now.items()
            if then.get(k) != v and not (k in MAY_BE_UNKNOWN and k not in then)}


# the identity keys that hash settings, and what `describe_diff` calls them when it names the keys behind one
HASHED = {"loss_config_sha256": ("loss_settings", "the loss settings"),
          "step_settings_sha256": ("step_settings", "the optimizer, schedule and model settings")}


def named_settings(then: dict, job) -> dict:
    """{hash key: (the checkpoint's settings, this run's)} for `describe_diff`."""
    return {"loss_config_sha256": (then.get("loss_settings"), loss_settings(job)),
            "step_settings_sha256": (then.get("step_settings"), step_settings(job))}


def describe_diff(diff: dict, settings: dict | None = None) -> str:
    """The differences as one clause, with the setting that resumes for the ones a user sets; `settings`
    (`named_settings`: for each hash key, the checkpoint's settings and this run's) names the keys behind a
    differing loss_config_sha256 or step_settings_sha256."""
    parts = []
    for k, (a, b) in sorted(diff.items()):
        text = f"{k} ({a!r} in the checkpoint, {b!r} now)"
        pair = (settings or {}).get(k, (None, None))
        named = settings_diff(*pair) if k in HASHED and all(p is not None for p in pair) else ""
        if named:
            text = f"{HASHED[k][1]}: " + named
        elif k == "step_settings_sha256" and pair[0] is None:
            text = ("the optimizer, schedule and model settings (unknown in the checkpoint: its config.yaml "
                    "cannot be read as a run's config)")
        elif k == "init_from":
            text = (f"train.init_from ({a or 'none: it started from model.name_or_path'} in the checkpoint, "
                    f"{b or 'none'} now)")
        elif k == "amp" and a in PRECISIONS:
            text += f"; train.amp={'no' if a == 'fp32' else a} trains as the checkpoint did"
        elif k == "attention" and a:
            setting = a if a in ("sdpa", "eager", "threshold-dropout") else "auto"
            text += f"; train.attention={setting} trains as the checkpoint did"
        elif k == "length_group_rows" and a is not None:
            text += f"; train.length_group_rows={a} computes as the checkpoint did"
        elif k == "attention_regularizers" and isinstance(a, dict):
            text += ("; train.attention_dropout=" + ("null" if a.get("attention_dropout") is None
                                                     else f"{a['attention_dropout']:g}")
                     + f" train.drophead={a.get('drophead', 0.0):g} trains as the checkpoint did")
        parts.append(text)
    return "; ".join(parts)


RESUMING_NEEDS = ("Resuming needs the same method, loss settings, optimizer settings and schedule (optim.*, "
                  "train.epochs, train.max_steps), model lengths, prefixes and pooling, examples, workers, batch "
                  "size, precision (train.amp as resolved), train.attention (as resolved), train.length_group_rows, "
                  "the attention regularizers and train.init_from; to go on from this checkpoint with other "
                  "settings, start a new run from its weights (another train.name with train.init_from=<checkpoint>)")

# the identity keys a run's config alone decides; the examples' count and digest need the examples built, and
# the precision and attention the workers' device
CONFIG_KEYS = ("world_size", "batch_per_worker", "seed", "length_group_rows", "attention_regularizers", "init_from")


def check_resume_early(resume, job) -> None:
    """Refuse, before the examples are built and before anything starts beside training, a resume that
    `check_identity` would refuse once they are for what the config alone decides: the loss and method
    settings (against the checkpoint's config.yaml) and the CONFIG_KEYS of its identity. A refused resume
    then costs no examples build (minutes on a big corpus; it would also replace the run's examples with
    those of the other settings), and ANCE's refresher, which writes versions into the run, never starts
    for it. `loss.similarity` and `loss.temperature` are left to `check_identity` (resolved against the
    model there), as are the examples, the precision and the attention implementation."""
    then = stored_identity(resume, read_state(resume) or {})
    if then is None:
        _refuse_unrecorded(resume)
    now = {k: v for k, v in run_identity(job, {"examples": None}, "", job.train.num_workers, 0).items()
           if k in CONFIG_KEYS}
    diff = identity_diff(then, now)
    parts = [describe_diff(diff)] if diff else []
    recorded = then.get("loss_settings")  # stored_identity read them from the checkpoint's config.yaml
    if recorded is not None:
        def comparable(settings: dict) -> dict:
            loss = {k: v for k, v in settings["loss"].items() if k not in ("similarity", "temperature")}
            return {**settings, "loss": loss}

        differs = settings_diff(comparable(recorded), comparable(loss_settings(job)))
        steps = settings_diff(then["step_settings"], step_settings(job))
        if steps:
            parts.insert(0, f"{HASHED['step_settings_sha256'][1]}: " + steps)
        if differs:
            parts.insert(0, "the loss settings: " + differs)
    else:
        parts.insert(0, describe_diff({"step_settings_sha256": (None, "")}))
    if parts:
        raise PipelineError(f"cannot resume from {resume}: this run differs in {'; '.join(parts)}. "
                            f"{RESUMING_NEEDS} (nothing was built or started)")


def _refuse_unrecorded(resume) -> None:
    raise PipelineError(f"cannot resume from {resume}: it records no run identity (made by an older version); "
                        "start a new run (another train.name) or train.resume=never")


def check_identity(resume, identity: dict, job=None) -> None:
    """Refuse to resume from a checkpoint of another run (PipelineError naming every difference; with `job`,
    this run's config, the loss and step settings that differ are named key by key)."""
    then = stored_identity(resume, read_state(resume) or {})
    if then is None:
        _refuse_unrecorded(resume)
    settings = named_settings(then, job) if job is not None else None
    diff = identity_diff(then, identity)
    if diff:
        raise PipelineError(f"cannot resume from {resume}: this run differs in "
                            + describe_diff(diff, settings) + f". {RESUMING_NEEDS}")
