"""Auditing one pending submission: the worker's signature, the task it claims, every rollout's proof.

:func:`audit_submission` turns a :class:`PendingSubmission` (the task as the ledger issued it,
the worker's submission and its signature over it) into a :class:`Verdict`. It checks that
the worker signed exactly this submission, that the submission answers the task it came with
(same task, lease and policy version), runs the checks that need no model on every rollout
(lengths, vocabulary, termination, logprob values), and then, with one batched prefill of the
policy version the task names, runs :func:`toploc.verify.verify_claims` (TOPLOC proof,
sampling replay, logprobs) over the rollouts the ledger picked for audit
(``audit_sample_indices``; all when it names none). :func:`audit_submissions` does the same
for several submissions of one policy version with a single prefill batch across them. Every
failure becomes a reason naming the rollout; one failed rollout rejects the whole group. The rewards of an accepted
group are recomputed with the run's environment (never taken from the worker) when a reward
function is given; when they cannot be (a prompt without its example index, a scorer that
raises anything or returns NaN, inf or a non-number) the audit raises :class:`RewardsUnavailable`, and
:func:`audit_submissions_safely` turns it into an ``environment_error`` verdict: the environment's
failure, in one line, recorded by the ledger without counting against the worker. The thresholds come
from :class:`Thresholds`: one set per run, from the TOPLOC calibrations of the run's precision
(for each threshold the loosest any engine a worker may claim needs, so the engine a submission
names changes nothing; toploc.calibrations), with the operator's ``[toploc]`` settings on top.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from engines.base import PrefillEngine
from engines.vision import never_drawn
from environments.base import Environment, Example, Scores, failure_summary, finite_scores
from environments.episode import (
    EnvironmentReplyError,
    EpisodeError,
    MultiTurnEnvironment,
    episode_scores,
    issued_turn_prompts,
    policy_turn,
    rebuild_episode,
)
from environments.images import Image
from environments.pinning import ImageMismatch, prompt_images
from environments.truncation import completion_scores
from protocol.errors import BadSignatureError, ProofError
from protocol.schemas import PendingSubmission, Prompt, TurnRollout, Verdict
from protocol.signing import verify_document
from toploc.calibrations import run_toploc_config
from toploc.config import ToplocConfig
from toploc.sampling import turn_stream
from toploc.verify import Claim, RolloutVerdict, SampleTask, decode_proof_b64, precheck_claim, verify_claims

MAX_VERDICT_REASONS = 64


@dataclass(frozen=True)
class Thresholds:
    """What a validator audits every submission of a run with, whatever engine the submission names:
    :func:`toploc.calibrations.run_toploc_config` of ``precision``, its own prefill engine and ``own``."""

    precision: str = "float32"
    """The run's precision (the run spec's): the dtype rollouts were generated and are recomputed in."""
    own: ToplocConfig = field(default_factory=ToplocConfig)
    """The validator's ``[toploc]`` section: the thresholds it sets explicitly override the calibration's."""
    verifying_engine: str = "hf"

    def config(self) -> ToplocConfig:
        """The run's thresholds (ConfigError when a generating engine has no calibration of the precision)."""
        return run_toploc_config(self.precision, self.own, verifying_engine=self.verifying_engine)


@dataclass(frozen=True)
class Episodes:
    """How the validator of a multi-turn run rebuilds episodes: the environment (with the run's episode limits,
    ``environment.limits``) and the policy's tokenizer."""

    environment: MultiTurnEnvironment
    tokenizer: Any


@dataclass(frozen=True)
class TurnClaim:
    """One policy turn of a rollout as a claim against the prompt the trusted side rebuilt."""

    position: int
    """The rollout's position in the submission."""
    turn: int
    claim: Claim
    label: str
    """``rollout pP/sS`` (with `` turn T`` in an episode of several turns): how reasons name it."""
    images: tuple[Image, ...] = ()
    """The prompt's images, rendered by this validator and checked against the ledger's pins."""


