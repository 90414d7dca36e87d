"""The validator's thresholds: the run precision's calibrations, with the ``[toploc]`` section on top.

The thresholds a TOML file sets reach the audit call of a running validator (:func:`run_validator`
with the network calls faked, the audit replaced by a probe that records what it was given and
stops the validator), on top of the run's thresholds: for each, the loosest calibration of the run
spec's precision over every engine a worker may name, so the engine a submission names changes
nothing. A run spec declaring a precision with no calibration stops the validator at start-up. An
unknown key is refused like any other, and so is a proof layout other than the one workers build,
which would reject every honest proof.
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
from tests.support.ledger_helpers import submission_for
from tests.unit.validator.test_refusals import pending_item
from toploc.calibrations import CalibrationKey, thresholds
from toploc.config import ToplocConfig
from toploc.proof import DEFAULT_CHUNK_SIZE, DEFAULT_TOPK
from validator import run as validator_run
from validator.audit import Thresholds
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

    precision = "bfloat16"

    def __init__(self, *_args: object) -> None:
        self.handed_out = False

    async def __aenter__(self) -> FakeLedger:
        return self

    async def __aexit__(self, *_exc: object) -> None:
        return None

    async def run_spec(self, _coordinator_id: str) -> Any:
        environment = SimpleNamespace(kind="builtin", name="reverse_text", config_hash="0" * 64)
        return SimpleNamespace(environment=environment, precision=self.precision, run_name="demo", lora=None)

    async def register(self, _request: object) -> None:
        return None

    async def pending(self, limit: int, wait_s: float = 0.0) -> Any:
        items = [] if self.handed_out else [pending_item(0)]
        self.handed_out = True
        return SimpleNamespace(submissions=items)


def start_validator(
    config: ValidatorConfig, monkeypatch: pytest.MonkeyPatch, ledger: type[FakeLedger] = FakeLedger
) -> list[Thresholds]:
    """Run the validator with the network faked until its first audit; what that audit was handed."""
    seen: list[Thresholds] = []
    stop = asyncio.Event()

    async def nothing(*_args: object, **_kwargs: object) -> None:
        return None

    async def coordinator_id(*_args: object) -> str:
        return "coordinator"

    async def audit(*args: Any) -> None:
        seen.append(args[5])
        stop.set()

    monkeypatch.setattr(validator_run, "check_coordinator", nothing)
    monkeypatch.setattr(validator_run, "check_relays", nothing)
    monkeypatch.setattr(validator_run, "LedgerClient", ledger)
    monkeypatch.setattr(validator_run, "trusted_coordinator_id", coordinator_id)
    monkeypatch.setattr(validator_run, "run_environment", lambda *_args: None)
    monkeypatch.setattr(validator_run, "run_node_gossip", nothing)
    monkeypatch.setattr(validator_run, "audit_pending", audit)
    asyncio.run(asyncio.wait_for(validator_run.run_validator(config, stop), timeout=30))
    return seen


def test_a_running_validator_audits_with_the_run_precisions_calibration_and_its_own_thresholds(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = load_config(ValidatorConfig, validator_toml(tmp_path, "max_mant_err_median = 0.25"))
    seen = start_validator(config, monkeypatch)
    assert seen == [Thresholds("bfloat16", config.toploc)]
    chosen = seen[0].config()
    assert chosen.max_mant_err_median == 0.25, "the operator's setting wins"
    calibrated = [thresholds(CalibrationKey("bfloat16", engine)) for engine in ("hf", "vllm")]
    assert chosen.max_mant_err_mean == max(c["max_mant_err_mean"] for c in calibrated)
    assert chosen.sampling_tolerance == max(c["sampling_tolerance"] for c in calibrated)


def test_a_run_with_an_uncalibrated_precision_stops_the_validator(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    class Float16Run(FakeLedger):
        precision = "float16"

    config = load_config(ValidatorConfig, validator_toml(tmp_path, ""))
    with pytest.raises(ConfigError) as refused:
        start_validator(config, monkeypatch, Float16Run)
    assert "precision float16" in refused.value.message
    assert "python -m bench.toploc_calibrate --dtype float16 --engine hf --write" in refused.value.message


def test_every_submission_is_audited_with_the_run_thresholds_whatever_engine_it_names(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from tests.unit.validator.test_refusals import OneEngine, RefusingLedger

    given: dict[str, ToplocConfig] = {}
    num_calls = 0

    def audited(items: list[Any], _engine: object, _eos: object, toploc: ToplocConfig, *_rest: object) -> list[Any]:
        nonlocal num_calls
        num_calls += 1
        for item in items:
            given[item.submission_id] = toploc
        return [(Verdict(submission_id=item.submission_id, accepted=True), []) for item in items]

    monkeypatch.setattr(validator_run, "audit_submissions_safely", audited)
    items = [pending_item(i) for i in range(3)]
    items[1] = items[1].model_copy(update={"submission": submission_for(items[1].task, engine="vllm")})
    ledger = RefusingLedger([None] * 3)
    thresholds_of_run = Thresholds("bfloat16", ToplocConfig())
    coroutine = validator_run.audit_pending(
        ledger,  # type: ignore[arg-type]
        OneEngine(tmp_path / "weights"),  # type: ignore[arg-type]
        ValidatorState(),
        items,
        asyncio.Event(),
        thresholds_of_run,
    )
    asyncio.run(asyncio.wait_for(coroutine, timeout=30))
    assert ledger.posted == ["s-0", "s-1", "s-2"], "verdicts go out in the order the ledger handed them"
    assert given["s-0"] == given["s-1"] == given["s-2"] == thresholds_of_run.config()
    assert num_calls == 1, "one prefill batch for the version, whatever engines the submissions name"
    hf_only = ToplocConfig(**thresholds(CalibrationKey("bfloat16", "hf")))
    assert given["s-0"].sampling_tolerance > hf_only.sampling_tolerance, "the loosest engine's, for every label"


def test_audit_pending_hands_the_thresholds_to_the_audit(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from tests.unit.validator.test_refusals import OneEngine, RefusingLedger

    given: list[object] = []

    def audited(items: list[Any], _engine: object, _eos: object, toploc: object, *_rest: object) -> list[Any]:
        given.append(toploc)
        return [(Verdict(submission_id=item.submission_id, accepted=True), []) for item in items]

    monkeypatch.setattr(validator_run, "audit_submissions_safely", audited)
    thresholds = ToplocConfig(max_exp_mismatches=1)
    coroutine = validator_run.audit_pending(
        RefusingLedger([None]),  # type: ignore[arg-type]
        OneEngine(tmp_path / "weights"),  # type: ignore[arg-type]
        ValidatorState(),
        [pending_item(0)],
        asyncio.Event(),
        thresholds,
    )
    asyncio.run(asyncio.wait_for(coroutine, timeout=30))
    assert given == [thresholds]
