"""Value patches: bit-exact round trips, chains, a wrong base, and corrupt patches that raise only IntegrityError."""

from __future__ import annotations

import contextlib
import filecmp
import json
import shutil
import tempfile
import tracemalloc
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
import zstandard
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from safetensors.torch import save_file

from protocol.errors import IntegrityError, LocalFaultError
from shardcast.format.patch import ENCODING, MAGIC, PatchStats, apply_patch, encode_patch
from tests.support.shardcast_nodes import header_bomb

LIMIT = 1 << 30
Fixture = tuple[Path, Path, Path, bytes]


def random_state(seed: int, dtype: torch.dtype, shapes: Mapping[str, tuple[int, ...]]) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return {name: (torch.randn(shape, generator=gen) * 0.02).to(dtype) for name, shape in shapes.items()}


SHAPES = {"embed.weight": (64, 48), "layers.0.mlp.weight": (48, 96), "layers.0.norm.weight": (48,), "head.weight": (7,)}


def write_checkpoint(directory: Path, state: dict[str, torch.Tensor], extras: dict[str, str] | None = None) -> Path:
    directory.mkdir(parents=True)
    save_file({k: v.contiguous() for k, v in state.items()}, str(directory / "model.safetensors"))
    files = {"config.json": '{"hidden_size": 48}', "tokenizer/vocab.json": '{"a": 1}'} if extras is None else extras
    for name, text in files.items():
        (directory / name).parent.mkdir(parents=True, exist_ok=True)
        (directory / name).write_text(text)
    return directory


def change_bits(state: dict[str, torch.Tensor], fraction: float, seed: int) -> dict[str, torch.Tensor]:
    """Move ``fraction`` of the elements by a few ulps (and some to unrelated bits), like an optimizer step."""
    rng = np.random.default_rng(seed)
    changed: dict[str, torch.Tensor] = {}
    for name, tensor in state.items():
        width = tensor.element_size()
        bits = tensor.contiguous().view(torch.uint8).numpy().copy().view(f"<u{width}").reshape(-1)
        mask = rng.random(bits.size) < fraction
        if fraction >= 1.0:
            mask[:] = True
        steps = rng.choice(np.array([1, 2, 3, -1, -2, 7], dtype=np.int64), size=bits.size)
        moved = (bits.astype(np.int64) + steps) % (1 << (8 * width))
        jumps = rng.random(bits.size) < 0.05
        moved[jumps] = rng.integers(0, 1 << (8 * width), size=int(jumps.sum()))
        moved = np.where(moved == bits, (bits.astype(np.int64) + 1) % (1 << (8 * width)), moved)
        new_bits = np.where(mask, moved, bits).astype(f"<u{width}")
        changed[name] = torch.from_numpy(new_bits.view(np.uint8).copy()).view(tensor.dtype).reshape(tensor.shape)
    return changed


def one_ulp_steps(tensor: torch.Tensor, fraction: float, seed: int) -> torch.Tensor:
    """Move ``fraction`` of a bf16 tensor's elements one ulp up or down (a few by two): a small lr step."""
    rng = np.random.default_rng(seed)
    bits = tensor.contiguous().view(torch.int16).numpy().copy().reshape(-1)
    chosen = rng.random(bits.size) < fraction
    steps = rng.choice(np.array([1, -1, 1, -1, 2, -2, 1, -1], dtype=np.int16), size=bits.size)
    bits[chosen] += steps[chosen]
    return torch.from_numpy(bits).view(torch.bfloat16).reshape(tensor.shape)


def same_tree(a: Path, b: Path) -> bool:
    files_a = sorted(p.relative_to(a).as_posix() for p in a.rglob("*") if p.is_file())
    files_b = sorted(p.relative_to(b).as_posix() for p in b.rglob("*") if p.is_file())
    return files_a == files_b and all(filecmp.cmp(a / f, b / f, shallow=False) for f in files_a)


