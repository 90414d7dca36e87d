"""Wire schemas refuse unknown fields, versions, NaN and out-of-range numbers; error codes are unique and map back."""

from __future__ import annotations

import math

import pydantic
import pytest

from protocol import errors, schemas
from protocol.schemas import HeartbeatRequest, LeaseRequest, Rollout, SamplingParams, SubmitRequest, Verdict


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


def test_no_wire_message_holds_nan_or_an_infinity() -> None:
    messages = [cls for cls in vars(schemas).values() if isinstance(cls, type) and issubclass(cls, schemas.WireModel)]
    assert len(messages) > 30 and all(cls.model_config.get("allow_inf_nan") is False for cls in messages)
    rollout = {"prompt_index": 0, "sample_index": 0, "completion_ids": [1], "finish_reason": "stop", "proof_b64": ""}
    for bad in (math.nan, math.inf, -math.inf):
        with pytest.raises(pydantic.ValidationError, match="finite"):
            Rollout.model_validate({**rollout, "logprobs": [bad]})
        with pytest.raises(pydantic.ValidationError, match=r"rewards\.0"):
            Verdict(submission_id="s", accepted=True, rewards=[bad])
        with pytest.raises(pydantic.ValidationError, match="tokens_per_s"):
            HeartbeatRequest(policy_versions_held=[], tokens_per_s=bad)


@pytest.mark.parametrize(
    ("model", "values", "field"),
    [
        (Rollout, {"logprobs": [-1e30]}, "logprobs.0"),
        (Rollout, {"completion_ids": [2**31]}, "completion_ids.0"),
        (Rollout, {"prompt_index": 10**30}, "prompt_index"),
        (Verdict, {"rewards": [1e300]}, "rewards.0"),
        (HeartbeatRequest, {"tokens_per_s": 1e300}, "tokens_per_s"),
        (HeartbeatRequest, {"tokens_per_s": -1.0}, "tokens_per_s"),
        (HeartbeatRequest, {"policy_versions_held": [2**31]}, "policy_versions_held.0"),
    ],
)
def test_numbers_have_ranges(model: type[pydantic.BaseModel], values: dict[str, object], field: str) -> None:
    valid: dict[type[pydantic.BaseModel], dict[str, object]] = {
        Rollout: {"prompt_index": 0, "sample_index": 0, "completion_ids": [1], "logprobs": [-0.5]}
        | {"finish_reason": "stop", "proof_b64": ""},
        Verdict: {"submission_id": "s", "accepted": True, "rewards": [0.5]},
        HeartbeatRequest: {"policy_versions_held": [0], "tokens_per_s": 10.0},
    }
    model.model_validate(valid[model])
    with pytest.raises(pydantic.ValidationError, match=field.replace(".", r"\.")):
        model.model_validate({**valid[model], **values})


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
