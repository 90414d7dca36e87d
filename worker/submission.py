"""What a worker sends: one generation request per sample of a task, and the submission of their results.

Every sample of a task is drawn with the task's seed on its own noise stream
(:func:`toploc.sampling.sample_stream`), so a validator replays each draw. A submission carries, per
rollout, the sampled tokens of each policy turn and the TOPLOC proof built from that turn's hidden
states; a single-turn task's rollouts have one turn each. Only sampled tokens are sent: the trusted
side derives prompts, masks and spans itself.
"""

from __future__ import annotations

import base64
from collections.abc import Sequence

from engines.base import GenerationRequest, GenerationResult
from environments.images import Image
from protocol.schemas import Rollout, SubmitRequest, Task, TurnRollout
from toploc.proof import build_proofs
from toploc.sampling import sample_stream


def generation_requests(
    task: Task, eos_token_ids: tuple[int, ...], images: Sequence[tuple[Image, ...]] | None = None
) -> list[GenerationRequest]:
    """One request per (prompt, sample) of a task, each on its own noise stream; ``images[i]``: prompt ``i``'s
    images, rendered here and checked against the task's hashes (:func:`environments.pinning.prompt_images`)."""
    shown = images if images is not None else [()] * len(task.prompts)
    if len(shown) != len(task.prompts):
        raise ValueError(f"task {task.task_id} has {len(task.prompts)} prompts but {len(shown)} lists of images")
    return [
        GenerationRequest(
            uid=f"{task.task_id}/{prompt.prompt_index}/{sample}",
            prompt_ids=list(prompt.token_ids),
            max_tokens=task.sampling.max_tokens,
            temperature=task.sampling.temperature,
            seed=task.sampling_seed,
            stream=sample_stream(prompt.prompt_index, sample),
            eos_token_ids=eos_token_ids,
            images=prompt_images,
        )
        for prompt, prompt_images in zip(task.prompts, shown, strict=True)
        for sample in range(task.group_size)
    ]


Sample = tuple[str, Sequence[GenerationResult]]
"""One sample of a task as generated: its uid (``task/prompt/sample``) and the engine's result of each policy turn."""


def build_submission(task: Task, engine_name: str, results: list[GenerationResult]) -> SubmitRequest:
    """The submission of a task's generated group, one turn per sample, with a proof per sample."""
    return build_turns_submission(task, engine_name, [(result.uid, [result]) for result in results])


def build_turns_submission(task: Task, engine_name: str, samples: Sequence[Sample]) -> SubmitRequest:
    """The submission of a task's samples, each ``(uid, the engine's result of each policy turn)``: per rollout its
    first turn, then any later turns, each with the proof built from its own hidden states (all proofs in one
    batch). Only sampled tokens are sent."""
    proofs = iter(build_proofs([result.hidden_states for _uid, turns in samples for result in turns]))
    rollouts = []
    for uid, turns in samples:
        _task_id, prompt_index, sample_index = uid.rsplit("/", 2)
        first, *later = [
            TurnRollout(
                completion_ids=result.completion_ids,
                logprobs=result.logprobs,
                finish_reason=result.finish_reason,
                proof_b64=base64.b64encode(next(proofs)).decode(),
            )
            for result in turns
        ]
        rollouts.append(
            Rollout(prompt_index=int(prompt_index), sample_index=int(sample_index), **dict(first), later_turns=later)
        )
    return SubmitRequest(
        lease_id=task.lease_id,
        task_id=task.task_id,
        policy_version=task.policy_version,
        engine="vllm" if engine_name == "vllm" else "hf",
        rollouts=rollouts,
    )
