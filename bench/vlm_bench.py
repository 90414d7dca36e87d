"""Vision-language runs: learning to count from images through the whole network, and what verifying them costs.

The task is the built-in ``count_shapes``: how many squares (1 to 6) are in a 56 x 56 image, reward 1 for the exact
count. The start checkpoint is ``builtin:tiny-qwen2-vl-count-start`` (the built-in tiny Qwen2-VL after a short SFT
of its text model on the task, stopped while it still miscounts). For each seed, ``prime-coordinator start`` runs
the RL loop with its local network (a relay, an HF worker that renders each prompt's image itself, a validator that
renders it again, an FSDP2 trainer with the vision tower frozen) for ``--steps`` steps at async level 1. The start
and each final policy are scored by one evaluator (the HF sampler at T = 1 on held-out images, exact count).

Measured apart, on the same machine, with the start checkpoint:

- **Honest audits**: a worker's HF engine generates and proves ``--calibration-rollouts`` rollouts (tasks of
  ``--prompts-per-task`` images x ``--group-size`` samples); a validator's HF engine audits them as it does in a
  run (``--audit-batch`` submissions per prefill batch, images rendered by the validator). Every rejected honest
  rollout is counted, and the time of each side gives ``verify_over_generate``.
- **Attacks**: groups generated with another image than the one pinned, with the pinned image perturbed by one
  pixel, and by another model (the start's weights moved by noise of ``--other-model-noise``), ``--attack-tasks``
  tasks each: the share rejected is ``attacks_detected``.

Prints one JSON object; ``summary``: ``accuracy_start``, ``accuracy_end`` (mean over seeds), ``accuracy_gain_min``
(smallest gain over seeds), ``verify_over_generate``, ``honest_rejections`` (honest rollouts rejected),
``honest_rollouts``, ``attacks_detected`` (share of attack submissions rejected) and ``steps``.

    python -m bench.vlm_bench                  # 3 seeds x 60 steps at lr 1e-3
    python -m bench.vlm_bench --quick          # 1 seed, 4 steps, small eval and calibration: the pipeline only
    python -m bench.vlm_bench --audit-only     # the calibration and the attacks, no runs
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from bench.runs import add_network_run_arguments, evaluate, network_run_config, run_coordinator, run_plan

START = "builtin:tiny-qwen2-vl-count-start"
ENVIRONMENT: dict[str, Any] = {"type": "builtin", "name": "count_shapes"}
ATTACKS = ("another_image", "perturbed_image", "another_model")

DEFAULT_STEPS = 60
DEFAULT_LR = 1e-3
"""The runs' steps and learning rate unless given: at 30 steps and 5e-4 the gain was still climbing (0.105)."""


def log(message: str) -> None:
    print(f"[vlm_bench] {message}", file=sys.stderr, flush=True)


class AuditLab:
    """A worker's and a validator's HF engines on one checkpoint, and tasks of ``count_shapes`` prompts."""

    def __init__(self, model: Path, args: argparse.Namespace) -> None:
        from transformers import AutoTokenizer

        from engines.hf import HFEngine
        from environments.builtin import builtin_environment
        from node.startup import eos_token_ids

        self.args = args
        self.environment = builtin_environment("count_shapes")
        self.worker = HFEngine(model, max_batch_size=256)
        self.validator = HFEngine(model, max_batch_size=256)
        self.tokenizer = AutoTokenizer.from_pretrained(str(model))
        self.eos = eos_token_ids(model)
        self.reward_fn_args = (self.environment, self.tokenizer, self.eos)

    def close(self) -> None:
        self.worker.close()
        self.validator.close()

    def task(self, number: int) -> Any:
        """Task ``number``: prompt group ``number`` of the run's prompts, as the ledger would lease it."""
        from environments.prompts import EnvironmentPrompts
        from protocol.schemas import Task

        prompts = EnvironmentPrompts(self.environment, self.tokenizer, self.worker.vision)
        group = prompts.prompt_group(number, self.args.prompts_per_task)
        return Task.model_validate(
            {
                "task_id": f"t-{number}",
                "lease_id": f"l-{number}",
                "task_name": self.environment.name,
                "prompts": [
                    {
                        "prompt_index": i,
                        "token_ids": list(p.token_ids),
                        "example_index": p.example_index,
                        "image_sha256": list(p.image_sha256),
                    }
                    for i, p in enumerate(group)
                ],
                "group_size": self.args.group_size,
                "sampling": {"temperature": 1.0, "max_tokens": self.args.max_tokens},
                "policy_version": 0,
                "sampling_seed": 1000 + number,
                "deadline": time.time() + 3600,
            }
        )

    def submission(self, task: Any, shown: Sequence[tuple[Any, ...]], engine: Any = None) -> Any:
        """A worker's signed submission of ``task`` generated with ``shown`` (each prompt's images)."""
        from tests.support.adversary import signed_pending
        from worker.submission import build_submission, generation_requests

        engine = engine or self.worker
        results = engine.generate(generation_requests(task, self.eos, list(shown)))
        return signed_pending(task, build_submission(task, engine.name, results))

    def pinned(self, task: Any) -> list[tuple[Any, ...]]:
        from environments.pinning import prompt_images

        return [prompt_images(self.environment, p.example_index, p.image_sha256) for p in task.prompts]

    def audit(self, items: list[Any]) -> list[tuple[Any, list[Any]]]:
        """The validator's verdicts on ``items`` and on each of their rollouts, ``--audit-batch`` submissions per
        prefill batch."""
        from validator.audit import audit_submissions_safely, environment_reward_fn

        reward_fn = environment_reward_fn(*self.reward_fn_args)
        verdicts: list[tuple[Any, list[Any]]] = []
        size = self.args.audit_batch
        for first in range(0, len(items), size):
            batch = items[first : first + size]
            shown = self.environment
            verdicts += audit_submissions_safely(batch, self.validator, self.eos, None, reward_fn, None, shown)
        return verdicts


