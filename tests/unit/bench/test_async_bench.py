"""The async bench's interval arithmetic: busy unions and the validators' spans from hand-outs to votes."""

from __future__ import annotations

import json
from types import SimpleNamespace

from bench.async_bench import union_length, validation_spans


def test_union_length_counts_overlaps_once() -> None:
    assert union_length([]) == 0.0
    assert union_length([(0.0, 1.0), (0.5, 2.0), (3.0, 4.0), (3.5, 3.6)]) == 3.0


def test_validation_spans_run_from_hand_out_to_last_vote_and_are_clipped() -> None:
    hand_outs = [
        ("v1", 1.0, json.dumps({"submission_ids": ["a", "b"]})),
        ("v1", 5.0, json.dumps({"submission_ids": ["c"]})),  # never voted on: not busy
        ("v2", 9.0, json.dumps({"submission_ids": ["d"]})),
    ]
    votes = [
        SimpleNamespace(validator_id="v1", submission_id="a", posted_at=2.0),
        SimpleNamespace(validator_id="v1", submission_id="b", posted_at=3.0),
        SimpleNamespace(validator_id="v2", submission_id="a", posted_at=4.0),  # v2 was never handed "a"
        SimpleNamespace(validator_id="v2", submission_id="d", posted_at=12.0),
    ]
    assert validation_spans(hand_outs, votes, first=0.0, last=10.0) == {"v1": [(1.0, 3.0)], "v2": [(9.0, 10.0)]}
    assert validation_spans(hand_outs, votes, first=2.5, last=8.0) == {"v1": [(2.5, 3.0)]}
