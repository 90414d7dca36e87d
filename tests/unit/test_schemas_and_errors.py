"""Wire schemas refuse unknown fields and versions; error codes are unique and map back."""

from __future__ import annotations

import pydantic
import pytest

from protocol import errors
from protocol.schemas import LeaseRequest, SamplingParams, SubmitRequest


def test_unknown_field_and_version_are_refused() -> None:
    assert LeaseRequest.model_validate({"max_tasks": 2}).v == 1
    with pytest.raises(pydantic.ValidationError, match="extra"):
        LeaseRequest.model_validate({"max_tasks": 2, "sneaky": True})
    with pytest.raises(pydantic.ValidationError):
        LeaseRequest.model_validate({"v": 2, "max_tasks": 2})


def test_bounds_are_part_of_the_contract() -> None:
    with pytest.raises(pydantic.ValidationError):
        SamplingParams(temperature=0.0, max_tokens=10)
    with pytest.raises(pydantic.ValidationError):
        SubmitRequest.model_validate(
            {"lease_id": "l", "task_id": "t", "policy_version": 0, "engine": "hf", "rollouts": []}
        )


def test_error_codes_are_unique_and_map_back() -> None:
    classes: list[type[errors.PrimeError]] = [errors.PrimeError, *errors._all_subclasses(errors.PrimeError)]
    codes = [cls.code for cls in classes]
    assert len(codes) == len(set(codes))
    for cls in classes:
        assert errors.error_for_code(cls.code) is cls
    assert errors.error_for_code("no-such-code") is errors.PrimeError


def test_http_status_codes_of_refusals() -> None:
    assert errors.StalePolicyError("x").status_code == 409
    assert errors.ReplayedNonceError("x").status_code == 401
    assert errors.RateLimitedError("x", retry_after_s=2).retry_after_s == 2