def round_trip(tmp_path: Path, base: Path, new: Path) -> PatchStats:
    stats = encode_patch(base, new, tmp_path / "v.patch")
    apply_patch(base, tmp_path / "v.patch", tmp_path / "out", LIMIT)
    assert same_tree(new, tmp_path / "out")
    return stats


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("fraction", [0.0, 0.01, 0.5, 1.0])
def test_round_trip_is_bit_exact(tmp_path: Path, dtype: torch.dtype, fraction: float) -> None:
    state = random_state(0, dtype, SHAPES)
    base = write_checkpoint(tmp_path / "base", state)
    new = write_checkpoint(tmp_path / "new", change_bits(state, fraction, seed=1))
    stats = round_trip(tmp_path, base, new)
    total = sum(t.numel() for t in state.values())
    assert stats.num_elements == total
    if fraction == 0.0:
        assert stats.num_changed == 0
        assert stats.entropy_bound_bytes == 0.0
    elif fraction == 1.0:
        assert stats.num_changed == total
    else:
        assert 0.5 * fraction * total < stats.num_changed < 1.5 * fraction * total
    assert stats.full_bytes == sum(p.stat().st_size for p in new.rglob("*") if p.is_file())
    assert stats.patch_bytes == (tmp_path / "v.patch").stat().st_size


def test_other_dtypes_round_trip(tmp_path: Path) -> None:
    gen = torch.Generator().manual_seed(3)
    state = {
        "half": torch.randn(300, generator=gen).half(),
        "double": torch.randn(50, generator=gen).double(),
        "ids": torch.randint(0, 1000, (40,), generator=gen),
        "flags": torch.rand(30, generator=gen) > 0.5,
        "empty": torch.zeros(0, 4),
    }
    base = write_checkpoint(tmp_path / "base", state)
    new_state = dict(state, half=state["half"] + 0.01, double=state["double"] * 1.5, flags=~state["flags"])
    new = write_checkpoint(tmp_path / "new", new_state)
    stats = round_trip(tmp_path, base, new)
    assert stats.num_changed > 0


def test_sparse_changes_make_a_small_patch(tmp_path: Path) -> None:
    shapes = {"a.weight": (512, 512), "b.weight": (512, 256)}
    state = random_state(0, torch.bfloat16, shapes)
    base = write_checkpoint(tmp_path / "base", state)
    new = write_checkpoint(tmp_path / "new", change_bits(state, 0.01, seed=2))
    stats = round_trip(tmp_path, base, new)
    assert stats.patch_bytes * 20 < stats.full_bytes
    assert stats.patch_bytes < 2 * stats.entropy_bound_bytes
    assert stats.entropy_bound_bytes < stats.patch_bytes


def test_non_tensor_files_and_changed_headers(tmp_path: Path) -> None:
    state = random_state(0, torch.bfloat16, SHAPES)
    base = write_checkpoint(tmp_path / "base", state, {"config.json": "{}", "old.txt": "gone", "tok/a.json": "[1]"})
    (base / "extra.safetensors").write_bytes((tmp_path / "base" / "model.safetensors").read_bytes())
    extras = {"config.json": '{"x": 2}', "tok/a.json": "[1]", "tok/b.json": "b"}
    new = write_checkpoint(tmp_path / "new", change_bits(state, 0.1, 4), extras)
    renamed = dict(state)
    renamed["renamed.weight"] = renamed.pop("head.weight")
    save_file(renamed, str(new / "extra.safetensors"))
    (new / "empty.bin").write_bytes(b"")
    stats = round_trip(tmp_path, base, new)
    assert not (tmp_path / "out" / "old.txt").exists()
    # The renamed file is carried whole: only model.safetensors' tensors were compared.
    assert stats.num_elements == sum(t.numel() for t in state.values())


def test_metadata_only_header_change_is_patched_tensorwise(tmp_path: Path) -> None:
    state = random_state(0, torch.float32, SHAPES)
    base = write_checkpoint(tmp_path / "base", state)
    new = write_checkpoint(tmp_path / "new", {})
    save_file(change_bits(state, 0.01, 5), str(new / "model.safetensors"), metadata={"format": "pt", "step": "7"})
    stats = round_trip(tmp_path, base, new)
    assert stats.num_elements == sum(t.numel() for t in state.values())


