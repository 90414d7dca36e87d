"""A worker serving a quantized copy of the policy: how many audited tokens a validator needs to catch it.

The policy is a random Qwen2 (tests.support.tiny_model, ``--model``) in float32, the precision of a CPU
run. A substituting worker generates with a copy whose every linear layer has weight-only fake-quantized
weights (tests.support.tiny_model.quantize_linear_layers): int8 with one scale per output channel, int4
with one scale per group of 32 inputs. It proves what it computed (its own hidden states) and reports its
own logprobs, as such a worker would. Honest workers generate with the policy itself. Each engine of
``--engines`` generates (HF, and vLLM where it runs); the validator's audit is the real one,
``toploc.verify.verify_claims`` on the HF prefill of the policy: TOPLOC proof, sampling replay and
logprob checks with the kept calibration of (float32, engine, hf) (validator.audit.Thresholds). A
worker names its own engine, so a substituted rollout counts as detected only when it is rejected under
the calibration of *every* engine it could name; an honest rollout is judged under its own engine's.

From the per-rollout detection rate ``p`` of a variant and its mean audited tokens per rollout ``L``,
auditing ``T`` tokens of a worker's rollouts (whole rollouts, independent) catches it with probability
``1 - (1 - p) ** (T / L)``; ``tokens_to_detect_<variant>`` is the least whole number of rollouts whose
tokens reach 0.99, times ``L`` (null when no rollout was caught). The ``_conservative`` figures use the
95% lower confidence bound of ``p`` (Clopper-Pearson) instead, since a rate of 1.0 from n rollouts only
says ``p >= 0.05 ** (1 / n)``. Prints one JSON object; ``summary`` holds ``tokens_to_detect_int8``,
``tokens_to_detect_int4`` (the worst of the engines and of the two strategies: the attacker picks) and
``honest_false_positive_rate``.
"""

from __future__ import annotations

import argparse
import json
import math
import platform
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

import torch

from bench.toploc_tasks import MODELS, make_tasks
from engines.base import Engine
from engines.hf import HFEngine
from tests.support.adversary import honest_claims, repaired
from tests.support.tiny_model import quantize_linear_layers, save_tiny_qwen2
from toploc.calibrations import GENERATING_ENGINES
from toploc.verify import Claim, RolloutVerdict, verify_claims
from validator.audit import Thresholds

TARGET_DETECTION = 0.99
CONFIDENCE = 0.95
VARIANTS = {"honest": None, "int8": (8, None), "int4": (4, 32)}
"""Copy of the policy -> (weight bits, group size along the input; None: one scale per output channel)."""
REPAIRED = "_repaired"
"""Suffix of the strategy that rebuilds proofs and logprobs with a prefill of the full policy."""
AUDITED_TOKENS = (16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192)


def detection_lower_bound(detected: int, trials: int, confidence: float = CONFIDENCE) -> float:
    """The one-sided Clopper-Pearson lower bound of a rate measured as ``detected`` of ``trials``.

    The ``p`` at which ``detected`` or more of ``trials`` happen with probability ``1 - confidence``
    (found by bisection: that probability grows with ``p``)."""
    if detected == 0 or trials == 0:
        return 0.0

    def at_least(p: float) -> float:
        return sum(math.comb(trials, k) * p**k * (1 - p) ** (trials - k) for k in range(detected, trials + 1))

    low, high = 0.0, 1.0
    for _ in range(60):
        middle = (low + high) / 2
        low, high = (middle, high) if at_least(middle) < 1 - confidence else (low, middle)
    return low


def tokens_to_detect(rate: float, tokens_per_rollout: float, target: float = TARGET_DETECTION) -> float | None:
    """Audited tokens (whole rollouts of ``tokens_per_rollout``) that catch a cheat with probability ``target``."""
    if rate <= 0:
        return None
    if rate >= 1:
        return round(tokens_per_rollout, 1)
    rollouts = math.ceil(math.log(1 - target) / math.log(1 - rate))
    return round(rollouts * tokens_per_rollout, 1)


def detection_curve(rate: float, tokens_per_rollout: float) -> dict[str, float]:
    """Detection probability after auditing each of :data:`AUDITED_TOKENS` tokens of a worker's rollouts."""
    return {str(t): round(1 - (1 - rate) ** (t / tokens_per_rollout), 6) for t in AUDITED_TOKENS}


