"""What the custom resources share: the API group, the base model, conditions and prices."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StringConstraints
from pydantic.alias_generators import to_camel

from llmbatch.api.resources.fields import Decimal, Label

GROUP = "llmbatch.io"
VERSION = "v1alpha1"
API_VERSION = f"{GROUP}/{VERSION}"


class CRModel(BaseModel):
    """Base of every custom-resource model: camelCase on the wire, docstrings as descriptions."""

    model_config = ConfigDict(
        alias_generator=to_camel,
        populate_by_name=True,
        use_attribute_docstrings=True,
        extra="ignore",
    )

    def to_k8s(self) -> dict[str, Any]:
        """The camelCase dict the Kubernetes API takes (unset optional fields left out)."""
        return self.model_dump(by_alias=True, exclude_none=True, mode="json")


class Condition(CRModel):
    """A standard Kubernetes condition."""

    type: Label
    """Condition type (CamelCase); each kind's ``conditions`` field says which it sets."""
    status: Literal["True", "False", "Unknown"]
    """Whether the condition holds."""
    reason: Annotated[str, StringConstraints(max_length=1024)] = ""
    """One CamelCase word saying why."""
    message: Annotated[str, StringConstraints(max_length=32768)] = ""
    """Human-readable details."""
    last_transition_time: Annotated[str, StringConstraints(max_length=64)] | None = None
    """When the status last changed (RFC 3339)."""
    observed_generation: int | None = None
    """The metadata.generation this condition was computed for."""


Conditions = Annotated[list[Condition], Field(max_length=16)]


class Pricing(CRModel):
    """Price per one million tokens, fixed on the batch at acceptance."""

    currency: Annotated[str, StringConstraints(max_length=8)] = "USD"
    """ISO currency code."""
    input_per_million: Decimal = "0"
    """Price of 1M input tokens."""
    output_per_million: Decimal = "0"
    """Price of 1M output tokens."""
