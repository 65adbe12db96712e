"""The listing index (llmbatch.gateway.listindex): order, updates, pages and cursors, deleted ones
included."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from llmbatch.gateway.listindex import Entry, ListIndex
from llmbatch.gateway.mapping import CursorNotFound

NS = "team-a"


def entry(n: int, group: str | None = None, created: int | None = None, **data: object) -> Entry:
    """Entry ``n``: created at ``n`` (or ``created``), id ``i<n>``."""
    key = (n if created is None else created, f"name-{n:04d}")
    return Entry(f"i{n}", key, {"id": f"i{n}", **data}, group=group)


def ids(page: list[dict[str, object]]) -> list[str]:
    return [str(item["id"]) for item in page]


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def filled(count: int, clock: Clock | None = None, **kwargs: float) -> ListIndex:
    index = ListIndex(clock=clock or Clock(), **kwargs)  # type: ignore[arg-type]
    for n in (3, 0, 4, 1, 2, *range(5, count)):  # not in order: the index sorts
        if n < count:
            index.put(NS, entry(n))
    return index


def walk(
    index: ListIndex, limit: int, descending: bool = True, group: str | None = None
) -> list[str]:
    """Every page, each from the last id of the one before, as the SDK's auto-pagination does."""
    seen: list[str] = []
    after = None
    for _ in range(len(index) + 2):  # bounded: a cursor that does not advance fails, not hangs
        page, more = index.page_after(NS, after, limit, descending=descending, group=group)
        seen += ids(page)
        assert not more or len(page) == limit  # a page short of the limit ends the list
        if not more:
            return seen
        after = seen[-1]
    raise AssertionError(f"pages never ended: {seen[:20]}")


def test_newest_first_and_oldest_first() -> None:
    index = filled(5)
    page, more = index.page_after(NS, None, 3)
    assert (ids(page), more) == (["i4", "i3", "i2"], True)
    page, more = index.page_after(NS, None, 3, descending=False)
    assert (ids(page), more) == (["i0", "i1", "i2"], True)


@pytest.mark.parametrize("limit", [1, 2, 3, 4, 5, 6, 100])
@pytest.mark.parametrize("descending", [True, False])
def test_pages_of_every_size_walk_the_whole_list_once(limit: int, descending: bool) -> None:
    expected = [f"i{n}" for n in range(7)]
    assert walk(filled(7), limit, descending) == (expected[::-1] if descending else expected)


def test_has_more_is_false_on_the_page_that_ends_the_list() -> None:
    index = filled(6)
    assert index.page_after(NS, None, 6)[1] is False
    assert index.page_after(NS, None, 5)[1] is True
    assert index.page_after(NS, "i3", 3) == ([{"id": "i2"}, {"id": "i1"}, {"id": "i0"}], False)
    assert index.page_after(NS, "i0", 3) == ([], False)  # after the last: empty, not an error
    assert index.page_after(NS, "i5", 3, descending=False) == ([], False)


def test_an_update_replaces_the_wire_object_in_place() -> None:
    index = filled(3)
    index.put(NS, entry(1, status="completed"))
    assert index.page_after(NS, None, 10)[0] == [
        {"id": "i2"},
        {"id": "i1", "status": "completed"},
        {"id": "i0"},
    ]
    assert len(index) == 3


def test_an_update_that_moves_the_sort_key_moves_the_entry() -> None:
    index = filled(3)
    index.put(NS, entry(0, created=10))
    assert ids(index.page_after(NS, None, 10)[0]) == ["i0", "i2", "i1"]
    assert len(index) == 3


def test_remove_takes_an_entry_out_of_every_page() -> None:
    index = filled(5)
    assert index.remove(NS, "i2") is True
    assert index.remove(NS, "i2") is False
    assert index.remove("other", "i1") is False
    assert walk(index, 2) == ["i4", "i3", "i1", "i0"]
    assert index.get(NS, "i2") is None
    assert len(index) == 4


@pytest.mark.parametrize(
    ("descending", "expected"), [(True, ["i2", "i1", "i0"]), (False, ["i4", "i5", "i6"])]
)
def test_a_deleted_cursor_pages_on_from_where_it_was(descending: bool, expected: list[str]) -> None:
    index = filled(7)
    index.remove(NS, "i3")
    page, _ = index.page_after(NS, "i3", 3, descending=descending)
    assert ids(page) == expected


def test_a_client_deleting_what_it_pages_through_sees_everything_once() -> None:
    """Retention (or the client itself) deletes each page's files while the SDK pages on."""
    index = filled(10)
    seen: list[str] = []
    after = None
    while True:
        page, more = index.page_after(NS, after, 3)
        seen += ids(page)
        for item in page:
            index.remove(NS, str(item["id"]))
        if not more:
            break
        after = seen[-1]
    assert seen == [f"i{n}" for n in range(9, -1, -1)]
    assert len(index) == 0


