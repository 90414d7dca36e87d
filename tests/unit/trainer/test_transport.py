"""The trainer transport's batch files (safetensors, older JSON ones still read) and its retention."""

from __future__ import annotations

import json
import threading
import time
from dataclasses import asdict
from pathlib import Path

import pytest

from environments.builtin import builtin_environment
from environments.images import Image
from trainer.transport import Doorbell, StepBatch, TrainDir, TrainSample, decode_batch, encode_batch


def sample(n: int, logprobs: bool = True) -> TrainSample:
    return TrainSample(
        prompt_ids=list(range(1, n + 2)),
        completion_ids=[151_000 - n, 7] * n,
        advantage=-0.1 * n + 1 / 3,
        inference_logprobs=[-1e-9 * (i + 1) - 0.1 / 7 for i in range(2 * n)] if logprobs else None,
        reward=0.1 * n,
    )


def test_batches_round_trip_exactly_whatever_their_shape(tmp_path: Path) -> None:
    train_dir = TrainDir(tmp_path)
    batch = StepBatch(3, [sample(0), sample(1), sample(5, logprobs=False), sample(40)], 0.7, ["a", "b", "c", "d"])
    train_dir.write_batch(batch)
    assert train_dir.has_batch(3) and not train_dir.has_batch(4)
    assert train_dir.read_batch(3) == batch
    episode = TrainSample([1, 2], [3, 4, 5, 6], 0.5, [-0.1, 0.0, 0.0, -0.2], sampled=[True, False, False, True])
    mixed = StepBatch(5, [sample(2), episode, TrainSample([1], [], sampled=[]), sample(3)], 1.0, ["a", "b", "c", "d"])
    train_dir.write_batch(mixed)
    assert train_dir.read_batch(5) == mixed
    empty = StepBatch(4, [], 1.0, [])
    train_dir.write_batch(empty)
    assert train_dir.read_batch(4) == empty


def test_a_json_batch_of_an_older_run_is_still_read(tmp_path: Path) -> None:
    train_dir = TrainDir(tmp_path)
    batch = StepBatch(2, [sample(2), sample(3)], 1.0, ["x", "y"])
    legacy = {
        "step": 2,
        "temperature": 1.0,
        "submission_ids": ["x", "y"],
        "samples": [asdict(s) for s in batch.samples],
    }
    train_dir.legacy_batch_path(2).parent.mkdir(parents=True)
    train_dir.legacy_batch_path(2).write_text(json.dumps(legacy))
    assert train_dir.has_batch(2)
    assert train_dir.read_batch(2) == batch


def test_a_foreign_or_misplaced_batch_file_is_refused_with_the_fix(tmp_path: Path) -> None:
    train_dir = TrainDir(tmp_path)
    train_dir.batch_path(1).parent.mkdir(parents=True)
    train_dir.batch_path(1).write_bytes(b"\x02\x00\x00\x00\x00\x00\x00\x00{}")
    with pytest.raises(ValueError, match=r"not a readable batch file.*delete it"):
        train_dir.read_batch(1)
    train_dir.batch_path(2).write_bytes(encode_batch(StepBatch(5, [sample(1)], 1.0, ["s"])))
    with pytest.raises(ValueError, match="holds the batch of step 5, not 2"):
        train_dir.read_batch(2)


def test_a_samples_images_round_trip_exactly(tmp_path: Path) -> None:
    shapes = builtin_environment("count_shapes")
    first, second = shapes.example(0).images[0], shapes.example(1).images[0]
    odd = Image(3, 2, bytes(range(18)))  # not square: height and width must not swap
    samples = [
        TrainSample([1, 2], [3], 0.5, [-0.1], images=(first,)),
        sample(2),  # text only, between two with images
        TrainSample([4], [5, 6], -0.5, [-0.2, -0.3], images=(odd, second, first)),
    ]
    train_dir = TrainDir(tmp_path)
    train_dir.write_batch(StepBatch(7, samples, 1.0, ["a", "b", "c"]))
    read = train_dir.read_batch(7)
    assert read is not None and read.samples == samples
    assert [[image.sha256 for image in s.images] for s in read.samples] == [
        [first.sha256],
        [],
        [odd.sha256, second.sha256, first.sha256],
    ]
    assert read.samples[2].images[0].to_pil().size == (3, 2)


def test_a_batch_file_written_before_images_still_decodes() -> None:
    from safetensors.numpy import load, save

    data = encode_batch(StepBatch(1, [sample(1), sample(2)], 1.0, ["a", "b"]))
    header_len = int.from_bytes(data[:8], "little")
    metadata = json.loads(data[8 : 8 + header_len])["__metadata__"]
    older = {name: value for name, value in load(data).items() if not name.startswith("image_")}
    batch = decode_batch(save(older, metadata=metadata))
    assert [s.images for s in batch.samples] == [(), ()]
    assert batch.samples == [sample(1), sample(2)]


def populate(train_dir: TrainDir, steps: range) -> None:
    for step in steps:
        train_dir.write_batch(StepBatch(step, [sample(1)], 1.0, [f"s{step}"]))
        train_dir.policy_dir(step).mkdir(parents=True)
        (train_dir.policy_dir(step) / "model.safetensors").write_bytes(b"w")
        train_dir.write_metrics(step, {"step": step})
        train_dir.write_done(step, {"step": step})


