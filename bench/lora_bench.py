"""LoRA runs against full-weight runs: learning, bytes per published version, adapter serving speed and memory.

Five parts, each its own keys of the one JSON object printed (``summary`` gathers the headline figures):

- **learning** (``lora_gain_over_full``): per seed, two runs through the real network (``prime-coordinator
  start`` with the local network, :mod:`bench.runs`) on ``sort_digits`` from ``builtin:small-qwen3-sort-start``
  (the task and start of ``bench.learning_vs_trl`` and ``make demo``), the same steps, batch, seed and warm-up:
  full-weight RL at ``--lr``, and LoRA RL (``[orchestrator.trainer.lora]``, ``--rank``, ``--alpha``) at
  ``--lora-lr`` (default 6 x ``--lr``: LoRA's best learning rate is several times full fine-tuning's,
  about ten on large models in Schulman et al., "LoRA Without Regret", 2025; on this small model 30 x
  collapsed at step 4 and 10 x learned erratically, docs/benchmarks.md). Each final policy (the LoRA run's
  with its adapter merged) and the start are scored by one evaluator: ``--eval-samples`` samples at T = 1
  of ``--eval-examples`` held-out prompts, exact answers. A gain is accuracy after minus before;
  ``lora_gain_over_full`` is the mean LoRA gain over the mean full gain (null, with
  ``lora_gain_over_full_null_reason``, when the full gain is not positive).
- **bytes** (``adapter_bytes``, ``full_bytes``, ``patch_bytes``): from the origin store's manifests
  (``<data_dir>/policies/v<N>/manifest.json``) of the LoRA run: the adapter's bytes per version (a patch
  version's rebuilt files counted), the bytes of a full version (the full run's full versions, else the
  base v0 of the LoRA run), and the mean bytes of the value-patch versions SHARDCAST sent (null if none).
  With ``--skip-learning``, a short LoRA run of ``--bytes-steps`` steps gives them.
- **serving speed** (``lora_tokens_per_s_ratio``): the vLLM CPU engine generating the same requests
  (``--requests`` x ``--gen-tokens`` tokens, no stop token) with a rank-``--rank`` adapter loaded, over a
  vLLM engine started without LoRA; each engine in a fresh process, the median of ``--repeats`` calls after
  a warm-up call.
- **memory** (``two_runs_memory_ratio``): one HF engine on the base serving two runs (two
  ``engines.adapted.AdapterView`` with different adapters) over the same engine serving one; the model's
  parameter and buffer bytes (adapters included) and, each case in a fresh process, the process RSS.
  The naive alternative, one engine per run, is reported beside it for contrast.
- **sizes** (``sizes``): adapter and weight bytes in bf16 of Qwen3-8B and Qwen3-32B at ranks 16 and 64
  (every attention and MLP projection adapted), computed from the architectures' shapes; nothing is downloaded.

    python -m bench.lora_bench                   # everything: 3 seeds x 2 runs x 30 steps, then the rest
    python -m bench.lora_bench --quick           # 1 seed x 10 steps, 1 trainer rank, a smaller eval
    python -m bench.lora_bench --skip-learning   # sizes, serving speed, memory and a 3-step LoRA run's bytes
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

START = "builtin:small-qwen3-sort-start"
LORA_LR_MULTIPLIER = 6
"""The LoRA run's learning rate over the full run's (see the module docstring)."""
ENVIRONMENT: dict[str, Any] = {"type": "builtin", "name": "sort_digits"}
SERVE_MODEL = "builtin:small-qwen3"
"""The model the serving parts load by default: the learning runs' architecture (random weights; no SFT to build)."""
LORA_MODULES = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
BF16_BYTES = 2
TWO_RUNS_MEMORY_TARGET = 1.2
GAIN_OVER_FULL_TARGET = 0.9


def log(message: str) -> None:
    print(f"[lora_bench] {message}", file=sys.stderr, flush=True)


