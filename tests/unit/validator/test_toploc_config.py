"""The validator's ``[toploc]`` section: read from TOML, strict, and handed to every audit it runs.

The thresholds a TOML file sets reach the audit call of a running validator (:func:`run_validator`
with the network calls faked, the audit replaced by a probe that records what it was given and
stops the validator). An unknown key is refused like any other, and so is a proof layout other
than the one workers build, which would reject every honest proof.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from protocol.errors import ConfigError
from protocol.schemas import Verdict
from runtime.config import load_config
from tests.unit.validator.test_refusals import pending_item
from toploc.config import ToplocConfig
from toploc.proof import DEFAULT_CHUNK_SIZE, DEFAULT_TOPK
from validator import node
from validator.config import ValidatorConfig
from validator.progress import ValidatorState


def validator_toml(tmp_path: Path, toploc: str) -> Path:
    path = tmp_path / "validator.toml"
    path.write_text(f'coordinator_url = "http://127.0.0.1:9"\ndata_dir = "{tmp_path / "data"}"\n[toploc]\n{toploc}\n')
    return path


def test_the_toploc_section_loads_from_toml(tmp_path: Path) -> None:
    config = load_config(ValidatorConfig, validator_toml(tmp_path, "max_exp_mismatches = 3\nlogprob_tolerance = 1e-3"))
    assert (config.toploc.max_exp_mismatches, config.toploc.logprob_tolerance) == (3, 1e-3)
    assert config.toploc.max_sign_mismatches == ToplocConfig().max_sign_mismatches
    assert load_config(ValidatorConfig).toploc == ToplocConfig()


def test_an_unknown_toploc_key_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"unknown key 'toploc\.max_exp_mismatch'"):
        load_config(ValidatorConfig, validator_toml(tmp_path, "max_exp_mismatch = 3"))


def test_a_proof_layout_workers_do_not_build_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"toploc\.chunk_size is 16, but workers build proofs with chunk_size = 32"):
        load_config(ValidatorConfig, validator_toml(tmp_path, "chunk_size = 16"))
    with pytest.raises(ConfigError, match=r"toploc\.topk"):
        load_config(ValidatorConfig, None, {"toploc.topk": 64})


def test_the_default_layout_is_the_one_workers_build() -> None:
    assert (ToplocConfig().chunk_size, ToplocConfig().topk) == (DEFAULT_CHUNK_SIZE, DEFAULT_TOPK)


class FakeLedger:
    """The ledger calls a validator makes before and while it audits; one pending submission."""

    def __init__(self, *_args: object) -> None:
        self.handed_out = False

    async def __aenter__(self) -> FakeLedger:
        return self

    async def __aexit__(self, *_exc: object) -> None:
        return None

    async def run_spec(self, _coordinator_id: str) -> Any:
        return SimpleNamespace(environment=SimpleNamespace(kind="builtin", name="reverse_text", config_hash="0" * 64))

    async def register(self, _request: object) -> None:
        return None

    async def pending(self, limit: int, wait_s: float = 0.0) -> Any:
        items = [] if self.handed_out else [pending_item(0)]
        self.handed_out = True
        return SimpleNamespace(submissions=items)


def test_a_running_validator_audits_with_the_configured_thresholds(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = load_config(ValidatorConfig, validator_toml(tmp_path, "max_mant_err_median = 0.25"))
    seen: list[ToplocConfig | None] = []
    stop = asyncio.Event()

    async def nothing(*_args: object, **_kwargs: object) -> None:
        return None

    async def coordinator_id(*_args: object) -> str:
        return "coordinator"

    async def audit(*args: Any) -> None:
        seen.append(args[5])
        stop.set()

    monkeypatch.setattr(node, "check_coordinator", nothing)
    monkeypatch.setattr(node, "check_relays", nothing)
    monkeypatch.setattr(node, "LedgerClient", FakeLedger)
    monkeypatch.setattr(node, "trusted_coordinator_id", coordinator_id)
    monkeypatch.setattr(node, "run_environment", lambda *_args: None)
    monkeypatch.setattr(node, "run_node_gossip", nothing)
    monkeypatch.setattr(node, "audit_pending", audit)
    asyncio.run(asyncio.wait_for(node.run_validator(config, stop), timeout=30))
    assert seen == [config.toploc]
    assert seen[0] is not None and seen[0].max_mant_err_median == 0.25


def test_audit_pending_hands_the_thresholds_to_the_audit(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from tests.unit.validator.test_refusals import OneEngine, RefusingLedger

    given: list[object] = []

    def audited(items: list[Any], _engine: object, _eos: object, toploc: object, _reward: object) -> list[Any]:
        given.append(toploc)
        return [(Verdict(submission_id=item.submission_id, accepted=True), []) for item in items]

    monkeypatch.setattr(node, "audit_submissions_safely", audited)
    thresholds = ToplocConfig(max_exp_mismatches=1)
    coroutine = node.audit_pending(
        RefusingLedger([None]),  # type: ignore[arg-type]
        OneEngine(tmp_path / "weights"),  # type: ignore[arg-type]
        ValidatorState(),
        [pending_item(0)],
        asyncio.Event(),
        thresholds,
    )
    asyncio.run(asyncio.wait_for(coroutine, timeout=30))
    assert given == [thresholds]
