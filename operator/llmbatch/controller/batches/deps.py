"""What the phases of the reconciler share: the API, the store, the settings, the pool lookup."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from llmbatch.api.resources import BatchPoolSpec
from llmbatch.controller.config import OperatorConfig
from llmbatch.controller.kube import Kube
from llmbatch.storage.base import ObjectStore

PoolLookup = Callable[[str | None], Awaitable[BatchPoolSpec | None]]
"""A BatchPool's spec by name; None when it does not exist (deleted)."""


@dataclass
class PhaseDeps:
    """The collaborators of one phase module (``run``, ``finalize``)."""

    kube: Kube
    store: ObjectStore
    config: OperatorConfig
    pool_of: PoolLookup
