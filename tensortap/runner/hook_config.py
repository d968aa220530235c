"""The hook configuration a `tensortap run` job hands to its training process (smdebug's JSON format)."""

from __future__ import annotations

from typing import Any

from tensortap.runner.spec import JobSpec


def _merge(into: dict[str, str], params: dict[str, str]) -> None:
    for k, v in params.items():
        if k == "include_regex" and into.get(k):
            parts = [p for p in into[k].split(",") + v.split(",") if p]
            into[k] = ",".join(dict.fromkeys(parts))
        elif k == "save_interval" and into.get(k):
            into[k] = str(min(int(into[k]), int(v)))  # the most frequent wins: every reader gets its steps
        else:
            into[k] = v


def rule_collections(spec: JobSpec) -> dict[str, dict[str, str]]:
    """Collections the job's built-in rules need, with regexes and save intervals (from rules.configs)."""
    from tensortap.rules.configs import config_for

    out: dict[str, dict[str, str]] = {}
    for r in spec.rules:
        if r.file is not None:
            continue  # a user's rule says nothing about collections: the user names them with --collection
        params: dict[str, Any] = dict(r.params)
        if spec.save_interval is not None:
            params["save_interval"] = spec.save_interval
        cfg = config_for(r.name, **params)
        for c in cfg.collections:
            p = c.to_dict()["CollectionParameters"]
            _merge(out.setdefault(c.name, {}), p)
    return out


def build_hook_config(spec: JobSpec) -> dict[str, Any]:
    """{"LocalPath", "HookParameters", "CollectionConfigurations"} for the job."""
    colls = rule_collections(spec)
    for name, params in spec.collections.items():
        # explicit --collection settings override what the rules asked for
        merged = colls.setdefault(name, {})
        merged.update(params)
    hook_params: dict[str, str] = {"include_workers": spec.include_workers}
    if spec.save_interval is not None:
        hook_params["save_interval"] = str(spec.save_interval)
    if spec.tensorboard_dir:
        hook_params["export_tensorboard"] = "true"
        hook_params["tensorboard_dir"] = spec.tensorboard_dir
    return {
        "LocalPath": spec.out_dir,
        "HookParameters": hook_params,
        "CollectionConfigurations": [
            {"CollectionName": name, "CollectionParameters": params} for name, params in sorted(colls.items())
        ],
    }
