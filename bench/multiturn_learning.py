"""Multi-turn learning through the whole network: a tool task, held-out exact answers, and what verifying costs.

The task is the built-in ``calculator``: work out ``a*b+c``, where the policy may write ``calc EXPRESSION``
and the environment answers with the value, then the policy answers. The start checkpoint is
``builtin:small-qwen3-calculator-start`` (the built-in small Qwen3 after a short SFT on model episodes,
stopped while it still copies numbers wrong). For each seed, ``prime-coordinator start`` runs the RL loop with
its local network (a relay, a vLLM and an HF worker playing episodes, a validator replaying every one, an
FSDP2 trainer training on the policy's sampled tokens only) for ``--steps`` steps at async level 1.

The start and each final policy are evaluated by one evaluator (this project's HF sampler at T = 1 playing
episodes as workers do, ``--eval-samples`` samples of each of ``--eval-examples`` held-out problems), scored by
exact answer. The cost of verifying is measured apart, on the same machine: the HF engine plays a task's
episodes and proves them as a worker does, then a validator audits that submission (replaying every
environment turn, rebuilding every prompt, checking every proof and every turn's seeded draws, recomputing the
rewards), each timed alone.

Prints one JSON object; ``summary``: ``accuracy_start``, ``accuracy_end`` (mean over seeds),
``accuracy_gain_min`` (smallest gain over seeds), ``verify_over_generate`` (the validator's seconds per episode
over the worker's, generation and proofs), ``sampled_token_share`` (of the trained samples' completion tokens,
those the policy sampled; the rest are the tool's replies, which carry no loss), ``turns_mean`` (policy turns
per episode in the training batches), ``eval_turns_mean_start`` and ``eval_turns_mean_end`` (held out; 2 when
every episode called the tool) and ``steps``.

    python -m bench.multiturn_learning             # 3 seeds x 30 steps
    python -m bench.multiturn_learning --quick     # 1 seed, 4 steps, small eval: the pipeline only
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from bench.runs import add_network_run_arguments, network_run_config, run_coordinator, run_plan

START = "builtin:small-qwen3-calculator-start"
ENVIRONMENT: dict[str, Any] = {"type": "builtin", "name": "calculator"}


def log(message: str) -> None:
    print(f"[multiturn_learning] {message}", file=sys.stderr, flush=True)


def evaluate_episodes(model: Path, num_examples: int, num_samples: int, max_tokens: int) -> dict[str, Any]:
    """Held-out figures of ``model`` playing calculator episodes at T = 1 (the HF engine, the checkpoint's end
    tokens): exact-answer accuracy, stop fraction and policy turns per episode (2 when it called the tool)."""
    from engines.base import GenerationRequest
    from engines.hf import HFEngine
    from environments.builtin import builtin_environment
    from node.startup import eos_token_ids
    from trainer.model import load_tokenizer
    from trainer.rollout import RolloutSampler

    environment = builtin_environment("calculator")
    engine = HFEngine(model, max_batch_size=512)
    try:
        tokenizer = load_tokenizer(str(model))
        sampler = RolloutSampler(
            engine, GenerationRequest, environment, tokenizer, 1.0, max_tokens, end_token_ids=eos_token_ids(model)
        )
        return sampler.evaluate(num_examples, num_samples, seed=0).as_dict()
    finally:
        engine.close()


def verify_cost(model: Path, args: argparse.Namespace) -> dict[str, Any]:
    """Seconds per episode for a worker (HF engine: play and prove) and for a validator (audit), same machine."""
    from transformers import AutoTokenizer

    from engines.episodes import PlayedEpisode
    from engines.hf import HFEngine
    from environments.builtin.calculator import Calculator
    from environments.prompts import EnvironmentPrompts
    from node.startup import eos_token_ids
    from protocol.schemas import Task
    from tests.support.adversary import signed_pending
    from validator.audit import Episodes, audit_submissions, environment_reward_fn
    from worker.episodes import EpisodePlayer, build_episode_submission

    environment = Calculator(seed=0)
    tokenizer = AutoTokenizer.from_pretrained(str(model))
    eos = eos_token_ids(model)
    prompts = EnvironmentPrompts(environment, tokenizer).prompt_group(7, args.prompts_per_task)
    task = Task.model_validate(
        {
            "task_id": "t-cost",
            "lease_id": "l-cost",
            "task_name": environment.name,
            "prompts": [
                {"prompt_index": i, "token_ids": list(p.token_ids), "example_index": p.example_index}
                for i, p in enumerate(prompts)
            ],
            "group_size": args.group_size,
            "sampling": {"temperature": 1.0, "max_tokens": args.max_tokens},
            "policy_version": 0,
            "sampling_seed": 99,
            "deadline": time.time() + 3600,
        }
    )
    engine = HFEngine(model, max_batch_size=512)
    try:
        engine.generate([])  # warm
        started = time.perf_counter()
        played: list[PlayedEpisode] = EpisodePlayer(environment, tokenizer).play(engine.generate, task, eos)
        generated = time.perf_counter()
        submission = build_episode_submission(task, engine.name, played)
        proved = time.perf_counter()
        item = signed_pending(task, submission)
        reward_fn = environment_reward_fn(environment, tokenizer, eos)
        audit_started = time.perf_counter()
        ((verdict, _),) = audit_submissions([item], engine, eos, None, reward_fn, Episodes(environment, tokenizer))
        audited = time.perf_counter()
    finally:
        engine.close()
    episodes = len(played)
    worker_s = (proved - started) / episodes
    return {
        "episodes": episodes,
        "turns": sum(len(p.turns) for p in played),
        "accepted": verdict.accepted,
        "reasons": verdict.reasons[:3],
        "generate_s_per_episode": round((generated - started) / episodes, 5),
        "prove_s_per_episode": round((proved - generated) / episodes, 5),
        "verify_s_per_episode": round((audited - audit_started) / episodes, 5),
        "verify_over_generate": round((audited - audit_started) / episodes / worker_s, 4),
    }


def run_metrics(root: Path) -> list[dict[str, Any]]:
    lines = (root / "run" / "metrics.jsonl").read_text().splitlines()
    return [row for row in map(json.loads, lines) if row.get("kind") == "step"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="1 seed, 4 steps, 32 eval problems: the pipeline only")
    add_network_run_arguments(parser, max_tokens=24)
    parser.add_argument("--engines", nargs="+", default=["vllm", "hf"], help="the local network's workers")
    parser.add_argument("--eval-examples", type=int, default=None, help="held-out problems (default 256; quick 32)")
    parser.add_argument("--eval-samples", type=int, default=4)
    parser.add_argument("--dir", type=Path, default=Path("runs/multiturn-learning"))
    args = parser.parse_args()
    seeds, num_eval = run_plan(args, quick_eval=32)

    from trainer.resolve import resolve_model_path

    root = args.dir.resolve()
    shutil.rmtree(root, ignore_errors=True)
    start = resolve_model_path(START)

    def score(model: Path) -> dict[str, Any]:
        return evaluate_episodes(model, num_eval, args.eval_samples, args.max_tokens)

    cost = verify_cost(start, args)
    log(f"verify/generate per episode: {cost['verify_over_generate']} ({cost['episodes']} episodes)")
    first = score(start)
    log(f"start: accuracy {first['accuracy']:.3f}, turns {first['turns_mean']:.3f}")
    runs: list[dict[str, Any]] = []
    for seed in seeds:
        log(f"seed {seed}: {args.steps} steps through the network")
        seed_root = root / f"seed{seed}"
        seed_root.mkdir(parents=True)
        started = time.time()
        config = network_run_config(f"multiturn-{seed}", seed_root, start, ENVIRONMENT, seed, args)
        run_coordinator(seed_root, config, "the network run")
        steps = run_metrics(seed_root)
        final = score(seed_root / "run" / "final-policy")
        log(f"seed {seed}: accuracy {final['accuracy']:.3f} after {time.time() - started:.0f} s")
        runs.append({"seed": seed, "wall_s": round(time.time() - started, 1), "eval": final, "steps": steps})
    print(json.dumps({"summary": summarise(first, runs, cost, args.steps), "start": first, "cost": cost, "runs": runs}))


def summarise(first: dict[str, Any], runs: list[dict[str, Any]], cost: dict[str, Any], steps: int) -> dict[str, Any]:
    start = float(first["accuracy"])
    ends = [float(run["eval"]["accuracy"]) for run in runs]
    batches = [step for run in runs for step in run["steps"]]
    return {
        "accuracy_start": round(start, 4),
        "accuracy_end": round(statistics.mean(ends), 4),
        "accuracy_gain_min": round(min(ends) - start, 4),
        "verify_over_generate": cost["verify_over_generate"],
        "sampled_token_share": round(statistics.mean(s["batch_sampled_fraction"] for s in batches), 4),
        "turns_mean": round(statistics.mean(s["batch_turns_mean"] for s in batches), 4),
        "eval_turns_mean_start": round(first["turns_mean"], 4),
        "eval_turns_mean_end": round(statistics.mean(run["eval"]["turns_mean"] for run in runs), 4),
        "steps": steps,
    }


if __name__ == "__main__":
    main()
