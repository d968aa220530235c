"""The XGBoost hook: an `xgboost.callback.TrainingCallback` that saves what a boosting round produced.

Step = boosting round (the `epoch` XGBoost passes to `after_iteration`), in TRAIN mode: training continued
from a saved booster keeps counting from the rounds it already has. At a saving step the hook saves, for
each included collection (names as smdebug.xgboost, spec 5.6 and 5.9):

* hyperparameters  `hyperparameters/<key>`: the `hyperparameters` given to the hook;
* metrics, losses  `<eval>-<metric>`: the round's value in `evals_log` (the mean with `xgb.cv`); losses are
  the metrics where lower is better (not auc, aucpr, map, ndcg, pre);
* predictions, labels  `predictions`, `labels`: `predict(validation_data)` and its labels;
* feature_importance  `feature_importance/<type>/<feature>` for weight, gain, cover, total_gain and
  total_cover: `get_score(importance_type=type)` divided by its sum (features without a split: 0);
* full_shap, average_shap  `full_shap/<feature>`, `average_shap/<feature>` (`/bias` only with `all`):
  `predict(train_data, pred_contribs=True)` per feature, and its mean over the samples (and classes); for
  gbtree after the first saving round as the last values plus the new trees' (tensortap.xgboost.shap);
* trees  `trees/<column>`: each column of `trees_to_dataframe()` (missing strings saved as "").

A round that saves only metrics, losses or hyperparameters keeps their values (a few µs inside the training
loop); the kept rounds go to the writer together at the next round that takes the full path (at least every
50 ms), at `flush()`, at the end of training and at `close()`. Readers find them within that and the writer's
flush interval; they learn that a round passed when the next full round begins or training ends. A crash loses
at most what was not flushed yet, as with every hook.

Errors inside the hook turn it off (logged once); boosting goes on.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Iterable
from typing import Any

import numpy as np
import xgboost as xgb

from tensortap import modes
from tensortap.collection import Collection, CollectionKeys
from tensortap.config import ReductionConfig, SaveConfig
from tensortap.exceptions import InvalidConfiguration
from tensortap.format import codec
from tensortap.format.writer import Record, ScalarRows
from tensortap.hooks import base as _base
from tensortap.hooks.base import Hook as BaseHook
from tensortap.xgboost.data import as_dmatrix
from tensortap.xgboost.shap import ShapValues

logger = logging.getLogger("tensortap")

__all__ = ["Hook", "DEFAULT_SAVE_INTERVAL", "IMPORTANCE_TYPES"]

DEFAULT_SAVE_INTERVAL = 10
_DEFAULT_SAVE = {"save_interval": DEFAULT_SAVE_INTERVAL}
IMPORTANCE_TYPES = ("weight", "gain", "cover", "total_gain", "total_cover")
#: metrics where higher is better (not losses), with or without an "@..." suffix
_GAIN_METRICS = "auc|aucpr|map|ndcg|pre"

K = CollectionKeys
_TRAIN, _GLOBAL = modes.TRAIN, modes.GLOBAL
_REGEXES = {
    K.HYPERPARAMETERS: r"^hyperparameters/.*$",
    K.METRICS: r"^[^/]+-[^/]+$",
    K.LOSSES: rf"^[^/]+-(?!({_GAIN_METRICS})(@|-|$))[^/]+$",
    K.PREDICTIONS: r"^predictions$",
    K.LABELS: r"^labels$",
    K.FEATURE_IMPORTANCE: r"^feature_importance/.*",
    # (the bias term, `<shap>/bias`, is left out, as smdebug's regexes mean to; `all` and include_regex still take it)
    K.AVERAGE_SHAP: r"^average_shap/(?!bias$)",
    K.FULL_SHAP: r"^full_shap/(?!bias$)",
    K.TREES: r"^trees/.*",
}
_SCALAR_ONLY = frozenset({K.SCALARS, K.SM_METRICS})
#: the collections whose tensors the hook computes, each in its own group
_GROUPS = tuple(_REGEXES)
#: groups whose values are known without the model: a round that saves only these keeps its values, and they are
#: handed to the writer together with the other kept rounds' at the next full round (or at flush, close, the end
#: of training, a change of collections)
_KEPT_GROUPS = frozenset({K.HYPERPARAMETERS, K.METRICS, K.LOSSES})
#: seconds at most between two rounds that take the hook's full path (which looks for a stop request); the
#: rounds in between that save nothing are only counted
_FULL_ROUND_EVERY = min(0.05, getattr(_base, "STOP_CHECK_INTERVAL", 0.05))


def _collective_identity() -> tuple[int, int] | None:
    """(rank, world size) in XGBoost's collective (xgboost.dask, the tracker) when it is running."""
    try:
        if xgb.collective.is_distributed():
            return xgb.collective.get_rank(), xgb.collective.get_world_size()
    except Exception:  # noqa: BLE001 - no collective, or an old xgboost
        return None
    return None


