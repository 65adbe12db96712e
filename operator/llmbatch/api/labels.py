"""The Kubernetes recommended labels (``app.kubernetes.io/*``) on the objects the operator
creates: cost tools, dashboards and label selectors group by them.

The chart puts the same keys on its own objects (``managed-by: Helm`` there); what the operator
creates says ``managed-by: llm-batch-operator`` and ``part-of: llm-batch-operator``.
"""

from __future__ import annotations

import re

NAME = "app.kubernetes.io/name"
INSTANCE = "app.kubernetes.io/instance"
COMPONENT = "app.kubernetes.io/component"
PART_OF = "app.kubernetes.io/part-of"
MANAGED_BY = "app.kubernetes.io/managed-by"

PROJECT = "llm-batch-operator"
"""The application every created object is part of, and the manager that creates it."""
EXECUTOR = "llm-batch-executor"
"""The application a slot Job and its pod run (the executor image's name)."""

RECOMMENDED = (NAME, INSTANCE, COMPONENT, PART_OF, MANAGED_BY)
"""The recommended keys; a pool's pod template cannot override them."""

_INVALID_EDGE = re.compile(r"^[^A-Za-z0-9]+|[^A-Za-z0-9]+$")


def label_value(text: str) -> str:
    """``text`` as a valid label value: at most 63 characters, alphanumeric at both ends."""
    return _INVALID_EDGE.sub("", text[:63])


def recommended_labels(*, name: str, instance: str, component: str) -> dict[str, str]:
    """The five recommended labels of one created object."""
    return {
        NAME: name,
        INSTANCE: label_value(instance),
        COMPONENT: component,
        PART_OF: PROJECT,
        MANAGED_BY: PROJECT,
    }