def claims_of(
    item: PendingSubmission,
    eos_token_ids: Sequence[int],
    episodes: Episodes | None = None,
    images: Environment | None = None,
) -> tuple[list[TurnClaim], list[str]]:
    """The rollouts of a submission as claims, one per policy turn, against the task the ledger issued; reasons
    for junk. A single turn's prompt is the task's; in a multi-turn run (``episodes``) every turn's prompt is
    rebuilt from the environment and the sampled turns (:func:`environments.episode.rebuild_episode`), and the
    first must be the task's. A prompt's pinned images are rendered with ``images`` (the run's environment)."""
    task, submission = item.task, item.submission
    prompts = {prompt.prompt_index: prompt for prompt in task.prompts}
    shown = {index: _prompt_images(prompt, images) for index, prompt in prompts.items()}
    claims: list[TurnClaim] = []
    reasons: list[str] = []
    for position, rollout in enumerate(submission.rollouts):
        label = f"rollout p{rollout.prompt_index}/s{rollout.sample_index}"
        if rollout.prompt_index not in prompts:
            reasons.append(f"{label}: the task has no prompt {rollout.prompt_index}")
            continue
        turns: list[TurnRollout] = [rollout, *rollout.later_turns]
        issued = list(prompts[rollout.prompt_index].token_ids)
        try:
            turn_prompts = _turn_prompts(
                issued, prompts[rollout.prompt_index].example_index, turns, eos_token_ids, episodes
            )
            proofs = [decode_proof_b64(turn.proof_b64) for turn in turns]
        except EnvironmentReplyError as exc:
            raise RewardsUnavailable(f"environment: replaying {label}: {exc}") from exc
        except (EpisodeError, ProofError) as exc:
            reasons.append(f"{label}: {exc.message if isinstance(exc, ProofError) else f'episode: {exc}'}")
            continue
        for number, (turn, prompt_ids, proof) in enumerate(zip(turns, turn_prompts, proofs, strict=True)):
            sample = SampleTask(
                prompt_ids=prompt_ids,
                sampling=task.sampling,
                seed=task.sampling_seed,
                stream=turn_stream(rollout.prompt_index, rollout.sample_index, number),
                eos_token_ids=tuple(eos_token_ids),
            )
            claim = Claim(sample, turn.completion_ids, turn.logprobs, turn.finish_reason, proof)
            suffix = f" turn {number}" if len(turns) > 1 else ""
            claims.append(TurnClaim(position, number, claim, label + suffix, shown[rollout.prompt_index]))
    return claims, reasons


def _prompt_images(prompt: Prompt, images: Environment | None) -> tuple[Image, ...]:
    """The images ``prompt`` pins, rendered here; RewardsUnavailable when they cannot be (not the worker's doing)."""
    if not prompt.image_sha256:
        return ()
    if images is None:
        raise RewardsUnavailable("environment: the task's prompts show images, and this validator renders none")
    try:
        return prompt_images(images, prompt.example_index, prompt.image_sha256)
    except ImageMismatch as exc:
        raise RewardsUnavailable(f"environment: prompt {prompt.prompt_index}: {exc}") from exc


def _turn_prompts(
    issued: list[int],
    example_index: int | None,
    turns: Sequence[TurnRollout],
    eos_token_ids: Sequence[int],
    episodes: Episodes | None,
) -> list[list[int]]:
    """Each turn's prompt ids, rebuilt by this validator; EpisodeError when the turns cannot be the episode."""
    if episodes is None:
        if len(turns) > 1:
            raise EpisodeError(f"{len(turns)} policy turns in a run whose environment is single-turn")
        return [issued]
    turn_ids = [turn.completion_ids for turn in turns]
    return issued_turn_prompts(episodes.environment, example_index, issued, turn_ids, episodes.tokenizer, eos_token_ids)


def submission_reasons(item: PendingSubmission) -> list[str]:
    """What is wrong with the submission as a whole (signature and task binding)."""
    reasons: list[str] = []
    try:
        verify_document(item.worker_id, item.submission.model_dump(mode="json"), item.worker_signature_b64)
    except BadSignatureError as exc:
        reasons.append(f"signature: {exc.message}")
    task, submission = item.task, item.submission
    if submission.task_id != task.task_id:
        reasons.append(f"task: the submission names task {submission.task_id}, the lease was for {task.task_id}")
    if submission.lease_id != task.lease_id:
        reasons.append(f"task: the submission names lease {submission.lease_id}, not {task.lease_id}")
    if submission.policy_version != task.policy_version:
        reasons.append(
            f"policy: generated with v{submission.policy_version}, the task was issued for v{task.policy_version}"
        )
    return reasons


RewardFn = Callable[[int, Sequence[Sequence[int]]], Scores]
"""(example index, each policy turn's sampled ids) -> the environment's named rewards, computed by the validator."""


