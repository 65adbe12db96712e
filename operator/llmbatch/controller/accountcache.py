"""Tenants' CreditAccounts as the operator last saw them: acceptance's first look at a tenant's
account, instead of a GET per accepted batch (#30: one GET per acceptance, a 404 for every
tenant without an account).

The watch feeds the accounts that exist. That an account does *not* exist is known only from a
read: a GET that found none is trusted for :data:`ABSENT_TTL` seconds, unless the watch shows
the account meanwhile. This is how Kubernetes' own quota admission reads ResourceQuotas (an
informer, and a live lookup remembered for 30 s when it has none): an account created moments
before a batch is accepted may be missed only while the watch lags behind its creation — and
never for a batch the gateway reserved credit for at creation (``core.billing.
RESERVED_ANNOTATION``): its acceptance reads the account whatever a recent read found, so its
reservation is charged at its end.

What the cache holds is only ever a first look. Every change of an account is read from the
API server and written with the resourceVersion read (``CreditLedger._update``), and a
reservation found in a cached account is the batch's own (only settlement and the upkeep of
ended or vanished batches remove one).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from llmbatch.api.resources import CREDIT_ACCOUNT_NAME
from llmbatch.controller.batchcache import newer

#: How long a read that found no account is trusted (the watch shows a new account sooner).
ABSENT_TTL = 10.0


@dataclass(frozen=True)
class Look:
    """What the cache knows of one tenant's account."""

    known: bool
    """False: it cannot tell (read the account)."""
    body: dict[str, Any] | None = None
    """The account (read only), or None when it is known not to exist."""


UNKNOWN = Look(known=False)


class AccountCache:
    """CreditAccounts by namespace, from the watch, and the namespaces found without one."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self._accounts: dict[str, dict[str, Any]] = {}
        self._absent: dict[str, float] = {}  # namespace -> when a read found no account

    def notice(self, body: dict[str, Any], *, deleted: bool = False) -> None:
        """A watch event of a CreditAccount (only the one named ``CREDIT_ACCOUNT_NAME`` counts)."""
        meta = body.get("metadata") or {}
        if meta.get("name") != CREDIT_ACCOUNT_NAME:
            return
        namespace = str(meta.get("namespace") or "")
        if deleted:
            self._accounts.pop(namespace, None)
            self._absent[namespace] = self.clock()
            return
        held = self._accounts.get(namespace)
        if held is None or newer(body, held):
            self._accounts[namespace] = body
        self._absent.pop(namespace, None)

    def read(self, namespace: str, body: dict[str, Any] | None) -> None:
        """What a GET of the namespace's account answered (None: there is none)."""
        if body is None:
            if namespace not in self._accounts:
                self._absent[namespace] = self.clock()
            return
        self.notice(body)

    def look(self, namespace: str) -> Look:
        body = self._accounts.get(namespace)
        if body is not None:
            return Look(known=True, body=body)
        found_none = self._absent.get(namespace)
        if found_none is not None and self.clock() - found_none < ABSENT_TTL:
            return Look(known=True)
        return UNKNOWN
