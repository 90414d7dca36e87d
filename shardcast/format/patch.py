"""Value patches: one file that turns a base checkpoint into the next version, bit-exact.

Between two RL steps almost every bf16 weight keeps its exact bits, so a version can ship as
the positions that changed and their new bits instead of the whole checkpoint. These are not
float deltas: applying a patch reproduces every byte of the new version, and the patch
itself carries the blake3 of each base file it reads and of each file it writes.
:func:`encode_patch` compares two checkpoint directories; :func:`apply_patch` treats the
patch as untrusted input (every length, count and offset is checked against the base file
and a caller's output limit before anything is allocated or written). The format
(``bitpatch-zstd-v1``) and the entropy bound that :class:`PatchStats` reports are described
in docs/shardcast.md ("Value patches: the codec"), with the file layout.
"""

from __future__ import annotations

import io
import json
import math
import os
import shutil
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, BinaryIO, cast

import blake3
import numpy as np
import numpy.typing as npt
import zstandard

from protocol.errors import IntegrityError, LocalFaultError, ProtocolError
from protocol.schemas import PATCH_ENCODING
from shardcast.format.manifest import check_relative_path, hash_file, list_checkpoint_files

ENCODING = PATCH_ENCODING
MAGIC = b"PNBPATCH"
_PREAMBLE = len(MAGIC) + 16
# The JSON header lists files and tensors; nothing legitimate comes near this.
MAX_HEADER_BYTES = 64 * 1024 * 1024
# What a header may take beyond what its base accounts for: file entries (path, size, blake3), the
# encoding, small files' records. A header is checked against this bound before it is decompressed.
HEADER_ALLOWANCE_BYTES = 1024 * 1024
# Header bytes a patch may spend per byte of its base's safetensors headers: the largest tensor record
# (nested position and value codings, about 27 blob references) is under 1 KiB, the smallest
# safetensors entry of a tensor over 45 bytes.
HEADER_BYTES_PER_BASE_HEADER_BYTE = 24
# A patched safetensors header describes the same tensors as its base's (same names, dtypes, shapes):
# it may differ in offsets and metadata, never grow past twice its base's size plus this.
SAFETENSORS_HEADER_GROWTH_BYTES = 64 * 1024
# The safetensors format refuses headers above 100 MB; so do we.
MAX_SAFETENSORS_HEADER_BYTES = 100_000_000
_CHUNK = 8 * 1024 * 1024

# Bytes per element of each safetensors dtype; the codec views elements as unsigned integers
# of that width when it is 2 or 4 bytes and as bytes otherwise.
_DTYPE_SIZES = {
    "BOOL": 1,
    "U8": 1,
    "I8": 1,
    "F8_E5M2": 1,
    "F8_E4M3": 1,
    "I16": 2,
    "U16": 2,
    "F16": 2,
    "BF16": 2,
    "I32": 4,
    "U32": 4,
    "F32": 4,
    "I64": 8,
    "U64": 8,
    "F64": 8,
}
_UINTS: dict[int, npt.DTypeLike] = {1: np.dtype("<u1"), 2: np.dtype("<u2"), 4: np.dtype("<u4"), 8: np.dtype("<u8")}
_FIELDS_CHUNK = 1 << 16  # fields packed or unpacked at a time (a multiple of 8; bounds the scratch memory)

UIntArray = npt.NDArray[np.unsignedinteger[Any]]


@dataclass(frozen=True)
class PatchStats:
    """What :func:`encode_patch` measured.

    ``entropy_bound_bytes`` is what an ideal coder would need for the same information: for
    each compared tensor of N elements with k changed, ``N * H2(k / N) / 8`` bytes for which
    positions changed (H2 the binary entropy in bits) plus ``k * H / 8`` bytes for the
    changes, H being the empirical entropy in bits of that tensor's change values
    (``new - old`` in integer units of the element); files carried whole (and changed
    safetensors headers) count at their zstd size, identical files at zero.
    """

    full_bytes: int  # total size of the new version's files
    patch_bytes: int  # size of the patch file written
    num_elements: int  # tensor elements compared (safetensors tensors present in both with equal dtype/shape)
    num_changed: int  # of those, elements whose bits changed
    entropy_bound_bytes: float  # an ideal coder's size for the changed positions and their changes


# --- safetensors layout ------------------------------------------------------------------


@dataclass(frozen=True)
class _Tensor:
    name: str
    dtype: str
    shape: tuple[int, ...]
    start: int  # absolute offset in the file
    nbytes: int

    @property
    def width(self) -> int:
        size = _DTYPE_SIZES[self.dtype]
        return size if size in (2, 4) else 1

    @property
    def count(self) -> int:
        return self.nbytes // self.width


@dataclass(frozen=True)
class _Layout:
    header_size: int  # 8 + JSON length: where the data starts
    tensors: tuple[_Tensor, ...]  # in data-offset order, covering the data exactly

    def signature(self) -> dict[str, tuple[str, tuple[int, ...]]]:
        return {t.name: (t.dtype, t.shape) for t in self.tensors}


