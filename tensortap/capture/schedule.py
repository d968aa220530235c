"""The save schedule: which included collections save at a step of a mode, and the next step that saves anything.

Framework-neutral: it knows collections, their save configs and the hook's default save config, nothing of a
framework. It answers from caches that hold while the collections and configs stay the same; whoever changes
them calls `invalidate()`. Answers are lists of collections; the same list object is returned while the set
saving stays the same, so a caller may key its own plans on the list's identity.
"""

from __future__ import annotations

import math
from collections.abc import Callable

from tensortap.collection import (
    SM_METRIC_COLLECTIONS,
    TRAIN_ONLY_COLLECTIONS,
    Collection,
    CollectionKeys,
    CollectionManager,
)
from tensortap.config import SaveConfig, SaveConfigMode
from tensortap.modes import EVAL, PREDICT, TRAIN, ModeKeys

#: the answer when nothing saves (never mutated)
NOTHING: list[Collection] = []


def _every_eval_step(cfg: SaveConfig) -> SaveConfig:
    """`cfg` with EVAL and PREDICT saving at every step where they have the same config as TRAIN."""
    train = cfg.get_save_config(TRAIN)
    modes = cfg.mode_save_configs
    changed = False
    for m in (EVAL, PREDICT):
        own = cfg.get_save_config(m)
        if own == train and own.save_interval != 1:
            modes[m] = SaveConfigMode(1, own.start_step, own.end_step, own.save_steps)
            changed = True
    return SaveConfig(modes) if changed else cfg


class SaveSchedule:
    """What saves when, for the collections named in `include` (the same list the hook keeps: change it, then
    call `invalidate()`), with `default` as the save config of every collection that has none of its own."""

    def __init__(self, collections: CollectionManager, include: list[str], default: SaveConfig,
                 save_all: bool = False):
        self.collections = collections
        self.include = include
        self.save_all = save_all
        self._default = default
        #: changes whenever answers of `for_tensor` may change (callers key caches derived from them on it)
        self.generation = 0
        self.invalidate()

    @property
    def default(self) -> SaveConfig:
        return self._default

    @default.setter
    def default(self, value: SaveConfig) -> None:
        self._default = value
        self.invalidate()

    def invalidate(self) -> None:
        """Collections, their configs or the included set may have changed: forget every answer."""
        self._included: list[Collection] | None = None
        self._merged: dict[int, SaveConfig] = {}
        # per mode: [(collection, its config in the mode)], and the config they all share (None if they differ)
        self._by_mode: dict[ModeKeys, tuple[list[tuple[Collection, SaveConfigMode]], SaveConfigMode | None]] = {}
        self._matches: dict[str, list[Collection]] = {}  # tensor name -> included collections matching it
        self._for: dict[str, list[Collection]] = {}  # tensor name -> those saving in `_for_set`
        self._for_set: list[Collection] = NOTHING
        self._last: list[Collection] = NOTHING
        self._last_key: tuple[ModeKeys, int] | None = None
        self.generation += 1

    def included(self) -> list[Collection]:
        if self._included is None:
            get = self.collections.get
            if CollectionKeys.ALL in self.include and self.save_all:
                self._included = list(self.collections.get_collections().values())
            else:
                self._included = [get(n) for n in self.include]
        return self._included

    def config_of(self, c: Collection) -> SaveConfig:
        """`c`'s save config, its unset modes taken from the default. Losses and metrics save at every EVAL and
        PREDICT step unless that mode has a config of its own (one that differs from TRAIN's): an evaluation
        once per epoch then gives a curve, not one point per `save_interval` epochs."""
        if c.save_config is None and c.name not in SM_METRIC_COLLECTIONS:
            return self._default
        merged = self._merged.get(id(c))
        if merged is None:
            merged = c.save_config.merge_default(self._default) if c.save_config is not None else self._default
            if c.name in SM_METRIC_COLLECTIONS:
                merged = _every_eval_step(merged)
            self._merged[id(c)] = merged
        return merged

    def saves_at(self, c: Collection, mode: ModeKeys, mode_step: int) -> bool:
        """Whether collection `c` (included or not) saves at step `mode_step` of `mode`."""
        if mode in (EVAL, PREDICT) and c.name in TRAIN_ONLY_COLLECTIONS:
            return False
        return self.config_of(c).should_save_step(mode, mode_step)

    def _mode(self, mode: ModeKeys) -> tuple[list[tuple[Collection, SaveConfigMode]], SaveConfigMode | None]:
        hit = self._by_mode.get(mode)
        if hit is None:
            train_only = mode in (EVAL, PREDICT)
            sched = [(c, self.config_of(c).get_save_config(mode)) for c in self.included()
                     if not (train_only and c.name in TRAIN_ONLY_COLLECTIONS)]
            cfgs = {cfg for _c, cfg in sched}
            hit = self._by_mode[mode] = (sched, cfgs.pop() if len(cfgs) == 1 else None)
        return hit

    def at(self, mode: ModeKeys, mode_step: int) -> list[Collection]:
        """The included collections saving at step `mode_step` of `mode` (NOTHING if none)."""
        if self._last_key is not None and self._last_key[1] == mode_step and self._last_key[0] is mode:
            return self._last
        sched, shared = self._mode(mode)
        if shared is not None:  # the usual case: one test decides for every collection
            now = [c for c, _cfg in sched] if shared.should_save_step(mode_step) else NOTHING
        else:
            now = [c for c, cfg in sched if cfg.should_save_step(mode_step)] or NOTHING
        if now is not NOTHING:
            if now == self._for_set:
                now = self._for_set
            else:
                self._for_set = now
                self._for.clear()
                self.generation += 1
        self._last, self._last_key = now, (mode, mode_step)
        return now

    def next_saving_step(self, mode: ModeKeys, mode_step: int,
                         where: Callable[[Collection], bool] | None = None) -> float:
        """The first step >= `mode_step` of `mode` at which an included collection (one for which `where` is
        true, when given) saves (inf if none)."""
        sched, shared = self._mode(mode)
        if where is not None:
            return min((cfg.next_save_step(mode_step) for c, cfg in sched if where(c)), default=math.inf)
        if shared is not None:
            return shared.next_save_step(mode_step)
        return min((cfg.next_save_step(mode_step) for _c, cfg in sched), default=math.inf)

    def for_tensor(self, name: str, now: list[Collection]) -> list[Collection]:
        """The collections of `now` (an answer of `at`) that contain tensor `name`."""
        if not now:
            return []
        if now is not self._for_set:
            self._for_set = now
            self._for.clear()
            self.generation += 1
        hit = self._for.get(name)
        if hit is None:
            colls = self._matches.get(name)
            if colls is None:
                colls = self._matches[name] = [c for c in self.included() if c.matches(name)]
            hit = self._for[name] = [c for c in colls if c in now]
        return hit