def test_a_cursor_never_held_is_not_found() -> None:
    index = filled(3)
    with pytest.raises(CursorNotFound):
        index.page_after(NS, "i99", 3)
    with pytest.raises(CursorNotFound):
        index.page_after("team-empty", "i1", 3)  # a namespace with nothing in it


def test_another_tenants_id_is_not_found_live_or_deleted() -> None:
    index = filled(3)
    index.put("team-b", entry(50))
    index.put("team-b", entry(51))
    index.remove("team-b", "i51")
    for other in ("i50", "i51"):
        with pytest.raises(CursorNotFound):
            index.page_after(NS, other, 3)
    assert ids(index.page_after("team-b", None, 3)[0]) == ["i50"]


def test_tombstones_expire() -> None:
    clock = Clock()
    index = filled(4, clock, tombstone_seconds=60)
    index.remove(NS, "i2")
    clock.now += 59
    assert ids(index.page_after(NS, "i2", 10)[0]) == ["i1", "i0"]
    clock.now += 1
    with pytest.raises(CursorNotFound):
        index.page_after(NS, "i2", 10)


def test_tombstones_are_bounded_per_namespace_oldest_first() -> None:
    index = filled(6, tombstones_per_namespace=2)
    for ident in ("i1", "i2", "i3"):
        index.remove(NS, ident)
    with pytest.raises(CursorNotFound):
        index.page_after(NS, "i1", 10)  # the oldest went
    assert ids(index.page_after(NS, "i2", 10)[0]) == ["i0"]
    assert ids(index.page_after(NS, "i3", 10)[0]) == ["i0"]


def test_an_id_back_again_is_live_not_a_tombstone() -> None:
    index = filled(4)
    index.remove(NS, "i1")
    index.put(NS, entry(1, created=10))  # same id, created anew (a reused name)
    assert ids(index.page_after(NS, "i1", 10)[0]) == ["i3", "i2", "i0"]


def test_groups_page_only_their_members() -> None:
    index = ListIndex()
    for n in range(8):
        index.put(NS, entry(n, group="batch" if n % 2 else "batch_output"))
    page, more = index.page_after(NS, None, 2, group="batch")
    assert (ids(page), more) == (["i7", "i5"], True)
    assert walk(index, 3, group="batch_output") == ["i6", "i4", "i2", "i0"]
    assert index.page_after(NS, None, 10, group="fine-tune") == ([], False)
    # a cursor from the other group: the page continues from where that entry sits
    assert ids(index.page_after(NS, "i4", 10, group="batch")[0]) == ["i3", "i1"]
    index.put(NS, entry(3, group="batch_output"))  # its group changed: it moves sub-list
    assert ids(index.page_after(NS, None, 10, group="batch")[0]) == ["i7", "i5", "i1"]
    assert "i3" in ids(index.page_after(NS, None, 10, group="batch_output")[0])
    index.remove(NS, "i5")
    assert ids(index.page_after(NS, "i5", 10, group="batch")[0]) == ["i1"]


def test_replace_is_the_new_listing_and_buries_what_went() -> None:
    index = filled(5)
    index.replace([(NS, entry(4, status="done")), (NS, entry(2)), (NS, entry(7)), ("b", entry(9))])
    assert index.page_after(NS, None, 10)[0] == [
        {"id": "i7"},
        {"id": "i4", "status": "done"},
        {"id": "i2"},
    ]
    assert ids(index.page_after(NS, "i3", 10)[0]) == ["i2"]  # gone since: a tombstone
    assert ids(index.page_after("b", None, 10)[0]) == ["i9"]
    assert len(index) == 4
    index.replace([(NS, entry(3))])
    assert ids(index.page_after(NS, None, 10)[0]) == ["i3"]
    assert ids(index.page_after(NS, "i7", 10)[0]) == ["i3"]
    with pytest.raises(CursorNotFound):
        index.page_after("b", "i1", 10)


@settings(max_examples=150, deadline=None)
@given(
    ops=st.lists(
        st.tuples(st.sampled_from(["put", "remove"]), st.integers(0, 30), st.integers(0, 5)),
        max_size=80,
    ),
    limit=st.integers(1, 12),
    descending=st.booleans(),
)
def test_pages_equal_a_sort_of_what_is_live(
    ops: list[tuple[str, int, int]], limit: int, descending: bool
) -> None:
    """Against the obvious model: a dict of live entries, sorted per request."""
    index = ListIndex()
    live: dict[str, Entry] = {}
    for op, n, created in ops:
        if op == "put":
            live[f"i{n}"] = entry(n, created=created)
            index.put(NS, live[f"i{n}"])
        else:
            assert index.remove(NS, f"i{n}") == (live.pop(f"i{n}", None) is not None)
    model = [e.id for e in sorted(live.values(), key=lambda e: e.key, reverse=descending)]
    assert walk(index, limit, descending) == model
    assert len(index) == len(live)
