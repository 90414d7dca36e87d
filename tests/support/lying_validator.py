"""A validator that accepts everything, for attack tests and benches: `python -m tests.support.lying_validator`.

It is `prime-validator run` except that it checks nothing: every submission it is handed is accepted at once, with
the rewards the run's environment gives its completions (so that its verdicts agree with an honest validator's on
honest work and it is not outvoted for them). What it lets through is what a colluding validator would: copied
samples, tokens another policy drew, forged log-probabilities. The trainer's own checks are what stand against it.
It may also collude further: ``--favour NODE_ID`` rewards that worker's samples 1, 0, 1, 0 ... whatever they hold
(a signal for whatever it submitted), and ``--flip-versions A:B`` rewards every sample of policy versions A to B - 1
with 1 - its reward (the policy taught to answer wrong), the poisons no check of the tokens can see.

Usage: ``python -m tests.support.lying_validator COORDINATOR_URL DATA_DIR [--favour NODE_ID] [--flip-versions A:B]``.
"""

from __future__ import annotations

import argparse
import asyncio
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from protocol.errors import PrimeError
from protocol.schemas import PendingSubmission, Verdict
from runtime.logs import setup_logging
from toploc.verify import RolloutVerdict
from validator import run
from validator.audit import RewardFn, RewardsUnavailable, recompute_rewards
from validator.config import ValidatorConfig


@dataclass(frozen=True)
class Collusion:
    """How the validator bends rewards beyond accepting everything."""

    favoured: str | None = None
    """A worker whose samples are rewarded 1, 0, 1, 0 ... whatever they hold."""
    flipped: range = range(0)
    """Policy versions whose samples are rewarded 1 - their reward."""

    def rewards(self, item: PendingSubmission, rewards: list[float]) -> list[float]:
        if item.worker_id == self.favoured:
            return [1.0 - (i % 2) for i in range(len(rewards))]
        if item.submission.policy_version in self.flipped:
            return [1.0 - reward for reward in rewards]
        return rewards


def accepting(collusion: Collusion) -> Any:
    """The validator's audit replaced: each submission accepted unchecked, with its completions' rewards as
    ``collusion`` bends them (an environment error where the environment gives none)."""

    def accept_everything(
        items: Sequence[PendingSubmission], engine: Any, eos: Any, config: Any, reward_fn: RewardFn | None, *_: Any
    ) -> list[tuple[Verdict, list[RolloutVerdict]]]:
        verdicts: list[tuple[Verdict, list[RolloutVerdict]]] = []
        for item in items:
            try:
                rewards, components = recompute_rewards(item, reward_fn) if reward_fn is not None else ([], {})
            except RewardsUnavailable as exc:
                reason = str(exc)[:512]
                unscored = Verdict(
                    submission_id=item.submission_id, accepted=False, reasons=[reason], environment_error=reason
                )
                verdicts.append((unscored, []))
                continue
            bent = collusion.rewards(item, rewards)
            verdict = Verdict(
                submission_id=item.submission_id,
                accepted=True,
                rewards=bent,
                reward_components=components if bent == rewards else {},
            )
            verdicts.append((verdict, []))
        return verdicts

    return accept_everything


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("coordinator_url")
    parser.add_argument("data_dir", type=Path)
    parser.add_argument("--favour", default=None, help="a worker whose samples are rewarded 1, 0, 1, 0 ...")
    parser.add_argument("--flip-versions", default=None, help="A:B: the rewards of versions A to B - 1 are flipped")
    args = parser.parse_args()
    flipped = range(0)
    if args.flip_versions:
        first, last = (int(part) for part in args.flip_versions.split(":"))
        flipped = range(first, last)
    setup_logging("info", json_logs=True)
    setattr(run, "audit_submissions_safely", accepting(Collusion(args.favour, flipped)))  # noqa: B010  # it checks nothing
    config = ValidatorConfig(coordinator_url=args.coordinator_url, data_dir=args.data_dir)
    try:
        asyncio.run(run.run_validator(config, asyncio.Event()))
    except PrimeError as exc:
        raise SystemExit(f"lying validator: {exc.message}") from None


if __name__ == "__main__":
    main()
