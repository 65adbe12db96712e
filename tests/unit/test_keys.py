"""Store keys are derived from namespace and id, never trusted from an object."""

from __future__ import annotations

from llmbatch.core.keys import file_key, owned_file_key


def test_owned_file_key_accepts_only_the_derived_key() -> None:
    own = file_key("team-a", "file-1")
    assert owned_file_key("team-a", "file-1", own) == own
    assert owned_file_key("team-a", "file-1", None) == own
    assert owned_file_key("team-a", "file-1", "") == own
    assert owned_file_key("team-a", "file-1", file_key("team-b", "file-1")) is None
    assert owned_file_key("team-a", "file-1", file_key("team-a", "file-2")) is None
    assert owned_file_key("team-a", "file-1", "files/team-a/file-1/../../team-b/x") is None
