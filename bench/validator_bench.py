"""Can one validator keep up with many workers? Rollouts verified/s against one worker's generated/s.

On the built-in tiny model, one HF worker engine generates tasks of 8 prompts x 8 samples
(the worker loop's generation and proof building), then one validator audits the same
submissions (signature, HF prefill, TOPLOC, sampling replay, logprobs) on the same machine,
one after the other so they do not share the CPU: first one submission at a time on a freshly
loaded engine (how this bench measured before), then one at a time warm, then 16 submissions
per prefill batch (what `prime-validator run` does), then batched with the ledger auditing a
quarter of the samples. Prints one JSON object whose ``summary`` holds ``workers_kept_up`` =
verified/s (every sample, batched) divided by one worker's generated/s, next to the others.

    python -m bench.validator_bench [--quick] [--tasks N] [--max-tokens N] [--repeats N] [--threads N]
"""

from __future__ import annotations

import argparse
import json
import time

import torch

from bench.rollout_tasks import local_task
from coordinator.ledger.audit_choice import audit_sample_indices
from coordinator.ledger.seeds import new_run_secret
from engines.hf import HFEngine
from node.startup import eos_token_ids
from protocol.identity import NodeIdentity
from protocol.schemas import PendingSubmission
from protocol.signing import sign_document
from trainer.resolve import resolve_model_path
from validator.audit import audit_submissions
from worker.submission import build_submission, generation_requests

BATCH_SIZE = 16  # ValidatorConfig.max_submissions_per_batch


def generated(
    engine: HFEngine, worker: NodeIdentity, num_tasks: int, max_tokens: int, eos: tuple[int, ...]
) -> tuple[list[PendingSubmission], float]:
    """Signed submissions of ``num_tasks`` tasks as the worker loop makes them, and the seconds it took."""
    items: list[PendingSubmission] = []
    started = time.perf_counter()
    for index in range(num_tasks):
        task = local_task(index, max_tokens)
        submission = build_submission(task, "hf", engine.generate(generation_requests(task, eos)))
        signature = sign_document(worker, submission.model_dump(mode="json"))
        items.append(
            PendingSubmission(
                submission_id=f"s-{index}",
                worker_id=worker.node_id,
                task=task,
                submission=submission,
                submitted_at=time.time(),
                worker_signature_b64=signature,
            )
        )
    return items, time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="fewer tasks (under a minute)")
    parser.add_argument("--tasks", type=int, default=None, help="tasks (default 8; quick 2)")
    parser.add_argument("--max-tokens", type=int, default=128, help="tokens per sample")
    parser.add_argument("--repeats", type=int, default=None, help="rounds, best of each kept (default 3; quick 2)")
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's own choice)")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    num_tasks = args.tasks or (2 if args.quick else 8)
    repeats = args.repeats or (2 if args.quick else 3)
    checkpoint = resolve_model_path("builtin:tiny-qwen2-reverse-start")
    eos = eos_token_ids(checkpoint)
    worker = NodeIdentity.generate()
    engine = HFEngine(checkpoint, max_batch_size=64)
    engine.generate(generation_requests(local_task(-1, 8), eos))  # warm-up
    validator = HFEngine(checkpoint, max_batch_size=64)
    secret = new_run_secret()

    times: dict[str, list[float]] = {"generate": [], "one_by_one": [], "batched": [], "batched_audit_fraction_0.25": []}
    accepted: dict[str, int] = {}
    cold_s = 0.0
    # Rounds interleave generation and auditing, and the best time of each is kept: this machine is shared, and
    # the least disturbed round is the closest to what the code costs.
    for round_index in range(repeats):
        items, generate_s = generated(engine, worker, num_tasks, args.max_tokens, eos)
        times["generate"].append(generate_s)
        if round_index == 0:  # the earlier figure: a freshly loaded engine, one submission at a time
            cold_s, accepted["cold_one_by_one"] = timed_audit(items, validator, eos, batch_size=1)
        quarter = [
            item.model_copy(
                update={
                    "audit_sample_indices": audit_sample_indices(
                        secret, item.submission_id, len(item.submission.rollouts), 0.25
                    )
                }
            )
            for item in items
        ]
        for mode, batch, chosen in (
            ("one_by_one", 1, items),
            ("batched", BATCH_SIZE, items),
            ("batched_audit_fraction_0.25", BATCH_SIZE, quarter),
        ):
            seconds, accepted[mode] = timed_audit(chosen, validator, eos, batch_size=batch)
            times[mode].append(seconds)
    num_rollouts = sum(len(item.submission.rollouts) for item in items)
    tokens = sum(len(r.completion_ids) for item in items for r in item.submission.rollouts)
    best = {mode: min(values) for mode, values in times.items()}
    generated_per_s = num_rollouts / best["generate"]

    def kept_up(seconds: float) -> float:
        return round(num_rollouts / seconds / generated_per_s, 2)

    print(
        json.dumps(
            {
                "summary": {
                    "workers_kept_up": kept_up(best["batched"]),
                    "workers_kept_up_one_by_one": kept_up(best["one_by_one"]),
                    "workers_kept_up_cold_one_by_one": kept_up(cold_s),
                    "workers_kept_up_audit_fraction_0.25": kept_up(best["batched_audit_fraction_0.25"]),
                },
                "rollouts": num_rollouts,
                "tokens": tokens,
                "generated_rollouts_per_s": round(generated_per_s, 1),
                "verified_rollouts_per_s": round(num_rollouts / best["batched"], 1),
                "seconds": {mode: [round(v, 3) for v in values] for mode, values in times.items()}
                | {"cold_one_by_one": round(cold_s, 3)},
                "submissions_per_batch": BATCH_SIZE,
                "accepted_submissions": accepted,
                "submissions": len(items),
                "torch_threads": torch.get_num_threads(),
                "model": "builtin:tiny-qwen2-reverse-start",
            }
        )
    )


def timed_audit(
    items: list[PendingSubmission], engine: HFEngine, eos: tuple[int, ...], batch_size: int
) -> tuple[float, int]:
    """Seconds to audit every item, ``batch_size`` submissions per prefill batch, and how many were accepted."""
    started = time.perf_counter()
    verdicts = [
        verdict
        for first in range(0, len(items), batch_size)
        for verdict, _ in audit_submissions(items[first : first + batch_size], engine, eos)
    ]
    return time.perf_counter() - started, sum(verdict.accepted for verdict in verdicts)


if __name__ == "__main__":
    main()
