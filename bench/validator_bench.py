"""Can one validator keep up with many workers? Rollouts verified/s against one worker's generated/s.

On the built-in tiny model, one HF worker engine generates tasks of 8 prompts x 8 samples
(the worker loop's generation and proof building), then one validator audits the same
submissions (signature, batched HF prefill, TOPLOC, sampling replay, logprobs) on the same
machine, one after the other so they do not share the CPU. Prints one JSON object whose
``summary`` holds ``workers_kept_up`` = verified/s divided by one worker's generated/s.

    python bench/validator_bench.py [--quick] [--tasks N] [--max-tokens N]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))

from bench.rollout_bench import local_task  # noqa: E402
from protocol.identity import NodeIdentity  # noqa: E402
from protocol.schemas import PendingSubmission  # noqa: E402
from protocol.signing import sign_document  # noqa: E402
from trainer.builtin import resolve_model_path  # noqa: E402
from validator.audit import audit_submission  # noqa: E402
from worker.engines.hf import HFEngine  # noqa: E402
from worker.loop import build_submission, generation_requests  # noqa: E402
from worker.node import eos_token_ids  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="fewer tasks (under a minute)")
    parser.add_argument("--tasks", type=int, default=None, help="tasks (default 8; quick 2)")
    parser.add_argument("--max-tokens", type=int, default=128, help="tokens per sample")
    args = parser.parse_args()
    num_tasks = args.tasks or (2 if args.quick else 8)
    checkpoint = resolve_model_path("builtin:tiny-qwen2-reverse-start")
    eos = eos_token_ids(checkpoint)
    worker = NodeIdentity.generate()
    engine = HFEngine(checkpoint, max_batch_size=64)
    engine.generate(generation_requests(local_task(-1, 8), eos))  # warm-up

    items: list[PendingSubmission] = []
    started = time.perf_counter()
    for index in range(num_tasks):
        task = local_task(index, args.max_tokens)
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
    generate_s = time.perf_counter() - started
    num_rollouts = sum(len(item.submission.rollouts) for item in items)
    tokens = sum(len(r.completion_ids) for item in items for r in item.submission.rollouts)

    validator = HFEngine(checkpoint, max_batch_size=64)
    started = time.perf_counter()
    verdicts = [audit_submission(item, validator, eos)[0] for item in items]
    verify_s = time.perf_counter() - started
    accepted = sum(verdict.accepted for verdict in verdicts)
    generated_per_s = num_rollouts / generate_s
    verified_per_s = num_rollouts / verify_s
    print(
        json.dumps(
            {
                "summary": {"workers_kept_up": round(verified_per_s / generated_per_s, 2)},
                "rollouts": num_rollouts,
                "tokens": tokens,
                "generated_rollouts_per_s": round(generated_per_s, 1),
                "verified_rollouts_per_s": round(verified_per_s, 1),
                "generate_s": round(generate_s, 3),
                "verify_s": round(verify_s, 3),
                "accepted_submissions": accepted,
                "submissions": len(items),
                "model": "builtin:tiny-qwen2-reverse-start",
            }
        )
    )


if __name__ == "__main__":
    main()