def test_chain_of_ten_patches(tmp_path: Path) -> None:
    state = random_state(0, torch.bfloat16, SHAPES)
    versions = [write_checkpoint(tmp_path / "v0", state)]
    for i in range(1, 11):
        state = change_bits(state, 0.02, seed=i)
        versions.append(write_checkpoint(tmp_path / f"v{i}", state, {"config.json": f'{{"step": {i}}}'}))
    current = versions[0]
    for i in range(1, 11):
        encode_patch(versions[i - 1], versions[i], tmp_path / f"p{i}")
        applied = tmp_path / f"applied{i}"
        apply_patch(current, tmp_path / f"p{i}", applied, LIMIT)
        current = applied
    assert same_tree(versions[10], current)


def test_patch_for_another_base_writes_nothing(tmp_path: Path) -> None:
    state = random_state(0, torch.bfloat16, SHAPES)
    base = write_checkpoint(tmp_path / "base", state)
    new = write_checkpoint(tmp_path / "new", change_bits(state, 0.01, 1))
    other = write_checkpoint(tmp_path / "other", change_bits(state, 0.01, 2))
    encode_patch(base, new, tmp_path / "p")
    with pytest.raises(IntegrityError, match="patch is for another base"):
        apply_patch(other, tmp_path / "p", tmp_path / "out", LIMIT)
    assert not (tmp_path / "out").exists()
    (tmp_path / "empty").mkdir()
    with pytest.raises(IntegrityError, match="patch is for another base"):
        apply_patch(other, tmp_path / "p", tmp_path / "empty", LIMIT)
    assert list((tmp_path / "empty").iterdir()) == []


def test_output_limit_and_busy_out_dir(tmp_path: Path) -> None:
    state = random_state(0, torch.bfloat16, SHAPES)
    base = write_checkpoint(tmp_path / "base", state)
    new = write_checkpoint(tmp_path / "new", change_bits(state, 0.01, 1))
    stats = encode_patch(base, new, tmp_path / "p")
    with pytest.raises(IntegrityError, match="max_output_bytes"):
        apply_patch(base, tmp_path / "p", tmp_path / "out", stats.full_bytes - 1)
    assert not (tmp_path / "out").exists()
    apply_patch(base, tmp_path / "p", tmp_path / "out", stats.full_bytes)
    with pytest.raises(LocalFaultError):
        apply_patch(base, tmp_path / "p", tmp_path / "out", LIMIT)


def test_patch_starts_with_magic_and_names_its_encoding(tmp_path: Path) -> None:
    state = random_state(0, torch.bfloat16, SHAPES)
    encode_patch(write_checkpoint(tmp_path / "a", state), write_checkpoint(tmp_path / "b", state), tmp_path / "p")
    assert (tmp_path / "p").read_bytes().startswith(MAGIC)
    assert ENCODING == "bitpatch-zstd-v1"


@pytest.fixture(scope="module")
def small_patch() -> Iterator[Fixture]:
    root = Path(tempfile.mkdtemp(prefix="patch-fuzz-"))
    # Dense, sparse and value-jump changes, and a changed header, so that every coding appears.
    state = random_state(0, torch.bfloat16, {"w": (40, 16), "v": (33,), "sparse": (128, 64), "ulps": (64, 64)})
    base = write_checkpoint(root / "base", state, {"config.json": "{}"})
    changed = change_bits({"w": state["w"]}, 0.3, 1) | change_bits({"sparse": state["sparse"]}, 0.02, 2)
    changed["v"] = torch.randn(33, generator=torch.Generator().manual_seed(5)).to(torch.bfloat16)
    changed["ulps"] = one_ulp_steps(state["ulps"], 0.05, seed=3)
    new = write_checkpoint(root / "new", {}, {"config.json": '{"a": 1}'})
    save_file(changed, str(new / "model.safetensors"), metadata={"step": "1"})
    encode_patch(base, new, root / "p")
    yield root, base, new, (root / "p").read_bytes()
    shutil.rmtree(root, ignore_errors=True)


def check_corrupt(root: Path, base: Path, new: Path, data: bytes) -> None:
    work = Path(tempfile.mkdtemp(dir=root))
    try:
        (work / "p").write_bytes(data)
        try:
            apply_patch(base, work / "p", work / "out", LIMIT)
        except IntegrityError:
            assert not (work / "out").exists()
        else:  # a flip zstd or JSON cannot see must still give the exact files (blake3 checked)
            assert same_tree(new, work / "out")
    finally:
        shutil.rmtree(work)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(flips=st.lists(st.tuples(st.integers(0, 1 << 30), st.integers(0, 7)), min_size=1, max_size=4))
