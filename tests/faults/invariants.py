"""What must hold after every fault-suite iteration (docs/reliability.md)."""

from __future__ import annotations

from collections import Counter
from decimal import Decimal
from typing import Any

import orjson

TERMINAL = ("completed", "failed", "expired", "cancelled")


def lines(data: bytes) -> list[dict[str, Any]]:
    return [orjson.loads(raw) for raw in data.splitlines() if raw.strip()]


def check_batch(
    *,
    input_ids: list[str],
    status: dict[str, Any],
    output: list[dict[str, Any]],
    errors: list[dict[str, Any]],
    expect_all_completed: bool = True,
) -> list[str]:
    """The violations of one finished batch (empty: every guarantee held).

    ``status`` is the Batch object's status (camelCase, as kubectl shows it).
    """
    found: list[str] = []
    phase = status.get("status")
    if phase not in TERMINAL:
        return [f"batch not terminal: {phase}"]
    seen = Counter(line["custom_id"] for line in output + errors)
    twice = sorted(cid for cid, n in seen.items() if n > 1)
    if twice:
        found.append(f"custom_ids in more than one line: {twice[:5]}")
    missing = sorted(set(input_ids) - set(seen))
    if missing:
        found.append(f"input lines with no output or error line: {missing[:5]}")
    extra = sorted(set(seen) - set(input_ids))
    if extra:
        found.append(f"lines for requests that were never submitted: {extra[:5]}")
    counts = status.get("requestCounts") or {}
    if counts.get("completed") != len(output) or counts.get("failed") != len(errors):
        found.append(f"request_counts {counts} != {len(output)} output, {len(errors)} error lines")
    if counts.get("total") != len(input_ids):
        found.append(f"request_counts.total {counts.get('total')} != {len(input_ids)} inputs")
    tokens = [0, 0]
    for line in output:
        usage = (line.get("response") or {}).get("body", {}).get("usage") or {}
        tokens[0] += int(usage.get("prompt_tokens") or 0)
        tokens[1] += int(usage.get("completion_tokens") or 0)
    usage = status.get("usage") or {}
    if [usage.get("inputTokens", 0), usage.get("outputTokens", 0)] != tokens:
        found.append(f"status.usage {usage} != the output lines' tokens {tokens}")
    pricing = status.get("pricing") or {}
    if pricing and status.get("cost") is not None:
        expected = (
            Decimal(tokens[0]) * Decimal(pricing.get("inputPerMillion", "0"))
            + Decimal(tokens[1]) * Decimal(pricing.get("outputPerMillion", "0"))
        ) / Decimal(1_000_000)
        if abs(Decimal(status["cost"]) - expected) > Decimal("0.000001"):
            found.append(f"cost {status['cost']} != tokens of the published lines ({expected})")
    if not (status.get("billing") or {}).get("settledAt"):
        found.append("the batch's credit was never settled")
    if expect_all_completed and phase == "completed" and errors:
        codes = Counter((e.get("error") or {}).get("code") for e in errors)
        found.append(f"requests failed under a survivable fault: {dict(codes)}")
    if expect_all_completed and phase != "completed":
        found.append(f"batch ended {phase}, not completed")
    return found
