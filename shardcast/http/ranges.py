"""HTTP ``Range`` headers (RFC 9110 §14): one byte range per request, parsed without I/O.

Supported forms: ``bytes=a-b``, ``bytes=a-`` and ``bytes=-n`` (the last n bytes). A header that
does not parse, or asks for several ranges, is a :class:`MalformedRange` (the server answers
400 and says why); a well-formed range that lies wholly past the end is an
:class:`UnsatisfiableRange` (416 with ``Content-Range: bytes */size``). An end past the last
byte is clamped, as the RFC asks.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

_RANGE = re.compile(r"^\s*bytes\s*=\s*(\d*)\s*-\s*(\d*)\s*$", re.IGNORECASE)
_MAX_HEADER_CHARS = 200


class RangeError(ValueError):
    """A Range header the server refuses; ``str()`` is the reason sent to the client."""


class MalformedRange(RangeError):  # noqa: N818 - names the kind of bad header, as HTTP does
    pass


class UnsatisfiableRange(RangeError):  # noqa: N818
    pass


@dataclass(frozen=True)
class ByteRange:
    start: int
    end: int
    """Inclusive, as in the header."""

    @property
    def length(self) -> int:
        return self.end - self.start + 1

    def content_range(self, size: int) -> str:
        return f"bytes {self.start}-{self.end}/{size}"


def parse_range(header: str, size: int) -> ByteRange:
    """The single byte range ``header`` asks for within a body of ``size`` bytes."""
    if len(header) > _MAX_HEADER_CHARS:
        raise MalformedRange("Range header is too long")
    if "," in header:
        raise MalformedRange("only one byte range per request is supported")
    match = _RANGE.match(header)
    if not match:
        raise MalformedRange(f"Range header {header!r} is not of the form bytes=START-END, bytes=START- or bytes=-N")
    first, last = match.groups()
    if not first and not last:
        raise MalformedRange("Range header gives neither a start nor an end")
    if not first:
        suffix = int(last)
        if suffix == 0 or size == 0:
            raise UnsatisfiableRange(f"suffix range of {suffix} bytes on a {size}-byte body is empty")
        return ByteRange(max(0, size - suffix), size - 1)
    start = int(first)
    end = int(last) if last else size - 1
    if last and end < start:
        raise MalformedRange(f"range end {end} is before its start {start}")
    if start >= size:
        raise UnsatisfiableRange(f"range starts at byte {start} but the body has {size} bytes")
    return ByteRange(start, min(end, size - 1))