# --- sizes from shapes -------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class DecoderShape:
    """A Qwen3-style decoder: GQA attention with per-head q/k norms, a SwiGLU MLP, untied embeddings."""

    hidden: int
    intermediate: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    vocab: int
    tied: bool = False

    def projections(self) -> dict[str, tuple[int, int]]:
        """(in_features, out_features) of each of a layer's seven projections."""
        q, kv = self.heads * self.head_dim, self.kv_heads * self.head_dim
        return {
            "q_proj": (self.hidden, q),
            "k_proj": (self.hidden, kv),
            "v_proj": (self.hidden, kv),
            "o_proj": (q, self.hidden),
            "gate_proj": (self.hidden, self.intermediate),
            "up_proj": (self.hidden, self.intermediate),
            "down_proj": (self.intermediate, self.hidden),
        }


QWEN3_SHAPES = {
    "Qwen3-8B": DecoderShape(
        hidden=4096, intermediate=12288, layers=36, heads=32, kv_heads=8, head_dim=128, vocab=151936
    ),
    "Qwen3-32B": DecoderShape(
        hidden=5120, intermediate=25600, layers=64, heads=64, kv_heads=8, head_dim=128, vocab=151936
    ),
}


def model_params(shape: DecoderShape) -> int:
    """Every weight: embeddings (and an untied output head), per layer the projections, the two RMSNorms and the
    q/k head norms, and the final norm."""
    projections = sum(i * o for i, o in shape.projections().values())
    norms = 2 * shape.hidden + 2 * shape.head_dim
    embeddings = shape.vocab * shape.hidden * (1 if shape.tied else 2)
    return embeddings + shape.layers * (projections + norms) + shape.hidden


def lora_params(shape: DecoderShape, rank: int, modules: tuple[str, ...] = LORA_MODULES) -> int:
    """A rank-``rank`` adapter on ``modules`` of every layer: A is rank x in, B is out x rank."""
    projections = shape.projections()
    return shape.layers * sum(rank * (projections[m][0] + projections[m][1]) for m in modules)


def size_table(ranks: tuple[int, ...] = (16, 64)) -> dict[str, dict[str, int]]:
    return {
        name: {
            "full_bytes_bf16": model_params(shape) * BF16_BYTES,
            **{f"rank{r}_adapter_bytes_bf16": lora_params(shape, r) * BF16_BYTES for r in ranks},
        }
        for name, shape in QWEN3_SHAPES.items()
    }


# --- helpers shared by the parts --------------------------------------------------------------------------------


def make_adapter(base_dir: Path, out_dir: Path, rank: int, alpha: float, seed: int) -> Path:
    """A random rank-``rank`` PEFT adapter on every linear layer of ``base_dir`` (both factors non-zero)."""
    import peft
    import torch
    from transformers import AutoModelForCausalLM

    base: Any = AutoModelForCausalLM.from_pretrained(base_dir, dtype=torch.float32)
    options: dict[str, Any] = {"r": rank, "lora_alpha": alpha, "target_modules": "all-linear", "lora_dropout": 0.0}
    config = peft.LoraConfig(**options)
    model: Any = peft.get_peft_model(base, config)
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, parameter in sorted(model.named_parameters()):
            if ".lora_A." in name:
                parameter.copy_(torch.randn(parameter.shape, generator=generator) / parameter.shape[1] ** 0.5)
            elif ".lora_B." in name:
                parameter.copy_(torch.randn(parameter.shape, generator=generator) * 0.05)
    out_dir.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out_dir, safe_serialization=True)
    return out_dir


def rss_bytes() -> dict[str, int]:
    """This process's resident set now and at its peak (VmRSS, VmHWM)."""
    found: dict[str, int] = {}
    for line in Path("/proc/self/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmRSS", "VmHWM"):
            found[key] = int(value.split()[0]) * 1024
    return {"rss_bytes": found["VmRSS"], "peak_rss_bytes": found["VmHWM"]}


def requests(count: int, max_tokens: int, vocab: int, adapter: str | None) -> list[Any]:
    """``count`` fixed prompts of 8 to 15 tokens, ``max_tokens`` each, no stop token: every call draws the same
    number of tokens."""
    import torch

    from engines.base import GenerationRequest
    from toploc.sampling import sample_stream

    generator = torch.Generator().manual_seed(7)
    return [
        GenerationRequest(
            uid=f"r{i}",
            prompt_ids=torch.randint(3, vocab, (8 + i % 8,), generator=generator).tolist(),
            max_tokens=max_tokens,
            temperature=1.0,
            seed=11,
            stream=sample_stream(i, 0),
            eos_token_ids=(),
            adapter=adapter,
        )
        for i in range(count)
    ]


