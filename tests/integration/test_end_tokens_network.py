"""End tokens in a real network: workers stop on, and validators check, every end token the checkpoint names.

The policy's configs say generation ends on <|im_end|> (id 2) while its tokenizer ends on
<|im_start|> (id 1), a token this tiny model samples often. A coordinator, an HF `prime-worker join`
and a `prime-validator run` on 127.0.0.1: every accepted completion holds an end token only as its
last token, some end on the tokenizer's, and no honest group is rejected. When workers and
validators took their end tokens from the configs alone, token 1 sat in the middle of accepted
completions, unseen by the termination check.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from sqlalchemy import select

from coordinator.ledger.storage.tables import submissions
from protocol.schemas import Rollout, SubmitRequest
from tests.support.network import ledger_rows, running_network, tiny_policy
from tests.support.shardcast_nodes import wait_until

pytestmark = pytest.mark.slow
CONFIG_EOS, TOKENIZER_EOS = 2, 1


def policy_ending_on_two_tokens(path: Path) -> Path:
    tiny_policy(path, seed=0)
    for name in ("config.json", "generation_config.json"):
        if (path / name).is_file():
            data = json.loads((path / name).read_text())
            data["eos_token_id"] = CONFIG_EOS
            (path / name).write_text(json.dumps(data))
    settings = json.loads((path / "tokenizer_config.json").read_text())
    settings["eos_token"] = "<|im_start|>"  # id 1
    (path / "tokenizer_config.json").write_text(json.dumps(settings))
    return path


def test_workers_stop_on_every_end_token_and_validators_check_each(tmp_path: Path) -> None:
    with running_network(tmp_path, checkpoints=[policy_ending_on_two_tokens(tmp_path / "policy-0")]) as net:
        net.start_worker("worker", "hf", [])
        validator = net.start_validator()

        def accepted_rollouts() -> list[Rollout]:
            assert validator.poll() is None, net.worker_log("validator")
            rows = [row for row in ledger_rows(net.root, select(submissions)) if row.status == "accepted"]
            return [r for row in rows for r in SubmitRequest.model_validate_json(row.body_json).rollouts]

        wait_until(lambda: len(accepted_rollouts()) >= 24, 300, "three accepted groups")
        rollouts = accepted_rollouts()
        inside = [r.completion_ids for r in rollouts if {CONFIG_EOS, TOKENIZER_EOS} & set(r.completion_ids[:-1])]
        assert not inside, f"{len(inside)} accepted completions hold an end token before their end: {inside[:2]}"
        ended = [r for r in rollouts if r.completion_ids[-1] == TOKENIZER_EOS]
        assert ended and all(r.finish_reason == "stop" for r in ended), "nothing ended on the tokenizer's end token"
        rejected = [v["reasons"] for v in net.verdicts().values() if not v["accepted"]]
        assert not rejected, rejected[:3]
