"""Costs at a real model's size: a random-init Qwen3-0.6B-shaped model through the worker's engines and the validator.

The model has Qwen3-0.6B's configuration (hidden 1024, 28 layers, 16 attention heads, 8 KV heads,
head_dim 128, intermediate 3072, a 151,936-token vocabulary, tied embeddings) and random weights
from a fixed seed, built offline and cached under ``.bench-cache/model_scale/``. A random init's
next-token distribution is nearly uniform (logits with a standard deviation of ~0.6 nats over
151,936 tokens, entropy ~11.7 nats); the final norm's weight is multiplied by ``NORM_SCALE`` (the
head is tied to the embeddings, so it cannot be scaled alone), which puts the logits' standard
deviation near 5 nats, the sampled tokens' mean -logprob (an entropy estimate, reported) at a few
nats, as a trained model's is.

One task of ``--sequences`` samples (groups of 8 per prompt) x ``--new-tokens`` tokens (no EOS, so
every sample runs the full length) goes through:

1. the vLLM engine (the worker's, engines/vllm.py: hidden-state capture and the verifiable
   sampler) generating with vLLM's own random sampling and with the verifiable sampler, rounds
   alternating, the time inside vLLM's ``Sampler`` measured for each; then the worker's proof
   building (``build_proofs``, and ``build_submission`` as the worker loop calls it);
2. the HF engine (engines/hf.py) generating the same task; an HF engine of another random init and
   one of the policy with 1% weight noise (tests/support/tiny_model.perturb_checkpoint) each
   generating an attack submission of ``--attack-sequences`` samples;
3. the validator's audit (validator.audit.audit_submissions: signature, HF prefill, TOPLOC proof,
   sampling replay, logprobs; every rollout audited) of each submission against the honest policy;
   and a micro-benchmark of the samplers on 16 rows of the model's real logits.

Engines run one after the other (the box's memory holds one such model comfortably, not four).
Prints one JSON object; ``summary``: ``params``, ``proof_overhead_fraction`` (proof building /
vLLM generation), ``sampler_overhead_fraction`` ((verifiable - plain) time in vLLM's sampler /
plain generation time), ``vllm_over_hf`` (tokens/s), ``verify_over_generate`` (validator audit of
the vLLM submission / its generation), ``policy_bytes`` (the checkpoint's safetensors),
``honest_rejections`` (honest rollouts rejected), ``attacks_detected`` (fraction of the attack
submissions rejected).

    python -m bench.model_scale [--quick] [--dtype float32|bfloat16] [--device cpu|cuda] [--layers N] ...
"""

from __future__ import annotations

import argparse
import gc
import json
import math
import platform
import statistics
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch

from engines.base import GenerationRequest, GenerationResult
from engines.random_model import random_causal_lm
from protocol.identity import NodeIdentity
from protocol.schemas import PendingSubmission, SamplingParams, Task
from protocol.signing import sign_document
from toploc.calibrations import toploc_config
from toploc.config import ToplocConfig
from toploc.proof import build_proofs
from worker.submission import build_submission, generation_requests

ROOT = Path(__file__).resolve().parents[1]
CACHE_DIR = ROOT / ".bench-cache" / "model_scale"
QWEN3_0_6B_SHAPE: dict[str, Any] = {
    "hidden_size": 1024,
    "num_hidden_layers": 28,
    "num_attention_heads": 16,
    "num_key_value_heads": 8,
    "head_dim": 128,
    "intermediate_size": 3072,
    "vocab_size": 151_936,
    "tie_word_embeddings": True,
    "max_position_embeddings": 40_960,
    "rope_theta": 1_000_000.0,
    "rms_norm_eps": 1e-6,
}
NORM_SCALE = 8.0
"""Multiplies the final norm's weight after init: logits std ~0.6 -> ~5 nats (tiny_model's logit_scale is 8 too)."""
GROUP_SIZE = 8
POLICY_SEED, OTHER_SEED, NOISE_SEED = 0, 1, 2
WEIGHT_NOISE = 0.01
TEMPERATURE = 1.0


