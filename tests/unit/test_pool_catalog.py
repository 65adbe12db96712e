"""The pool catalog acceptance chooses a batch's pool from: the BatchPools the watch showed,
a fresh listing only when the watch shows none serving the batch's model."""

from __future__ import annotations

import asyncio
import pathlib
from typing import Any

from llmbatch.controller.poolcatalog import CONFIRM_SECONDS, PoolCatalog
from tests.fixtures.builders import make_batch, make_input_file, make_pool
from tests.fixtures.reconciler import ReconcilerHarness


class Listing:
    """The API server's BatchPools: its listing and its reads, counting the calls."""

    def __init__(self, *pools: dict[str, Any]) -> None:
        self.pools = list(pools)
        self.calls = 0
        self.reads = 0

    async def __call__(self) -> list[dict[str, Any]]:
        self.calls += 1
        return self.pools

    async def read(self, name: str) -> dict[str, Any] | None:
        self.reads += 1
        return next((p for p in self.pools if p["metadata"]["name"] == name), None)


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def catalog_of(listing: Listing, clock: Clock | None = None) -> PoolCatalog:
    return PoolCatalog(listing, listing.read, clock or Clock())


def chosen(catalog: PoolCatalog, model: str, wanted: str | None = None) -> str | None:
    pool, _ = asyncio.run(catalog.choose(model, wanted))
    return None if pool is None else str(pool["metadata"]["name"])


def test_a_pool_the_watch_showed_is_chosen_without_a_listing() -> None:
    listing = Listing(make_pool("pool-a", models=("m",)))
    clock = Clock()
    catalog = catalog_of(listing, clock)
    catalog.notice(make_pool("pool-a", models=("m",)))
    for _ in range(3):
        assert chosen(catalog, "m") == "pool-a"
    assert listing.calls == 0
    assert listing.reads == 1  # confirmed once per CONFIRM_SECONDS, not once per batch
    clock.now += CONFIRM_SECONDS
    assert chosen(catalog, "m") == "pool-a"
    assert listing.reads == 2


def test_a_pool_deleted_while_the_watch_was_away_is_not_chosen() -> None:
    """A watch that restarts lists the pools again and reports none deleted meanwhile: the
    read that confirms a chosen pool finds it gone, and the listing decides."""
    listing = Listing(make_pool("pool-b", models=("m",)))
    catalog = catalog_of(listing)
    catalog.notice(make_pool("pool-a", models=("m",)))  # deleted since; no event said so
    assert chosen(catalog, "m") == "pool-b"
    assert chosen(catalog, "m") == "pool-b"


def test_a_pool_being_deleted_is_never_chosen() -> None:
    going = make_pool("pool-a", models=("m",))
    going["metadata"]["deletionTimestamp"] = "2026-12-01T00:00:00Z"
    listing = Listing(going)
    catalog = catalog_of(listing)
    catalog.notice(going)
    assert chosen(catalog, "m") is None


def test_pools_are_chosen_in_the_order_the_api_server_lists_them() -> None:
    pools = make_pool("pool-a", models=("m",)), make_pool("pool-b", models=("m",))
    catalog = catalog_of(Listing(*pools))
    catalog.notice(pools[1])
    catalog.notice(pools[0])
    assert chosen(catalog, "m") == "pool-a"  # by name, as a listing is ordered
    assert chosen(catalog, "m", wanted="pool-b") == "pool-b"


def test_a_model_the_watch_shows_no_pool_for_is_looked_up_in_a_fresh_listing() -> None:
    """A pool created a moment before the batch, before the watch showed it, still serves it;
    a model no pool serves is refused from the fresh listing."""
    listing = Listing(make_pool("pool-a", models=("m",)), make_pool("pool-new", models=("n",)))
    catalog = catalog_of(listing)
    catalog.notice(make_pool("pool-a", models=("m",)))
    assert chosen(catalog, "n") == "pool-new"
    assert chosen(catalog, "x") is None
    assert listing.calls == 2


def test_a_deleted_pool_leaves_the_catalog_and_an_edit_replaces_it() -> None:
    listing = Listing(make_pool("pool-a", models=("n",)))  # what the API server holds now
    catalog = catalog_of(listing)
    catalog.notice(make_pool("pool-a", models=("m",)))
    catalog.notice(make_pool("pool-a", models=("n",)))  # models edited
    assert chosen(catalog, "m") is None
    assert chosen(catalog, "n") == "pool-a"
    catalog.notice(make_pool("pool-a", models=("n",)), deleted=True)
    listing.pools = []
    assert chosen(catalog, "n") is None


def test_acceptance_with_the_pool_in_the_catalog_lists_no_pools(tmp_path: pathlib.Path) -> None:
    """The reconciler's validation chooses from the catalog the pool watch fills
    (``handlers.pool_seen``): accepting a batch sends no listing of BatchPools."""
    h = ReconcilerHarness(tmp_path)
    pool = h.kube.add("batchpools", make_pool())
    h.reconciler.pool_catalog.notice(pool)
    file_id = "file-00000000000000000000000000000001"
    h.kube.add("batchfiles", make_input_file(h.store, file_id, 3))
    h.kube.add("batches", make_batch("batch-" + "a" * 24, input_file_id=file_id))
    h.step("batch-" + "a" * 24)
    assert h.status("batch-" + "a" * 24)["pool"] == "pool-a"
    assert ("list", "batchpools", "") not in h.kube.calls


def test_an_operator_chooses_only_the_pools_it_serves() -> None:
    """LLMBATCH_POOLS: operators on disjoint tenants and pools; one never accepts a batch into
    a pool another schedules (its batches would never be placed), from the watch or a listing."""
    theirs, ours = make_pool("pool-theirs", models=("m",)), make_pool("pool-ours", models=("m",))
    listing = Listing(theirs, ours)
    catalog = PoolCatalog(listing, listing.read, Clock(), served=lambda name: name == "pool-ours")
    catalog.notice(theirs)
    assert chosen(catalog, "m") == "pool-ours"  # from the listing: the watch showed only theirs
    assert chosen(catalog, "m", wanted="pool-theirs") is None
    listing.pools = [theirs]
    catalog = PoolCatalog(listing, listing.read, Clock(), served=lambda name: name == "pool-ours")
    assert chosen(catalog, "m") is None