def honest_audits(lab: AuditLab, num_rollouts: int) -> dict[str, Any]:
    """Honest rollouts generated and proved by the worker, audited by the validator: rejections and seconds."""
    per_task = lab.args.prompts_per_task * lab.args.group_size
    tasks = [lab.task(number) for number in range(-(-num_rollouts // per_task))]
    lab.worker.generate([])  # warm
    started = time.perf_counter()
    items = [lab.submission(task, lab.pinned(task)) for task in tasks]
    generated = time.perf_counter()
    verdicts = lab.audit(items)
    audited = time.perf_counter()
    rollouts = len(tasks) * per_task
    rejected = [verdict for verdict, _ in verdicts if not verdict.accepted]
    checked = [rollout for _, rollout_verdicts in verdicts for rollout in rollout_verdicts]
    worker_s, validator_s = generated - started, audited - generated
    return {
        "rollouts": rollouts,
        "rollouts_checked": len(checked),
        "rejected_submissions": len(rejected),
        "rejected_rollouts": sum(not rollout.accepted for rollout in checked),
        "reasons": [reason for verdict in rejected for reason in verdict.reasons][:5],
        "worker_s_per_rollout": round(worker_s / rollouts, 6),
        "validator_s_per_rollout": round(validator_s / rollouts, 6),
        "verify_over_generate": round(validator_s / worker_s, 4),
    }


def attack_images(lab: AuditLab, attack: str, task: Any) -> list[tuple[Any, ...]]:
    from environments.images import Image

    def perturbed(image: Image) -> Image:
        return Image(image.width, image.height, bytes([(image.rgb[0] + 128) % 256]) + image.rgb[1:])

    if attack == "another_image":
        return [lab.environment.example(p.example_index + 1).images for p in task.prompts]
    if attack == "perturbed_image":
        return [tuple(perturbed(image) for image in shown) for shown in lab.pinned(task)]
    return lab.pinned(task)


def moved_model(model: Path, noise: float) -> Any:
    """Another model: ``model``'s weights plus Gaussian noise of ``noise`` (seeded)."""
    import torch

    from engines.hf import HFEngine

    other = HFEngine(model, max_batch_size=256)
    generator = torch.Generator().manual_seed(5)
    with torch.no_grad():
        for parameter in other.model.parameters():
            parameter.add_(torch.randn(parameter.shape, generator=generator).to(parameter.dtype) * noise)
    return other


def attacks(lab: AuditLab, model: Path, num_tasks: int) -> dict[str, Any]:
    """Per attack, the share of its submissions the validator rejected (tasks not used by the honest audits)."""
    other = moved_model(model, lab.args.other_model_noise)
    found: dict[str, Any] = {}
    try:
        for offset, attack in enumerate(ATTACKS):
            tasks = [lab.task(100_000 + offset * num_tasks + n) for n in range(num_tasks)]
            engine = other if attack == "another_model" else lab.worker
            items = [lab.submission(task, attack_images(lab, attack, task), engine) for task in tasks]
            verdicts = [verdict for verdict, _ in lab.audit(items)]
            found[attack] = {
                "submissions": len(items),
                "rejected": sum(not v.accepted for v in verdicts),
                "reasons": [v.reasons[0] for v in verdicts if v.reasons][:2],
            }
    finally:
        other.close()
    return found


def run_metrics(root: Path) -> list[dict[str, Any]]:
    lines = (root / "run" / "metrics.jsonl").read_text().splitlines()
    return [row for row in map(json.loads, lines) if row.get("kind") == "step"]


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="1 seed, 4 steps, small eval and calibration")
    parser.add_argument("--audit-only", action="store_true", help="the calibration and the attacks, no runs")
    # the frozen random tower leaves the count little room to climb: the run needs more, and larger, steps
    add_network_run_arguments(parser, max_tokens=4, steps=DEFAULT_STEPS, lr=DEFAULT_LR)
    parser.add_argument("--eval-examples", type=int, default=None, help="held-out images (default 256; quick 32)")
    parser.add_argument("--eval-samples", type=int, default=4)
    parser.add_argument("--calibration-rollouts", type=int, default=None, help="honest rollouts (default 1024)")
    parser.add_argument("--audit-batch", type=int, default=8, help="submissions per validator prefill batch")
    parser.add_argument("--attack-tasks", type=int, default=None, help="tasks per attack (default 8; quick 2)")
    parser.add_argument("--other-model-noise", type=float, default=0.02)
    parser.add_argument("--start", default=START, help=f"the start checkpoint (default {START})")
    parser.add_argument("--dir", type=Path, default=Path("runs/vlm-bench"))
    args = parser.parse_args()
    args.engines = ["hf"]  # vLLM's CPU build cannot import its Qwen2-VL path (docs/models.md)
    args.calibration_rollouts = args.calibration_rollouts or (128 if args.quick else 1024)
    args.attack_tasks = args.attack_tasks or (2 if args.quick else 8)
    return args


def main() -> None:
    args = parse_args()
    seeds, num_eval = run_plan(args, quick_eval=32)

    from trainer.resolve import resolve_model_path

    root = args.dir.resolve()
    shutil.rmtree(root, ignore_errors=True)
    start = resolve_model_path(args.start)
    lab = AuditLab(start, args)
    try:
        honest = honest_audits(lab, args.calibration_rollouts)
        log(f"honest: {honest['rejected_rollouts']} of {honest['rollouts']} rollouts rejected")
        attacked = attacks(lab, start, args.attack_tasks)
        log(f"attacks: {json.dumps({k: v['rejected'] for k, v in attacked.items()})}")
    finally:
        lab.close()

    def score(model: Path) -> dict[str, Any]:
        return evaluate(model, ENVIRONMENT, num_eval, args.eval_samples, args.max_tokens)

    first = score(start)
    log(f"start: accuracy {first['accuracy']:.3f}")
    runs: list[dict[str, Any]] = []
    for seed in [] if args.audit_only else seeds:
        log(f"seed {seed}: {args.steps} steps through the network")
        seed_root = root / f"seed{seed}"
        seed_root.mkdir(parents=True)
        started = time.time()
        config = network_run_config(f"vlm-{seed}", seed_root, start, ENVIRONMENT, seed, args)
        run_coordinator(seed_root, config, "the network run")
        final = score(seed_root / "run" / "final-policy")
        log(f"seed {seed}: accuracy {final['accuracy']:.3f} after {time.time() - started:.0f} s")
        runs.append(
            {"seed": seed, "wall_s": round(time.time() - started, 1), "eval": final, "steps": run_metrics(seed_root)}
        )
    summary = summarise(first, runs, honest, attacked, args.steps)
    print(json.dumps({"summary": summary, "start": first, "honest": honest, "attacks": attacked, "runs": runs}))


def summarise(
    first: dict[str, Any], runs: list[dict[str, Any]], honest: dict[str, Any], attacked: dict[str, Any], steps: int
) -> dict[str, Any]:
    start = float(first["accuracy"])
    ends = [float(run["eval"]["accuracy"]) for run in runs]
    mean: Callable[[list[float]], float] = statistics.mean
    return {
        "accuracy_start": round(start, 4),
        "accuracy_end": round(mean(ends), 4) if ends else None,
        "accuracy_gain_min": round(min(ends) - start, 4) if ends else None,
        "verify_over_generate": honest["verify_over_generate"],
        "honest_rejections": honest["rejected_rollouts"],
        "honest_rollouts": honest["rollouts_checked"],
        "attacks_detected": round(
            sum(a["rejected"] for a in attacked.values()) / sum(a["submissions"] for a in attacked.values()), 4
        ),
        "steps": steps if runs else 0,
    }


if __name__ == "__main__":
    main()