def qwen3_config(num_layers: int, vocab_size: int) -> Any:
    """Qwen3-0.6B's configuration with ``num_layers`` layers and ``vocab_size`` tokens (both its own by default)."""
    from transformers import Qwen3Config

    shape = QWEN3_0_6B_SHAPE | {"num_hidden_layers": num_layers, "vocab_size": vocab_size}
    return Qwen3Config(**shape, bos_token_id=0, eos_token_id=1, pad_token_id=0)


def _done(path: Path) -> bool:
    return (path / "config.json").exists() and any(path.glob("*.safetensors"))


def build_random_checkpoint(path: Path, config: Any, seed: int, dtype: torch.dtype) -> Path:
    """A random init of ``config`` from ``seed`` (global torch RNG left as it was), saved once under ``path``."""
    if _done(path):
        return path
    model = random_causal_lm(config, seed)
    with torch.no_grad():
        model.model.norm.weight.mul_(NORM_SCALE)
    staging = path.with_name(path.name + ".partial")
    model.to(dtype).save_pretrained(staging, safe_serialization=True)
    del model
    gc.collect()
    staging.rename(path)
    return path


def checkpoints(num_layers: int, vocab_size: int, dtype: torch.dtype, cache_dir: Path = CACHE_DIR) -> dict[str, Path]:
    """The policy, another random init and the policy with 1% weight noise, built once per shape and dtype."""
    from tests.support.tiny_model import perturb_checkpoint

    root = cache_dir / f"qwen3-l{num_layers}-v{vocab_size}-{str(dtype).removeprefix('torch.')}"
    root.mkdir(parents=True, exist_ok=True)
    config = qwen3_config(num_layers, vocab_size)
    policy = build_random_checkpoint(root / "policy", config, POLICY_SEED, dtype)
    other = build_random_checkpoint(root / "other", config, OTHER_SEED, dtype)
    noisy = root / "noisy"
    if not _done(noisy):
        staging = noisy.with_name("noisy.partial")
        perturb_checkpoint(policy, staging, WEIGHT_NOISE, seed=NOISE_SEED)
        staging.rename(noisy)
    return {"policy": policy, "other": other, "noisy": noisy}