def run_child(spec: dict[str, Any], timeout_s: float = 1800) -> dict[str, Any]:
    """Run one measurement (``spec``) in a fresh interpreter; its one JSON line on stdout is the answer."""
    done = subprocess.run(
        [sys.executable, "-m", "bench.lora_bench", "--child", json.dumps(spec)],
        capture_output=True,
        text=True,
        timeout=timeout_s,
        cwd=Path(__file__).resolve().parents[1],
    )
    if done.returncode != 0:
        raise SystemExit(f"{spec['part']} child failed (exit {done.returncode}):\n{done.stderr[-3000:]}")
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


# --- serving speed ----------------------------------------------------------------------------------------------


def child_vllm(spec: dict[str, Any]) -> dict[str, Any]:
    """Tokens per second of one vLLM engine (with LoRA and an adapter loaded when ``spec['rank']`` is set)."""
    from engines.vllm import VllmEngine

    rank = spec["rank"]
    engine = VllmEngine(Path(spec["model"]), max_batch_size=spec["requests"], max_model_len=256, lora_rank=rank)
    adapter = None
    if rank is not None:
        engine.load_adapter("run-a", Path(spec["adapter"]))
        adapter = "run-a"

    def rates(name: str | None) -> list[float]:
        batch = requests(spec["requests"], spec["tokens"], engine.vocab_size, name)
        engine.generate(batch)  # warm-up
        found = []
        for _ in range(spec["repeats"]):
            started = time.perf_counter()
            results = engine.generate(batch)
            found.append(sum(len(r.completion_ids) for r in results) / (time.perf_counter() - started))
        return found

    result: dict[str, Any] = {"tokens_per_s": rates(adapter)}
    if rank is not None:
        result["base_requests_tokens_per_s"] = rates(None)
    engine.close()
    return result


def serving_speed(model: Path, adapter: Path, args: argparse.Namespace) -> dict[str, Any]:
    common = {"part": "vllm", "model": str(model), "requests": args.requests, "tokens": args.gen_tokens}
    common["repeats"] = args.repeats
    started = time.monotonic()
    plain = run_child({**common, "rank": None})
    lora = run_child({**common, "rank": args.rank, "adapter": str(adapter)})
    plain_median = statistics.median(plain["tokens_per_s"])
    lora_median = statistics.median(lora["tokens_per_s"])
    return {
        "lora_tokens_per_s_ratio": round(lora_median / plain_median, 4),
        "vllm_tokens_per_s_plain": round(plain_median, 1),
        "vllm_tokens_per_s_adapter": round(lora_median, 1),
        "vllm_tokens_per_s_lora_engine_base_requests": round(statistics.median(lora["base_requests_tokens_per_s"]), 1),
        "vllm_tokens_per_s_runs": {
            "plain": [round(x, 1) for x in plain["tokens_per_s"]],
            "adapter": [round(x, 1) for x in lora["tokens_per_s"]],
        },
        "serving_settings": {
            "engine": "vllm (CPU, float32, eager)",
            "model": str(model),
            "requests": args.requests,
            "tokens_per_request": args.gen_tokens,
            "repeats": args.repeats,
            "rank": args.rank,
        },
        "serving_s": round(time.monotonic() - started, 1),
    }


# --- memory -----------------------------------------------------------------------------------------------------


def tensor_bytes(model: Any) -> int:
    """Parameter and buffer bytes of ``model``, each storage counted once."""
    seen: set[int] = set()
    total = 0
    for tensor in [*model.parameters(), *model.buffers()]:
        if tensor.data_ptr() not in seen:
            seen.add(tensor.data_ptr())
            total += tensor.numel() * tensor.element_size()
    return total