def names(train_dir: TrainDir, folder: str) -> list[str]:
    return sorted(p.name for p in (train_dir.root / folder).iterdir())


def test_prune_published_keeps_what_a_restart_needs(tmp_path: Path) -> None:
    train_dir = TrainDir(tmp_path)
    populate(train_dir, range(1, 7))
    train_dir.staging_policy_dir(2).mkdir()  # an export cut short, long since redone
    (train_dir.root / "batches" / ".step_1.safetensors.999.tmp").write_bytes(b"half")
    train_dir.legacy_batch_path(3).write_text("{}")  # a run dir from before the safetensors transport
    (train_dir.root / "done" / "notes.txt").write_text("not ours")
    removed = train_dir.prune_published(4)
    assert names(train_dir, "batches") == ["step_5.safetensors", "step_6.safetensors"]
    assert names(train_dir, "policies") == ["step_5", "step_6"]
    # the published step's done marker stays: a trainer restarted at its checkpoint must see it finished
    assert names(train_dir, "done") == ["notes.txt", "step_4.json", "step_5.json", "step_6.json"]
    assert names(train_dir, "metrics") == ["step_4.json", "step_5.json", "step_6.json"]
    assert len(removed) == 4 + 4 + 3 + 3 + 1 + 1 + 1
    assert train_dir.prune_published(4) == []

    kept = TrainDir(tmp_path / "kept")
    populate(kept, range(1, 7))
    kept.prune_published(4, keep_steps=2)
    assert names(kept, "batches") == [f"step_{s}.safetensors" for s in (3, 4, 5, 6)]
    assert names(kept, "done") == [f"step_{s}.json" for s in (3, 4, 5, 6)]
    assert TrainDir(tmp_path / "nothing").prune_published(3) == []


def test_the_final_policy_is_kept_whole_and_outlives_pruning(tmp_path: Path) -> None:
    train_dir = TrainDir(tmp_path / "train")
    populate(train_dir, range(1, 4))
    (train_dir.policy_dir(3) / "model.safetensors").write_bytes(b"weights of step 3")
    final = tmp_path / "final-policy"
    train_dir.keep_policy(3, final)
    train_dir.prune_published(3)
    assert names(train_dir, "policies") == []
    assert (final / "model.safetensors").read_bytes() == b"weights of step 3"
    assert not list(tmp_path.glob(".final-policy.partial*"))
    (train_dir.root / "policies" / "step_4").mkdir(parents=True)
    (train_dir.policy_dir(4) / "model.safetensors").write_bytes(b"weights of step 4")
    train_dir.keep_policy(4, final)  # kept again (a longer run): replaced whole
    assert sorted(p.name for p in final.iterdir()) == ["model.safetensors"]
    assert (final / "model.safetensors").read_bytes() == b"weights of step 4"


def test_a_lora_runs_result_is_the_merged_policy_and_its_adapter(tmp_path: Path) -> None:
    train_dir = TrainDir(tmp_path / "train")
    for merged, content in ((False, b"adapter of step 2"), (True, b"merged weights of step 2")):
        train_dir.policy_dir(2, merged).mkdir(parents=True)
        (train_dir.policy_dir(2, merged) / "weights.safetensors").write_bytes(content)
    train_dir.keep_result(2, tmp_path / "final-policy", tmp_path / "final-adapter")
    assert (tmp_path / "final-policy" / "weights.safetensors").read_bytes() == b"merged weights of step 2"
    assert (tmp_path / "final-adapter" / "weights.safetensors").read_bytes() == b"adapter of step 2"
    train_dir.keep_result(2, tmp_path / "full-run")  # no adapter: the exported policy itself
    assert (tmp_path / "full-run" / "weights.safetensors").read_bytes() == b"adapter of step 2"


def test_a_doorbell_wakes_its_listener_and_a_lost_ring_costs_one_timeout(tmp_path: Path) -> None:
    bell_path = tmp_path / "train" / "batch.bell"
    Doorbell(bell_path).ring()  # nobody listens yet (no pipe even): nothing happens, nothing blocks
    listener = Doorbell(bell_path)
    assert listener.listen()
    started = time.monotonic()
    assert not listener.wait(0.05)
    assert time.monotonic() - started >= 0.05
    threading.Timer(0.1, Doorbell(bell_path).ring).start()
    started = time.monotonic()
    assert listener.wait(10.0)
    assert time.monotonic() - started < 5.0
    for _ in range(3):
        Doorbell(bell_path).ring()
    assert listener.wait(0)  # rings pile up as one
    assert not listener.wait(0)
    listener.close()
    Doorbell(bell_path).ring()  # the pipe stays, its reader is gone: still no block, no error


def test_writing_a_batch_or_a_done_marker_rings_its_doorbell(tmp_path: Path) -> None:
    train_dir = TrainDir(tmp_path)
    batch_bell, done_bell = Doorbell(train_dir.batch_bell), Doorbell(train_dir.done_bell)
    assert batch_bell.listen() and done_bell.listen()
    train_dir.write_batch(StepBatch(1, [], 1.0, []))
    assert batch_bell.wait(0) and not done_bell.wait(0)
    train_dir.write_done(1, {"loss": 0.0})
    assert done_bell.wait(0) and not batch_bell.wait(0)
    batch_bell.close()
    done_bell.close()
