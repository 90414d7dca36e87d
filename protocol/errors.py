"""Every error prime-network raises on purpose, in one hierarchy.

Each error says what happened and, where a user can act, what to do. Errors that cross
the HTTP boundary carry the status code and a short machine-readable ``code`` the ledger
answers with, so a client can map a response back to the same class.

    PrimeError
    ├── ConfigError                 a config file, env var or flag is invalid (names key and file)
    ├── IdentityError               a node key cannot be created, read or trusted
    │   └── KeyPermissionError      the key file is readable by others (must be 0600)
    ├── SignatureError         401  a signed request or document does not verify
    │   ├── MissingSignatureError   the signature headers are absent or malformed
    │   ├── BadSignatureError       the signature does not match the content
    │   ├── StaleTimestampError     the timestamp is outside the clock-skew window
    │   └── ReplayedNonceError      the nonce was already used by this node
    ├── ProtocolError          400  a message is malformed or has the wrong version
    ├── RequestRefused              the ledger understood the request and refused it
    │   ├── ForbiddenError     403  the node may not do this (not approved, banned)
    │   ├── NotFoundError      404  the task, lease or version does not exist
    │   ├── ConflictError      409  the request contradicts the ledger's state
    │   │   └── StalePolicyError    the policy version is older than current - async_level
    │   ├── RunEndedError      410  the run has trained its last step: nothing more to lease or audit
    │   ├── PayloadTooLargeError 413 the request body is over the configured limit
    │   └── RateLimitedError   429  too many requests; retry after the given delay
    ├── IntegrityError              downloaded bytes or a manifest fail verification
    │   ├── VersionRefusedError     a signed version cannot be rebuilt (its own patch is bad): refused for good
    │   └── OtherRunError           a well-signed manifest of another run than the node's (not the relay's fault)
    ├── ProofError                  a TOPLOC proof cannot be built or parsed
    ├── ChildExitedError            a process the coordinator runs (trainer, local network) exited
    ├── RunPausedError              the run paused by a rule (refused updates, a rollback set to pause); start again
    ├── StartupError                a role cannot start: a database, port, model, package or peer it
    │                               needs is missing or wrong (carries the fix)
    ├── LocalFaultError             this machine's disk failed us (no space, permissions, read-only)
    └── RemoteUnavailableError 503  a coordinator or relay could not be reached
        └── NotReadyError      503  a relay holds the version but is still mirroring that shard
"""

from __future__ import annotations

import errno


class PrimeError(Exception):
    """Base of every deliberate prime-network error."""

    status_code: int = 500
    code: str = "internal"

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class ConfigError(PrimeError):
    """A config file, environment variable or flag is invalid."""

    code = "config"


class IdentityError(PrimeError):
    """A node key cannot be created, read or trusted."""

    code = "identity"


class KeyPermissionError(IdentityError):
    """A node key file is readable or writable by users other than its owner."""

    code = "key_permissions"


class SignatureError(PrimeError):
    """A signed request or signed document does not verify."""

    status_code = 401
    code = "signature"


class MissingSignatureError(SignatureError):
    code = "unsigned"


class BadSignatureError(SignatureError):
    code = "bad_signature"


class StaleTimestampError(SignatureError):
    code = "stale_timestamp"


class ReplayedNonceError(SignatureError):
    code = "replayed_nonce"


class ProtocolError(PrimeError):
    """A message is malformed, has unknown fields, or speaks an unsupported version."""

    status_code = 400
    code = "malformed"


class RequestRefused(PrimeError):  # noqa: N818 - a refusal, not a failure of ours
    """The ledger understood a request and refused it."""

    status_code = 400
    code = "refused"


class ForbiddenError(RequestRefused):
    status_code = 403
    code = "forbidden"


class NotFoundError(RequestRefused):
    status_code = 404
    code = "not_found"


class ConflictError(RequestRefused):
    status_code = 409
    code = "conflict"


class StalePolicyError(ConflictError):
    code = "stale_policy"


class RunEndedError(RequestRefused):
    """The run has trained and published its last step: a worker or validator has nothing left to do."""

    status_code = 410
    code = "run_ended"


