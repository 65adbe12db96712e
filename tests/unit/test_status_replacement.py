"""The status a merge patch makes (``llmbatch.kube.status``): RFC 7386's rules, and the body of
the status PUT the batch steps send instead of the patch."""

from __future__ import annotations

from typing import Any

import pytest

from llmbatch.kube import merged, status_replacement

# RFC 7386, appendix A: target, patch, result.
RFC_7386_EXAMPLES: list[tuple[Any, Any, Any]] = [
    ({"a": "b"}, {"a": "c"}, {"a": "c"}),
    ({"a": "b"}, {"b": "c"}, {"a": "b", "b": "c"}),
    ({"a": "b"}, {"a": None}, {}),
    ({"a": "b", "b": "c"}, {"a": None}, {"b": "c"}),
    ({"a": ["b"]}, {"a": "c"}, {"a": "c"}),
    ({"a": "c"}, {"a": ["b"]}, {"a": ["b"]}),
    ({"a": {"b": "c"}}, {"a": {"b": "d", "c": None}}, {"a": {"b": "d"}}),
    ({"a": [{"b": "c"}]}, {"a": [1]}, {"a": [1]}),
    (["a", "b"], ["c", "d"], ["c", "d"]),
    ({"a": "b"}, ["c"], ["c"]),
    ({"a": "foo"}, None, None),
    ({"a": "foo"}, "bar", "bar"),
    ({"e": None}, {"a": 1}, {"e": None, "a": 1}),
    ([1, 2], {"a": "b", "c": None}, {"a": "b"}),
    ({}, {"a": {"bb": {"ccc": None}}}, {"a": {"bb": {}}}),
]


@pytest.mark.parametrize(("target", "patch", "result"), RFC_7386_EXAMPLES)
def test_merged_follows_the_rfc_examples(target: Any, patch: Any, result: Any) -> None:
    before = repr(target), repr(patch)
    assert merged(target, patch) == result
    assert (repr(target), repr(patch)) == before  # neither argument is changed


def test_merged_copies_what_the_patch_brings() -> None:
    patch = {"shards": [{"index": 0}]}
    result = merged({}, patch)
    result["shards"][0]["index"] = 9
    assert patch == {"shards": [{"index": 0}]}


def batch(**status: Any) -> dict[str, Any]:
    return {
        "metadata": {
            "name": "batch-1",
            "namespace": "team-a",
            "uid": "u-1",
            "resourceVersion": "42",
            "labels": {"llmbatch.io/pool": "p"},
            "finalizers": ["llmbatch.io/batch"],
        },
        "spec": {"requests": [{"custom_id": str(i)} for i in range(100)]},
        "status": status,
    }


def test_the_replacement_carries_identity_precondition_and_merged_status_only() -> None:
    body = batch(status="validating", requestCounts={"total": 3, "completed": 0}, errors=[1])
    put = status_replacement(
        body,
        {"status": "in_progress", "requestCounts": {"completed": 1}, "errors": None},
        api_version="llmbatch.io/v1alpha1",
        kind="Batch",
    )
    assert put == {
        "apiVersion": "llmbatch.io/v1alpha1",
        "kind": "Batch",
        "metadata": {
            "name": "batch-1",
            "namespace": "team-a",
            "uid": "u-1",
            "resourceVersion": "42",  # the precondition: the version the step decided on
        },
        "status": {"status": "in_progress", "requestCounts": {"total": 3, "completed": 1}},
    }
    assert "spec" not in put  # the API server keeps the stored spec on a status write
    assert body["status"]["status"] == "validating"  # the step's body is not changed


def test_a_body_without_status_gets_the_patch_as_its_status() -> None:
    body = batch()
    del body["status"]
    put = status_replacement(body, {"status": "validating"}, api_version="v", kind="Batch")
    assert put["status"] == {"status": "validating"}
