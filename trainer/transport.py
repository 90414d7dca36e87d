"""The filesystem transport between the orchestrator and the trainer service (like prime-rl's).

Everything lives under one directory (``<data_dir>/train``): the orchestrator writes
``batches/step_<n>.safetensors`` (the samples of step n, with advantages); trainer rank 0 reads
it and broadcasts it to the other ranks. The ranks train, export the policy to ``policies/step_<n>/``
and save the trainer state under ``checkpoints/``; rank 0 keeps the step's metrics in
``metrics/step_<n>.json`` before that save and writes ``done/step_<n>.json`` (the metrics) last. Every file is
written to a temporary name and renamed, so a reader never sees half of one and a crash
leaves either the whole file or none. Each side rings a :class:`Doorbell` (a named pipe) after
writing what the other waits for (``batch.bell``, ``done.bell``), so neither has to poll for it.

A batch file holds the samples (:class:`TrainSample`) as flat safetensors arrays (token ids as int32,
advantages, rewards and logprobs as float64, so they round-trip exactly) with an offsets array per ragged
field (a multi-turn sample's sampled-token flags as uint8, after those of the samples before it; the images a
vision-language sample's prompt shows as their RGB bytes in one flat uint8 array, each image's (height, width),
and an offsets array of images per sample), and the step, temperature and submission ids in its metadata: a
256-sample x 4,096-token
batch is a few tens of MB written and read in well under a second, where JSON took seconds.
Batch files of older runs (``step_<n>.json``) are still read. :meth:`TrainDir.prune_published`
removes what published steps no longer need (see docs/retention.md).

The whole directory, as :class:`TrainDir` names it:

- ``service.json``: what the coordinator tells its trainer service (:mod:`trainer.launch`);
- ``batches/step_<n>.safetensors``: the orchestrator's batch of step n;
- ``policies/step_<n>/``: the policy the trainer exported after step n, exported under
  ``policies/.step_<n>.partial`` and renamed when whole; ``merged/step_<n>/`` the same for a LoRA
  run's last policy with its adapter folded in;
- ``checkpoints/``: the trainer's own state, for an exact resume;
- ``metrics/step_<n>.json``, then ``done/step_<n>.json``: the step's metrics, the second file the hand-off;
- ``batch.bell``, ``done.bell``: the doorbells; ``trainer.log``: the trainer job's output.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import re
import select
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np
from safetensors.numpy import load as load_tensors
from safetensors.numpy import save as save_tensors

from environments.images import Image

BATCH_FORMAT = "prime-batch/1"
"""The ``format`` metadata of a batch file; a file with another one is refused, not guessed at."""
_STEP_NAME = re.compile(r"^\.?step_(\d{1,18})(?:\.json|\.safetensors|\.partial)?(?:\.\d+\.tmp)?$")
"""A step's file or folder in the transport, or its temporary or staging name."""


@dataclass(frozen=True)
class Draws:
    """How a sample's completion tokens were drawn (:mod:`toploc.sampling`): the lease's seed, and per completion
    token its noise stream and position (-1 for a token the policy did not sample: an environment's reply)."""

    seed: int
    streams: list[int]
    positions: list[int]


@dataclass(frozen=True)
class TrainSample:
    """One sample to train on: prompt and completion token ids, with data per completion token."""

    prompt_ids: list[int]
    completion_ids: list[int]
    advantage: float = 0.0
    """The sample's (group-relative) advantage; unused by SFT."""
    inference_logprobs: list[float] | None = None
    """One per completion token, from the engine that sampled it; None for SFT."""
    reward: float = 0.0
    """For metrics only."""
    sampled: list[bool] | None = None
    """One per completion token: True where the policy sampled it. None: all of them. A multi-turn episode's
    sample holds the environment's replies between its turns; only sampled tokens carry loss."""
    images: tuple[Image, ...] = ()
    """The images the prompt shows (a vision-language run), rendered by the trusted side from the task's example
    and checked against the hashes the ledger pinned; its image tokens stand for them, in order."""
    policy_version: int | None = None
    """The policy version that sampled the completion: the weights a trainer that recomputes behaviour
    log-probabilities uses for it. None: the policy being trained (SFT, the local RL loop)."""
    group: int = -1
    """Which of the step's submissions (:attr:`StepBatch.submission_ids`) the sample comes from; -1: none."""
    draws: Draws | None = None
    """How its tokens were drawn, for a trainer that replays the draws (None: not replayed)."""

    @property
    def num_tokens(self) -> int:
        return len(self.prompt_ids) + len(self.completion_ids)

    @property
    def num_trained(self) -> int:
        """Completion tokens that carry loss (the sampled ones)."""
        return len(self.completion_ids) if self.sampled is None else sum(self.sampled)


