"""What a training script hands a hook itself: `save_tensor` and `save_scalar` (smdebug's signatures), checked
value by value: one that cannot be saved is skipped, counted (dropped_records) and logged once, never raised
into the training loop."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import numpy as np

from tensortap.collection import CollectionKeys
from tensortap.exceptions import InvalidConfiguration
from tensortap.format import codec
from tensortap.format.records import Record


class ValueSaving:
    """The values a script saves itself (mixed into `tensortap.hooks.base.Hook`)."""

    def save_tensor(
        self, tensor_name: str, tensor_value: Any, collections_to_write: str | Iterable[str] = CollectionKeys.DEFAULT
    ) -> None:
        """Save `tensor_value` at the current step in the named collections (created if missing),
        when their save config saves this step. A name, collection or value that cannot be saved is skipped,
        counted (dropped_records) and logged once; it never raises into the training loop."""
        if not self.active:
            return
        if not isinstance(tensor_name, str) or not tensor_name:
            self._skip_value(tensor_name, tensor_value, "the tensor name must be a non-empty string")
            return
        names = [collections_to_write] if isinstance(collections_to_write, str) else collections_to_write
        try:
            names = list(names)
        except TypeError:
            names = [names]
        if not names or not all(isinstance(n, str) and n for n in names):
            self._skip_value(tensor_name, tensor_value, f"collections_to_write={collections_to_write!r} must be a "
                                                        "collection name or a list of them")
            return
        if self._too_large(tensor_name, tensor_value):
            return
        with self.guard("save_tensor"):
            self._ensure_step()
            colls = []
            for n in names:
                c = self.collection_manager.get(n)
                if c.name not in self.include_collections and n != CollectionKeys.DEFAULT:
                    self.include_collections.append(c.name)  # naming a collection asks for it
                    self._invalidate_caches()
                colls.append(c)
            now = self.collections_to_save()
            colls = [c for c in colls if c in now or self._collection_saves_now(c)]
            if colls:
                try:
                    value = codec.as_storable(tensor_value)
                except Exception as e:  # noqa: BLE001 - any object may be handed over: none breaks training
                    self._skip_value(tensor_name, tensor_value, str(e) or type(e).__name__)
                    return
                self.write_tensor(tensor_name, value, colls)

    def _skip_value(self, name: Any, value: Any, why: str) -> None:
        """A value handed over during training that cannot be saved: skipped, counted in dropped_records, and
        logged once per tensor (naming it and the value's type); the hook and training go on."""
        self._dropped_here += 1
        self._warn_once(f"bad-value:{name!r}", f"tensortap: {name!r} not saved: {why} (got a "
                                               f"{type(value).__module__}.{type(value).__qualname__}); such values "
                                               "are skipped and counted (dropped_records), training goes on")

    def _too_large(self, name: str, value: Any) -> bool:
        """A value larger than the writer may hold (max_pending_bytes) is dropped before anything copies it
        (a broadcast view's copy could take all the memory): counted in dropped_records, warned once."""
        nbytes = getattr(value, "nbytes", None)
        limit = self._writer_opts["max_pending_bytes"]
        if isinstance(nbytes, int) and nbytes > limit:
            self._dropped_here += 1
            self._warn_once("too-large", f"tensortap: {name!r} not saved: {nbytes} bytes is more than "
                                         f"max_pending_bytes={limit}; such values are dropped and counted "
                                         "(dropped_records)")
            return True
        return False

    def save_scalar(self, name: str, value: Any, sm_metric: bool = False, timestamp: float | None = None) -> None:
        """Save a scalar as `scalar/<name>` at the current step, whatever the save config (smdebug's signature).

        `sm_metric=True` also puts it in the `sm_metrics` collection (smdebug sends such scalars to SageMaker
        Metrics; here they are the job's metrics, shown with its losses). `timestamp` (UNIX seconds) is accepted
        for smdebug's scripts; tensortap's store keeps no wall time per value (docs/migration.md). A name or value
        that cannot be saved (None, text, several numbers) is skipped, counted in dropped_records and logged once;
        it never raises into the training loop."""
        if not isinstance(sm_metric, bool):
            raise InvalidConfiguration(f"save_scalar({name!r}, ..., sm_metric={sm_metric!r}): sm_metric must be True "
                                       "or False (the third parameter is sm_metric, as in smdebug; pass timestamp=)")
        if timestamp is not None and (isinstance(timestamp, bool) or not isinstance(timestamp, int | float)):
            raise InvalidConfiguration(f"save_scalar({name!r}, ..., timestamp={timestamp!r}): timestamp must be None "
                                       "or a number of seconds")
        if not self.active:
            return
        if not isinstance(name, str) or not name:
            self._skip_value(name, value, "the scalar name must be a non-empty string")
            return
        try:
            size = np.size(value)
            kind = np.asarray(value).dtype.kind if size == 1 and value is not None else ""
        except Exception:  # noqa: BLE001 - any object may be handed over: none breaks training
            size, kind = -1, ""
        if size != 1 or kind not in tuple("biufc"):
            self._skip_value(f"scalar/{name}", value, "save_scalar needs a single number")
            return
        if self._scalars_wait_for_step and not self.clock.in_step:
            # Between the framework's own steps (before training, between fit and evaluate, after it): saved at
            # the next step, as smdebug saves them at its next write; steps stay the framework's.
            self._outside_scalars.append((name, np.asarray(value).reshape(()).copy(), sm_metric, timestamp))
            return
        with self.guard("save_scalar"):
            self._ensure_step()
            colls = [self.collection_manager.get(CollectionKeys.SCALARS)]
            if sm_metric:
                colls.append(self.collection_manager.get(CollectionKeys.SM_METRICS))
            full = f"scalar/{name}"
            self._note_membership(full, colls)
            if not self.dry_run:
                arr = np.asarray(value).reshape(())
                self._get_writer().submit(
                    Record(name=full, step=self.step, mode=self.mode.value,
                           mode_step=self.mode_steps[self.mode], value=codec.as_storable(arr))
                )

    def _save_outside_scalars(self) -> None:
        """Save the scalars kept since the last step (see save_scalar) at the current one."""
        kept, self._outside_scalars = self._outside_scalars, []
        wait, self._scalars_wait_for_step = self._scalars_wait_for_step, False
        try:
            for name, value, sm_metric, timestamp in kept:
                self.save_scalar(name, value, sm_metric, timestamp)
        finally:
            self._scalars_wait_for_step = wait
