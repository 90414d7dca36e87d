"""Environments through the real network: coordinator, HF worker and validator processes on 127.0.0.1.

For each adapter (reasoning_gym, python, verifiers v1 and v0) the run serves the environment's prompts,
and every accepted submission carries the rewards the validator recomputed with the
environment's own scorer: the test recomputes them here, from the ledger's rows (the prompts'
example indices and the worker's completion tokens), with the same environment and tokenizer.
A validator whose environment differs from the signed run spec (another argument, another
version of the code) refuses to start and says why; a coordinator whose environment has a
non-deterministic reward refuses to start. A completion cut at ``max_tokens`` without EOS is
accepted with the environment's minimum reward, whatever its text would have scored.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import tomli_w
from pydantic import TypeAdapter
from sqlalchemy import select

from coordinator.ledger.storage.tables import submissions, tasks
from environments.base import Environment
from environments.config import EnvironmentConfig
from environments.loader import load_environment
from environments.truncation import is_truncated
from node.startup import eos_token_ids
from protocol.schemas import SubmitRequest, Verdict
from tests.support.network import BIN, REPO_ROOT, REVERSE_TEXT, Network, ledger_rows, running_network
from tests.support.shardcast_nodes import wait_until

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1500)]  # ecosystem imports are slow on a busy machine

ENVS_DIR = REPO_ROOT / "tests" / "envs"
TASKSETS_DIR = ENVS_DIR / "site"
"""Where the tests' verifiers tasksets live, importable as top-level modules like installed packages."""
START_TIMEOUT_S = 300
"""The ecosystem packages take a while to import on a busy machine."""
SPELL = {"type": "reasoning_gym", "dataset": "spell_backward", "seed": 1, "size": 1000, "args": {"max_word_len": 5}}


def start_model() -> Path:
    from trainer.resolve import resolve_model_path

    return resolve_model_path("builtin:tiny-qwen2")


def accepted(net: Network) -> list[tuple[dict[int, dict[str, Any]], SubmitRequest, Verdict]]:
    """(task prompts by index, submission, final verdict) of every accepted submission."""
    prompts = {row.task_id: json.loads(row.prompts_json) for row in ledger_rows(net.root, select(tasks))}
    found = []
    for row in ledger_rows(net.root, select(submissions)):
        if row.status == "accepted":
            by_index = {p["prompt_index"]: p for p in prompts[row.task_id]}
            found.append(
                (
                    by_index,
                    SubmitRequest.model_validate_json(row.body_json),
                    Verdict.model_validate_json(row.verdict_json),
                )
            )
    return found


def check_recomputed_rewards(
    net: Network, section: dict[str, Any], importable: Path | None = None, min_submissions: int = 2
) -> set[str]:
    """Wait for accepted submissions and check each verdict against the environment scored here (its module
    imported from ``importable`` when given, as the network's nodes import it); the reward names."""
    wait_until(lambda: len(accepted(net)) >= min_submissions, 300, f"{min_submissions} accepted submissions")
    if importable is not None:
        sys.path.insert(0, str(importable))
    try:
        environment = load_environment(TypeAdapter(EnvironmentConfig).validate_python(section))
        return _check_verdicts(net, environment)
    finally:
        if importable is not None:
            sys.path.remove(str(importable))


def _check_verdicts(net: Network, environment: Environment) -> set[str]:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(start_model()))
    eos = {tokenizer.eos_token_id}
    names: set[str] = set()
    for prompts, submission, verdict in accepted(net):
        assert len(verdict.rewards) == len(submission.rollouts) > 0
        for position, rollout in enumerate(submission.rollouts):
            ids = list(rollout.completion_ids)
            stopped = bool(ids) and ids[-1] in eos
            ids = ids[:-1] if stopped else ids
            example = environment.example(prompts[rollout.prompt_index]["example_index"])
            scores = environment.score(example, tokenizer.decode(ids, skip_special_tokens=True))
            # the run's truncation rule: a completion cut at max_tokens earns nothing (these rewards are >= 0)
            expected = dict(scores.rewards) if stopped else dict.fromkeys(scores.rewards, 0.0)
            assert verdict.rewards[position] == pytest.approx(sum(scores.weights[k] * v for k, v in expected.items()))
            for name, value in expected.items():
                assert verdict.reward_components[name][position] == pytest.approx(value)
        names |= set(verdict.reward_components)
    return names


def refused_validator(net: Network, name: str, *extra: str, pythonpath: str | None = None) -> str:
    """Start a validator that must refuse: wait for its exit and return its log."""
    proc = net.start_validator(name, *extra, pythonpath=pythonpath)
    proc.wait(timeout=240)
    assert proc.returncode != 0
    return " ".join((net.root / f"{name}.log").read_text(errors="replace").split())  # unwrapped


def test_reasoning_gym_rewards_are_recomputed_and_another_argument_is_refused(tmp_path: Path) -> None:
    with running_network(tmp_path, [start_model()], environment=SPELL, start_timeout_s=START_TIMEOUT_S) as net:
        net.start_worker("worker", "hf", [])
        net.start_validator()
        assert check_recomputed_rewards(net, SPELL) == {"score_answer"}
        other = tmp_path / "other.toml"
        other.write_text(tomli_w.dumps({"environment": {**SPELL, "args": {"max_word_len": 6}}}))
        log = refused_validator(net, "validator-other", "-c", str(other))
        assert "'max_word_len': 6" in log and "set [environment] to the run's" in log