def _generator(kind: str, model_dir: Path) -> Engine:
    if kind == "vllm":
        from engines.vllm import VllmEngine

        return VllmEngine(model_dir, max_batch_size=64, dtype="float32")
    return HFEngine(model_dir, max_batch_size=64)


def _checks(verdict: RolloutVerdict) -> list[str]:
    return sorted({reason.split(":", 1)[0] for reason in verdict.reasons})


def _audit(verifier: HFEngine, claims: list[Claim], engines: list[str]) -> dict[str, list[RolloutVerdict]]:
    """Each claim's verdict as a validator gives it whatever engine a worker names: the run's one threshold set
    (for each threshold the loosest any engine's kept calibration needs), the same for every engine named."""
    prefills = verifier.prefill([c.task.prompt_ids for c in claims], [c.completion_ids for c in claims])
    verdicts = verify_claims(claims, prefills, Thresholds().config())
    return {engine: verdicts for engine in engines}


def _variant_report(
    claims: list[Claim],
    verdicts: dict[str, list[RolloutVerdict]],
    own_engine: str | None,
    policy_tokens: list[list[int]],
) -> Any:
    """Counts of one variant generated by one engine: honest judged as its engine, cheats as the worst case.

    ``policy_tokens`` are the honest completions of the same tasks: a substituted rollout with exactly those
    tokens (and a repaired proof) is the honest rollout, so ``differing_rejected`` counts the catches among
    the rollouts that would change what is trained on."""
    if own_engine is not None:
        rejected = [not v.accepted for v in verdicts[own_engine]]
    else:
        rejected = [all(not verdicts[e][i].accepted for e in verdicts) for i in range(len(claims))]
    checks: Counter[str] = Counter()
    for engine_verdicts in verdicts.values():
        for verdict in engine_verdicts:
            checks.update(_checks(verdict))
    differing = [c.completion_ids != tokens for c, tokens in zip(claims, policy_tokens, strict=True)]
    return {
        "rollouts": len(claims),
        "rejected": sum(rejected),
        "differ_from_policy_draws": sum(differing),
        "differing_rejected": sum(d and r for d, r in zip(differing, rejected, strict=True)),
        "tokens": sum(len(c.completion_ids) for c in claims),
        "rejected_by_check": dict(sorted(checks.items())),
        "rejected_by_engine_calibration": {e: sum(not v.accepted for v in vs) for e, vs in verdicts.items()},
    }