def test_bit_flips_raise_integrity_error(small_patch: Fixture, flips: list[tuple[int, int]]) -> None:
    root, base, new, data = small_patch
    corrupt = bytearray(data)
    for position, bit in flips:
        corrupt[position % len(corrupt)] ^= 1 << bit
    check_corrupt(root, base, new, bytes(corrupt))


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(cut=st.integers(0, 1 << 30), junk=st.binary(max_size=64))
def test_truncated_or_extended_patches_raise_integrity_error(small_patch: Fixture, cut: int, junk: bytes) -> None:
    root, base, new, data = small_patch
    check_corrupt(root, base, new, data[: cut % len(data)] + junk)


MAGICLESS = zstandard.FORMAT_ZSTD1_MAGICLESS


def rewrite_header(data: bytes, mutate: Callable[[dict[str, Any]], object]) -> bytes:
    """The patch with its JSON header changed by ``mutate`` (the body kept as it is)."""
    packed_len, raw_len = int.from_bytes(data[8:16], "little"), int.from_bytes(data[16:24], "little")
    reader = zstandard.ZstdDecompressor(format=MAGICLESS).stream_reader(data[24 : 24 + packed_len])
    header = json.loads(reader.read(raw_len))
    mutate(header)
    raw = json.dumps(header).encode()
    packed = zstandard.ZstdCompressor(compression_params=zstandard.ZstdCompressionParameters(format=MAGICLESS))
    frame = packed.compress(raw)
    return MAGIC + len(frame).to_bytes(8, "little") + len(raw).to_bytes(8, "little") + frame + data[24 + packed_len :]


def tensor_file(header: dict[str, Any]) -> dict[str, Any]:
    found: dict[str, Any] = next(f for f in header["files"] if f["kind"] == "tensors")
    return found


def record(header: dict[str, Any], positions: str | None = None, values: str | None = None) -> dict[str, Any]:
    """The first changed tensor record with the given codings."""
    for found in tensor_file(header)["tensors"]:
        if found["k"] and positions in (None, found["p"]["c"]) and values in (None, found["v"]["c"]):
            assert isinstance(found, dict)
            return found
    raise AssertionError(f"no record coded {positions}/{values}: the fixture no longer covers every coding")


def swap_positions_coding(h: dict[str, Any]) -> None:
    spec = record(h, positions="bm")["p"]
    spec.clear()
    spec.update(c="rice", l=0, w=1, b=[[0, 5]])