def environment_reward_fn(environment: Environment, tokenizer: Any, eos_token_ids: Sequence[int]) -> RewardFn:
    """Rewards of ``environment``, from completions decoded with the policy's tokenizer (EOS dropped), under the
    run's truncation rule (a completion whose last token is not EOS was cut at max_tokens). A multi-turn
    environment's episode is replayed from its turns (within ``environment.limits``) and scored whole. The samples
    of a group share their example: it is drawn once for consecutive calls with one index (a scorer reads its
    example, never changes it)."""
    drawn: dict[int, Example] = {}  # the last example drawn, by index

    def reward(example_index: int, turn_ids: Sequence[Sequence[int]]) -> Scores:
        example = drawn.get(example_index)
        if example is None:
            example = environment.example(example_index)
            drawn.clear()
            drawn[example_index] = example
        if isinstance(environment, MultiTurnEnvironment):
            episode, _ = rebuild_episode(environment, example, turn_ids, tokenizer, eos_token_ids)
            return episode_scores(environment, episode)
        (ids,) = turn_ids
        turn = policy_turn(tokenizer, ids, eos_token_ids)
        return completion_scores(environment, example, turn.text, turn.truncated)

    return reward


class RewardsUnavailable(Exception):  # noqa: N818 - carries the reason a verdict cannot be given
    """The rewards of a submission cannot be recomputed (a prompt without its example index, a failing scorer)."""


def recompute_rewards(item: PendingSubmission, reward_fn: RewardFn) -> tuple[list[float], dict[str, list[float]]]:
    """Each rollout's total reward and each named reward, in submission order; RewardsUnavailable when not."""
    prompts = {prompt.prompt_index: prompt for prompt in item.task.prompts}
    totals: list[float] = []
    components: dict[str, list[float]] = {}
    for position, rollout in enumerate(item.submission.rollouts):
        example_index = prompts[rollout.prompt_index].example_index
        if example_index is None:
            raise RewardsUnavailable(f"prompt {rollout.prompt_index} carries no example index")
        try:  # the environment is code the run chose, not the worker: whatever it raises is its own failure
            turn_ids = [rollout.completion_ids, *(turn.completion_ids for turn in rollout.later_turns)]
            scores = finite_scores(reward_fn(example_index, turn_ids))
        except Exception as exc:
            label = f"rollout p{rollout.prompt_index}/s{rollout.sample_index}"
            raise RewardsUnavailable(f"environment: scoring {label} failed: {failure_summary(exc)}") from exc
        if position and set(scores.rewards) != set(components):  # the environment's inconsistency, not the worker's
            label = f"rollout p{rollout.prompt_index}/s{rollout.sample_index}"
            raise RewardsUnavailable(
                f"environment: scoring {label} gave other named rewards ({', '.join(sorted(scores.rewards))}) "
                f"than the rollouts before it ({', '.join(sorted(components))})"
            )
        totals.append(scores.total)
        for name, value in scores.rewards.items():
            components.setdefault(name, []).append(float(value))
    return totals, components


def audited_positions(item: PendingSubmission) -> list[int]:
    """The rollout positions to recompute: the ledger's choice, or every rollout when it names none valid."""
    num_rollouts = len(item.submission.rollouts)
    chosen = sorted({i for i in item.audit_sample_indices if i < num_rollouts})
    return chosen or list(range(num_rollouts))


def mostly_unrecomputed(items: Sequence[PendingSubmission]) -> bool:
    """Whether under half of the samples of these submissions are to be recomputed (low audit shares)."""
    recomputed = sum(len(audited_positions(item)) for item in items)
    return 2 * recomputed < sum(len(item.submission.rollouts) for item in items)


@dataclass
class _Audit:
    """One submission on its way through :func:`audit_submissions`."""

    item: PendingSubmission
    reasons: list[str]
    claims: list[TurnClaim]
    """The turns of the rollouts to recompute."""
    rollout_verdicts: list[RolloutVerdict] = field(default_factory=list)


def _start_audit(
    item: PendingSubmission,
    vocab_size: int,
    eos_token_ids: Sequence[int],
    episodes: Episodes | None,
    images: Environment | None,
    never_drawn: frozenset[int] = frozenset(),
) -> _Audit:
    """The checks that need no model, on every turn of every rollout (a token the policy never draws included:
    ``never_drawn``, a vision-language policy's vision tokens); the claims of the audited rollouts' turns when all
    pass."""
    reasons = submission_reasons(item)
    claims, junk = claims_of(item, eos_token_ids, episodes, images)
    reasons += junk
    if reasons:
        return _Audit(item, reasons, [])
    for turn in claims:
        found = precheck_claim(turn.claim, vocab_size)
        if any(not 0 <= t < vocab_size for t in turn.claim.task.prompt_ids):
            found.append("shape: prompt token ids outside the vocabulary")
        drawn = next((t for t in turn.claim.completion_ids if t in never_drawn), None)
        if drawn is not None:
            found.append(f"shape: completion holds token {drawn}, which holds an image's place and is never drawn")
        reasons += [f"{turn.label}: {reason}" for reason in found]
    if reasons:
        return _Audit(item, reasons, [])
    audited = set(audited_positions(item))
    return _Audit(item, reasons, [turn for turn in claims if turn.position in audited])


