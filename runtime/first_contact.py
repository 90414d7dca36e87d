"""A node's first contact with the coordinator and relays it was given: a wrong URL fails at once, in one line.

Before a worker or validator registers, :func:`check_coordinator` asks the coordinator URL for
its run status (GET /v1/status). A URL that answers, but not as a prime-network coordinator
(a relay, another web service, a wrong path), is a :class:`~protocol.errors.StartupError` at
once; one that does not answer is retried until ``timeout_s`` (the coordinator may still be
starting) and then is one. :func:`check_relay` asks each relay URL for its version list (GET
/versions): one that answers as something else is an error; one that does not answer is only
logged, since relays come and go and downloads fail over between them.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import ssl
import time
from collections.abc import Sequence

import httpx
import pydantic

from protocol import routes
from protocol.errors import StartupError
from protocol.schemas import RunStatus, VersionsResponse

log = logging.getLogger(__name__)
COORDINATOR_FIX = (
    "check --coordinator (coordinator_url): it is the URL `prime-coordinator start` logs as 'ledger API listening on', "
    "e.g. http://HOST:8000"
)
RELAY_FIX = (
    "check --relay (relays): a relay URL is what `prime-relay serve` listens on, e.g. http://HOST:8100, "
    "or a coordinator's origin, http://HOST:8000/shardcast"
)


PLAIN_HTTP_SIGNS = ("WRONG_VERSION_NUMBER", "RECORD_LAYER_FAILURE", "PACKET_LENGTH_TOO_LONG", "HTTP_REQUEST")
"""OpenSSL's reasons when the server's first bytes are an HTTP response instead of a TLS handshake."""


def _speaks_plain_http(exc: BaseException) -> bool:
    """Whether a failed TLS connection failed because the server answered in plain HTTP (a retry cannot help)."""
    seen: BaseException | None = exc
    while seen is not None:
        if isinstance(seen, ssl.SSLError) and any(sign in str(seen).upper() for sign in PLAIN_HTTP_SIGNS):
            return True
        seen = seen.__cause__ or seen.__context__
    return any(sign in str(exc).upper() for sign in PLAIN_HTTP_SIGNS)


def _what_answered(response: httpx.Response) -> str:
    kind = response.headers.get("content-type", "no content type").split(";")[0]
    return f"it answered {response.status_code} ({kind})"


async def _pause(stop: asyncio.Event | None, seconds: float) -> None:
    if stop is None:
        await asyncio.sleep(seconds)
        return
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(stop.wait(), timeout=seconds)


async def check_coordinator(url: str, timeout_s: float, stop: asyncio.Event | None = None) -> RunStatus:
    """The coordinator's run status, or a StartupError naming what is wrong with ``url``."""
    if not url.startswith(("http://", "https://")):
        raise StartupError(f"coordinator URL {url!r} is not an http:// or https:// URL", COORDINATOR_FIX)
    deadline = time.monotonic() + timeout_s
    delay = 0.5
    async with httpx.AsyncClient(base_url=url, timeout=10.0) as http:
        while True:
            try:
                response = await http.get(routes.STATUS)
            except httpx.TransportError as exc:
                if url.startswith("https://") and _speaks_plain_http(exc):
                    plain = "http://" + url.removeprefix("https://")
                    raise StartupError(
                        f"the coordinator at {url} answers plain HTTP, not HTTPS (TLS handshake: {exc})",
                        f"use {plain}, or put a TLS proxy in front of the coordinator",
                    ) from exc
                if time.monotonic() >= deadline or (stop is not None and stop.is_set()):
                    raise StartupError(
                        f"cannot reach the coordinator at {url} ({type(exc).__name__}: {exc or 'no answer'}) "
                        f"after {timeout_s:.0f} s",
                        COORDINATOR_FIX + ", and that it is running and reachable from this machine",
                    ) from exc
                log.info("coordinator at %s not reachable yet (%s); retrying", url, type(exc).__name__)
                await _pause(stop, delay)
                delay = min(delay * 2, 5.0)
                continue
            if response.status_code >= 500:
                if time.monotonic() >= deadline:
                    raise StartupError(f"the coordinator at {url} fails: {_what_answered(response)}", COORDINATOR_FIX)
                await _pause(stop, delay)
                continue
            try:
                if response.status_code != 200:
                    raise ValueError(_what_answered(response))
                return RunStatus.model_validate_json(response.content)
            except ValueError as exc:  # pydantic's ValidationError is one too
                detail = str(exc) if not isinstance(exc, pydantic.ValidationError) else "its answer is not a run status"
                raise StartupError(
                    f"{url} is not a prime-network coordinator (GET {routes.STATUS}: {detail})", COORDINATOR_FIX
                ) from None


RELAY_CHECK_TIMEOUT_S = 5.0
"""A relay's whole answer to the first-contact check must arrive within this: a slow relay is only logged."""


async def check_relays(urls: Sequence[str], timeout_s: float = RELAY_CHECK_TIMEOUT_S) -> list[bool]:
    """:func:`check_relay` for every URL at once, so one slow relay delays a start by ``timeout_s`` at most."""
    return list(await asyncio.gather(*(check_relay(url, timeout_s) for url in urls)))


async def check_relay(url: str, timeout_s: float = RELAY_CHECK_TIMEOUT_S) -> bool:
    """Whether ``url`` answers as a SHARDCAST relay or origin; a StartupError if it answers as something else.

    The check is bounded as a whole (``timeout_s``), not per read: a relay that trickles its answer
    is logged as slow and left to the downloads' own progress deadlines, never waited for.
    """
    try:
        async with asyncio.timeout(timeout_s), httpx.AsyncClient(timeout=timeout_s) as http:
            response = await http.get(f"{url.rstrip('/')}/versions")
    except TimeoutError:
        log.warning("relay %s did not answer within %.0f s; downloads use the other sources", url, timeout_s)
        return False
    except httpx.TransportError as exc:
        log.warning("relay %s is not reachable now (%s); downloads use the other sources", url, type(exc).__name__)
        return False
    if response.status_code >= 500:
        log.warning("relay %s fails now (%d); downloads use the other sources", url, response.status_code)
        return False
    try:
        if response.status_code != 200:
            raise ValueError(_what_answered(response))
        VersionsResponse.model_validate_json(response.content)
    except ValueError as exc:  # pydantic's ValidationError is one too
        detail = str(exc) if not isinstance(exc, pydantic.ValidationError) else "its answer is not a version list"
        raise StartupError(f"{url} is not a SHARDCAST relay (GET /versions: {detail})", RELAY_FIX) from None
    return True
