"""A worker's heartbeat always fits the wire schema: an absurd measured rate is capped, never a crash."""

from __future__ import annotations

import asyncio

from protocol.schemas import MAX_TOKENS_PER_S, HeartbeatRequest, HeartbeatResponse
from worker.loop import WorkerState, heartbeat_forever


class OneHeartbeat:
    def __init__(self, stop: asyncio.Event) -> None:
        self.stop = stop
        self.sent: list[HeartbeatRequest] = []

    async def heartbeat(self, request: HeartbeatRequest) -> HeartbeatResponse:
        self.sent.append(request)
        self.stop.set()
        return HeartbeatResponse(current_policy_version=0, heartbeat_interval_s=10.0)


class Held:
    def held_versions(self) -> list[int]:
        return [0]


def test_an_absurd_rate_is_capped_to_the_schemas_bound() -> None:
    state = WorkerState(num_tokens=10**12, generation_s=1e-6)  # a clock hiccup: 10^18 tokens/s
    assert state.tokens_per_s > MAX_TOKENS_PER_S

    async def beat() -> list[HeartbeatRequest]:
        stop = asyncio.Event()
        ledger = OneHeartbeat(stop)
        await asyncio.wait_for(heartbeat_forever(ledger, Held(), state, "hf", stop), timeout=30)  # type: ignore[arg-type]
        return ledger.sent

    (sent,) = asyncio.run(beat())
    assert sent.tokens_per_s == MAX_TOKENS_PER_S
