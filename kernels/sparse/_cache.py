"""A per-plan cache of what is built from a :class:`batchlu.kernels.sparse.Plan` on first use."""

from __future__ import annotations

import collections
import threading


class PerPlan:
    """``PerPlan(build)(plan)``: ``build(plan)``, made on first use and cached by the plan's digest
    (the last ``keep`` plans of this process), so that copies of one plan (unpickled in each task)
    share it. Two threads asking at once may both build; the first stored wins."""

    def __init__(self, build, keep: int = 4):
        self.build, self.keep = build, keep
        self._cache: collections.OrderedDict = collections.OrderedDict()
        self._lock = threading.Lock()

    def __call__(self, plan):
        key = plan.digest
        with self._lock:
            found = self._cache.get(key)
            if found is not None:
                self._cache.move_to_end(key)
                return found
        made = self.build(plan)
        with self._lock:
            made = self._cache.setdefault(key, made)
            while len(self._cache) > self.keep:
                self._cache.popitem(last=False)
            return made