def child_memory(spec: dict[str, Any]) -> dict[str, Any]:
    """One case: ``engines`` HF engines on the base, serving ``len(adapters)`` runs as AdapterViews between them."""
    import torch

    from engines.adapted import AdapterView
    from engines.hf import HFEngine

    torch.set_num_threads(1)
    import peft  # noqa: F401  (imported before the first figure: the delta is the engines' own memory)
    from transformers import AutoModelForCausalLM  # noqa: F401

    before = rss_bytes()
    bases = [HFEngine(Path(spec["model"])) for _ in range(spec["engines"])]
    views = []
    for i, adapter in enumerate(spec["adapters"]):
        view = AdapterView(bases[i % len(bases)], f"run-{chr(ord('a') + i)}")
        view.load_weights(Path(adapter))
        views.append(view)
    for view in views:  # each run serves a small batch, so its activations and caches count too
        view.generate(requests(4, 16, view.vocab_size, None))
    after = rss_bytes()
    return {
        "model_bytes": sum(tensor_bytes(base.model) for base in bases),
        "rss_bytes": after["rss_bytes"],
        "peak_rss_bytes": after["peak_rss_bytes"],
        "rss_delta_bytes": after["rss_bytes"] - before["rss_bytes"],
    }


def memory(model: Path, adapters: tuple[Path, Path]) -> dict[str, Any]:
    started = time.monotonic()
    spec = {"part": "memory", "model": str(model)}
    one = run_child({**spec, "engines": 1, "adapters": [str(adapters[0])]})
    shared = run_child({**spec, "engines": 1, "adapters": [str(a) for a in adapters]})
    separate = run_child({**spec, "engines": 2, "adapters": [str(a) for a in adapters]})

    def ratio(case: dict[str, Any], key: str) -> float:
        return round(float(case[key]) / float(one[key]), 4)

    return {
        "two_runs_memory_ratio": ratio(shared, "model_bytes"),
        "two_runs_memory_target": TWO_RUNS_MEMORY_TARGET,
        "two_runs_rss_ratio": ratio(shared, "rss_bytes"),
        "two_runs_rss_delta_ratio": ratio(shared, "rss_delta_bytes"),
        "two_engines_memory_ratio": ratio(separate, "model_bytes"),
        "two_engines_rss_ratio": ratio(separate, "rss_bytes"),
        "two_engines_rss_delta_ratio": ratio(separate, "rss_delta_bytes"),
        "memory_cases": {"one_run": one, "two_runs_one_base": shared, "two_runs_two_engines": separate},
        "memory_settings": {
            "engine": "hf (float32)",
            "model": str(model),
            "model_bytes": "parameters + buffers, adapters included",
            "rss": "VmRSS of a fresh process after loading and one 4-request call per run; delta: minus VmRSS "
            "before the engines",
        },
        "memory_s": round(time.monotonic() - started, 1),
    }


# --- network runs: learning and bytes ---------------------------------------------------------------------------


def run_config(root: Path, start: Path, seed: int, args: argparse.Namespace, lora: bool) -> dict[str, Any]:
    from bench.runs import network_run_config

    name = f"lora-bench-{seed}-{'lora' if lora else 'full'}"
    config = network_run_config(name, root, start, ENVIRONMENT, seed, args)
    if lora:
        config["orchestrator"]["trainer"]["optimizer"]["lr"] = args.lora_lr
        config["orchestrator"]["trainer"]["lora"] = {"enabled": True, "rank": args.rank, "alpha": args.alpha}
    return config


def version_sizes(data_dir: Path) -> list[dict[str, Any]]:
    """Each published version in the origin store: its number, kind and bytes sent (a patch's result bytes too)."""
    found = []
    for path in (data_dir / "policies").glob("v*/manifest.json"):
        manifest = json.loads(path.read_text())["manifest"]
        kind = manifest.get("kind", "full")
        entry = {"version": int(path.parent.name[1:]), "kind": kind, "bytes": int(manifest["total_size_bytes"])}
        if kind == "patch":
            entry["result_bytes"] = sum(int(f["size_bytes"]) for f in manifest["result_files"])
        found.append(entry)
    return sorted(found, key=lambda entry: entry["version"])


def mean(values: list[int]) -> float | None:
    return round(sum(values) / len(values), 1) if values else None