def bench_task(index: int, num_sequences: int, prompt_tokens: int, new_tokens: int, vocab_size: int) -> Task:
    """A task shaped like the ledger's: prompts of random token ids, groups of up to 8 samples."""
    group_size = min(GROUP_SIZE, num_sequences)
    if num_sequences % group_size:
        raise SystemExit(f"--sequences must be a multiple of {group_size} (or at most {GROUP_SIZE})")
    generator = torch.Generator().manual_seed(100 + index)
    prompts = [
        {"prompt_index": i, "token_ids": torch.randint(2, vocab_size, (prompt_tokens,), generator=generator).tolist()}
        for i in range(num_sequences // group_size)
    ]
    return Task.model_validate(
        {
            "task_id": f"scale-{index}",
            "lease_id": f"scale-{index}",
            "task_name": "model_scale",
            "prompts": prompts,
            "group_size": group_size,
            "sampling": SamplingParams(temperature=TEMPERATURE, max_tokens=new_tokens).model_dump(),
            "policy_version": 0,
            "sampling_seed": 7_000 + index,
            "deadline": time.time() + 86_400,
        }
    )


class Clock:
    """Accumulated seconds of one function (engine sampler, HF draw), synchronised on CUDA."""

    def __init__(self, device: str) -> None:
        self.seconds = 0.0
        self.calls = 0
        self.cuda = device.startswith("cuda")

    def wrap(self, function: Callable[..., Any]) -> Callable[..., Any]:
        def timed(*args: Any, **kwargs: Any) -> Any:
            if self.cuda:
                torch.cuda.synchronize()
            started = time.perf_counter()
            value = function(*args, **kwargs)
            if self.cuda:
                torch.cuda.synchronize()
            self.seconds += time.perf_counter() - started
            self.calls += 1
            return value

        return timed

    def take(self) -> float:
        seconds, self.seconds, self.calls = self.seconds, 0.0, 0
        return seconds


@contextmanager
def patched(owner: Any, name: str, clock: Clock) -> Iterator[None]:
    original = getattr(owner, name)
    setattr(owner, name, clock.wrap(original))
    try:
        yield
    finally:
        setattr(owner, name, original)


def warm_up(requests: Sequence[GenerationRequest]) -> list[GenerationRequest]:
    """Two short requests: the first calls of an engine pay for allocations and caches."""
    return [replace(request, uid=f"warm/{request.uid}", max_tokens=4) for request in requests[:2]]


def progress(message: str) -> None:
    """A line on stderr (stdout is the one JSON object): the full run takes many minutes."""
    print(f"[model_scale {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def timed(function: Callable[[], Any]) -> tuple[Any, float]:
    started = time.perf_counter()
    value = function()
    return value, time.perf_counter() - started


def vllm_phase(
    checkpoint: Path, task: Task, dtype: str, device: str, repeats: int, max_model_len: int
) -> dict[str, Any]:
    """Plain vs verifiable generation in one vLLM engine (sampler time inside it), then the worker's proofs."""
    from vllm import SamplingParams as VllmSamplingParams
    from vllm.inputs import TokensPrompt
    from vllm.v1.sample.sampler import Sampler

    from engines.vllm import VllmEngine

    requests = generation_requests(task, ())
    shape = json.loads((checkpoint / "config.json").read_text())
    kv_bytes_per_token = 2 * shape["num_key_value_heads"] * shape["head_dim"] * shape["num_hidden_layers"]
    kv_bytes_per_token *= 4 if dtype == "float32" else 2
    kv_cache_bytes = int(1.5 * kv_bytes_per_token * len(requests) * max_model_len) + (64 << 20)
    engine = VllmEngine(
        checkpoint,
        max_batch_size=len(requests),
        max_model_len=max_model_len,
        dtype=dtype,
        kv_cache_bytes=kv_cache_bytes,
        device=device,
    )
    llm: Any = engine._llm  # plain sampling goes to vLLM directly: the engine only samples verifiably
    hooks: Any = engine._hooks

    def plain() -> None:
        params = [
            VllmSamplingParams(
                temperature=request.temperature,
                max_tokens=request.max_tokens,
                logprobs=0,
                ignore_eos=True,
                detokenize=False,
                extra_args={"uid": f"plain/{request.uid}"},  # hidden states captured as for verifiable requests
            )
            for request in requests
        ]
        prompts = [TokensPrompt(prompt_token_ids=list(request.prompt_ids)) for request in requests]
        outputs = llm.generate(prompts, params, use_tqdm=False)
        llm.collective_rpc(hooks.take_captured, args=([f"plain/{request.uid}" for request in requests],))
        lengths = [len(output.outputs[0].token_ids) for output in outputs]
        if lengths != [request.max_tokens for request in requests]:
            raise RuntimeError("vLLM's plain sampling stopped early")

    clock = Clock(device)
    times: dict[str, list[float]] = {"plain": [], "verifiable": []}
    sampler_s: dict[str, list[float]] = {"plain": [], "verifiable": []}
    results: list[GenerationResult] = []
    with patched(Sampler, "forward", clock):
        engine.generate(warm_up(requests))
        plain()
        clock.take()
        for _ in range(repeats):
            _, seconds = timed(plain)
            times["plain"].append(seconds)
            sampler_s["plain"].append(clock.take())
            results, seconds = timed(lambda: engine.generate(requests))
            times["verifiable"].append(seconds)
            sampler_s["verifiable"].append(clock.take())
    engine.close()
    gc.collect()
    hidden = [result.hidden_states for result in results]
    build_proofs(hidden[:1])  # the field tables are built once per process
    proofs_s = min(timed(lambda: build_proofs(hidden))[1] for _ in range(3))
    submission, submission_s = timed(lambda: build_submission(task, "vllm", results))
    tokens = sum(len(result.completion_ids) for result in results)
    best = {mode: min(values) for mode, values in times.items()}
    best_sampler = {mode: sampler_s[mode][times[mode].index(best[mode])] for mode in times}
    return {
        "submission": submission,
        "tokens": tokens,
        "generate_s": best["verifiable"],
        "plain_generate_s": best["plain"],
        "sampler_s": best_sampler["verifiable"],
        "plain_sampler_s": best_sampler["plain"],
        "rounds_s": times,
        "rounds_sampler_s": sampler_s,
        "proof_build_s": proofs_s,
        "build_submission_s": submission_s,
        "proof_bytes": sum(len(p) for p in build_proofs(hidden[:1])),
        "mean_neg_logprob": -statistics.fmean(lp for result in results for lp in result.logprobs),
        "kv_cache_bytes": kv_cache_bytes,
    }


def hf_generation(
    checkpoint: Path, task: Task, dtype: str, device: str, threads: int | None
) -> tuple[Any, dict[str, Any]]:
    """The HF engine's generation of ``task`` (timed, its sampler's share too), and the engine for reuse."""
    import engines.hf
    from engines.hf import HFEngine

    requests = generation_requests(task, ())
    engine = HFEngine(checkpoint, dtype=dtype, device=device, max_batch_size=len(requests), num_threads=threads)  # type: ignore[arg-type]
    engine.generate(warm_up(requests))
    clock = Clock(device)
    with patched(engines.hf, "draw_tokens_at", clock):
        results, seconds = timed(lambda: engine.generate(requests))
    figures = {
        "submission": build_submission(task, "hf", results),
        "tokens": sum(len(result.completion_ids) for result in results),
        "generate_s": seconds,
        "sampler_s": clock.take(),
    }
    return engine, figures


def signed(worker: NodeIdentity, task: Task, submission: Any, name: str) -> PendingSubmission:
    return PendingSubmission(
        submission_id=name,
        worker_id=worker.node_id,
        task=task,
        submission=submission,
        submitted_at=time.time(),
        worker_signature_b64=sign_document(worker, submission.model_dump(mode="json")),
    )


def sampler_micro(engine: Any, task: Task, submission: Any, repeats: int) -> dict[str, Any]:
    """ms per step of each sampler on 16 rows of the policy's real logits (one prefill of one rollout)."""
    from toploc.sampling import draw_tokens_at, noisy_scores_at, stream_states

    rollout = submission.rollouts[0]
    prompt = next(p for p in task.prompts if p.prompt_index == rollout.prompt_index)
    logits = engine.prefill([list(prompt.token_ids)], [rollout.completion_ids])[0].logits[:16].to(engine.device)
    rows = logits.shape[0]
    temperatures = torch.full((rows,), TEMPERATURE)
    states = stream_states([task.sampling_seed] * rows, torch.arange(rows), logits.device)
    positions = torch.arange(rows)

    def median_ms(function: Callable[[], Any]) -> float:
        function()
        return 1e3 * statistics.median(timed(function)[1] for _ in range(repeats))

    reference = noisy_scores_at(logits, temperatures, states, positions).argmax(dim=-1)
    scaled = logits / TEMPERATURE
    return {
        "rows": rows,
        "vocab_size": int(logits.shape[1]),
        "logits_std": float(logits.std(dim=-1).mean()),
        "verifiable_ms": median_ms(lambda: draw_tokens_at(logits, temperatures, states, positions)),
        "verifiable_definition_ms": median_ms(
            lambda: noisy_scores_at(logits, temperatures, states, positions).argmax(dim=-1)
        ),
        "multinomial_ms": median_ms(lambda: torch.multinomial(torch.softmax(scaled, dim=-1), 1)),
        "exponential_race_ms": median_ms(  # vLLM's random sampling: argmax(p / Exp(1))
            lambda: (torch.softmax(scaled, dim=-1) / torch.empty_like(scaled).exponential_()).argmax(dim=-1)
        ),
        "log_softmax_ms": median_ms(lambda: torch.log_softmax(scaled, dim=-1)),
        "same_tokens_as_definition": bool(
            torch.equal(draw_tokens_at(logits, temperatures, states, positions), reference)
        ),
    }


def summarize(figures: dict[str, Any]) -> dict[str, Any]:
    """The summary's keys from the measured figures (see the module docstring for each definition)."""
    vllm, hf = figures["vllm"], figures["hf"]
    honest = figures["audits"]["honest"]
    attacks = figures["audits"]["attacks"]
    return {
        "params": figures["params"],
        "proof_overhead_fraction": round(vllm["proof_build_s"] / vllm["generate_s"], 4),
        "sampler_overhead_fraction": round((vllm["sampler_s"] - vllm["plain_sampler_s"]) / vllm["plain_generate_s"], 4),
        "vllm_over_hf": round((vllm["tokens"] / vllm["generate_s"]) / (hf["tokens"] / hf["generate_s"]), 3),
        "verify_over_generate": round(honest["vllm"]["audit_s"] / vllm["generate_s"], 3),
        "policy_bytes": figures["policy_bytes"],
        "honest_rejections": sum(audit["rollouts_rejected"] for audit in honest.values()),
        "attacks_detected": (sum(not audit["accepted"] for audit in attacks.values()) / len(attacks))
        if attacks
        else math.nan,
    }


def audit(engine: Any, item: PendingSubmission, config: ToplocConfig, repeats: int) -> tuple[dict[str, Any], list[str]]:
    from validator.audit import audit_submissions

    seconds = []
    verdict: Any = None
    rollout_verdicts: list[Any] = []
    for _ in range(repeats):
        ([(verdict, rollout_verdicts)], elapsed) = timed(lambda: audit_submissions([item], engine, (), config))
        seconds.append(elapsed)
    return {
        "accepted": bool(verdict.accepted),
        "rollouts": len(item.submission.rollouts),
        "rollouts_rejected": sum(not v.accepted for v in rollout_verdicts),
        "audit_s": min(seconds),
        "max_sampling_gap": max((v.max_sampling_gap for v in rollout_verdicts), default=math.nan),
        "max_logprob_error": max((v.max_logprob_error for v in rollout_verdicts), default=math.nan),
    }, list(verdict.reasons[:3])


def run(args: argparse.Namespace) -> dict[str, Any]:
    torch_dtype = {"float32": torch.float32, "bfloat16": torch.bfloat16}[args.dtype]
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        raise SystemExit("--device cuda needs a CUDA GPU: run it on a GPU machine (bench/gpu_worker.sh) or use cpu")
    started = time.perf_counter()
    paths, build_s = timed(lambda: checkpoints(args.layers, args.vocab_size, torch_dtype))
    task = bench_task(0, args.sequences, args.prompt_tokens, args.new_tokens, args.vocab_size)
    attack_task = bench_task(1, args.attack_sequences, args.prompt_tokens, args.new_tokens, args.vocab_size)
    max_model_len = 16 * math.ceil((args.prompt_tokens + args.new_tokens + 1) / 16)
    own = ToplocConfig.model_validate(json.loads(Path(args.toploc).read_text())) if args.toploc else None
    # As a validator audits: the calibration of (dtype, generating engine), with --toploc's fields on top.
    configs = {engine: toploc_config(args.dtype, engine, own=own) for engine in ("vllm", "hf")}

    progress(f"checkpoints ready in {build_s:.0f} s; vLLM generation")
    vllm = vllm_phase(paths["policy"], task, args.dtype, args.device, args.repeats, max_model_len)
    progress(f"vLLM done ({vllm['generate_s']:.1f} s per generation); HF generation")
    engine, hf = hf_generation(paths["policy"], task, args.dtype, args.device, args.threads)
    params = sum(parameter.numel() for parameter in engine.model.parameters())
    attack_submissions = {}
    for name in ("other", "noisy"):
        progress(f"attack generation: {name}")
        attacker, generated = hf_generation(paths[name], attack_task, args.dtype, args.device, args.threads)
        attacker.close()
        del attacker
        gc.collect()
        attack_submissions[name] = generated["submission"]

    worker = NodeIdentity.generate()
    honest_items = {
        "vllm": signed(worker, task, vllm.pop("submission"), "honest-vllm"),
        "hf": signed(worker, task, hf.pop("submission"), "honest-hf"),
    }
    attack_items = {name: signed(worker, attack_task, s, f"attack-{name}") for name, s in attack_submissions.items()}
    progress("validator audits")
    honest, reasons = {}, {}
    for name, item in honest_items.items():
        honest[name], reasons[f"honest-{name}"] = audit(engine, item, configs[name], repeats=1)
    attacks = {}
    for name, item in attack_items.items():
        attacks[name], reasons[f"attack-{name}"] = audit(engine, item, configs["hf"], repeats=1)  # HF-generated
    micro = sampler_micro(engine, task, honest_items["vllm"].submission, repeats=5)
    figures: dict[str, Any] = {
        "params": params,
        "policy_bytes": sum(file.stat().st_size for file in paths["policy"].glob("*.safetensors")),
        "vllm": vllm,
        "hf": hf,
        "audits": {"honest": honest, "attacks": attacks},
    }
    return {
        "summary": summarize(figures),
        "vllm": vllm,
        "hf": hf,
        "audits": {"honest": honest, "attacks": attacks, "first_reasons": reasons},
        "sampler_micro": micro,
        "shape": QWEN3_0_6B_SHAPE | {"num_hidden_layers": args.layers, "vocab_size": args.vocab_size},
        "norm_scale": NORM_SCALE,
        "sequences": args.sequences,
        "attack_sequences": args.attack_sequences,
        "prompt_tokens": args.prompt_tokens,
        "new_tokens": args.new_tokens,
        "temperature": TEMPERATURE,
        "dtype": args.dtype,
        "device": args.device,
        "repeats": args.repeats,
        "torch_threads": torch.get_num_threads(),
        "toploc": {engine: config.model_dump() for engine, config in configs.items()},
        "toploc_source": f"toploc/calibration/ for {args.dtype}" + (f", {args.toploc} on top" if args.toploc else ""),
        "checkpoint_build_s": round(build_s, 1),
        "total_s": round(time.perf_counter() - started, 1),
        "quick": args.quick,
        "machine": {"platform": platform.platform(), "torch": torch.__version__, "python": sys.version.split()[0]},
        "notes": [
            "generation times are the best of the rounds; vLLM rounds alternate plain and verifiable sampling",
            "sampler_overhead_fraction: (verifiable - plain) seconds inside vLLM's Sampler / plain generation",
            "this machine may be shared: ratios measured in one run are the figures to compare",
        ],
    }


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    from worker.devices import cpu_engine_threads

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="2 layers, 4 sequences x 32 tokens (a smoke run)")
    parser.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32")
    parser.add_argument("--device", default="cpu", help="cpu or cuda (every engine and the validator)")
    parser.add_argument("--layers", type=int, default=None, help="decoder layers (default 28; quick 2)")
    parser.add_argument("--vocab-size", type=int, default=QWEN3_0_6B_SHAPE["vocab_size"])
    parser.add_argument("--sequences", type=int, default=None, help="samples of the task (default 16; quick 4)")
    parser.add_argument("--new-tokens", type=int, default=None, help="tokens per sample (default 128; quick 32)")
    parser.add_argument("--prompt-tokens", type=int, default=32)
    parser.add_argument("--attack-sequences", type=int, default=None, help="samples per attack (default 4; quick 2)")
    parser.add_argument("--repeats", type=int, default=None, help="vLLM rounds of each sampling (default 2; quick 1)")
    parser.add_argument("--threads", type=int, default=None, help="HF torch threads (default: the worker's choice)")
    parser.add_argument("--toploc", default=None, help="JSON of [toploc] fields set over the calibration of --dtype")
    args = parser.parse_args(argv)
    quick = args.quick
    args.layers = args.layers or (2 if quick else QWEN3_0_6B_SHAPE["num_hidden_layers"])
    args.sequences = args.sequences or (4 if quick else 16)
    args.new_tokens = args.new_tokens or (32 if quick else 128)
    args.attack_sequences = args.attack_sequences or (2 if quick else 4)
    args.repeats = args.repeats or (1 if quick else 2)
    if args.threads is None and args.device == "cpu":
        args.threads = cpu_engine_threads()
    return args


def main() -> None:
    print(json.dumps(run(parse_args()), indent=2, default=float))


if __name__ == "__main__":
    main()