def test_python_environment_rewards_are_recomputed_and_other_code_is_refused(tmp_path: Path) -> None:
    ours, theirs = tmp_path / "ours", tmp_path / "theirs"
    for directory in (ours, theirs):
        directory.mkdir()
        shutil.copyfile(ENVS_DIR / "words.py", directory / "keyword_env.py")
    with (theirs / "keyword_env.py").open("a") as changed:
        changed.write("\n# another version of the code\n")
    section = {"type": "python", "target": "keyword_env:KeywordEnvironment", "args": {"limit": 12}}
    with running_network(
        tmp_path, [start_model()], environment=section, pythonpath=[ours], start_timeout_s=START_TIMEOUT_S
    ) as net:
        net.start_worker("worker", "hf", [])
        net.start_validator()
        assert check_recomputed_rewards(net, section, ours) == {"exact", "short"}
        log = refused_validator(net, "validator-theirs", pythonpath=f"{REPO_ROOT}:{theirs}")
        assert "run the coordinator's version of keyword_env" in log


def test_verifiers_v1_rewards_are_recomputed_with_the_tasksets_own_code(tmp_path: Path) -> None:
    section = {"type": "verifiers", "taskset": "vf_echo_taskset", "args": {"count": 8}, "eval_fraction": 0.25}
    with running_network(
        tmp_path, [start_model()], environment=section, pythonpath=[TASKSETS_DIR], start_timeout_s=START_TIMEOUT_S
    ) as net:
        net.start_worker("worker", "hf", [])
        net.start_validator()
        assert check_recomputed_rewards(net, section, TASKSETS_DIR) == {"exact", "starts_right"}
        log = refused_validator(net, "validator-no-taskset", pythonpath=str(REPO_ROOT))
        assert "cannot load the run's environment verifiers 'vf_echo_taskset'" in log


def test_verifiers_v0_rewards_are_recomputed_with_the_environments_rubric(tmp_path: Path) -> None:
    section = {"type": "verifiers", "api": "v0", "taskset": "vf0-echo-env", "args": {"count": 6}}
    with running_network(
        tmp_path, [start_model()], environment=section, pythonpath=[TASKSETS_DIR], start_timeout_s=START_TIMEOUT_S
    ) as net:
        net.start_worker("worker", "hf", [])
        net.start_validator()
        assert check_recomputed_rewards(net, section, TASKSETS_DIR) == {"exact", "starts_right", "num_turns"}
        other = tmp_path / "v1.toml"
        other.write_text(tomli_w.dumps({"environment": {**section, "api": "v1"}}))
        log = refused_validator(net, "validator-v1", "-c", str(other), pythonpath=f"{REPO_ROOT}:{TASKSETS_DIR}")
        assert "cannot load the run's environment verifiers 'vf0-echo-env'" in log


def test_a_coordinator_refuses_an_environment_with_a_non_deterministic_reward(tmp_path: Path) -> None:
    config = tmp_path / "run.toml"
    section = {"type": "python", "target": "tests.envs.words:FlakyEnvironment"}
    config.write_text(tomli_w.dumps({"data_dir": str(tmp_path / "run"), "environment": section}))
    done = subprocess.run(
        [str(BIN / "prime-coordinator"), "start", "-c", str(config), "--port", "0"],
        capture_output=True,
        text=True,
        timeout=240,
        env={
            "PATH": str(Path(sys.executable).parent),
            "PYTHONPATH": str(REPO_ROOT),
            "HOME": str(Path.home()),
            "PRIME_BUILTIN_DIR": os.environ["PRIME_BUILTIN_DIR"],  # the session's cache, not ~/.prime-network
        },
    )
    assert done.returncode != 0
    assert "reward luck is not deterministic" in done.stderr + done.stdout


def test_a_truncated_completion_is_accepted_with_the_minimum_reward(tmp_path: Path) -> None:
    """A random policy with a 3-token budget never stops: the validator accepts its work at reward 0, though the
    text scores above 0 (the built-in reverse_text credits any letter in common with the answer)."""
    from transformers import AutoTokenizer

    with running_network(tmp_path, sections={"scheduling": {"max_tokens": 3}}) as net:
        net.start_worker("worker", "hf", [])
        net.start_validator()
        environment = load_environment(TypeAdapter(EnvironmentConfig).validate_python(REVERSE_TEXT))
        tokenizer = AutoTokenizer.from_pretrained(str(net.checkpoints[0]))
        end_tokens = eos_token_ids(net.checkpoints[0])

        def truncated_text_scores() -> list[float]:
            """The environment's own score of each accepted truncated completion's text; each was rewarded 0."""
            scores: list[float] = []
            for prompts, submission, verdict in accepted(net):
                for position, rollout in enumerate(submission.rollouts):
                    if not is_truncated(rollout.completion_ids, end_tokens):
                        continue  # stopped on one of its end tokens: scored as usual (the other tests check those)
                    example = environment.example(prompts[rollout.prompt_index]["example_index"])
                    text = tokenizer.decode(rollout.completion_ids, skip_special_tokens=True)
                    scores.append(environment.score(example, text).total)
                    assert verdict.rewards[position] == 0.0
                    assert verdict.reward_components["lcs_ratio"][position] == 0.0
            return scores

        # random 3-token texts share a letter with the answer often, not always: wait for one that does
        wait_until(
            lambda: len(accepted(net)) >= 2 and max(truncated_text_scores(), default=0.0) > 0.0,
            300,
            "an accepted truncated completion whose text alone would score above 0",
        )
        assert max(truncated_text_scores()) > 0.0  # the rule, not the text, made them 0