def run(model: str, engines: list[str], num_prompts: int, group_size: int, max_tokens: int) -> dict[str, Any]:
    spec = MODELS[model]
    per_engine: dict[str, dict[str, Any]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        policy_dir = save_tiny_qwen2(work / "policy", seed=0, spec=spec)
        copies = {"honest": policy_dir}
        for name, quantization in VARIANTS.items():
            if quantization is not None:
                bits, group = quantization
                copies[name] = quantize_linear_layers(policy_dir, work / name, bits, group)
        verifier = HFEngine(policy_dir, max_batch_size=64)
        tasks = make_tasks(num_prompts, group_size, max_tokens, verifier.vocab_size, seed=7)
        for engine in engines:
            per_engine[engine] = {}
            for name, model_dir in copies.items():
                generator = verifier if (engine == "hf" and name == "honest") else _generator(engine, model_dir)
                started = time.perf_counter()
                claims = honest_claims(generator, tasks)
                generation_s = time.perf_counter() - started
                if generator is not verifier:
                    generator.close()
                if name == "honest":
                    policy_tokens = [c.completion_ids for c in claims]
                strategies = {name: claims}
                if name != "honest":
                    strategies[name + REPAIRED] = repaired(verifier, claims)
                for strategy, strategy_claims in strategies.items():
                    verdicts = _audit(verifier, strategy_claims, list(GENERATING_ENGINES))
                    own = engine if name == "honest" else None
                    report = _variant_report(strategy_claims, verdicts, own, policy_tokens)
                    report["generation_s"] = round(generation_s, 2)
                    per_engine[engine][strategy] = report
    return per_engine


def summarize(per_engine: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """The summary figures: the worst engine's tokens to detect each variant, honest rejections over all."""
    summary: dict[str, Any] = {}
    details: dict[str, Any] = {}
    for copy in VARIANTS:
        if copy == "honest":
            continue
        worst: float | None = 0.0
        worst_conservative: float | None = 0.0
        for engine, name in ((e, n) for e in per_engine for n in (copy, copy + REPAIRED)):
            counts = per_engine[engine][name]
            rate = counts["rejected"] / counts["rollouts"]
            lower = detection_lower_bound(counts["rejected"], counts["rollouts"])
            tokens_per_rollout = counts["tokens"] / counts["rollouts"]
            needed = tokens_to_detect(rate, tokens_per_rollout)
            needed_conservative = tokens_to_detect(lower, tokens_per_rollout)
            details[f"{name}_{engine}"] = {
                "detection_rate_per_rollout": round(rate, 6),
                "detection_rate_lower_bound_95": round(lower, 6),
                "tokens_per_rollout": round(tokens_per_rollout, 2),
                "detection_rate_of_rollouts_off_the_policys_draws": (
                    round(counts["differing_rejected"] / counts["differ_from_policy_draws"], 6)
                    if counts["differ_from_policy_draws"]
                    else None
                ),
                "tokens_to_detect": needed,
                "tokens_to_detect_conservative": needed_conservative,
                "detection_vs_audited_tokens": detection_curve(rate, tokens_per_rollout),
            }
            worst = None if worst is None or needed is None else max(worst, needed)
            worst_conservative = (
                None
                if worst_conservative is None or needed_conservative is None
                else max(worst_conservative, needed_conservative)
            )
        summary[f"tokens_to_detect_{copy}"] = worst
        summary[f"tokens_to_detect_{copy}_conservative"] = worst_conservative
    honest = [variants["honest"] for variants in per_engine.values()]
    num_honest = sum(h["rollouts"] for h in honest)
    summary["honest_false_positive_rate"] = sum(h["rejected"] for h in honest) / num_honest
    summary["honest_rollouts"] = num_honest
    summary["engines"] = sorted(per_engine)
    return {"summary": summary, "detection": details}


def _vllm_runs() -> bool:
    try:
        import vllm  # noqa: F401
    except Exception:  # any import failure (a missing or CUDA-only build) means vLLM does not run here
        return False
    return True


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="HF only, fewer and shorter rollouts (about a minute)")
    parser.add_argument("--model", choices=sorted(MODELS), default="tiny-heads32")
    parser.add_argument("--engines", default=None, help="comma-separated (default: hf, and vllm where it imports)")
    parser.add_argument("--prompts", type=int, default=None)
    parser.add_argument("--group-size", type=int, default=2)
    parser.add_argument("--max-tokens", type=int, default=None)
    args = parser.parse_args()
    started = time.perf_counter()
    num_prompts, max_tokens = (24, 48) if args.quick else (96, 96)
    num_prompts = args.prompts or num_prompts
    max_tokens = args.max_tokens or max_tokens
    engines = ["hf"] if args.quick or not _vllm_runs() else ["hf", "vllm"]
    if args.engines:
        engines = args.engines.split(",")
    unknown = sorted(set(engines) - set(GENERATING_ENGINES))
    if unknown:
        parser.error(f"unknown engine(s) {unknown}; known: {', '.join(GENERATING_ENGINES)}")
    per_engine = run(args.model, engines, num_prompts, args.group_size, max_tokens)
    report = summarize(per_engine)
    report.update(
        {
            "per_engine": per_engine,
            "setup": {
                "model": f"tests.support.tiny_model.save_tiny_qwen2(seed=0, {MODELS[args.model]}), float32",
                "quantization": {
                    n: {"bits": q[0], "group_size": q[1] or "per output channel"} for n, q in VARIANTS.items() if q
                },
                "prompts": num_prompts,
                "group_size": args.group_size,
                "max_tokens": max_tokens,
                "verifier": "HF prefill of the policy, float32, kept calibrations (float32, <engine>, hf)",
                "target_detection": TARGET_DETECTION,
                "quick": args.quick,
            },
            "machine": {"platform": platform.platform(), "torch": torch.__version__, "python": sys.version.split()[0]},
            "elapsed_s": round(time.perf_counter() - started, 1),
        }
    )
    print(json.dumps(report, indent=2, sort_keys=True))


if __name__ == "__main__":
    main()