def _parse_layout(header: bytes, file_size: int) -> _Layout | None:
    """The tensors of a safetensors file from its first bytes, or None when it is not one we can patch.

    We only patch files whose tensors tile the data buffer back to back with no gap, so that
    the header plus the tensors is the whole file.
    """
    if len(header) < 8:
        return None
    length = int.from_bytes(header[:8], "little")
    if length > MAX_SAFETENSORS_HEADER_BYTES or 8 + length > min(len(header), file_size):
        return None
    try:
        meta = json.loads(header[8 : 8 + length])
    except (UnicodeDecodeError, ValueError, RecursionError):
        return None
    if not isinstance(meta, dict):
        return None
    data_start = 8 + length
    tensors: list[_Tensor] = []
    for name, info in meta.items():
        if name == "__metadata__":
            continue
        if not isinstance(info, dict) or set(info) != {"dtype", "shape", "data_offsets"}:
            return None
        dtype, shape, offsets = info["dtype"], info["shape"], info["data_offsets"]
        if dtype not in _DTYPE_SIZES or not isinstance(shape, list) or not isinstance(offsets, list):
            return None
        if not all(type(d) is int and d >= 0 for d in shape):
            return None
        if len(offsets) != 2 or not all(type(o) is int and o >= 0 for o in offsets):
            return None
        begin, end = offsets
        if end - begin != math.prod(shape) * _DTYPE_SIZES[dtype]:
            return None
        tensors.append(_Tensor(name, dtype, tuple(shape), data_start + begin, end - begin))
    tensors.sort(key=lambda t: (t.start, t.nbytes))
    position = data_start
    for tensor in tensors:
        if tensor.start != position:
            return None
        position += tensor.nbytes
    if position != file_size:
        return None
    return _Layout(data_start, tuple(tensors))


def _read_layout(path: Path, size: int) -> tuple[_Layout, bytes] | None:
    """(layout, header bytes) of a safetensors file on disk, or None when it is not one we patch."""
    if not path.name.endswith(".safetensors") or size < 8:
        return None
    with path.open("rb") as f:
        prefix = f.read(8)
        length = int.from_bytes(prefix, "little")
        if length > MAX_SAFETENSORS_HEADER_BYTES or 8 + length > size:
            return None
        header = prefix + f.read(length)
    layout = _parse_layout(header, size)
    return (layout, header) if layout is not None else None


def _elements(f: io.BufferedReader, tensor: _Tensor) -> UIntArray:
    """A tensor's bytes, read from its file, as unsigned integers of its element width (writable)."""
    buffer = bytearray(tensor.nbytes)
    f.seek(tensor.start)
    if f.readinto(buffer) != tensor.nbytes:
        raise IntegrityError(f"{f.name} ended inside tensor {tensor.name}")
    array: UIntArray = np.frombuffer(buffer, dtype=_UINTS[tensor.width])
    return array


# --- streams -----------------------------------------------------------------------------


def _planes(values: UIntArray) -> list[bytes]:
    """Byte planes of little-endian unsigned integers: byte 0 of every item, then byte 1, ..."""
    width = values.dtype.itemsize
    if width == 1:
        return [values.tobytes()]
    grid = values.astype(_UINTS[width], copy=False).view(np.uint8).reshape(-1, width)
    return [np.ascontiguousarray(grid[:, j]).tobytes() for j in range(width)]


def _zigzag(delta: UIntArray) -> UIntArray:
    """Map wrapping differences to small unsigned numbers: 0, -1, +1, -2, +2 ... -> 0, 1, 2, 3, 4 ..."""
    width = delta.dtype.itemsize
    signed = delta.view(np.dtype(f"<i{width}"))
    mapped = (signed << 1) ^ (signed >> (8 * width - 1))
    result: UIntArray = mapped.view(_UINTS[width])
    return result


def _unzigzag(mapped: UIntArray) -> UIntArray:
    width = mapped.dtype.itemsize
    sign = (mapped & 1).view(np.dtype(f"<i{width}"))
    result: UIntArray = (mapped >> 1) ^ (-sign).view(_UINTS[width])
    return result


def _entropy_bits(values: UIntArray) -> float:
    """Empirical entropy, in bits per item, of ``values``."""
    if values.size == 0:
        return 0.0
    if values.dtype.itemsize <= 2:
        counts = np.bincount(values)
        counts = counts[counts > 0]
    else:
        counts = np.unique(values, return_counts=True)[1]
    p = counts / values.size
    return float(-(p * np.log2(p)).sum())


def _binary_entropy(p: float) -> float:
    if p <= 0.0 or p >= 1.0:
        return 0.0
    return -(p * math.log2(p) + (1 - p) * math.log2(1 - p))


def _compressor(level: int, checksum: bool = False) -> zstandard.ZstdCompressor:
    """Frames without magic or content size: the header already says what each holds.

    Body frames carry no checksum either (every output file is checked against the blake3 the
    header names). The header's own frame does (``checksum``): nothing else covers the paths it
    names, so without one a flipped bit in a file name would write the right bytes under a wrong
    name. Decoders read the flag from the frame, so patches written either way decode.
    """
    params = zstandard.ZstdCompressionParameters.from_level(
        level, format=zstandard.FORMAT_ZSTD1_MAGICLESS, write_checksum=checksum, write_content_size=False
    )
    return zstandard.ZstdCompressor(compression_params=params)


