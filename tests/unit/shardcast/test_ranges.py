"""Range header parsing: the forms curl and browsers send, and the refusals."""

from __future__ import annotations

import pytest

from shardcast.http.ranges import ByteRange, MalformedRange, UnsatisfiableRange, parse_range


@pytest.mark.parametrize(
    ("header", "expected"),
    [
        ("bytes=0-9", ByteRange(0, 9)),
        ("bytes=10-", ByteRange(10, 99)),
        ("bytes=-10", ByteRange(90, 99)),
        ("bytes=-1000", ByteRange(0, 99)),
        ("bytes=95-1000", ByteRange(95, 99)),
        ("BYTES = 5 - 5", ByteRange(5, 5)),
    ],
)
def test_valid_ranges(header: str, expected: ByteRange) -> None:
    assert parse_range(header, 100) == expected


def test_length_and_content_range() -> None:
    byte_range = parse_range("bytes=10-19", 100)
    assert byte_range.length == 10
    assert byte_range.content_range(100) == "bytes 10-19/100"


@pytest.mark.parametrize("header", ["bytes=a-b", "items=0-1", "bytes=5-2", "bytes=-", "bytes=0-1,5-6", "x" * 300])
def test_malformed(header: str) -> None:
    with pytest.raises(MalformedRange):
        parse_range(header, 100)


@pytest.mark.parametrize(("header", "size"), [("bytes=100-", 100), ("bytes=-0", 100), ("bytes=0-", 0)])
def test_unsatisfiable(header: str, size: int) -> None:
    with pytest.raises(UnsatisfiableRange):
        parse_range(header, size)


def test_slice_segments_maps_a_range_onto_file_pieces() -> None:
    from pathlib import Path

    from shardcast.http.server import Segment, slice_segments

    a, b = Path("a"), Path("b")
    segments = [Segment(a, 100, 10), Segment(b, 0, 20)]
    assert slice_segments(segments, 0, 30) == segments
    assert slice_segments(segments, 5, 10) == [Segment(a, 105, 5), Segment(b, 0, 5)]
    assert slice_segments(segments, 12, 3) == [Segment(b, 2, 3)]
    assert slice_segments(segments, 29, 1) == [Segment(b, 19, 1)]
