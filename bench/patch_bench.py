"""Value patches (shardcast.format.patch) on real AdamW steps: how small, how exact, how much sooner a version lands.

The trainer's own :class:`~trainer.train.Trainer` (AdamW, fp32 master weights, default betas,
no weight decay, grad clip 1.0) takes GRPO steps on a randomly initialised Qwen2 (default:
hidden 768, 12 layers, vocab 32000, about 125M parameters; untied embeddings) and exports the
policy after every step the way the trainer publishes it (``Trainer.export`` with
``export_dtype = "bfloat16"``: the state dict cast to bf16 in ``model.safetensors`` plus
config and tokenizer files). The data are a synthetic on-policy task: each step, prompts of
random token ids from the whole vocabulary, completions sampled from the current policy
(temperature 1, no top-k/top-p) with the engine-side logprobs taken from the sampling pass,
reward = the fraction of completion tokens in the lower half of the vocabulary,
group-relative advantages. Two runs from the same start weights and the same seeds differ
only in the learning rate (1e-6 and 1e-5, constant). For every step after the first,
``encode_patch(previous, new)`` then ``apply_patch`` onto the previous version, and the
reconstructed files' blake3 must equal the exported ones.

Figures are medians over the steps after the first ``--skip`` (default 10): ``bytes_ratio``
is full bytes / patch bytes, ``entropy_bound_ratio`` is full bytes / the ideal coder's size
(``PatchStats.entropy_bound_bytes``), ``limit_fraction`` their quotient (how close the
codec gets to that bound), ``unchanged_fraction`` the share of bf16 elements whose bits did
not change. Progress goes to stderr, one JSON object to stdout.

Then the wire: ``broadcast_speedup`` is how much sooner every client holds a new version when
it ships as a patch than when it ships full, end to end through SHARDCAST on loopback. The
last two versions of the lr 1e-6 run are the base and the new version. Twice, once per kind,
in an origin store of its own signed by a fresh coordinator key: the base is published full as
v0; one ``prime-relay origin``, two ``prime-relay serve`` relays mirroring it, and four clients
that fetch v0 (``prime-relay fetch``, untimed) start. The four clients then wait, warm (as a
running worker is: imported, the patch codec too), and the new version is published as v1,
full or as a patch against v0 (``publish_checkpoint(..., patches=PatchPolicy(...))``). The clock
runs from v1's announcement, through the relays listing and mirroring it, to the last client's
``done`` event; the clients are told v1 once both relays list it, each downloads from both, and
a patch client rebuilds v1 from the v0 it holds. ``broadcast_full_s / broadcast_patch_s`` is
the speedup; ``broadcast_*_bytes`` are the bytes each client downloaded; ``broadcast_exact`` is 1
when every client's files have the blake3 of the new version's (and counts in ``exact``).
``full_fetch_s`` is one client's own download of the full version (median of the four), beside
``apply_s``, the median time to rebuild a version from its patch on disk. Publishing (hashing,
and for the patch encoding it) is outside the clock and reported per kind
under ``broadcast_runs`` (``publish_s``), with the clock's parts. ``--no-broadcast`` skips it.

    python -m bench.patch_bench            # full size, 30 steps per learning rate
    python -m bench.patch_bench --quick    # about 7M parameters, 12 steps: a smoke test
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from protocol.identity import NodeIdentity
    from protocol.schemas import SignedManifest
    from shardcast.origin.publish import PatchPolicy

QUICK = {"hidden": 256, "layers": 4, "intermediate": 704, "vocab": 8000, "steps": 12}
FULL = {"hidden": 768, "layers": 12, "intermediate": 2048, "vocab": 32000, "steps": 30}
HEAD_DIM = 64
MIB = 1024 * 1024
LRS = (1e-6, 1e-5)
NUM_RELAYS, NUM_CLIENTS = 2, 4
RELAY_POLL_INTERVAL_S = 0.05  # how soon a relay sees a new version: a fixed cost of both kinds, kept small


def progress(message: str) -> None:
    print(f"[patch_bench] {message}", file=sys.stderr, flush=True)


def build_start(directory: Path, dims: dict[str, int], seed: int) -> int:
    """Save a random Qwen2 of ``dims`` (with the built-in tokenizer) and return its parameter count."""
    from transformers import GenerationConfig

    from engines.random_model import random_causal_lm
    from trainer.builtin import builtin_tokenizer, qwen2_config
    from trainer.tokenizer import EOS_TOKEN, save_hf_tokenizer
    from trainer.transformers_logs import quiet_transformers

    quiet_transformers()
    tokenizer = builtin_tokenizer()
    eos_id = tokenizer.token_to_id(EOS_TOKEN)
    assert eos_id is not None, "the built-in tokenizer has an end-of-sequence token"
    shape = {
        "hidden_size": dims["hidden"],
        "intermediate_size": dims["intermediate"],
        "num_hidden_layers": dims["layers"],
        "num_attention_heads": dims["heads"],
        "num_key_value_heads": dims["kv_heads"],
    }
    config = qwen2_config(shape, dims["vocab"], eos_id)
    model = random_causal_lm(config, seed)
    model.generation_config = GenerationConfig(eos_token_id=eos_id, pad_token_id=eos_id, bos_token_id=eos_id)
    model.save_pretrained(str(directory), safe_serialization=True)
    save_hf_tokenizer(tokenizer, directory, config.max_position_embeddings)
    return int(sum(p.numel() for p in model.parameters()))


def sample_batch(trainer: Any, step: int, args: argparse.Namespace, vocab: int) -> list[Any]:
    """On-policy samples of the synthetic task: the policy completes random prompts, rewards favour low ids."""
    import torch

    from trainer.advantages import batch_advantages
    from trainer.transport import TrainSample

    generator = torch.Generator().manual_seed(1000 + step)
    prompts = torch.randint(0, vocab, (args.prompts, args.prompt_tokens), generator=generator)
    prompts = prompts.repeat_interleave(args.group, dim=0)
    torch.manual_seed(2000 + step)
    with torch.no_grad():
        out = trainer.model.generate(
            input_ids=prompts,
            attention_mask=torch.ones_like(prompts),
            do_sample=True,
            temperature=1.0,
            top_k=0,
            top_p=1.0,
            max_new_tokens=args.completion_tokens,
            min_new_tokens=args.completion_tokens,
            output_logits=True,
            return_dict_in_generate=True,
        )
    completions = out.sequences[:, prompts.shape[1] :]
    logits = torch.stack(out.logits, dim=1).float()
    logprobs = torch.log_softmax(logits, dim=-1).gather(-1, completions.unsqueeze(-1)).squeeze(-1)
    rewards = (completions < vocab // 2).float().mean(dim=1).tolist()
    advantages = batch_advantages(rewards, args.group)
    return [
        TrainSample(
            prompt_ids=prompts[i].tolist(),
            completion_ids=completions[i].tolist(),
            advantage=advantages[i],
            inference_logprobs=logprobs[i].tolist(),
            reward=rewards[i],
        )
        for i in range(len(rewards))
    ]


def tree_hashes(directory: Path) -> dict[str, str]:
    """Relative path -> blake3 of every checkpoint file (a client's local manifest left out)."""
    from shardcast.format.manifest import result_files_of

    return {entry.path: entry.hash for entry in result_files_of(directory, "blake3")}


def run_lr(
    lr: float, start: Path, work: Path, args: argparse.Namespace, vocab: int, keep: Path | None = None
) -> list[dict[str, Any]]:
    """Train ``args.steps`` steps at ``lr``; patch every published version against the one before.

    With ``keep``, the last two versions are kept as ``keep/base`` and ``keep/new``.
    """
    from shardcast.format.patch import apply_patch, encode_patch
    from trainer.config import TrainerSection
    from trainer.train import Trainer

    section = TrainerSection(
        model=str(start),
        seed=0,
        optimizer={"lr": lr, "schedule": "constant"},
        checkpoint={"export_dtype": "bfloat16"},
    )
    trainer = Trainer(section, num_steps=args.steps)
    previous = trainer.export(work / "v0")
    records: list[dict[str, Any]] = []
    for step in range(1, args.steps + 1):
        started = time.perf_counter()
        metrics = trainer.rl_step(sample_batch(trainer, step, args, vocab), section_loss())
        train_s = time.perf_counter() - started
        new = trainer.export(work / f"v{step}")
        patch = work / f"p{step}"
        started = time.perf_counter()
        stats = encode_patch(previous, new, patch, level=args.level)
        encode_s = time.perf_counter() - started
        out = work / f"applied{step}"
        started = time.perf_counter()
        apply_patch(previous, patch, out, max_output_bytes=2 * stats.full_bytes)
        apply_s = time.perf_counter() - started
        exact = tree_hashes(out) == tree_hashes(new)
        records.append(
            {
                "step": step,
                "full_bytes": stats.full_bytes,
                "patch_bytes": stats.patch_bytes,
                "entropy_bound_bytes": round(stats.entropy_bound_bytes, 1),
                "num_elements": stats.num_elements,
                "num_changed": stats.num_changed,
                "exact": exact,
                "encode_s": round(encode_s, 3),
                "apply_s": round(apply_s, 3),
                "train_s": round(train_s, 2),
                "reward_mean": round(metrics["reward_mean"], 4),
                "grad_norm": round(metrics["grad_norm"], 4),
            }
        )
        changed = stats.num_changed / max(1, stats.num_elements)
        ratio, bound = stats.full_bytes / stats.patch_bytes, stats.full_bytes / max(1.0, stats.entropy_bound_bytes)
        progress(
            f"lr {lr:g} step {step}/{args.steps}: changed {changed:.4%}, ratio {ratio:.1f} (bound {bound:.1f}), "
            f"exact {exact}, train {train_s:.1f}s encode {encode_s:.2f}s apply {apply_s:.2f}s"
        )
        if keep is not None and step == args.steps:
            keep.mkdir(parents=True)
            previous.rename(keep / "base")
            new = new.rename(keep / "new")
        else:
            shutil.rmtree(previous)
        shutil.rmtree(out)
        patch.unlink()
        previous = new
    if keep is None:
        shutil.rmtree(previous)
    return records


def broadcast(base: Path, new: Path, work: Path, shard_size: int, level: int) -> dict[str, dict[str, Any]]:
    """Ship ``new`` through origin -> relays -> clients that hold ``base``: once full, once as a patch."""
    from protocol.identity import NodeIdentity

    coordinator = NodeIdentity.generate()
    want = tree_hashes(new)
    runs = {}
    for kind in ("full", "patch"):
        os.sync()  # no dirty pages left by the run before: neither pays the other's writeback
        runs[kind] = broadcast_once(kind, base, new, work / kind, coordinator, shard_size, level, want)
        shutil.rmtree(work / kind)
    return runs


def broadcast_once(
    kind: str,
    base: Path,
    new: Path,
    work: Path,
    coordinator: NodeIdentity,
    shard_size: int,
    level: int,
    want: dict[str, str],
) -> dict[str, Any]:
    """One origin store (base as v0, ``new`` as v1 of ``kind``), relays mirroring it, clients holding v0.

    Timed: from v1's announcement until the last client has it (relays mirror it and serve it meanwhile).
    """
    from bench.shardcast_clients import OUR_CLIENT, Processes, start_waiting_clients, tell
    from shardcast.format.store import VersionStore
    from shardcast.origin.publish import PatchPolicy, publish_checkpoint
    from tests.support.shardcast_nodes import Nodes, holds, wait_until

    work.mkdir(parents=True)
    store = VersionStore(work / "store")

    def publish(checkpoint: Path, version: int, patches: PatchPolicy | None) -> SignedManifest:
        return publish_checkpoint(
            checkpoint,
            version,
            coordinator,
            store,
            shard_size,
            keep_versions=None,
            fsync_enabled=False,
            patches=patches,
        )

    publish(base, 0, None)
    nodes, procs = Nodes(work), Processes()
    try:
        origin = nodes.origin(store.root)
        relays = [
            nodes.relay([origin], coordinator.node_id, poll_interval_s=RELAY_POLL_INTERVAL_S)[0]
            for _ in range(NUM_RELAYS)
        ]
        wait_until(lambda: all(holds(relay, 0) for relay in relays), 300, "the relays to mirror the base")
        outs = [work / f"client{index}" for index in range(NUM_CLIENTS)]
        for proc in [nodes.fetch(0, relays, coordinator.node_id, out) for out in outs]:
            done_of(proc)
        # warm clients, as a running worker is when a version is announced: interpreter start-up and the
        # first import of the patch codec are no part of either figure
        script = f"import shardcast.format.patch\n{OUR_CLIENT}"
        argvs = [[sys.executable, "-c", script, ",".join(relays), coordinator.node_id, str(out), "0"] for out in outs]
        clients = start_waiting_clients(procs, argvs, work)
        started = time.monotonic()
        signed = publish(new, 1, PatchPolicy(level=level) if kind == "patch" else None)
        announced = time.monotonic()
        if signed.manifest.kind != kind:
            raise RuntimeError(f"the origin published v1 {signed.manifest.kind}, not {kind}")
        wait_until(lambda: all(holds(relay, 1, complete=False) for relay in relays), 300, "the relays to list v1")
        listed = time.monotonic()
        tell(clients, "1")
        dones, per_client = [], []
        for proc in clients:  # a client has the version at its done event (its exit is no part of it)
            dones.append(done_of(proc))
            per_client.append(time.monotonic() - listed)
        finished = time.monotonic()
    finally:
        nodes.stop_all()
        procs.stop_all()
    expected = {"kind": "patch", "from": "held", "base": 0, "chain": [1]} if kind == "patch" else {"kind": "full"}
    for done in dones:  # a patch must be applied to the base the client holds, not reached any other way
        route = {key: done.get(key) for key in expected}
        if route != expected:
            raise RuntimeError(f"a client fetched v1 as {route}, not as a {kind} version on the base it holds")
    exact = all(tree_hashes(out / "v1") == want for out in outs)
    return {
        "wall_s": round(finished - announced, 3),
        "publish_s": round(announced - started, 3),
        "relays_listed_s": round(listed - announced, 3),
        "clients_s": round(finished - listed, 3),
        "per_client_s": [round(seconds, 3) for seconds in per_client],
        "client_download_s": [done["seconds"] for done in dones],  # as each client timed its own download
        "bytes": signed.manifest.total_size_bytes,
        "client_bytes": [done["bytes"] for done in dones],
        "exact": exact,
    }


def done_of(proc: subprocess.Popen[bytes]) -> dict[str, Any]:
    """The ``done`` event of a download, read as it comes; RuntimeError with the last event if there is none."""
    from tests.support.shardcast_nodes import stream_events

    events = []
    for event in stream_events(proc):
        if event["event"] == "done":
            return event
        events.append(event)
    raise RuntimeError(f"a download failed (exit {proc.wait()}): {events[-1:]}")


def section_loss() -> Any:
    from trainer.config import LossConfig

    return LossConfig()


def summarize(records: list[dict[str, Any]], skip: int) -> dict[str, float]:
    measured = records[skip:] or records
    bytes_ratio = statistics.median(r["full_bytes"] / r["patch_bytes"] for r in measured)
    bound_ratio = statistics.median(r["full_bytes"] / max(r["entropy_bound_bytes"], 1.0) for r in measured)
    unchanged = statistics.median(1 - r["num_changed"] / r["num_elements"] for r in measured)
    return {"bytes_ratio": bytes_ratio, "entropy_bound_ratio": bound_ratio, "unchanged_fraction": unchanged}


def broadcast_figures(shipped: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """The broadcast keys of the result (None each when the broadcast was skipped)."""
    if not shipped:
        names = ("speedup", "full_s", "patch_s", "full_bytes", "patch_bytes", "exact")
        return {"full_fetch_s": None, **{f"broadcast_{name}": None for name in names}}
    full, patch = shipped["full"], shipped["patch"]
    return {
        # one client's own download of the full version through the relays (median of the four)
        "full_fetch_s": round(statistics.median(full["client_download_s"]), 3),
        "broadcast_speedup": round(full["wall_s"] / patch["wall_s"], 3),
        "broadcast_full_s": full["wall_s"],
        "broadcast_patch_s": patch["wall_s"],
        "broadcast_full_bytes": full["bytes"],
        "broadcast_patch_bytes": patch["bytes"],
        "broadcast_exact": int(full["exact"] and patch["exact"]),
    }


def build_parser() -> argparse.ArgumentParser:
    """The bench's command line."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="a ~7M-parameter model and 12 steps (smoke test)")
    parser.add_argument("--hidden", type=int, help="hidden size, a multiple of 64 (default 768; --quick 256)")
    parser.add_argument("--layers", type=int, help="decoder layers (default 12; --quick 4)")
    parser.add_argument("--intermediate", type=int, help="MLP width (default 2048; --quick 704)")
    parser.add_argument("--vocab", type=int, help="vocabulary size (default 32000; --quick 8000)")
    parser.add_argument("--steps", type=int, help="optimizer steps per learning rate (default 30; --quick 12)")
    parser.add_argument("--skip", type=int, default=10, help="first steps left out of the medians (default 10)")
    parser.add_argument("--prompts", type=int, default=2, help="prompts per step")
    parser.add_argument("--group", type=int, default=4, help="completions per prompt")
    parser.add_argument("--prompt-tokens", type=int, default=16)
    parser.add_argument("--completion-tokens", type=int, default=24)
    parser.add_argument("--level", type=int, default=3, help="zstd level of the patches")
    parser.add_argument("--threads", type=int, default=None, help="torch intra-op threads")
    parser.add_argument("--workdir", type=Path, default=None, help="where versions are written (default: a temp dir)")
    parser.add_argument("--no-broadcast", action="store_true", help="skip the origin -> relays -> clients timing")
    parser.add_argument("--shard-mib", type=int, default=32, help="shard size of the broadcast (default 32 MiB)")
    return parser


def model_dims(args: argparse.Namespace, preset: dict[str, int], parser: argparse.ArgumentParser) -> dict[str, int]:
    """The model's shape: the flags over ``preset``, with the attention heads that fit its hidden size."""
    dims = {key: getattr(args, key, None) or preset[key] for key in ("hidden", "layers", "intermediate", "vocab")}
    if dims["hidden"] % HEAD_DIM:
        parser.error(f"--hidden must be a multiple of {HEAD_DIM} (the head size)")
    dims["heads"] = dims["hidden"] // HEAD_DIM
    dims["kv_heads"] = next(d for d in (4, 2, 1) if dims["heads"] % d == 0)
    return dims


def train_and_ship(
    args: argparse.Namespace, dims: dict[str, int]
) -> tuple[int, dict[float, list[dict[str, Any]]], dict[str, dict[str, Any]]]:
    """Train and patch at each learning rate, then ship the last version full and as a patch: params, runs, shipped."""
    with tempfile.TemporaryDirectory(prefix="patch-bench-", dir=args.workdir) as tmp:
        root = Path(tmp)
        params = build_start(root / "start", dims, seed=0)
        progress(f"random Qwen2 of {params / 1e6:.1f}M parameters; {args.steps} steps per lr {LRS}")
        runs = {}
        kept = None if args.no_broadcast else root / "kept"
        for lr in LRS:
            work = root / f"lr{lr:g}"
            work.mkdir()
            runs[lr] = run_lr(lr, root / "start", work, args, dims["vocab"], kept if lr == LRS[0] else None)
        shipped: dict[str, dict[str, Any]] = {}
        if kept is not None:
            progress(f"broadcast: origin -> {NUM_RELAYS} relays -> {NUM_CLIENTS} clients, full then patch")
            shipped = broadcast(kept / "base", kept / "new", root / "broadcast", args.shard_mib * MIB, args.level)
            for kind, run in shipped.items():
                progress(f"broadcast {kind}: {run['bytes']} bytes, {run['wall_s']} s, exact {run['exact']}")
    return params, runs, shipped


def summary_of(
    runs: dict[float, list[dict[str, Any]]], shipped: dict[str, dict[str, Any]], skip: int, params: int
) -> dict[str, Any]:
    """The result's ``summary``: the medians per learning rate, exactness, and the broadcast's figures."""
    low, high = summarize(runs[LRS[0]], skip), summarize(runs[LRS[1]], skip)
    measured = [r for records in runs.values() for r in records[skip:]]
    return {
        "bytes_ratio_lr1e6": round(low["bytes_ratio"], 2),
        "entropy_bound_ratio_lr1e6": round(low["entropy_bound_ratio"], 2),
        "limit_fraction_lr1e6": round(low["bytes_ratio"] / low["entropy_bound_ratio"], 4),
        "bytes_ratio_lr1e5": round(high["bytes_ratio"], 2),
        "entropy_bound_ratio_lr1e5": round(high["entropy_bound_ratio"], 2),
        "limit_fraction_lr1e5": round(high["bytes_ratio"] / high["entropy_bound_ratio"], 4),
        "unchanged_fraction_lr1e6": round(low["unchanged_fraction"], 6),
        "unchanged_fraction_lr1e5": round(high["unchanged_fraction"], 6),
        "exact": int(
            all(r["exact"] for records in runs.values() for r in records) and all(r["exact"] for r in shipped.values())
        ),
        **broadcast_figures(shipped),
        "encode_s": round(statistics.median(r["encode_s"] for r in measured), 3),
        "apply_s": round(statistics.median(r["apply_s"] for r in measured), 3),
        "params": params,
    }


def config_of(args: argparse.Namespace, dims: dict[str, int], skip: int) -> dict[str, Any]:
    """The result's ``config``: the model, the optimizer, the data and the broadcast's setup, in words."""
    return {
        "model": f"Qwen2ForCausalLM, random init (seed 0, initializer_range 0.02), untied, {dims}",
        "start_weights": "random init, the same for both runs",
        "master_dtype": "float32",
        "published_dtype": "bfloat16 (Trainer.export, export_dtype=bfloat16)",
        "optimizer": "AdamW betas (0.9, 0.999), eps 1e-8, weight decay 0, grad clip 1.0, constant lr",
        "lrs": list(LRS),
        "steps": args.steps,
        "medians_over_steps_after": skip,
        "data": (
            f"synthetic on-policy GRPO: {args.prompts} prompts x {args.group} completions per step, "
            f"{args.prompt_tokens} random prompt tokens, {args.completion_tokens} sampled completion tokens "
            "(temperature 1), reward = fraction of completion ids below vocab/2, group-relative advantages"
        ),
        "loss": "GRPO, mask correction (trainer defaults)",
        "zstd_level": args.level,
        "broadcast": "skipped (--no-broadcast)"
        if args.no_broadcast
        else {
            "topology": (
                f"1 origin (prime-relay origin) -> {NUM_RELAYS} relays (prime-relay serve, each mirroring "
                f"the origin, polling it every {RELAY_POLL_INTERVAL_S} s) -> {NUM_CLIENTS} clients (each a "
                "process given both relays: the base fetched with prime-relay fetch --no-fsync, the new "
                "version with shardcast.client.download.download_version, fsync off, in a warm process)"
            ),
            "origins": 1,
            "relays": NUM_RELAYS,
            "clients": NUM_CLIENTS,
            "network": "loopback (127.0.0.1), all processes on this machine",
            "shard_size_bytes": args.shard_mib * MIB,
            "versions": f"base = lr {LRS[0]:g} step {args.steps - 1}, new = step {args.steps}",
            "clock": (
                "from the new version's announcement at the origin (after publishing) until the last client "
                "has it verified and in place (its done event); the clients hold the base beforehand, are "
                "running and have imported what they need (warm, as a worker is), and are told the version "
                "once both relays list it"
            ),
        },
    }


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """Run the bench with the flags ``argv``; the result document (the JSON object the bench prints)."""
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)

    import torch

    if args.threads:
        torch.set_num_threads(args.threads)
    preset = QUICK if args.quick else FULL
    dims = model_dims(args, preset, parser)
    args.steps = args.steps or preset["steps"]
    skip = min(args.skip, args.steps // 2)
    started = time.perf_counter()
    params, runs, shipped = train_and_ship(args, dims)
    summary = summary_of(runs, shipped, skip, params)
    result: dict[str, Any] = {
        "bench": "patch_bench",
        "summary": summary,
        "config": config_of(args, dims, skip),
        "runs": {f"lr{lr:g}": records for lr, records in runs.items()},
        "broadcast_runs": shipped,
        "machine": {
            "cpu_count": os.cpu_count(),
            "torch_threads": torch.get_num_threads(),
            "torch": torch.__version__,
            "python": platform.python_version(),
        },
        "wall_s": round(time.perf_counter() - started, 1),
    }
    return result


if __name__ == "__main__":
    print(json.dumps(main()))