StepAction = Literal["train", "skip", "restore"]
"""What the trainer does with a step: train on its samples; skip it (publish the policy unchanged); or restore
an earlier version's weights (a rollback) and publish them as the step's policy."""

_ACTIONS: dict[str, StepAction] = {"train": "train", "skip": "skip", "restore": "restore"}


@dataclass(frozen=True)
class StepBatch:
    """One step's batch as the trainer receives it."""

    step: int
    samples: list[TrainSample]
    temperature: float
    submission_ids: list[str]
    attempt: int = 1
    """Counts the batches written for this step: a step a breaker tripped is handed a rebuilt batch, or a skip,
    as the next attempt (the trainer never takes the same attempt twice)."""
    action: StepAction = "train"
    restore_dir: str | None = None
    """``restore``: the exported policy (HF checkpoint or adapter directory) whose weights the trainer loads."""
    lr_scale: float = 1.0
    """``restore``: the learning rate is multiplied by this from the step on."""


def write_bytes_atomic(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with tmp.open("wb") as handle:
        handle.write(data)
        handle.flush()
        os.fsync(handle.fileno())
    tmp.replace(path)


def write_json_atomic(path: Path, value: Any) -> None:
    write_bytes_atomic(path, json.dumps(value, separators=(",", ":")).encode())


def read_json_object(path: Path) -> dict[str, Any] | None:
    """The JSON object in ``path``, or None when there is no such file (yet)."""
    if not path.is_file():
        return None
    value: dict[str, Any] = json.loads(path.read_text())
    return value


def _ragged(rows: list[list[Any]], dtype: Any) -> tuple[np.ndarray, np.ndarray]:
    offsets = np.zeros(len(rows) + 1, dtype=np.int64)
    np.cumsum([len(row) for row in rows], out=offsets[1:])
    flat = np.fromiter(itertools.chain.from_iterable(rows), dtype=dtype, count=int(offsets[-1]))
    return flat, offsets


def _split(flat: np.ndarray, offsets: np.ndarray) -> list[list[Any]]:
    values = flat.tolist()
    bounds = offsets.tolist()
    return [values[bounds[i] : bounds[i + 1]] for i in range(len(bounds) - 1)]


def encode_batch(batch: StepBatch) -> bytes:
    """The safetensors bytes of ``batch`` (see the module docstring for the layout)."""
    samples = batch.samples
    prompts, prompt_offsets = _ragged([s.prompt_ids for s in samples], np.int32)
    completions, completion_offsets = _ragged([s.completion_ids for s in samples], np.int32)
    logprobs, logprob_offsets = _ragged([s.inference_logprobs or [] for s in samples], np.float64)
    tensors = {
        "prompt_ids": prompts,
        "prompt_offsets": prompt_offsets,
        "completion_ids": completions,
        "completion_offsets": completion_offsets,
        "inference_logprobs": logprobs,
        "logprob_offsets": logprob_offsets,
        "has_logprobs": np.array([s.inference_logprobs is not None for s in samples], dtype=np.uint8),
        "sampled": _ragged([s.sampled or [] for s in samples], np.uint8)[0],
        "has_sampled": np.array([s.sampled is not None for s in samples], dtype=np.uint8),
        "advantage": np.array([s.advantage for s in samples], dtype=np.float64),
        "reward": np.array([s.reward for s in samples], dtype=np.float64),
        "policy_version": np.array([-1 if s.policy_version is None else s.policy_version for s in samples], np.int64),
        "group": np.array([s.group for s in samples], dtype=np.int64),
        "draw_seed": np.array([-1 if s.draws is None else s.draws.seed for s in samples], dtype=np.int64),
        "draw_streams": _ragged([s.draws.streams if s.draws else [] for s in samples], np.int64)[0],
        "draw_positions": _ragged([s.draws.positions if s.draws else [] for s in samples], np.int64)[0],
        **_encode_images([s.images for s in samples]),
    }
    metadata = {
        "format": BATCH_FORMAT,
        "step": str(batch.step),
        "temperature": repr(batch.temperature),
        "submission_ids": json.dumps(batch.submission_ids),
        "attempt": str(batch.attempt),
        "action": batch.action,
        "restore_dir": batch.restore_dir or "",
        "lr_scale": repr(batch.lr_scale),
    }
    return save_tensors(tensors, metadata=metadata)


def _batch_metadata(data: bytes) -> dict[str, str]:
    header_len = int.from_bytes(data[:8], "little")
    header: dict[str, Any] = json.loads(data[8 : 8 + header_len])
    metadata: dict[str, str] = header.get("__metadata__", {})
    return metadata


def decode_batch(data: bytes) -> StepBatch:
    """The :class:`StepBatch` in safetensors ``data``; ValueError when it is not a batch file of this format."""
    metadata = _batch_metadata(data)
    if metadata.get("format") != BATCH_FORMAT:
        raise ValueError(f"not a {BATCH_FORMAT} batch file (format {metadata.get('format')!r})")
    t = load_tensors(data)
    prompts = _split(t["prompt_ids"], t["prompt_offsets"])
    completions = _split(t["completion_ids"], t["completion_offsets"])
    logprobs = _split(t["inference_logprobs"], t["logprob_offsets"])
    has_logprobs = t["has_logprobs"].tolist()
    sampled = _sampled_flags(t, completions)
    images = _decode_images(t, len(prompts))
    # files written before samples carried their version and group
    versions = t["policy_version"].tolist() if "policy_version" in t else [-1] * len(prompts)
    groups = t["group"].tolist() if "group" in t else [-1] * len(prompts)
    draws = _draws(t, completions)
    samples = [
        TrainSample(
            prompt_ids=prompt,
            completion_ids=completion,
            advantage=advantage,
            inference_logprobs=lps if has else None,
            reward=reward,
            sampled=flags,
            images=shown,
            policy_version=None if version < 0 else version,
            group=group,
            draws=drawn,
        )
        for prompt, completion, lps, has, advantage, reward, flags, shown, version, group, drawn in zip(
            prompts,
            completions,
            logprobs,
            has_logprobs,
            t["advantage"].tolist(),
            t["reward"].tolist(),
            sampled,
            images,
            versions,
            groups,
            draws,
            strict=True,
        )
    ]
    action = _ACTIONS.get(metadata.get("action", "train"))
    if action is None:
        raise ValueError(f"unknown step action {metadata.get('action')!r}")
    return StepBatch(
        step=int(metadata["step"]),
        samples=samples,
        temperature=float(metadata["temperature"]),
        submission_ids=list(json.loads(metadata["submission_ids"])),
        attempt=int(metadata.get("attempt", "1")),
        action=action,
        restore_dir=metadata.get("restore_dir") or None,
        lr_scale=float(metadata.get("lr_scale", "1.0")),
    )


def _draws(tensors: dict[str, np.ndarray], completions: list[list[int]]) -> list[Draws | None]:
    """Each sample's draws (none in a batch file written before samples carried them); the streams and positions of
    the samples that have them lie one after another in completion order."""
    if "draw_seed" not in tensors:
        return [None] * len(completions)
    streams, positions = tensors["draw_streams"].tolist(), tensors["draw_positions"].tolist()
    found: list[Draws | None] = []
    at = 0
    for completion, seed in zip(completions, tensors["draw_seed"].tolist(), strict=True):
        if seed < 0:
            found.append(None)
            continue
        end = at + len(completion)
        found.append(Draws(seed, streams[at:end], positions[at:end]))
        at = end
    if at != len(streams) or len(streams) != len(positions):
        raise ValueError(f"{len(streams)} draw streams for {at} completion tokens of the samples that have them")
    return found


def _sampled_flags(tensors: dict[str, np.ndarray], completions: list[list[int]]) -> list[list[bool] | None]:
    """Each sample's sampled-token flags (None: every completion token); the flags of the samples that have them
    lie one after another in completion order."""
    if "has_sampled" not in tensors:
        return [None] * len(completions)
    flat = [bool(v) for v in tensors["sampled"].tolist()]
    flags: list[list[bool] | None] = []
    at = 0
    for completion, has in zip(completions, tensors["has_sampled"].tolist(), strict=True):
        flags.append(flat[at : at + len(completion)] if has else None)
        at += len(completion) if has else 0
    if at != len(flat):
        raise ValueError(f"{len(flat)} sampled flags for {at} completion tokens of the samples that have them")
    return flags


def _encode_images(samples_images: list[tuple[Image, ...]]) -> dict[str, np.ndarray]:
    """Every sample's images, in sample order: their pixels one after another, each one's (height, width), and
    where each sample's images start among them."""
    images = [image for shown in samples_images for image in shown]
    offsets = np.zeros(len(samples_images) + 1, dtype=np.int64)
    np.cumsum([len(shown) for shown in samples_images], out=offsets[1:])
    return {
        "image_rgb": np.frombuffer(b"".join(image.rgb for image in images), dtype=np.uint8),
        "image_sizes": np.array([(image.height, image.width) for image in images], dtype=np.int64).reshape(-1, 2),
        "image_offsets": offsets,
    }


def _decode_images(tensors: dict[str, np.ndarray], num_samples: int) -> list[tuple[Image, ...]]:
    """Each sample's images (none in a batch file written before samples had them)."""
    if "image_offsets" not in tensors:
        return [()] * num_samples
    rgb = tensors["image_rgb"].tobytes()
    sizes = tensors["image_sizes"].reshape(-1, 2).tolist()
    images: list[Image] = []
    at = 0
    for height, width in sizes:
        size = height * width * 3
        images.append(Image(width, height, rgb[at : at + size]))
        at += size
    if at != len(rgb):
        raise ValueError(f"{len(rgb)} bytes of pixels for images of {at}")
    bounds = tensors["image_offsets"].tolist()
    if len(bounds) != num_samples + 1 or bounds[-1] != len(images):
        raise ValueError(f"image offsets {bounds[:3]}... do not fit {num_samples} samples and {len(images)} images")
    return [tuple(images[bounds[i] : bounds[i + 1]]) for i in range(num_samples)]


def _decode_json_batch(text: str) -> StepBatch:
    """A batch of the JSON format, which predates images in prompts (an ``images`` field, if any, must be empty)."""
    value = json.loads(text)
    samples = []
    for sample in value["samples"]:
        if sample.pop("images", None):
            raise ValueError("a JSON batch file cannot hold images")
        samples.append(TrainSample(**sample))
    return StepBatch(
        step=int(value["step"]),
        samples=samples,
        temperature=float(value["temperature"]),
        submission_ids=list(value["submission_ids"]),
    )


def _step_of(name: str) -> int | None:
    match = _STEP_NAME.match(name)
    return int(match.group(1)) if match else None


def _remove(path: Path) -> None:
    if path.is_dir():
        shutil.rmtree(path, ignore_errors=True)
    else:
        path.unlink(missing_ok=True)


class Doorbell:
    """A named pipe one side rings after writing a file the other side waits for, so the waiter need not poll.

    The waiter blocks in :meth:`wait` until rung or until its timeout, and then looks for the file
    as it would have anyway: a ring is only a hint, so one lost (nobody listening yet, a filesystem
    without named pipes) costs at most one timeout. The waiter holds the pipe open for reading and
    writing, so it never sees end-of-file between rings; :meth:`ring` never blocks and does nothing
    when nobody listens. Both sides must be on one machine (the orchestrator and trainer rank 0 are).
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        self._fd: int | None = None

    def ring(self) -> None:
        try:
            fd = os.open(self.path, os.O_WRONLY | os.O_NONBLOCK)
        except OSError:  # no pipe yet, or nobody holds it open (ENXIO): nobody waits
            return
        try:
            os.write(fd, b"\0")
        except BlockingIOError:  # the pipe is full of rings nobody read yet: rung already
            pass
        finally:
            os.close(fd)

    def listen(self) -> bool:
        """Make the pipe and hold it open, so rings from now on are kept for :meth:`wait`; False without one."""
        return self._open() is not None

    def _open(self) -> int | None:
        if self._fd is None:
            try:
                if not self.path.exists():
                    self.path.parent.mkdir(parents=True, exist_ok=True)
                    with contextlib.suppress(FileExistsError):
                        os.mkfifo(self.path)
                self._fd = os.open(self.path, os.O_RDWR | os.O_NONBLOCK)
            except OSError:
                return None
        return self._fd

    def wait(self, timeout_s: float) -> bool:
        """Wait until rung (True; every ring so far is consumed) or ``timeout_s`` has passed (False)."""
        fd = self._open()
        if fd is None:  # no named pipe here: a plain sleep, as polling did
            time.sleep(max(0.0, timeout_s))
            return False
        readable, _, _ = select.select([fd], [], [], max(0.0, timeout_s))
        if not readable:
            return False
        with contextlib.suppress(BlockingIOError):
            while os.read(fd, 4096):
                pass
        return True

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


class TrainDir:
    """Paths and files of the transport under ``root``."""

    def __init__(self, root: Path) -> None:
        self.root = root

    @property
    def checkpoints(self) -> Path:
        return self.root / "checkpoints"

    @property
    def log_path(self) -> Path:
        return self.root / "trainer.log"

    def batch_path(self, step: int) -> Path:
        return self.root / "batches" / f"step_{step}.safetensors"

    def legacy_batch_path(self, step: int) -> Path:
        """Where runs before the safetensors transport kept the batch (JSON); still read."""
        return self.root / "batches" / f"step_{step}.json"

    def policy_dir(self, step: int, merged: bool = False) -> Path:
        """Step ``step``'s exported policy; ``merged``: a LoRA run's last policy with its adapter folded in."""
        return self.root / ("merged" if merged else "policies") / f"step_{step}"

    def done_path(self, step: int) -> Path:
        return self.root / "done" / f"step_{step}.json"

    @property
    def batch_bell(self) -> Path:
        """The :class:`Doorbell` the orchestrator rings after writing a batch file (trainer rank 0 waits on it)."""
        return self.root / "batch.bell"

    @property
    def done_bell(self) -> Path:
        """The :class:`Doorbell` trainer rank 0 rings after writing a done marker (the orchestrator waits on it)."""
        return self.root / "done.bell"

    def write_batch(self, batch: StepBatch) -> None:
        write_bytes_atomic(self.batch_path(batch.step), encode_batch(batch))
        Doorbell(self.batch_bell).ring()

    def batch_attempt(self, step: int) -> int | None:
        """The attempt of step ``step``'s batch file (its header alone is read), or None when there is none."""
        path = self.batch_path(step)
        if not path.is_file():
            return 1 if self.legacy_batch_path(step).is_file() else None
        with path.open("rb") as handle:
            header_len = int.from_bytes(handle.read(8), "little")
            header: dict[str, Any] = json.loads(handle.read(header_len))
        return int(header.get("__metadata__", {}).get("attempt", "1"))

    def has_batch(self, step: int) -> bool:
        return self.batch_path(step).is_file() or self.legacy_batch_path(step).is_file()

    def read_batch(self, step: int) -> StepBatch | None:
        """Step ``step``'s batch (a JSON file of an older run too), or None when it is not written yet."""
        path = self.batch_path(step)
        if path.is_file():
            try:
                batch = decode_batch(path.read_bytes())
            except (ValueError, KeyError) as exc:
                raise ValueError(
                    f"{path} is not a readable batch file ({exc}); delete it to have it rewritten"
                ) from exc
        elif self.legacy_batch_path(step).is_file():
            batch = _decode_json_batch(self.legacy_batch_path(step).read_text())
        else:
            return None
        if batch.step != step:
            raise ValueError(f"{path} holds the batch of step {batch.step}, not {step}; delete it to have it rewritten")
        return batch

    def write_done(self, step: int, metrics: dict[str, Any]) -> None:
        write_json_atomic(self.done_path(step), metrics)
        Doorbell(self.done_bell).ring()

    def read_done(self, step: int) -> dict[str, Any] | None:
        return read_json_object(self.done_path(step))

    def metrics_path(self, step: int) -> Path:
        return self.root / "metrics" / f"step_{step}.json"

    def write_metrics(self, step: int, metrics: dict[str, Any]) -> None:
        """The step's metrics, kept before its checkpoint so a done marker lost in a crash can be rewritten."""
        write_json_atomic(self.metrics_path(step), metrics)

    def read_metrics(self, step: int) -> dict[str, Any] | None:
        return read_json_object(self.metrics_path(step))

    def staging_policy_dir(self, step: int, merged: bool = False) -> Path:
        return self.policy_dir(step, merged).with_name(f".step_{step}.partial")

    def install_policy(self, step: int, merged: bool = False) -> Path:
        """Move a fully exported policy from its staging name to ``policy_dir(step, merged)`` (rank 0)."""
        target = self.policy_dir(step, merged)
        if target.exists():
            shutil.rmtree(target)
        self.staging_policy_dir(step, merged).replace(target)
        return target

    def keep_policy(self, step: int, target: Path, merged: bool = False) -> Path:
        """Put step ``step``'s exported policy at ``target`` too, whole or not at all (hard links where possible).

        Pruning removes the exported policies of published steps; the run's last one is its result, so it
        is kept apart from them. A kept copy already there is replaced only once the new one is complete.
        """
        source = self.policy_dir(step, merged)
        staging = target.with_name(f".{target.name}.partial")
        _remove(staging)

        def link_or_copy(src: str, dst: str) -> object:
            try:
                os.link(src, dst)
                return dst
            except OSError:
                return shutil.copy2(src, dst)

        shutil.copytree(source, staging, copy_function=link_or_copy)
        if target.exists():
            shutil.rmtree(target)
        staging.replace(target)
        return target

    def keep_result(self, step: int, policy_target: Path, adapter_target: Path | None = None) -> None:
        """Keep the run's result, the policy of its last step ``step``, at ``policy_target``. A LoRA run passes
        ``adapter_target``: its result is the copy with the adapter folded in (the trainer exports one with the
        last step only), and the adapter itself is kept there."""
        self.keep_policy(step, policy_target, merged=adapter_target is not None)
        if adapter_target is not None:
            self.keep_policy(step, adapter_target)

    def prune_published(self, published: int, keep_steps: int = 0) -> list[Path]:
        """Remove what steps up to ``published`` (trained, and published by the coordinator) no longer need.

        For a published step s older than the newest ``keep_steps``: its batch file (the ledger keeps
        which submissions it used) and its exported policy (the origin store has its own links to the
        bytes) go; its done marker and metrics (the ledger has the metrics) go too, except those of
        step ``published`` itself, whose done marker tells a restarted trainer at that checkpoint that
        the step is finished. Nothing of a step after ``published`` is touched: a restart needs it.
        Returns the paths removed.
        """
        horizon = published - keep_steps
        removed: list[Path] = []
        for folder in ("batches", "policies", "done", "metrics"):
            directory = self.root / folder
            last = horizon if folder in ("batches", "policies") else min(horizon, published - 1)
            for entry in directory.iterdir() if directory.is_dir() else ():
                step = _step_of(entry.name)
                if step is not None and step <= last:
                    _remove(entry)
                    removed.append(entry)
        return removed