def audit_submissions(
    items: Sequence[PendingSubmission],
    engine: PrefillEngine,
    eos_token_ids: Sequence[int],
    config: ToplocConfig | None = None,
    reward_fn: RewardFn | None = None,
    episodes: Episodes | None = None,
    images: Environment | None = None,
) -> list[tuple[Verdict, list[RolloutVerdict]]]:
    """Verdicts on submissions of one policy version, with one batched prefill of all their audited rollouts.

    Only the rollouts the ledger picked (``audit_sample_indices``) are recomputed; the checks
    that need no model run on all of them, and rewards are recomputed for all of them.
    """
    never = never_drawn(engine)
    audits = [_start_audit(item, engine.vocab_size, eos_token_ids, episodes, images, never) for item in items]
    batch = [(audit, turn) for audit in audits for turn in audit.claims]
    if batch:
        claims = [turn.claim for _audit, turn in batch]
        prompt_ids, completions = [c.task.prompt_ids for c in claims], [c.completion_ids for c in claims]
        prefills = engine.prefill(prompt_ids, completions, images=[turn.images for _audit, turn in batch])
        for (audit, turn), checked in zip(batch, verify_claims(claims, prefills, config), strict=True):
            audit.reasons += [f"{turn.label}: {r}" for r in checked.reasons]
            audit.rollout_verdicts.append(checked)
    results = []
    for audit in audits:
        rewards: list[float] = []
        components: dict[str, list[float]] = {}
        if reward_fn is not None and not audit.reasons:
            rewards, components = recompute_rewards(audit.item, reward_fn)
        verdict = Verdict(
            submission_id=audit.item.submission_id,
            accepted=not audit.reasons,
            reasons=[reason[:512] for reason in audit.reasons[:MAX_VERDICT_REASONS]],
            rewards=rewards,
            reward_components=components,
        )
        results.append((verdict, audit.rollout_verdicts))
    return results


def audit_submissions_safely(
    items: Sequence[PendingSubmission],
    engine: PrefillEngine,
    eos_token_ids: Sequence[int],
    config: ToplocConfig | None = None,
    reward_fn: RewardFn | None = None,
    episodes: Episodes | None = None,
    images: Environment | None = None,
) -> list[tuple[Verdict, list[RolloutVerdict]]]:
    """:func:`audit_submissions`, but a submission the engine cannot recompute (e.g. longer than the model's
    positions) is rejected with the reason instead of failing the whole batch and the validator with it, and
    a submission whose rewards cannot be recomputed gets an ``environment_error`` verdict (accepting nothing,
    with the failure in one line) instead of no verdict: it neither stays pending nor counts against the worker."""
    try:
        return list(audit_submissions(items, engine, eos_token_ids, config, reward_fn, episodes, images))
    except (ValueError, RewardsUnavailable):
        pass  # find the submission(s) at fault, one at a time
    results: list[tuple[Verdict, list[RolloutVerdict]]] = []
    for item in items:
        try:
            results += audit_submissions([item], engine, eos_token_ids, config, reward_fn, episodes, images)
        except ValueError as exc:
            reason = f"audit: the rollouts cannot be recomputed: {exc}"[:512]
            results.append((Verdict(submission_id=item.submission_id, accepted=False, reasons=[reason]), []))
        except RewardsUnavailable as exc:
            reason = str(exc)[:512]
            unscored = Verdict(submission_id=item.submission_id, accepted=False, reasons=[reason])
            results.append((unscored.model_copy(update={"environment_error": reason}), []))
    return results


def audit_submission(
    item: PendingSubmission,
    engine: PrefillEngine,
    eos_token_ids: Sequence[int],
    config: ToplocConfig | None = None,
    reward_fn: RewardFn | None = None,
    episodes: Episodes | None = None,
    images: Environment | None = None,
) -> tuple[Verdict, list[RolloutVerdict]]:
    """The verdict on one submission (with recomputed rewards when accepted), and the audited rollouts' verdicts."""
    return audit_submissions([item], engine, eos_token_ids, config, reward_fn, episodes, images)[0]