def bytes_figures(lora_versions: list[dict[str, Any]], full_versions: list[dict[str, Any]] | None) -> dict[str, Any]:
    """adapter_bytes (LoRA run, v >= 1, what each version's adapter weighs), full_bytes (the full run's full versions;
    else the LoRA run's base v0), patch_bytes (the LoRA run's patch versions, as sent)."""
    adapters = [v["result_bytes"] if v["kind"] == "patch" else v["bytes"] for v in lora_versions if v["version"] >= 1]
    patches = [v["bytes"] for v in lora_versions if v["kind"] == "patch"]
    if full_versions:
        fulls, source = [v["bytes"] for v in full_versions if v["kind"] == "full"], "the full run's full versions"
    else:
        fulls, source = [v["bytes"] for v in lora_versions if v["version"] == 0], "the LoRA run's base (v0)"
    figures: dict[str, Any] = {
        "adapter_bytes": mean(adapters),
        "full_bytes": mean(fulls),
        "patch_bytes": mean(patches),
        "full_bytes_source": source,
        "lora_versions": len(adapters),
        "lora_patch_versions": len(patches),
        "lora_version_sizes": lora_versions,
    }
    if full_versions:
        full_patches = [v["bytes"] for v in full_versions if v["kind"] == "patch"]
        figures["full_run_patch_bytes"] = mean(full_patches)
    return figures


def network_run(root: Path, start: Path, seed: int, args: argparse.Namespace, lora: bool) -> dict[str, Any]:
    from bench.runs import run_coordinator

    root.mkdir(parents=True, exist_ok=True)
    kind = "LoRA" if lora else "full"
    log(f"seed {seed}: {kind} run, {args.steps} steps")
    started = time.monotonic()
    run_coordinator(root, run_config(root, start, seed, args, lora), f"seed {seed}: the {kind} run")
    return {"wall_s": round(time.monotonic() - started, 1), "versions": version_sizes(root / "run")}


def learning(start: Path, args: argparse.Namespace) -> dict[str, Any]:
    from bench.runs import evaluate

    seeds = []
    for seed in range(args.seeds):
        seed_dir = args.dir / f"seed{seed}"
        started = time.monotonic()
        before = evaluate(start, ENVIRONMENT, args.eval_examples, args.eval_samples, args.max_tokens, seed)
        log(f"seed {seed}: start accuracy {before['accuracy']:.3f}")
        full = network_run(seed_dir / "full", start, seed, args, lora=False)
        full_after = evaluate(
            seed_dir / "full" / "run" / "final-policy", ENVIRONMENT, args.eval_examples, args.eval_samples,
            args.max_tokens, seed,
        )  # fmt: skip
        lora = network_run(seed_dir / "lora", start, seed, args, lora=True)
        lora_after = evaluate(
            seed_dir / "lora" / "run" / "final-policy", ENVIRONMENT, args.eval_examples, args.eval_samples,
            args.max_tokens, seed,
        )  # fmt: skip
        log(f"seed {seed}: accuracy full {full_after['accuracy']:.3f}, LoRA {lora_after['accuracy']:.3f}")
        seeds.append(
            {
                "seed": seed,
                "accuracy_before": before["accuracy"],
                "full_accuracy_after": full_after["accuracy"],
                "lora_accuracy_after": lora_after["accuracy"],
                "full_gain": full_after["accuracy"] - before["accuracy"],
                "lora_gain": lora_after["accuracy"] - before["accuracy"],
                "full_wall_s": full["wall_s"],
                "lora_wall_s": lora["wall_s"],
                "eval_before": before,
                "eval_full": full_after,
                "eval_lora": lora_after,
                "bytes": bytes_figures(lora["versions"], full["versions"]),
                "total_s": round(time.monotonic() - started, 1),
            }
        )
    return {"seeds": seeds, **learning_summary(seeds)}