class _Scalars:
    """Float scalars gathered for one hand-off (`ScalarRows`): per value its tensor, step, mode step."""

    def __init__(self) -> None:
        self.names: list[str] = []
        self._ids: dict[str, int] = {}
        self.name: list[int] = []
        self.steps: list[int] = []
        self.mode_steps: list[int] = []
        self.values: list[float] = []

    def add(self, name: str, step: int, mode_step: int, value: float) -> None:
        i = self._ids.get(name)
        if i is None:
            i = self._ids[name] = len(self.names)
            self.names.append(name)
        self.name.append(i)
        self.steps.append(step)
        self.mode_steps.append(mode_step)
        self.values.append(value)

    def rows(self, mode: int) -> ScalarRows:
        return ScalarRows(self.names, self.name, self.steps, mode, self.mode_steps, self.values)


class Hook(BaseHook, xgb.callback.TrainingCallback):
    """Captures an XGBoost training job: pass it in `callbacks=[hook]` (xgb.train, xgb.cv, the sklearn API,
    xgboost.dask).

    `hyperparameters` (a dict) is saved in the `hyperparameters` collection; `train_data` is what SHAP
    values are computed on, `validation_data` what predictions and labels come from: an xgboost.DMatrix
    (QuantileDMatrix too), `(path, "csv"|"libsvm")` (a local file; csv has the label in its first column) or
    `(X, y)`. `reduction_config` is ignored (as in smdebug); `save_config` defaults to every 10 rounds.
    The writer is a thread (`writer="thread"`) unless `writer=` or $TENSORTAP_WRITER says otherwise; the
    thread starts at the first hand-off a flush interval after training began, so a job that ends sooner is
    written by `close()` (docs/format.md §7).

    Distributed: the rank and world size come from XGBoost's collective (xgboost.dask, the tracker) at the
    start of training; xgboost.dask's workers each rebuild the hook from its configuration (not its data).
    """

    builtin_collections = (K.ALL, K.DEFAULT, K.SCALARS, *_GROUPS)
    default_include_collections = (K.METRICS,)
    always_include_collections = (K.METRICS,)
    # (a short boosting job costs less than a thread's start and join: its data is written at close)
    _late_writer_thread = True
    _scalars_wait_for_step = True  # (steps are boosting rounds)

    identity_source = staticmethod(_collective_identity)  # (the collective may start after the hook)

    def __init__(
        self,
        out_dir: str | None = None,
        export_tensorboard: bool = False,
        tensorboard_dir: str | None = None,
        dry_run: bool = False,
        reduction_config: ReductionConfig | None = None,
        save_config: SaveConfig | Any = None,
        include_regex: str | Iterable[str] | None = None,
        include_collections: Iterable[str | Collection] | None = None,
        save_all: bool = False,
        include_workers: str = "one",
        hyperparameters: dict[str, Any] | None = None,
        train_data: Any = None,
        validation_data: Any = None,
        **kwargs: Any,
    ):
        if reduction_config is not None:
            logger.warning("tensortap.xgboost: reduction_config is not supported by the XGBoost hook and is ignored")
        if save_config is None:
            if os.environ.get("TENSORTAP_AUTO") == "1" and os.environ.get("TENSORTAP_CONFIG"):
                # under `tensortap run` the runner's config decides, with this hook's default interval
                from tensortap.hook_config import load_hook_config

                save_config = load_hook_config(os.environ["TENSORTAP_CONFIG"], _DEFAULT_SAVE).save_config
            else:
                save_config = SaveConfig(save_interval=DEFAULT_SAVE_INTERVAL)
        if hyperparameters is not None and not isinstance(hyperparameters, dict):
            raise InvalidConfiguration(f"hyperparameters={hyperparameters!r} must be a dict or None")
        if kwargs.get("writer") is None and not os.environ.get("TENSORTAP_WRITER"):
            # A boosting round hands over little data, and starting a writer process costs more than a short
            # boosting job: the writer is a thread unless asked otherwise.
            kwargs["writer"] = "thread"
        self._init_args = dict(
            out_dir=out_dir, export_tensorboard=export_tensorboard, tensorboard_dir=tensorboard_dir,
            dry_run=dry_run, save_config=save_config, include_regex=include_regex,
            include_collections=include_collections, save_all=save_all, include_workers=include_workers,
            hyperparameters=hyperparameters, **{k: v for k, v in kwargs.items() if k not in ("rank", "world_size")},
        )
        #: rounds whose metrics are kept for the next hand-off: (step, TRAIN step, [(eval, metric, last value)])
        self._kept: list[tuple[int, int, list[tuple[str, str, Any]]]] = []
        super().__init__(
            out_dir, export_tensorboard=export_tensorboard, tensorboard_dir=tensorboard_dir, dry_run=dry_run,
            reduction_config=None, save_config=save_config, include_regex=include_regex,
            include_collections=include_collections, save_all=save_all, include_workers=include_workers, **kwargs,
        )
        if getattr(self, "_pending_collection_configs", None):
            # The runner's collection configs (applied at the first round), read again with this hook's default
            # for the save keys they leave out (the base reads them with the deep-learning hooks' 500 steps).
            from tensortap.hook_config import load_hook_config

            self._pending_collection_configs = load_hook_config(os.environ["TENSORTAP_CONFIG"],
                                                                _DEFAULT_SAVE).collection_configs
        self.hyperparameters = hyperparameters
        self.train_data = as_dmatrix(train_data, "train_data")
        self.validation_data = as_dmatrix(validation_data, "validation_data")
        self._labels: np.ndarray | None = None
        self._shap = ShapValues()
        # a round that saves only collections of these groups keeps their values (the engine's light window)
        self.engine.light = self._keeps
        self._reset_rounds()
        from tensortap.xgboost.singleton import set_hook

        set_hook(self)

    @classmethod
    def create_from_json_file(cls, json_file_path: str | None = None, **overrides: Any) -> Hook:
        """A hook configured by smdebug-style JSON (`json_file_path`, else $TENSORTAP_CONFIG, else
        $SMDEBUG_CONFIG_FILE_PATH); save keys the config leaves out default to every 10 rounds, for the hook
        and for each collection it configures (as smdebug.xgboost)."""
        from tensortap.hook_config import load_hook_config

        cfg = load_hook_config(json_file_path, _DEFAULT_SAVE)
        if "save_config" not in overrides:
            overrides["save_config"] = cfg.save_config
        hook = super().create_from_json_file(json_file_path, **overrides)
        hook.apply_collection_configs(cfg.collection_configs)  # (the base reads them with the 500 steps' default)
        return hook

    def _init_builtin_collections(self) -> None:
        for name, regex in _REGEXES.items():
            self.collection_manager.get(name).include(regex)

    # --- distributed ------------------------------------------------------------------------

    def __copy__(self) -> Hook:
        return self  # a hook is a handle on its job's output: copies (sklearn's clone) share it

    def __deepcopy__(self, memo: dict[int, Any]) -> Hook:
        return self

    def __getstate__(self) -> dict[str, Any]:
        """What a copy in another process (xgboost.dask ships callbacks to its workers) is rebuilt from: the
        configuration and the collections, not the data or the writer. The copies do the training, so this
        process's hook stops writing."""
        pending = self.__dict__.get("_copy_state")
        if pending is not None:  # a copy not started yet, passed on
            return pending
        state = {"args": dict(self._init_args), "collections": self.collection_manager.to_json_dict()}
        self.writes = False
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        # The copy becomes a hook at before_training, when XGBoost's collective tells its rank (workers are
        # told after they receive the callbacks): until then it does nothing.
        self.disabled = True
        self._closed = True
        self._copy_state = state

    def _start_copy(self, state: dict[str, Any]) -> None:
        from tensortap.collection import CollectionManager

        rank, world_size = _collective_identity() or (0, 1)
        self.__init__(**state["args"], rank=rank, world_size=world_size)
        self._copy_state = None
        self._is_copy = True
        for name, coll in CollectionManager.from_json_dict(state["collections"]).get_collections().items():
            own = self.get_collection(name)
            own.include_regex = coll.include_regex
            own.save_config = coll.save_config
            own.reduction_config = coll.reduction_config
            own.save_histogram = coll.save_histogram

    # --- TrainingCallback -------------------------------------------------------------------

    def before_training(self, model: Any) -> Any:
        state = self.__dict__.get("_copy_state")
        if state is not None:
            try:
                self._start_copy(state)
            except Exception as e:  # noqa: BLE001 - never break training
                logger.error("tensortap.xgboost: the hook's copy in this process is off: %s", e, exc_info=True)
                self.disabled = self._closed = True
            return model
        self._reset_rounds()
        if not self.disabled:
            with self.guard("before_training"):
                identity = _collective_identity()
                if identity is not None:
                    self.engine.adopt_identity(*identity)  # (the collective may start after the hook)
                self._claim()
        return model

    def _claim(self) -> None:
        """Claim this worker's folder in out_dir once its name is known (what the base constructor does when it
        knows the worker); another job's folder: this hook writes nothing, training goes on."""
        engine = self.engine
        if engine.claim_pending:
            engine.claim()
            if self.writes and not self.disabled and not self.dry_run:
                self._get_writer()  # (it opens its chunk beside the first rounds)

    def after_training(self, model: Any) -> Any:
        if self.__dict__.get("_is_copy"):
            self.close()  # a copy serves one training call, in a process that may end without exit handlers
        elif self.active:
            self.end_step()
            self.flush()  # every round saved is readable when xgb.train returns; close() completes the job
        return model

    def after_iteration(self, model: Any, epoch: int, evals_log: dict[str, Any]) -> bool:
        if self.disabled or self._closed:
            return False
        try:
            # The round: XGBoost counts `epoch` from 0 in every call, a continued booster from the rounds it has.
            if epoch == self._last_epoch + 1:
                rnd = epoch + self._round_offset
            else:
                rnd = model.num_boosted_rounds() - 1 if isinstance(model, xgb.Booster) else epoch
                self._round_offset = rnd - epoch
            self._last_epoch = epoch
            counted = self.engine.count_light(rnd) if self.clock.mode is _TRAIN else 0
            if counted:
                # A round in the run of them after a full round that saves nothing, or only metrics (kept, and
                # handed off with the other kept rounds at the next full round): only counted (the step engine's
                # light window). Readers learn that it passed when the next full round begins (or training ends).
                if counted == 2:
                    values = []
                    for d, ms in evals_log.items():
                        for m, log in ms.items():
                            if log:
                                values.append((d, m, log[-1]))
                    self._kept.append((rnd, rnd, values))
                return False
            if self.engine.claim_pending:  # (no before_training: the callback driven by hand)
                self._claim()
                if self.disabled:
                    return False
            self._begin_round(rnd)  # (ends the last round: readers learn it passed)
            if self.writes:
                now = self.collections_to_save()
                if now:
                    self._save_round(model, evals_log, now)
            self.engine.open_light_window(time.monotonic() + _FULL_ROUND_EVERY)
        except Exception as e:  # noqa: BLE001 - never break training (what guard() does, without a generator)
            if isinstance(e, InvalidConfiguration):
                raise
            self._fail("after_iteration", e)
        return False

    def _reset_rounds(self) -> None:
        """Forget what the last rounds told (a new training begins, or collections changed)."""
        self._last_epoch = -2  # the epoch of the last round seen (-2: none)
        self._round_offset = 0  # round - epoch in this training
        self.engine.close_light_window()

    def _collections_changed(self) -> None:
        self._hand_off_kept()  # (saved as the collections were when those rounds ended)
        super()._collections_changed()

    def _keeps(self, c: Collection) -> bool:
        """Whether a round that saves `c` may keep its values for a later hand-off (only metrics and losses from
        XGBoost's evaluation log, or hyperparameters)."""
        return self._wanted([c]) <= _KEPT_GROUPS

    def _begin_round(self, rnd: int) -> None:
        if self.mode is not modes.TRAIN:
            self.set_mode(modes.TRAIN)
        step = self.step
        if rnd > step + 1:  # the first round of a continued booster: the step is the round
            self.step = rnd - 1
            self.mode_steps[modes.TRAIN] = rnd - 1
        elif rnd <= step:
            self._warn_once("rounds-restart", f"tensortap.xgboost: boosting round {rnd} after step {step}: this "
                            f"hook already saw those rounds (a new training?); its steps go on counting from {step}")
        self.next_step()

    # --- saving -----------------------------------------------------------------------------

    def _wanted(self, now: list[Collection]) -> set[str]:
        """The groups whose tensors may be saved now."""
        names = {c.name for c in now}
        # (save_scalar's collections name only its scalars: no group computed for them)
        if K.ALL in names or any(c.name not in _REGEXES and (c.include_regex or (
                c.tensor_names and c.name not in _SCALAR_ONLY)) for c in now):
            return set(_GROUPS)
        return names

    def _round_plan(self, now: list[Collection], _key: Any) -> tuple[set[str], dict[str, tuple | None]]:
        """(the groups a round saving `now` computes, per scalar tensor name its `_resolve` plan (None: not saved),
        filled as the rounds go)."""
        return self._wanted(now), {}

    def _save_round(self, model: Any, evals_log: dict[str, Any], now: list[Collection]) -> None:
        wanted, plans = self.engine.plans.get(now, None, self._round_plan)  # (the engine's plan cache)
        if wanted & _KEPT_GROUPS:  # (handed off with the kept rounds' at the next full round)
            self._kept.append((self.step, self.mode_step, [(d, m, log[-1]) for d, ms in evals_log.items()
                                                           for m, log in ms.items() if log]))
        model_groups = wanted - _KEPT_GROUPS
        if model_groups and not isinstance(model, xgb.Booster):
            self._warn_once("cv", "tensortap.xgboost: with xgb.cv only hyperparameters and metrics are saved")
        elif model_groups:
            items: list[tuple[str, Any, list[Collection]]] = []
            scalars = _Scalars()  # (float scalars saved raw: one hand-off)
            collections_for = self.collections_for
            step, mode_step = self.step, self.mode_step

            def add(name: str, value: Any) -> None:
                if isinstance(value, float):  # (np.float64 too)
                    plan = plans.get(name, False)
                    if plan is False:
                        plan = plans[name] = self._resolve(name, now)
                    if plan is None:
                        return
                    if plan[1] and not plan[2]:  # (raw, no reductions)
                        scalars.add(name, step, mode_step, value)
                        return
                colls = collections_for(name)
                if colls:
                    items.append((name, value, colls))

            self._save_model_groups(model, model_groups, add)
            if scalars.values and not self.dry_run:
                self._get_writer().submit_scalars(scalars.rows(self.mode.value))
            if items:
                self.write_tensors(items, copy=False)

    def _hand_off_kept(self) -> None:
        """Hand the kept rounds' metrics and hyperparameters to the writer, in one hand-off."""
        kept = self._kept
        if not kept:
            return
        self._kept = []
        if not self.active:
            return
        try:
            records: list[Record] = []
            scalars = _Scalars()  # (metrics saved raw only: one hand-off)
            at = self.schedule.at
            train = _TRAIN.value
            last_now = wanted = resolved = None
            for step, mode_step, values in kept:
                now = at(_TRAIN, mode_step)
                if not now:
                    continue
                if now is not last_now:
                    wanted, last_now = self._wanted(now), now
                    resolved = {}  # (eval, metric) -> (name, save_raw, reductions, save_shape), or None: not saved
                if K.HYPERPARAMETERS in wanted and self.hyperparameters:
                    for k, v in self.hyperparameters.items():
                        value = self._storable_param(k, v)
                        if value is not None:
                            plan = self._resolve(f"hyperparameters/{k}", now)
                            if plan is not None:
                                records.append(Record(plan[0], step, train, mode_step, codec.as_storable(value),
                                                      plan[1], plan[2], save_shape=plan[3]))
                if K.METRICS in wanted or K.LOSSES in wanted:
                    for d, m, last in values:
                        plan = resolved.get((d, m), False)
                        if plan is False:
                            plan = resolved[(d, m)] = self._resolve(f"{d}-{m}", now)
                        if plan is None:
                            continue
                        value = last[0] if isinstance(last, tuple | list) else last
                        if plan[1] and not plan[2]:  # (raw, no reductions)
                            scalars.add(plan[0], step, mode_step, float(value))
                        else:
                            records.append(Record(plan[0], step, train, mode_step, np.array(value, dtype=np.float64),
                                                  plan[1], plan[2], save_shape=plan[3]))
            if self.dry_run:
                return
            if scalars.values:
                self._get_writer().submit_scalars(scalars.rows(train))
            if records:
                self._get_writer().submit_many(records)
        except Exception as e:  # noqa: BLE001 - never break training
            self._fail("saving metrics", e)

    def _resolve(self, name: str, now: list[Collection]) -> tuple[str, bool, tuple, bool] | None:
        """(name, save_raw, reductions, save_shape) of tensor `name` saved with the collections `now`; None: not
        saved."""
        colls = self.schedule.for_tensor(name, now)
        if not colls:
            return None
        self._note_membership(name, colls)
        return (name, *self._plan(name, colls))

    def on_step_end(self) -> None:
        self._hand_off_kept()  # (before readers learn that those rounds passed)

    def on_close(self) -> None:
        self._hand_off_kept()

    def flush(self, timeout: float | None = 30.0) -> None:
        self._hand_off_kept()
        super().flush(timeout)

    def _save_model_groups(self, model: Any, wanted: set[str], add: Any) -> None:
        if wanted & {K.PREDICTIONS, K.LABELS}:
            if self.validation_data is None:
                self._warn_once("no-validation", "tensortap.xgboost: predictions and labels need validation_data")
            else:
                if K.PREDICTIONS in wanted:
                    add("predictions", model.predict(self.validation_data))
                if K.LABELS in wanted:
                    if self._labels is None:
                        self._labels = np.asarray(self.validation_data.get_label())
                    add("labels", self._labels)
        names = None
        if K.FEATURE_IMPORTANCE in wanted:
            names = self._feature_names(model)
            for kind in IMPORTANCE_TYPES:
                try:
                    scores = model.get_score(importance_type=kind)
                except xgb.core.XGBoostError as e:  # e.g. gblinear has weights only
                    self._warn_once(f"importance:{kind}", f"tensortap.xgboost: no {kind} importance: {e}")
                    continue
                total = float(sum(scores.values()))
                for f in names:
                    v = scores.get(f, 0.0)
                    add(f"feature_importance/{kind}/{f}", np.float64(v / total if total else 0.0))
        if K.TREES in wanted:
            self._save_trees(model, add)
        if wanted & {K.FULL_SHAP, K.AVERAGE_SHAP}:
            if self.train_data is None:
                self._warn_once("no-train", "tensortap.xgboost: SHAP values need train_data")
            else:
                shap = self._shap.values(model, self.train_data)
                names = (names or self._feature_names(model)) + ["bias"]
                if K.FULL_SHAP in wanted:
                    per_feature = np.ascontiguousarray(np.moveaxis(shap, -1, 0))  # row i: feature i's values
                    for i, f in enumerate(names):
                        add(f"full_shap/{f}", per_feature[i])
                if K.AVERAGE_SHAP in wanted:
                    avg = shap.reshape(-1, shap.shape[-1]).mean(axis=0, dtype=np.float64)
                    for i, f in enumerate(names):
                        add(f"average_shap/{f}", avg[i])

    def _save_trees(self, model: Any, add: Any) -> None:
        try:
            frame = model.trees_to_dataframe()
        except (ValueError, ImportError) as e:  # gblinear has no trees; pandas missing
            self._warn_once("trees", f"tensortap.xgboost: trees not saved: {e}")
            return
        import pandas as pd

        for column in frame.columns:
            series = frame[column]
            if pd.api.types.is_numeric_dtype(series.dtype):
                value = series.to_numpy()
            else:
                value = np.array(["" if pd.isna(v) else str(v) for v in series.to_numpy(dtype=object)], dtype=str)
            add(f"trees/{column}", value)

    @staticmethod
    def _feature_names(model: Any) -> list[str]:
        names = model.feature_names
        return list(names) if names else [f"f{i}" for i in range(model.num_features())]

    def _storable_param(self, key: str, value: Any) -> Any:
        if isinstance(value, bool | int | float | str | np.generic):
            return np.asarray(value)
        if isinstance(value, list | tuple) and all(isinstance(v, bool | int | float | str) for v in value):
            return np.asarray([str(v) for v in value]) if any(isinstance(v, str) for v in value) else np.asarray(value)
        self._warn_once(f"hp:{key}", f"tensortap.xgboost: hyperparameter {key!r} ({type(value).__name__}) not saved")
        return None