class _Body:
    """The patch's body, written to a spool file: each blob is one zstd frame at a known offset."""

    def __init__(self, spool: BinaryIO, level: int) -> None:
        self.spool = spool
        self.offset = 0
        self.compressor = _compressor(level)

    def compress(self, data: bytes) -> bytes:
        return self.compressor.compress(data)

    def add(self, frame: bytes) -> list[int]:
        self.spool.write(frame)
        ref = [self.offset, len(frame)]
        self.offset += len(frame)
        return ref

    def add_file(self, path: Path) -> tuple[list[int], int]:
        """Compress a whole file into the body; returns its blob and compressed size."""
        start = self.offset
        with path.open("rb") as src:
            _, written = self.compressor.copy_stream(src, self.spool, size=path.stat().st_size)
        self.offset += written
        return [start, written], written


def _narrowest(largest: int) -> int:
    return next(w for w in (1, 2, 4, 8) if largest < 1 << (8 * w))


def _pack_fields(values: npt.NDArray[np.uint64], bits: int) -> bytes:
    """The low ``bits`` bits of each value, most significant first, back to back (numpy.packbits order)."""
    shifts = np.arange(bits - 1, -1, -1, dtype=np.uint64)
    pieces = []
    for start in range(0, values.size, _FIELDS_CHUNK):
        grid = ((values[start : start + _FIELDS_CHUNK, None] >> shifts) & np.uint64(1)).astype(np.uint8)
        pieces.append(np.packbits(grid.reshape(-1)).tobytes())
    return b"".join(pieces)