def learning_summary(seeds: list[dict[str, Any]]) -> dict[str, Any]:
    """Means over seeds; ``lora_gain_over_full`` = mean LoRA gain / mean full gain (null when the latter is <= 0)."""

    def avg(key: str) -> float:
        return round(float(sum(s[key] for s in seeds)) / len(seeds), 4)

    full_gain, lora_gain = avg("full_gain"), avg("lora_gain")
    figures: dict[str, Any] = {
        "full_accuracy_before": avg("accuracy_before"),
        "lora_accuracy_before": avg("accuracy_before"),
        "full_accuracy_after": avg("full_accuracy_after"),
        "lora_accuracy_after": avg("lora_accuracy_after"),
        "full_gain": full_gain,
        "lora_gain": lora_gain,
        "lora_gain_over_full": round(lora_gain / full_gain, 4) if full_gain > 0 else None,
        "lora_gain_over_full_target": GAIN_OVER_FULL_TARGET,
    }
    if full_gain <= 0:
        figures["lora_gain_over_full_null_reason"] = f"the full run's mean gain is {full_gain} (not positive)"
    return figures


# --- the program ------------------------------------------------------------------------------------------------


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="1 seed x 10 steps, 1 trainer rank, a smaller eval")
    parser.add_argument("--skip-learning", action="store_true", help="no learning runs: the cheap parts only")
    parser.add_argument("--seeds", type=int, default=None, help="seeds of the learning runs (default 3; quick 1)")
    parser.add_argument("--steps", type=int, default=None, help="RL steps of each run (default 30; quick 10)")
    parser.add_argument("--bytes-steps", type=int, default=3, help="steps of the LoRA run of --skip-learning")
    parser.add_argument("--lr", type=float, default=5e-4, help="the full run's learning rate")
    parser.add_argument("--lora-lr", type=float, default=None, help="the LoRA run's learning rate (default 6 x --lr)")
    parser.add_argument("--rank", type=int, default=16, help="LoRA rank (the runs, the serving and memory parts)")
    parser.add_argument("--alpha", type=float, default=32.0, help="LoRA alpha (scale alpha / rank)")
    parser.add_argument("--warmup-steps", type=int, default=5, help="linear warm-up of both runs' learning rate")
    parser.add_argument("--prompts-per-task", type=int, default=4)
    parser.add_argument("--groups-per-step", type=int, default=8, help="submissions per step (prompts: x 4)")
    parser.add_argument("--group-size", type=int, default=8)
    parser.add_argument("--max-tokens", type=int, default=16, help="the runs' and the eval's token budget")
    parser.add_argument("--trainer-ranks", type=int, default=None, help="torchrun ranks (default 2; quick 1)")
    parser.add_argument(
        "--engines",
        nargs="+",
        default=["vllm"],
        help="the runs' workers, the same for both runs (an HF worker stops on a LoRA run's adapter name when that"
        " name has a '.', e.g. the coordinator's IP address)",
    )
    parser.add_argument("--eval-examples", type=int, default=None, help="held-out prompts (default 256; quick 128)")
    parser.add_argument("--eval-samples", type=int, default=None, help="samples per prompt (default 4; quick 2)")
    parser.add_argument("--serve-model", default=SERVE_MODEL, help="checkpoint of the serving and memory parts")
    parser.add_argument("--requests", type=int, default=16, help="requests per vLLM call")
    parser.add_argument("--gen-tokens", type=int, default=64, help="tokens per request in the vLLM calls")
    parser.add_argument("--repeats", type=int, default=None, help="timed vLLM calls per engine (default 5; quick 3)")
    parser.add_argument("--skip-serving", action="store_true", help="no vLLM speed part")
    parser.add_argument("--skip-memory", action="store_true", help="no memory part")
    parser.add_argument("--dir", type=Path, default=Path("runs/lora-bench"), help="run files (emptied first)")
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    quick = args.quick
    args.seeds = args.seeds or (1 if quick else 3)
    args.steps = args.steps or (10 if quick else 30)
    args.lora_lr = args.lora_lr if args.lora_lr is not None else LORA_LR_MULTIPLIER * args.lr
    args.trainer_ranks = args.trainer_ranks or (1 if quick else 2)
    args.eval_examples = args.eval_examples or (128 if quick else 256)
    args.eval_samples = args.eval_samples or (2 if quick else 4)
    args.repeats = args.repeats or (3 if quick else 5)
    args.dir = args.dir.resolve()
    return args


