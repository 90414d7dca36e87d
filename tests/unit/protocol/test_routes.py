"""The shared ``/v1`` route paths: a template fills in only with exactly its parameters, each one path segment."""

from __future__ import annotations

import pytest

from protocol import routes


def test_fill_puts_each_parameter_in_its_place_as_one_path_segment() -> None:
    assert routes.fill(routes.POLICY_VERSION, version=7) == "/v1/policy-versions/7"
    assert routes.fill(routes.POLICY_VERSION, version="a/b c") == "/v1/policy-versions/a%2Fb%20c"
    assert routes.fill(routes.STATUS) == "/v1/status"


@pytest.mark.parametrize("params", [{}, {"version": 1, "extra": 2}, {"versoin": 1}])
def test_fill_refuses_a_missing_misspelt_or_extra_parameter(params: dict[str, int]) -> None:
    with pytest.raises(ValueError, match="takes"):
        routes.fill(routes.POLICY_VERSION, **params)
