"""Batches through their lifecycle: ``reconciler`` (one step per call) over one module per phase
(``validate``, ``run``, ``finalize``), the typed step (``step``), GPU time (``gputime``) and the
merge of shard chunks into the result files (``merge``)."""

from llmbatch.controller.batches.reconciler import BatchReconciler
from llmbatch.controller.batches.step import BatchView, Rejected, Step

__all__ = ["BatchReconciler", "BatchView", "Rejected", "Step"]