def summarize(report: dict[str, Any]) -> dict[str, Any]:
    keys = (
        "lora_gain_over_full",
        "lora_gain_over_full_null_reason",
        "full_accuracy_before",
        "full_accuracy_after",
        "lora_accuracy_after",
        "full_gain",
        "lora_gain",
        "adapter_bytes",
        "full_bytes",
        "patch_bytes",
        "lora_tokens_per_s_ratio",
        "vllm_tokens_per_s_plain",
        "vllm_tokens_per_s_adapter",
        "two_runs_memory_ratio",
        "two_runs_memory_target",
        "two_runs_rss_ratio",
        "two_engines_memory_ratio",
        "two_engines_rss_ratio",
    )
    return {key: report[key] for key in keys if key in report}


def main() -> None:
    args = parse_args()
    if args.child is not None:
        spec = json.loads(args.child)
        print(json.dumps(child_vllm(spec) if spec["part"] == "vllm" else child_memory(spec)))
        return
    from trainer.resolve import resolve_model_path

    started = time.monotonic()
    report: dict[str, Any] = {"bench": "lora_bench", "quick": args.quick}
    report["settings"] = {
        "task": ENVIRONMENT["name"],
        "start_checkpoint": START,
        "steps": args.steps,
        "seeds": args.seeds,
        "rank": args.rank,
        "alpha": args.alpha,
        "full_lr": args.lr,
        "lora_lr": args.lora_lr,
        "warmup_steps": args.warmup_steps,
        "prompts_per_step": args.groups_per_step * args.prompts_per_task,
        "group_size": args.group_size,
        "max_tokens": args.max_tokens,
        "engines": args.engines,
        "trainer_ranks": args.trainer_ranks,
        "eval": f"{args.eval_samples} samples at T = 1 of {args.eval_examples} held-out prompts, exact answers",
        "skip_learning": args.skip_learning,
    }
    timings: dict[str, float] = {}
    report["sizes"] = size_table()
    shutil.rmtree(args.dir, ignore_errors=True)
    args.dir.mkdir(parents=True)

    serve_model = resolve_model_path(args.serve_model)
    if not (args.skip_serving and args.skip_memory):
        adapters = tuple(
            make_adapter(serve_model, args.dir / "adapters" / name, args.rank, args.alpha, seed)
            for seed, name in ((1, "run-a"), (2, "run-b"))
        )
        if not args.skip_serving:
            log("serving speed: vLLM without and with an adapter")
            report |= serving_speed(serve_model, adapters[0], args)
            timings["serving_s"] = report.pop("serving_s")
        if not args.skip_memory:
            log("memory: one run, two runs on one base, two engines")
            report |= memory(serve_model, (adapters[0], adapters[1]))
            timings["memory_s"] = report.pop("memory_s")

    part_started = time.monotonic()
    start = resolve_model_path(START)
    timings["start_checkpoint_s"] = round(time.monotonic() - part_started, 1)
    part_started = time.monotonic()
    if args.skip_learning:
        bytes_args = argparse.Namespace(**{**vars(args), "steps": args.bytes_steps, "warmup_steps": 0})
        lora = network_run(args.dir / "bytes-run", start, 0, bytes_args, lora=True)
        report |= bytes_figures(lora["versions"], None)
        report["bytes_run"] = {"steps": args.bytes_steps, "wall_s": lora["wall_s"]}
        timings["bytes_run_s"] = round(time.monotonic() - part_started, 1)
    else:
        found = learning(start, args)
        report |= {key: value for key, value in found.items() if key != "seeds"}
        report |= {key: value for key, value in found["seeds"][0]["bytes"].items()}
        report["learning_seeds"] = found["seeds"]
        timings["learning_s"] = round(time.monotonic() - part_started, 1)
    timings["total_s"] = round(time.monotonic() - started, 1)
    report["timings_s"] = timings
    report["machine"] = {"cpu_count": os.cpu_count(), "python": sys.version.split()[0]}
    report["summary"] = summarize(report)
    print(json.dumps(report))


if __name__ == "__main__":
    main()