MUTATIONS: dict[str, Callable[[dict[str, Any]], object]] = {
    "encoding": lambda h: h.update(encoding="bitpatch-zstd-v0"),
    "extra key": lambda h: h.update(more=1),
    "base hash": lambda h: h["base"][0].__setitem__(2, "0" * 64),
    "base size": lambda h: h["base"][0].__setitem__(1, 5),
    "base missing": lambda h: h["base"].clear(),
    "escaping path": lambda h: h["files"][0].update(path="../evil"),
    "repeated path": lambda h: h["files"].append(dict(h["files"][0])),
    "file under a file": lambda h: h["files"].append(dict(h["files"][0], path=h["files"][0]["path"] + "/x")),
    "huge size": lambda h: h["files"][0].update(size=1 << 40),
    "float size": lambda h: h["files"][0].update(size=1.5),
    "bad hash": lambda h: h["files"][0].update(blake3="zz"),
    "unknown kind": lambda h: h["files"][0].update(kind="delta"),
    "no files": lambda h: h.update(files=[]),
    "header size": lambda h: tensor_file(h)["header"].update(n=tensor_file(h)["header"]["n"] - 1),
    "header size huge": lambda h: tensor_file(h)["header"].update(n=1 << 40),
    "header dropped": lambda h: tensor_file(h).update(header=None),
    "record count": lambda h: tensor_file(h)["tensors"].pop(),
    "record not an object": lambda h: tensor_file(h)["tensors"].__setitem__(0, [1]),
    "k too large": lambda h: record(h).update(k=10**12),
    "k negative": lambda h: record(h).update(k=-1),
    "k off by one": lambda h: record(h).update(k=record(h)["k"] + 1),
    "k bool": lambda h: record(h).update(k=True),
    "positions coding unknown": lambda h: record(h)["p"].update(c="g9"),
    "positions coding swapped": swap_positions_coding,
    "rice low bits": lambda h: record(h, positions="rice")["p"].update(l=record(h, positions="rice")["p"]["l"] + 1),
    "rice low bits huge": lambda h: record(h, positions="rice")["p"].update(l=70),
    "rice quotient width": lambda h: record(h, positions="rice")["p"].update(w=3),
    "values coding unknown": lambda h: record(h)["v"].update(c="x"),
    "delta as values": lambda h: record(h, values="d")["v"].update(c="v"),
    "split as delta": lambda h: record(h, values="s")["v"].update(c="d"),
    "magnitude count": lambda h: record(h, values="s")["v"].update(e=record(h, values="s")["v"]["e"] + 1),
    "magnitudes dropped": lambda h: record(h, values="s")["v"].update(e=0, p=None),
    "blob past end": lambda h: record(h)["p"]["b"].__setitem__(0, [1 << 40, 10]),
    "blob zero length": lambda h: record(h)["p"]["b"].__setitem__(0, [0, 0]),
    "blob not a pair": lambda h: record(h)["p"]["b"].__setitem__(0, 7),
    "blob missing": lambda h: record(h)["p"]["b"].pop(),
    "planes swapped": lambda h: record(h, values="d")["v"]["b"].reverse(),
    "unchanged record with data": lambda h: tensor_file(h)["tensors"].__setitem__(0, {"k": 0, "p": None}),
    "safetensors header grown past its base's": lambda h: tensor_file(h)["header"].update(n=tensor_file(h)["size"]),
}


@pytest.mark.parametrize("name", sorted(MUTATIONS))
def test_tampered_headers_raise_integrity_error(small_patch: Fixture, name: str) -> None:
    root, base, _, data = small_patch
    work = Path(tempfile.mkdtemp(dir=root))
    try:
        (work / "p").write_bytes(rewrite_header(data, MUTATIONS[name]))
        with pytest.raises(IntegrityError):
            apply_patch(base, work / "p", work / "out", LIMIT)
        assert not (work / "out").exists()
    finally:
        shutil.rmtree(work)


def test_frames_that_claim_huge_sizes_are_refused(small_patch: Fixture) -> None:
    root, base, _, data = small_patch
    bomb = zstandard.ZstdCompressor().compress(bytes(50_000_000))
    work = Path(tempfile.mkdtemp(dir=root))
    try:
        body_start = 24 + int.from_bytes(data[8:16], "little")
        body_len = len(data) - body_start

        def point_at_bomb(header: dict[str, Any]) -> None:
            whole = next(f for f in header["files"] if f["kind"] == "whole")
            whole["blob"] = [body_len, len(bomb)]

        (work / "p").write_bytes(rewrite_header(data, point_at_bomb) + bomb)
        with pytest.raises(IntegrityError):
            apply_patch(base, work / "p", work / "out", LIMIT)
        huge_header = MAGIC + (10).to_bytes(8, "little") + (1 << 40).to_bytes(8, "little") + bytes(10)
        (work / "q").write_bytes(huge_header)
        with pytest.raises(IntegrityError, match="limit"):
            apply_patch(base, work / "q", work / "out", LIMIT)
    finally:
        shutil.rmtree(work)


def test_one_ulp_steps_code_near_the_entropy_bound(tmp_path: Path) -> None:
    state = random_state(0, torch.bfloat16, {"w": (1024, 1024)})
    base = write_checkpoint(tmp_path / "base", state, {})
    new = write_checkpoint(tmp_path / "new", {"w": one_ulp_steps(state["w"], 0.01, seed=1)}, {})
    stats = round_trip(tmp_path, base, new)
    assert stats.entropy_bound_bytes / stats.patch_bytes > 0.9


def test_every_bit_flip_in_the_header_is_caught(small_patch: Fixture) -> None:
    # The header names the output paths and nothing else hashes them: a flip there must be caught
    # by the header frame's checksum, not written out as the right bytes under a wrong name.
    root, base, new, data = small_patch
    header_end = 24 + int.from_bytes(data[8:16], "little")
    for position in range(header_end):
        for bit in range(8):
            corrupt = bytearray(data)
            corrupt[position] ^= 1 << bit
            check_corrupt(root, base, new, bytes(corrupt))