class PayloadTooLargeError(RequestRefused):
    status_code = 413
    code = "payload_too_large"


class RateLimitedError(RequestRefused):
    status_code = 429
    code = "rate_limited"

    def __init__(self, message: str, retry_after_s: float = 1.0) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s


class IntegrityError(PrimeError):
    """Downloaded bytes or a manifest do not match what the coordinator signed."""

    code = "integrity"


class VersionRefusedError(IntegrityError):
    """A policy version the coordinator signed cannot be used: its patch, every shard verified, does not rebuild the
    checkpoint its manifest names from an intact base. Signed versions never change, so asking again cannot help."""

    code = "version_refused"


class OtherRunError(IntegrityError):
    """A manifest signed by the trusted coordinator, but for another run than the one the node takes part in (or
    naming none): the coordinator's key signs for more than one run. The relay serving it is not lying."""

    code = "other_run"


class ProofError(PrimeError):
    """A TOPLOC proof cannot be built or parsed (never silently replaced by a null proof)."""

    code = "proof"


class RemoteUnavailableError(PrimeError):
    """A coordinator or relay could not be reached or answered with a server error."""

    status_code = 503
    code = "unavailable"


class NotReadyError(RemoteUnavailableError):
    """A relay knows the version but has not verified the asked-for shard yet; ask again shortly."""

    code = "not_ready"

    def __init__(self, message: str, retry_after_s: float = 1.0) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s


def _all_subclasses(cls: type[PrimeError]) -> list[type[PrimeError]]:
    found: list[type[PrimeError]] = []
    for sub in cls.__subclasses__():
        found.append(sub)
        found.extend(_all_subclasses(sub))
    return found


def error_for_code(code: str) -> type[PrimeError]:
    """The error class whose ``code`` is ``code`` (PrimeError when unknown); used by clients."""
    for cls in _all_subclasses(PrimeError):
        if cls.code == code:
            return cls
    return PrimeError


class ChildExitedError(PrimeError):
    """A process the coordinator started and needs (the trainer service, a local-network node) exited."""

    code = "child_exited"


class RunPausedError(PrimeError):
    """The run paused by one of its rules (updates refused in a row, a rollback set to pause): the coordinator stops
    with its state kept, and started again it goes on. The message says why and what the operator can do."""

    code = "run_paused"


class StartupError(PrimeError):
    """A role cannot start: something it needs (a database, a port, a model, a package, a peer) is missing or wrong.

    It carries the problem and the fix apart; its message is both on one line, as the command prints it.
    """

    code = "startup"

    def __init__(self, problem: str, fix: str) -> None:
        super().__init__(f"{problem}; {fix}")
        self.problem = problem
        self.fix = fix


_LOCAL_FAULT_ADVICE = {
    errno.ENOSPC: "free space on that disk (or point the directory elsewhere), then run again",
    errno.EDQUOT: "raise the disk quota or free space (or point the directory elsewhere), then run again",
    errno.EACCES: "give this user write access to it (or point the directory elsewhere), then run again",
    errno.EPERM: "give this user write access to it (or point the directory elsewhere), then run again",
    errno.EROFS: "the disk is mounted read-only: remount it read-write or point the directory elsewhere",
    errno.EIO: "the disk reported an I/O error: check it (dmesg, SMART) or point the directory elsewhere",
}


class LocalFaultError(PrimeError):
    """A file operation on this machine failed (no space, permissions, read-only disk): not a remote's fault.

    Retrying against another relay cannot help, so downloads stop at once with this error
    instead of treating it as a network failure.
    """

    code = "local_fault"

    def __init__(self, message: str, errno_code: int | None = None) -> None:
        super().__init__(message)
        self.errno_code = errno_code

    @classmethod
    def from_os_error(cls, exc: OSError, doing: str) -> LocalFaultError:
        """``doing`` says what failed, e.g. "writing /data/v3/model.safetensors"."""
        reason = exc.strerror or type(exc).__name__
        advice = _LOCAL_FAULT_ADVICE.get(exc.errno or 0, "fix the local disk or directory, then run again")
        return cls(f"local disk fault while {doing}: {reason}; {advice}", exc.errno)
