"""What `prime-validator run` has done so far, for people (a rich live line) and machines (JSON log lines).

:class:`ValidatorState` counts submissions and samples audited, accepted and rejected, and the
rejection reasons by kind (the text before the first colon of a reason with its rollout label
removed: ``toploc``, ``sampling``, ``signature`` ...). Rates are per second of auditing time,
so they say what one validator can sustain rather than how busy the network was.
:func:`show_status` redraws the line every second while the validator runs.
"""

from __future__ import annotations

import asyncio
import collections
import time
from dataclasses import dataclass, field
from typing import Any

from rich.console import Console
from rich.table import Table

from node.live import format_uptime, show_live
from protocol.schemas import Verdict


def reason_kind(reason: str) -> str:
    """'rollout p0/s1: toploc: 40 exponent mismatches' -> 'toploc'; 'signature: bad' -> 'signature'."""
    head, _, rest = reason.partition(": ")
    if head.startswith("rollout p") and rest:
        head = rest.partition(": ")[0]
    return head.split(":")[0][:48]


@dataclass
class ValidatorState:
    num_accepted: int = 0
    num_rejected: int = 0
    num_samples: int = 0
    """Samples of the submissions judged (rewards recomputed for all)."""
    num_samples_verified: int = 0
    """Samples recomputed by prefill (the ledger's audited ones)."""
    audit_s: float = 0.0
    audit_cpu_s: float = 0.0
    """The validator process's CPU seconds while auditing (all its threads): its work, whatever else shares the
    machine's cores."""
    started_at: float = field(default_factory=time.monotonic)
    policy_version: int | None = None
    reasons: collections.Counter[str] = field(default_factory=collections.Counter)
    num_environment_errors: int = 0
    """Submissions the run's environment could not score (an ``environment_error`` verdict, not a rejection)."""
    num_unfetchable: int = 0
    """Submissions skipped because their policy version could not be fetched (left to the ledger to close)."""

    @property
    def num_submissions(self) -> int:
        return self.num_accepted + self.num_rejected

    @property
    def samples_per_s(self) -> float:
        return self.num_samples_verified / self.audit_s if self.audit_s else 0.0

    @property
    def submissions_per_s(self) -> float:
        return self.num_submissions / self.audit_s if self.audit_s else 0.0

    def record(self, verdict: Verdict, num_samples: int, num_verified: int) -> None:
        self.num_samples += num_samples
        self.num_samples_verified += num_verified
        if verdict.environment_error is not None:
            self.num_environment_errors += 1
        elif verdict.accepted:
            self.num_accepted += 1
        else:
            self.num_rejected += 1
            self.reasons.update(set(reason_kind(reason) for reason in verdict.reasons))

    def top_reasons(self, count: int = 3) -> str:
        return ", ".join(f"{reason} x{n}" for reason, n in self.reasons.most_common(count))

    def figures(self) -> dict[str, Any]:
        """The numbers of the summary, for JSON log lines."""
        return {
            "samples_per_s": round(self.samples_per_s, 2),
            "submissions_per_s": round(self.submissions_per_s, 3),
            "num_accepted": self.num_accepted,
            "num_rejected": self.num_rejected,
            "num_samples_verified": self.num_samples_verified,
            "audit_s": round(self.audit_s, 3),
            "audit_cpu_s": round(self.audit_cpu_s, 3),
            "top_reasons": dict(self.reasons.most_common(3)),
            "num_environment_errors": self.num_environment_errors,
            "num_unfetchable": self.num_unfetchable,
        }

    def summary(self) -> str:
        common = self.top_reasons()
        return (
            f"{self.num_accepted} accepted, {self.num_rejected} rejected, {self.samples_per_s:.1f} samples/s and "
            f"{self.submissions_per_s:.2f} submissions/s verified"
            + (f", {self.num_environment_errors} environment errors" if self.num_environment_errors else "")
            + (f", {self.num_unfetchable} skipped (version gone)" if self.num_unfetchable else "")
            + (f"; top reasons: {common}" if common else "")
        )


def render(state: ValidatorState) -> Table:
    table = Table(show_header=True, header_style="bold", box=None)
    for column in ("policy", "accepted", "rejected", "samples/s", "subs/s", "verified", "top reasons", "uptime"):
        table.add_column(column)
    table.add_row(
        f"v{state.policy_version}" if state.policy_version is not None else "-",
        str(state.num_accepted),
        str(state.num_rejected),
        f"{state.samples_per_s:.1f}",
        f"{state.submissions_per_s:.2f}",
        f"{state.num_samples_verified}/{state.num_samples}",
        state.top_reasons() or "-",
        format_uptime(state.started_at),
    )
    return table


async def show_status(state: ValidatorState, stop: asyncio.Event, console: Console | None = None) -> None:
    """Redraw the status line every second until ``stop`` is set."""
    await show_live(lambda: render(state), stop, console)
