"""On a CUDA machine: the vLLM worker engine's tokens/s and its proofs checked by the CPU validator.

Generates 64 samples x 256 tokens on the built-in tiny model with the vLLM engine on the GPU
(float32, the run's precision, so the CPU validator's calibrated thresholds apply), then
audits every rollout with an HF prefill on the CPU, as a validator without a GPU would.
Prints one JSON object; ``summary``: ``gpu_tokens_per_s``, ``rollouts_accepted_fraction``.
Run it through bench/gpu_worker.sh.
"""

from __future__ import annotations

import json
import time

import torch

from engines.hf import HFEngine
from engines.vllm import VllmEngine
from node.startup import eos_token_ids
from protocol.schemas import SamplingParams
from tests.support.adversary import honest_claims
from toploc.sampling import sample_stream
from toploc.verify import SampleTask, verify_claims
from trainer.resolve import resolve_model_path


def main() -> None:
    if not torch.cuda.is_available():
        raise SystemExit("no CUDA GPU here: run this on a GPU machine (bench/gpu_worker.sh)")
    checkpoint = resolve_model_path("builtin:tiny-qwen2")
    eos = eos_token_ids(checkpoint)
    generator = torch.Generator().manual_seed(0)
    tasks = [
        SampleTask(
            prompt_ids=torch.randint(10, 200, (16,), generator=generator).tolist(),
            sampling=SamplingParams(temperature=1.0, max_tokens=256),
            seed=1234,
            stream=sample_stream(index // 8, index % 8),
            eos_token_ids=eos,
        )
        for index in range(64)
    ]
    engine = VllmEngine(checkpoint, max_batch_size=64, dtype="float32", device="cuda")
    honest_claims(engine, tasks[:4])  # warm-up
    started = time.perf_counter()
    claims = honest_claims(engine, tasks)
    seconds = time.perf_counter() - started
    tokens = sum(len(claim.completion_ids) for claim in claims)
    validator = HFEngine(checkpoint, max_batch_size=16, device="cpu")
    prefills = validator.prefill([c.task.prompt_ids for c in claims], [c.completion_ids for c in claims])
    verdicts = verify_claims(claims, prefills)
    accepted = sum(v.accepted for v in verdicts)
    print(
        json.dumps(
            {
                "summary": {
                    "gpu_tokens_per_s": round(tokens / seconds, 1),
                    "rollouts_accepted_fraction": accepted / len(verdicts),
                },
                "gpu": torch.cuda.get_device_name(0),
                "tokens": tokens,
                "generate_and_prove_s": round(seconds, 3),
                "rejections": [list(v.reasons) for v in verdicts if not v.accepted][:5],
            }
        )
    )


if __name__ == "__main__":
    main()