def peak_bytes_of(call: Callable[[], object]) -> int:
    """The most Python and numpy memory ``call`` had allocated at once (it may raise IntegrityError)."""
    tracemalloc.start()
    try:
        with contextlib.suppress(IntegrityError):
            call()
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def test_a_header_that_inflates_past_what_its_base_needs_is_refused_before_it_is_read(small_patch: Fixture) -> None:
    root, base, _, _ = small_patch
    bomb = header_bomb(16 * 1024 * 1024)
    assert len(bomb) < 64 * 1024  # kilobytes on the wire
    work = Path(tempfile.mkdtemp(dir=root))
    try:
        (work / "p").write_bytes(bomb)
        with pytest.raises(IntegrityError, match="limit its base allows"):
            apply_patch(base, work / "p", work / "out", LIMIT)
        peak = peak_bytes_of(lambda: apply_patch(base, work / "p", work / "out", LIMIT))
        assert peak < 2 * 1024 * 1024, f"refusing the header took {peak} bytes"
    finally:
        shutil.rmtree(work)


def integer_fields(value: object, path: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """The path of every integer (not bool) in a JSON value."""
    if isinstance(value, dict):
        return [p for key, item in value.items() for p in integer_fields(item, (*path, key))]
    if isinstance(value, list):
        return [p for i, item in enumerate(value) for p in integer_fields(item, (*path, i))]
    return [path] if type(value) is int else []


def set_field(header: dict[str, Any], path: tuple[Any, ...], number: int) -> None:
    target: Any = header
    for key in path[:-1]:
        target = target[key]
    target[path[-1]] = number


SIZES = st.one_of(st.integers(-(2**63), 2**64), st.sampled_from([0, 1, 2**31, 2**32, 2**40, 2**62, 2**63 - 1]))


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(picks=st.lists(st.tuples(st.integers(0, 1 << 20), SIZES), min_size=1, max_size=3))
def test_any_number_in_the_header_is_bounded_before_use(small_patch: Fixture, picks: list[tuple[int, int]]) -> None:
    """Every length, count, offset and coding number the header declares, set to anything, gives the exact files
    or an IntegrityError, and never makes the applier hold more than a small multiple of the checkpoint."""
    root, base, new, data = small_patch
    packed_len, raw_len = int.from_bytes(data[8:16], "little"), int.from_bytes(data[16:24], "little")
    header = json.loads(
        zstandard.ZstdDecompressor(format=MAGICLESS).stream_reader(data[24 : 24 + packed_len]).read(raw_len)
    )
    fields = integer_fields(header)

    def mutate(h: dict[str, Any]) -> None:
        for which, number in picks:
            set_field(h, fields[which % len(fields)], number)

    work = Path(tempfile.mkdtemp(dir=root))
    try:
        (work / "p").write_bytes(rewrite_header(data, mutate))
        checkpoint_bytes = sum(p.stat().st_size for p in new.rglob("*") if p.is_file())
        peak = peak_bytes_of(lambda: apply_patch(base, work / "p", work / "out", LIMIT))
        assert peak < 8 * checkpoint_bytes + 4 * 1024 * 1024, f"{peak} bytes for a {checkpoint_bytes}-byte checkpoint"
        if (work / "out").exists():
            assert same_tree(new, work / "out")
    finally:
        shutil.rmtree(work)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(packed_len=SIZES, raw_len=SIZES)
def test_any_declared_header_length_is_bounded_before_use(small_patch: Fixture, packed_len: int, raw_len: int) -> None:
    root, base, _, data = small_patch
    work = Path(tempfile.mkdtemp(dir=root))
    try:
        preamble = MAGIC + (packed_len % 2**64).to_bytes(8, "little") + (raw_len % 2**64).to_bytes(8, "little")
        (work / "p").write_bytes(preamble + data[24:])
        peak = peak_bytes_of(lambda: apply_patch(base, work / "p", work / "out", LIMIT))
        assert peak < 4 * 1024 * 1024
    finally:
        shutil.rmtree(work)