def _unpack_fields(packed: bytes, count: int, bits: int) -> npt.NDArray[np.uint64]:
    weights = np.uint64(1) << np.arange(bits - 1, -1, -1, dtype=np.uint64)
    out = np.empty(count, dtype=np.uint64)
    data = np.frombuffer(packed, dtype=np.uint8)
    for start in range(0, count, _FIELDS_CHUNK):  # a chunk of a multiple of 8 fields starts on a byte
        n = min(_FIELDS_CHUNK, count - start)
        begin = start * bits // 8
        grid = np.unpackbits(data[begin : begin + (n * bits + 7) // 8], count=n * bits).reshape(n, bits)
        out[start : start + n] = grid.astype(np.uint64) @ weights
    return out


def _spec_size(spec: dict[str, Any]) -> int:
    """Compressed bytes of a candidate spec whose ``"b"`` still holds the frames themselves."""
    frames: list[bytes] = spec["b"]
    return sum(len(f) for f in frames) + sum(_spec_size(v) for v in spec.values() if isinstance(v, dict))


def _place(body: _Body, spec: dict[str, Any]) -> dict[str, Any]:
    """Write a chosen spec's frames into the body, replacing each by its [offset, length]."""
    spec["b"] = [body.add(frame) for frame in spec["b"]]
    for value in spec.values():
        if isinstance(value, dict):
            _place(body, value)
    return spec


def _encode_positions(body: _Body, positions: npt.NDArray[np.int64], n: int) -> dict[str, Any]:
    """The cheapest coding of ``positions`` (sorted, distinct, in [0, n)) that we try.

    ``"rice"``: each gap minus one is split into its low ``l`` bits, packed back to back, and
    the rest (``q``, unsigned integers of ``w`` bytes, in byte planes); a Golomb-Rice code
    whose unary part zstd codes, near the entropy of geometric gaps for ``l`` near
    log2(mean gap * ln 2). ``"bm"``: a bitmap of the n elements, for dense changes.
    """
    k = int(positions.size)
    minus_one = np.diff(positions, prepend=-1).astype(np.uint64) - np.uint64(1)
    best = math.log2(max(1.0, n / k * math.log(2)))
    candidates: list[dict[str, Any]] = []
    for bits in sorted({max(0, math.floor(best)), max(0, math.ceil(best)), max(0, math.floor(best) - 1)}):
        quotients = minus_one >> np.uint64(bits)
        width = _narrowest(int(quotients.max()))
        frames = [body.compress(_pack_fields(minus_one, bits))] if bits else []
        frames += [body.compress(plane) for plane in _planes(quotients.astype(_UINTS[width]))]
        candidates.append({"c": "rice", "l": bits, "w": width, "b": frames})
    if k * 32 >= n:
        mask = np.zeros(n, dtype=bool)
        mask[positions] = True
        candidates.append({"c": "bm", "b": [body.compress(np.packbits(mask).tobytes())]})
    return min(candidates, key=_spec_size)


def _encode_values(body: _Body, old_values: UIntArray, new_values: UIntArray) -> dict[str, Any]:
    """The cheapest coding of the changed elements' new bits that we try.

    ``"d"``: zigzag(new - old) in byte planes. ``"v"``: the new bits in byte planes. ``"s"``:
    sign and magnitude of new - old apart: the signs as a bitmap (``"b"[0]``), magnitude 1
    (one ulp, the common case) implied, the ``"e"`` other magnitudes at the positions coded
    by ``"p"`` (among the k changes) in byte planes (``"b"[1:]``).
    """
    width = old_values.dtype.itemsize
    delta = new_values - old_values
    candidates = [
        {"c": "d", "b": [body.compress(p) for p in _planes(_zigzag(delta))]},
        {"c": "v", "b": [body.compress(p) for p in _planes(new_values)]},
    ]
    signed = delta.view(np.dtype(f"<i{width}"))
    magnitudes = np.abs(signed.astype(np.int64)).astype(_UINTS[width])
    others = np.flatnonzero(magnitudes != 1)
    split: dict[str, Any] = {"c": "s", "e": int(others.size), "p": None}
    split["b"] = [body.compress(np.packbits(signed < 0).tobytes())]
    if others.size:
        split["p"] = _encode_positions(body, others, int(delta.size))
        split["b"] += [body.compress(p) for p in _planes(magnitudes[others])]
    candidates.append(split)
    return min(candidates, key=_spec_size)


def _encode_tensor(body: _Body, old: UIntArray, new: UIntArray) -> tuple[dict[str, Any], int, float]:
    """The record of one tensor, its changed count and its entropy bound in bytes."""
    positions = np.flatnonzero(old != new)
    k, n = int(positions.size), int(old.size)
    if k == 0:
        return {"k": 0}, 0, 0.0
    old_values, new_values = old[positions], new[positions]
    bound = n * _binary_entropy(k / n) / 8 + k * _entropy_bits(new_values - old_values) / 8
    record = {
        "k": k,
        "p": _place(body, _encode_positions(body, positions, n)),
        "v": _place(body, _encode_values(body, old_values, new_values)),
    }
    return record, k, bound


def encode_patch(base_dir: Path, new_dir: Path, patch_path: Path, level: int = 3) -> PatchStats:
    """Write one file that turns the checkpoint in base_dir into the one in new_dir, bit-exact.

    Per file of ``new_dir``: byte-identical to the base file of that path -> "same"; a
    safetensors file whose base counterpart lists the same tensor names, dtypes and shapes
    (both tiling their data buffer) -> patched tensor by tensor; anything else -> carried
    whole, zstd-compressed at ``level``. Base files the new version lacks are not written.
    ``patch_path`` is written through a temporary sibling and renamed, so it never holds a
    partial patch. A local manifest copy (:data:`~shardcast.format.manifest.LOCAL_MANIFEST_NAME`)
    in either directory is ignored, as the manifest itself ignores it.
    """
    base_files = dict(list_checkpoint_files(base_dir))
    new_files = list_checkpoint_files(new_dir)
    spool_path = patch_path.with_name(patch_path.name + ".body.tmp")
    tmp_path = patch_path.with_name(patch_path.name + ".tmp")
    base_entries: list[list[Any]] = []
    file_entries: list[dict[str, Any]] = []
    num_elements = num_changed = 0
    bound = 0.0
    try:
        with spool_path.open("wb") as spool:
            body = _Body(spool, level)
            for path, size in new_files:
                new_path = new_dir / path
                new_hash = hash_file("blake3", new_path)
                entry: dict[str, Any] = {"path": path, "size": size, "blake3": new_hash}
                new_layout = _read_layout(new_path, size)
                base_layout = None
                base_hash = ""
                if path in base_files:
                    base_hash = hash_file("blake3", base_dir / path)
                    base_layout = _read_layout(base_dir / path, base_files[path])
                if path in base_files and base_files[path] == size and base_hash == new_hash:
                    entry["kind"] = "same"
                    base_entries.append([path, size, base_hash])
                    if new_layout is not None:
                        num_elements += sum(t.count for t in new_layout[0].tensors)
                elif (
                    new_layout is not None
                    and base_layout is not None
                    and new_layout[0].signature() == base_layout[0].signature()
                ):
                    entry["kind"] = "tensors"
                    base_entries.append([path, base_files[path], base_hash])
                    (new_lay, new_header), (base_lay, base_header) = new_layout, base_layout
                    if new_header == base_header:
                        entry["header"] = None
                    else:
                        frame = body.compress(new_header)
                        entry["header"] = {"n": len(new_header), "b": [body.add(frame)]}
                        bound += len(frame)
                    base_by_name = {t.name: t for t in base_lay.tensors}
                    records: list[dict[str, Any]] = []
                    with (base_dir / path).open("rb") as base_file, new_path.open("rb") as new_file:
                        for tensor in new_lay.tensors:
                            old = _elements(base_file, base_by_name[tensor.name])
                            new = _elements(new_file, tensor)
                            record, changed, tensor_bound = _encode_tensor(body, old, new)
                            del old, new
                            records.append(record)
                            num_elements += tensor.count
                            num_changed += changed
                            bound += tensor_bound
                    entry["tensors"] = records
                else:
                    entry["kind"] = "whole"
                    entry["blob"], written = body.add_file(new_path)
                    bound += written
                file_entries.append(entry)
        header = {"encoding": ENCODING, "base": base_entries, "files": file_entries}
        raw = json.dumps(header, separators=(",", ":"), sort_keys=True).encode()
        if len(raw) > header_limit(base_dir):  # appliers refuse it: publish the version full instead
            raise ProtocolError(f"patch header of {len(raw)} bytes is over the {header_limit(base_dir)} limit")
        packed = _compressor(max(level, 3), checksum=True).compress(raw)
        with tmp_path.open("wb") as out, spool_path.open("rb") as spool:
            out.write(MAGIC + len(packed).to_bytes(8, "little") + len(raw).to_bytes(8, "little") + packed)
            shutil.copyfileobj(spool, out, _CHUNK)
        os.replace(tmp_path, patch_path)
    finally:
        spool_path.unlink(missing_ok=True)
        tmp_path.unlink(missing_ok=True)
    return PatchStats(
        full_bytes=sum(size for _, size in new_files),
        patch_bytes=patch_path.stat().st_size,
        num_elements=num_elements,
        num_changed=num_changed,
        entropy_bound_bytes=bound,
    )


# --- applying ----------------------------------------------------------------------------


def _bad(reason: str) -> IntegrityError:
    return IntegrityError(f"malformed patch: {reason}")


def _int(value: object, low: int, high: int, what: str) -> int:
    if type(value) is not int or not low <= value <= high:
        raise _bad(f"{what} is not an integer in [{low}, {high}]")
    return value


def _str(value: object, what: str) -> str:
    if not isinstance(value, str):
        raise _bad(f"{what} is not a string")
    return value


def _list(value: object, what: str) -> list[Any]:
    if not isinstance(value, list):
        raise _bad(f"{what} is not a list")
    return value


def _hex64(value: object, what: str) -> str:
    text = _str(value, what)
    if len(text) != 64 or any(c not in "0123456789abcdef" for c in text):
        raise _bad(f"{what} is not 64 hex digits")
    return text


class _Slice:
    """A read-only window of a file, as a zstd stream source."""

    def __init__(self, f: io.BufferedReader, start: int, length: int) -> None:
        self.f, self.position, self.left = f, start, length

    def read(self, size: int = -1) -> bytes:
        size = self.left if size < 0 else min(size, self.left)
        self.f.seek(self.position)
        data = self.f.read(size)
        self.position += len(data)
        self.left -= len(data)
        return data


class _Reader:
    """The patch's body: blobs checked against its bounds, decompressed to an exact size."""

    def __init__(self, f: io.BufferedReader, start: int, length: int) -> None:
        self.f, self.start, self.length = f, start, length
        self.decompressor = zstandard.ZstdDecompressor(format=zstandard.FORMAT_ZSTD1_MAGICLESS)

    def blob(self, ref: object, what: str) -> tuple[int, int]:
        """(absolute offset, length) of a blob reference, checked against the body."""
        pair = _list(ref, what)
        if len(pair) != 2:
            raise _bad(f"{what} is not an [offset, length] pair")
        offset = _int(pair[0], 0, self.length, f"{what} offset")
        length = _int(pair[1], 1, self.length - offset, f"{what} length")
        return self.start + offset, length

    def chunks(self, ref: object, size: int, what: str) -> Iterator[bytes]:
        """The blob decompressed, in pieces, exactly ``size`` bytes in all."""
        offset, length = self.blob(ref, what)
        produced = 0
        try:
            source = _Slice(self.f, offset, length)
            with self.decompressor.stream_reader(
                cast(IO[bytes], source), read_size=min(length, _CHUNK), closefd=False
            ) as reader:
                while produced < size:
                    piece = reader.read(min(_CHUNK, size - produced))
                    if not piece:
                        break
                    produced += len(piece)
                    yield piece
                if produced == size and reader.read(1):
                    raise _bad(f"{what} holds more than {size} bytes")
        except zstandard.ZstdError as exc:
            raise _bad(f"{what} does not decompress ({exc})") from None
        if produced != size:
            raise _bad(f"{what} holds {produced} bytes, expected {size}")

    def exact(self, ref: object, size: int, what: str) -> bytes:
        return b"".join(self.chunks(ref, size, what))

    def uints(self, refs: Sequence[object], count: int, width: int, what: str) -> UIntArray:
        """``count`` unsigned integers of ``width`` bytes from that many byte planes."""
        if len(refs) != width:
            raise _bad(f"{what} has {len(refs)} byte planes, expected {width}")
        grid = np.empty((count, width), dtype=np.uint8)
        for j, ref in enumerate(refs):
            grid[:, j] = np.frombuffer(self.exact(ref, count, f"{what} plane {j}"), dtype=np.uint8)
        values: UIntArray = grid.view(_UINTS[width]).reshape(count)
        return values


def _spec(value: object, keys: set[str], what: str) -> dict[str, Any]:
    if not isinstance(value, dict) or set(value) != keys:
        raise _bad(f"{what} does not have exactly the fields {sorted(keys)}")
    return value


def _blobs(spec: dict[str, Any], count: int, what: str) -> list[Any]:
    blobs = _list(spec["b"], f"{what} blobs")
    if len(blobs) != count:
        raise _bad(f"{what} has {len(blobs)} blobs, expected {count}")
    return blobs


def _decode_positions(reader: _Reader, value: object, k: int, n: int, what: str) -> npt.NDArray[np.int64]:
    """``k`` sorted distinct positions in [0, n) (k >= 1), every field checked."""
    kind = value.get("c") if isinstance(value, dict) else None
    if kind == "bm":
        spec = _spec(value, {"c", "b"}, what)
        (ref,) = _blobs(spec, 1, what)
        packed = np.frombuffer(reader.exact(ref, (n + 7) // 8, f"{what} bitmap"), dtype=np.uint8)
        marks = np.unpackbits(packed)
        if int(np.count_nonzero(marks)) != k or marks[n:].any():
            raise _bad(f"{what} bitmap does not mark {k} of {n} positions")
        return np.flatnonzero(marks[:n]).astype(np.int64)
    if kind != "rice":
        raise _bad(f"{what} has unknown positions coding {str(kind)[:20]!r}")
    spec = _spec(value, {"c", "l", "w", "b"}, what)
    bits = _int(spec["l"], 0, 62, f"{what} low bits")
    width = _int(spec["w"], 1, 8, f"{what} quotient width")
    if width not in _UINTS:
        raise _bad(f"{what} quotient width {width} is not 1, 2, 4 or 8")
    refs = _blobs(spec, (1 if bits else 0) + width, what)
    quotients = reader.uints(refs[1 if bits else 0 :], k, width, f"{what} quotients").astype(np.uint64)
    if int(quotients.max()) > n >> bits:
        raise _bad(f"{what} has a gap past its {n} elements")
    gaps = (quotients << np.uint64(bits)) + np.uint64(1)
    if bits:
        low = reader.exact(refs[0], (k * bits + 7) // 8, f"{what} low bits")
        gaps += _unpack_fields(low, k, bits)
    if int(gaps.max()) > n:
        raise _bad(f"{what} has a gap past its {n} elements")
    ends = np.cumsum(gaps, dtype=np.uint64)  # a wrap-around shows as a decrease
    if k > 1 and not bool((ends[1:] > ends[:-1]).all()):
        raise _bad(f"{what} positions overflow")
    if int(ends[-1]) > n:
        raise _bad(f"{what} has a position past its {n} elements")
    return ends.astype(np.int64) - 1


def _decode_values(reader: _Reader, value: object, old: UIntArray, what: str) -> UIntArray:
    """The new bits of the ``len(old)`` changed elements whose old bits are ``old``."""
    k, width = int(old.size), old.dtype.itemsize
    kind = value.get("c") if isinstance(value, dict) else None
    if kind == "d":
        spec = _spec(value, {"c", "b"}, what)
        result: UIntArray = old + _unzigzag(reader.uints(_blobs(spec, width, what), k, width, what))
        return result
    if kind == "v":
        spec = _spec(value, {"c", "b"}, what)
        return reader.uints(_blobs(spec, width, what), k, width, what)
    if kind != "s":
        raise _bad(f"{what} has unknown values coding {str(kind)[:20]!r}")
    spec = _spec(value, {"c", "e", "p", "b"}, what)
    others = _int(spec["e"], 0, k, f"{what} magnitude count")
    refs = _blobs(spec, 1 + (width if others else 0), what)
    signs = np.unpackbits(np.frombuffer(reader.exact(refs[0], (k + 7) // 8, f"{what} signs"), dtype=np.uint8))
    magnitudes = np.ones(k, dtype=_UINTS[width])
    if others:
        where = _decode_positions(reader, spec["p"], others, k, f"{what} magnitudes")
        magnitudes[where] = reader.uints(refs[1:], others, width, f"{what} magnitudes")
    elif spec["p"] is not None:
        raise _bad(f"{what} codes positions of no magnitudes")
    negative = signs[:k].astype(bool)
    magnitudes[negative] = ~magnitudes[negative] + np.array(1, dtype=magnitudes.dtype)
    result = old + magnitudes
    return result


def _patched_tensor(reader: _Reader, record: object, base: UIntArray, what: str) -> UIntArray:
    if not isinstance(record, dict):
        raise _bad(f"{what} record is not an object")
    n = int(base.size)
    k = _int(record.get("k"), 0, n, f"{what} changed count")
    if k == 0:
        _spec(record, {"k"}, what)
        return base
    spec = _spec(record, {"k", "p", "v"}, what)
    positions = _decode_positions(reader, spec["p"], k, n, f"{what} positions")
    base[positions] = _decode_values(reader, spec["v"], base[positions], f"{what} values")
    return base


@dataclass(frozen=True)
class _Output:
    path: str
    size: int
    blake3: str
    kind: str
    spec: dict[str, Any]


def header_limit(base_dir: Path) -> int:
    """The most bytes a patch's JSON header may decompress to against the checkpoint in ``base_dir``.

    Sized from the base (local and trusted): :data:`HEADER_ALLOWANCE_BYTES` plus
    :data:`HEADER_BYTES_PER_BASE_HEADER_BYTE` per byte of its safetensors headers (a header's size
    follows the number of tensors it describes), never over :data:`MAX_HEADER_BYTES`. Only each
    safetensors file's 8-byte length prefix is read.
    """
    total = 0
    for path in base_dir.rglob("*.safetensors") if base_dir.is_dir() else ():
        if path.is_file() and not path.is_symlink():
            with path.open("rb") as f:
                total += min(int.from_bytes(f.read(8), "little"), MAX_SAFETENSORS_HEADER_BYTES)
    return min(MAX_HEADER_BYTES, HEADER_ALLOWANCE_BYTES + HEADER_BYTES_PER_BASE_HEADER_BYTE * total)


def _read_header(f: io.BufferedReader, file_size: int, max_header_bytes: int) -> tuple[dict[str, Any], _Reader]:
    preamble = f.read(_PREAMBLE)
    if len(preamble) < _PREAMBLE or preamble[: len(MAGIC)] != MAGIC:
        raise _bad("not a value patch (bad magic or too short)")
    packed_len = int.from_bytes(preamble[8:16], "little")
    raw_len = int.from_bytes(preamble[16:24], "little")
    if packed_len > file_size - _PREAMBLE or packed_len == 0:
        raise _bad("header length is past the end of the file")
    if raw_len > max_header_bytes:  # before a byte is decompressed: a small frame can inflate to gigabytes
        raise _bad(f"header of {raw_len} bytes is over the {max_header_bytes}-byte limit its base allows")
    raw = _Reader(f, _PREAMBLE, packed_len).exact([0, packed_len], raw_len, "header")
    try:
        header = json.loads(raw)
    except (UnicodeDecodeError, ValueError, RecursionError):
        raise _bad("header is not JSON") from None
    if not isinstance(header, dict) or set(header) != {"encoding", "base", "files"}:
        raise _bad("header does not have exactly encoding, base and files")
    if header["encoding"] != ENCODING:
        raise _bad(f"encoding {str(header['encoding'])[:40]!r} is not {ENCODING}")
    body_start = _PREAMBLE + packed_len
    return header, _Reader(f, body_start, file_size - body_start)


def _plain_path(value: object, what: str) -> str:
    path = _str(value, what)
    try:
        check_relative_path(path)
    except ProtocolError as exc:
        raise _bad(exc.message) from None
    return path


def _outputs(header: dict[str, Any], base_sizes: dict[str, int], max_output_bytes: int) -> list[_Output]:
    outputs: list[_Output] = []
    total = 0
    for i, spec in enumerate(_list(header["files"], "files")):
        if not isinstance(spec, dict):
            raise _bad(f"file {i} is not an object")
        path = _plain_path(spec.get("path"), f"file {i} path")
        size = _int(spec.get("size"), 0, max_output_bytes, f"size of {path}")
        digest = _hex64(spec.get("blake3"), f"blake3 of {path}")
        kind = spec.get("kind")
        expected = {"same": set(), "whole": {"blob"}, "tensors": {"header", "tensors"}}.get(str(kind))
        if expected is None or set(spec) != {"path", "size", "blake3", "kind"} | expected:
            raise _bad(f"{path} has unknown kind {kind!r} or fields")
        if kind in ("same", "tensors") and path not in base_sizes:
            raise _bad(f"{path} reads a base file the patch does not hash")
        if kind == "same" and size != base_sizes[path]:
            raise _bad(f"{path} is the same as a base file of another size")
        total += size
        if total > max_output_bytes:
            raise IntegrityError(f"patch would write more than max_output_bytes={max_output_bytes}")
        outputs.append(_Output(path, size, digest, str(kind), spec))
    paths = [o.path for o in outputs]
    parents = {"/".join(p.split("/")[:j]) for p in paths for j in range(1, p.count("/") + 1)}
    if len(set(paths)) != len(paths) or parents & set(paths):
        raise _bad("output paths repeat or one is another's folder")
    if not outputs:
        raise _bad("patch writes no files")
    return outputs


def _check_base(header: dict[str, Any], base_dir: Path) -> dict[str, int]:
    """Sizes of the base files the patch reads, after checking each one's size and blake3."""
    listed: dict[str, tuple[int, str]] = {}
    for i, item in enumerate(_list(header["base"], "base")):
        fields = _list(item, f"base file {i}")
        if len(fields) != 3:
            raise _bad(f"base file {i} is not [path, size, blake3]")
        path = _plain_path(fields[0], f"base file {i} path")
        listed[path] = (_int(fields[1], 0, 1 << 62, f"base size of {path}"), _hex64(fields[2], f"base hash of {path}"))
    try:
        present = dict(list_checkpoint_files(base_dir)) if listed else {}
    except ProtocolError as exc:
        raise IntegrityError(f"patch is for another base: {exc.message}") from None
    for path, (size, digest) in listed.items():
        if present.get(path) != size or hash_file("blake3", base_dir / path) != digest:
            raise IntegrityError(f"patch is for another base: {path} differs")
    return {path: size for path, (size, _) in listed.items()}


class _HashingWriter:
    def __init__(self, out: BinaryIO) -> None:
        self.out = out
        self.hasher = blake3.blake3()
        self.written = 0

    def write(self, data: bytes | memoryview) -> None:
        self.out.write(data)
        self.hasher.update(data)
        self.written += len(data)


def _write_tensors(output: _Output, base_path: Path, reader: _Reader, writer: _HashingWriter) -> None:
    base_layout = _read_layout(base_path, base_path.stat().st_size)
    if base_layout is None:
        raise _bad(f"{output.path} patches a base file that is not a safetensors file we patch")
    base_lay, base_header = base_layout
    if output.spec["header"] is None:
        new_header = base_header
    else:
        what = f"{output.path} header"
        spec = _spec(output.spec["header"], {"n", "b"}, what)
        # An 8-byte length and the JSON it announces: the same tensors as the base's, so about its size
        limit = 2 * len(base_header) + SAFETENSORS_HEADER_GROWTH_BYTES
        size = _int(spec["n"], 8, min(output.size, MAX_SAFETENSORS_HEADER_BYTES + 8, limit), f"{what} size")
        new_header = reader.exact(_blobs(spec, 1, what)[0], size, what)
    new_lay = _parse_layout(new_header, output.size)
    if new_lay is None or new_lay.header_size != len(new_header):
        raise _bad(f"{output.path} header is not a safetensors header of its size")
    if new_lay.signature() != base_lay.signature():
        raise _bad(f"{output.path} tensors differ from the base file's")
    records = _list(output.spec["tensors"], f"{output.path} tensors")
    if len(records) != len(new_lay.tensors):
        raise _bad(f"{output.path} has {len(records)} tensor records for {len(new_lay.tensors)} tensors")
    base_by_name = {t.name: t for t in base_lay.tensors}
    writer.write(new_header)
    with base_path.open("rb") as base_file:
        for tensor, record in zip(new_lay.tensors, records, strict=True):
            base = _elements(base_file, base_by_name[tensor.name])
            patched = _patched_tensor(reader, record, base, f"{output.path}:{tensor.name}")
            writer.write(patched.data.cast("B"))
            del base, patched


def apply_patch(base_dir: Path, patch_path: Path, out_dir: Path, max_output_bytes: int) -> None:
    """Reconstruct new_dir's files into out_dir (created; must not exist or be empty). Raises IntegrityError
    when the patch is malformed, is for another base, or would write more than max_output_bytes.

    The patch is untrusted: its header's declared size is bounded by what the base can need
    (:func:`header_limit`) before it is decompressed, then it is read and checked in full (encoding, paths, sizes
    against ``max_output_bytes``, the blake3 of every base file it reads) before a byte is
    written; every decompression is bounded by the size the checked header implies; every
    output is hashed as it is written and compared with the blake3 the patch names. On any
    error the files written so far are removed (and ``out_dir`` too when this call made it),
    so a caller that writes into a staging directory and renames it into place once this
    returns never shows a partial version. An ``out_dir`` that holds files is refused with
    :class:`~protocol.errors.LocalFaultError`, as are failures of this machine's disk.
    """
    created = not out_dir.exists()
    if not created and (not out_dir.is_dir() or any(out_dir.iterdir())):
        raise LocalFaultError(f"{out_dir} is not an empty directory; apply_patch writes only into one")
    try:
        with patch_path.open("rb") as patch:
            header, reader = _read_header(patch, os.fstat(patch.fileno()).st_size, header_limit(base_dir))
            base_sizes = _check_base(header, base_dir)
            outputs = _outputs(header, base_sizes, max_output_bytes)
            out_dir.mkdir(parents=True, exist_ok=True)
            for output in outputs:
                target = out_dir / output.path
                target.parent.mkdir(parents=True, exist_ok=True)
                with target.open("xb") as out:
                    writer = _HashingWriter(out)
                    if output.kind == "same":
                        with (base_dir / output.path).open("rb") as src:
                            while piece := src.read(_CHUNK):
                                writer.write(piece)
                    elif output.kind == "whole":
                        for piece in reader.chunks(output.spec["blob"], output.size, output.path):
                            writer.write(piece)
                    else:
                        _write_tensors(output, base_dir / output.path, reader, writer)
                if writer.written != output.size or writer.hasher.hexdigest() != output.blake3:
                    raise IntegrityError(f"patched {output.path} does not match the blake3 the patch names")
    except BaseException as exc:
        _remove_outputs(out_dir, created)
        if isinstance(exc, OSError):
            raise LocalFaultError.from_os_error(exc, f"applying patch {patch_path}") from exc
        raise


def _remove_outputs(out_dir: Path, created: bool) -> None:
    if created:
        shutil.rmtree(out_dir, ignore_errors=True)
        return
    for child in out_dir.iterdir() if out_dir.is_dir() else ():
        if child.is_dir() and not child.is_symlink():
            shutil.rmtree(child, ignore_errors=True)
        else:
            child.unlink(missing_ok=True)
