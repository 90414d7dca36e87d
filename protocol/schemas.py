"""Versioned wire schemas shared by every role: the one home of what crosses the network.

Every message carries ``v`` (the wire version, now 1) and forbids unknown fields, so a peer
speaking another version or sending junk gets a clear 4xx instead of a silent misread. Bounds
on sizes and counts live here too: they are part of the contract and the first line of
defence against hostile clients. No message can hold NaN or an infinity (``allow_inf_nan`` is
off for every float), and every number a node reports has a range (logprobs, rewards, rates,
byte counts, versions, indices), so each role refuses the same junk before using or storing
it. Binary fields (proofs) travel as base64 strings.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    JsonValue,
    SerializerFunctionWrapHandler,
    model_serializer,
    model_validator,
)

WIRE_VERSION: Literal[1] = 1

NodeId = Annotated[str, Field(min_length=40, max_length=64, pattern=r"^[1-9A-HJ-NP-Za-km-z]+$")]
Sha256Hex = Annotated[str, Field(pattern=r"^[0-9a-f]{64}$")]
MAX_POLICY_VERSION = 2**31 - 1  # the ledger stores versions as 32-bit INTEGERs
MAX_PROMPTS_PER_TASK = 256
MAX_IMAGES_PER_PROMPT = 16
MAX_GROUP_SIZE = 64
MAX_TOKENS_PER_SAMPLE = 32768
MAX_EPISODE_TURNS = 256
"""Policy turns of one multi-turn episode: each gets a noise stream of its own (toploc.sampling.turn_stream)."""
MAX_BYTES = 2**60
"""Largest byte count or offset any message may carry (1 EiB): far above any model, below SQL's BIGINT."""
MAX_COUNT = 2**40
"""Largest index or count of things (examples, shards, tasks) a message may carry."""
MAX_ABS_LOGPROB = 1e4
"""Bound on a claimed log-probability's magnitude; a sampled token's is above -100 for any vocabulary."""
MAX_ABS_REWARD = 1e6
"""Bound on a recomputed reward's magnitude (the built-in tasks score in [0, 1])."""
MAX_TOKENS_PER_S = 1e9
"""Bound on a node's reported generation rate."""
MAX_UNIX_TIME = 2**40
"""Bound on a timestamp (about the year 36800): catches garbage, never a real clock."""
MAX_LONG_POLL_S = 20.0
"""Longest ``wait_s`` a long-poll (``POST /v1/leases``, ``GET /v1/submissions/pending``) may ask the ledger to hold
it: well inside the clients' 30 s request timeout."""
LONG_POLL_S = 10.0
"""The ``wait_s`` workers and validators ask for: a long-poll answered empty after it is asked again at once."""

PolicyVersion = Annotated[int, Field(ge=0, le=MAX_POLICY_VERSION)]
TokenId = Annotated[int, Field(ge=0, lt=2**31)]
ByteCount = Annotated[int, Field(ge=0, le=MAX_BYTES)]
Count = Annotated[int, Field(ge=0, le=MAX_COUNT)]
UnixTime = Annotated[float, Field(ge=0, le=MAX_UNIX_TIME)]
Logprob = Annotated[float, Field(ge=-MAX_ABS_LOGPROB, le=MAX_ABS_LOGPROB)]
"""Finite and bounded here; above 0 is refused by the ledger, which counts it against the worker."""
Reward = Annotated[float, Field(ge=-MAX_ABS_REWARD, le=MAX_ABS_REWARD)]
Role = Literal["worker", "validator"]
EngineName = Literal["vllm", "hf"]
Precision = Literal["float32", "bfloat16", "float16"]
"""The dtype a run computes in: the trainer's published weights, workers' engines and validators' prefill."""
MAX_NAMED_REWARDS = 16
RewardName = Annotated[str, Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_.\-]+$")]


class WireModel(BaseModel):
    """Base of every message: versioned, strict about unknown fields, immutable, no NaN or infinity."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    v: Literal[1] = WIRE_VERSION


class ErrorBody(WireModel):
    """What every refusal returns: a stable machine code and a sentence for people."""

    error: str = Field(description="Machine-readable code, e.g. 'stale_policy'.")
    detail: str = Field(description="What happened and what to do.")


class Hardware(WireModel):
    accelerator: str = Field(max_length=128, description="e.g. 'NVIDIA H100 80GB' or 'cpu'.")
    num_devices: int = Field(ge=0, le=1024)
    memory_bytes: ByteCount


class RegisterRequest(WireModel):
    role: Role
    hardware: Hardware
    engine: EngineName | None = None
    software_version: str = Field(max_length=64)
    p2p_addrs: list[Annotated[str, Field(max_length=256)]] = Field(default_factory=list, max_length=16)


class RegisterResponse(WireModel):
    node_id: NodeId
    role: Role
    approved: bool
    current_policy_version: PolicyVersion


class HeartbeatRequest(WireModel):
    policy_versions_held: list[PolicyVersion] = Field(max_length=64)
    engine: EngineName | None = None
    tokens_per_s: float = Field(ge=0, le=MAX_TOKENS_PER_S)
    hardware: Hardware | None = None


class SamplingParams(WireModel):
    temperature: float = Field(gt=0, le=10)
    top_k: int | None = Field(default=None, ge=1, lt=2**31)
    max_tokens: int = Field(ge=1, le=MAX_TOKENS_PER_SAMPLE)


class Prompt(WireModel):
    prompt_index: int = Field(ge=0, lt=MAX_PROMPTS_PER_TASK)
    token_ids: list[TokenId] = Field(min_length=1, max_length=MAX_TOKENS_PER_SAMPLE)
    text: str = Field(default="", max_length=65536, description="For people; token_ids are authoritative.")
    example_index: int | None = Field(
        default=None,
        ge=0,
        le=MAX_COUNT,
        description="The example's index in the task's generator: rewards are recomputed from it.",
    )
    image_sha256: list[Sha256Hex] = Field(
        default_factory=list,
        max_length=MAX_IMAGES_PER_PROMPT,
        description="The hashes of the example's images, in order: every party renders them from example_index "
        "and checks them against these.",
    )


class LeaseRequest(WireModel):
    max_tasks: int = Field(default=1, ge=1, le=64)
    policy_versions_held: list[PolicyVersion] = Field(default_factory=list, max_length=64)


class Task(WireModel):
    """One leased unit of work: a group of samples per prompt under one policy version."""

    task_id: str = Field(max_length=128)
    lease_id: str = Field(max_length=128)
    task_name: str = Field(max_length=64, description="The environment, e.g. 'reverse_text'.")
    prompts: list[Prompt] = Field(min_length=1, max_length=MAX_PROMPTS_PER_TASK)
    group_size: int = Field(ge=1, le=MAX_GROUP_SIZE)
    sampling: SamplingParams
    policy_version: PolicyVersion
    sampling_seed: int = Field(ge=0, lt=2**63, description="From the ledger, never chosen by the worker.")
    deadline: UnixTime = Field(description="Unix time after which the lease may be re-issued.")


class LeaseResponse(WireModel):
    tasks: list[Task]
    retry_after_s: float = Field(
        ge=0,
        le=86400,
        description="When no task was leased, when to ask again (0 after a long-poll that waited its wait_s out).",
    )


class LeaseRenewal(WireModel):
    lease_id: str = Field(max_length=128)


class TurnRollout(WireModel):
    """The tokens the policy sampled in one turn, with what proves them. Only sampled tokens are sent: a prompt,
    and in an episode every environment reply and template marker, is rebuilt by whoever checks it."""

    completion_ids: list[TokenId] = Field(max_length=MAX_TOKENS_PER_SAMPLE)
    logprobs: list[Logprob] = Field(max_length=MAX_TOKENS_PER_SAMPLE)
    finish_reason: Literal["stop", "length"]
    proof_b64: str = Field(max_length=4 * MAX_TOKENS_PER_SAMPLE * 16, description="TOPLOC proof bytes, base64.")


class Rollout(TurnRollout):
    """One sample: the tokens a worker generated for one prompt (in an episode, its first policy turn), with what
    proves them."""

    prompt_index: int = Field(ge=0, lt=MAX_PROMPTS_PER_TASK)
    sample_index: int = Field(ge=0, lt=MAX_GROUP_SIZE)
    later_turns: list[TurnRollout] = Field(
        default_factory=list,
        max_length=MAX_EPISODE_TURNS - 1,
        description="A multi-turn episode's policy turns after the first, in order; empty for a single turn.",
    )


class SubmitRequest(WireModel):
    lease_id: str = Field(max_length=128)
    task_id: str = Field(max_length=128)
    policy_version: PolicyVersion
    engine: EngineName
    rollouts: list[Rollout] = Field(min_length=1, max_length=MAX_PROMPTS_PER_TASK * MAX_GROUP_SIZE)


class SubmitResponse(WireModel):
    submission_id: str
    status: Literal["pending", "accepted", "rejected", "environment_error", "expired"]
    duplicate: bool = Field(description="True when this exact group was already submitted (idempotent).")


class PendingSubmission(WireModel):
    submission_id: str
    worker_id: NodeId
    task: Task
    submission: SubmitRequest
    submitted_at: UnixTime
    worker_signature_b64: str = Field(description="The worker's signature over the submission's canonical JSON.")
    audit_sample_indices: list[Annotated[int, Field(ge=0, lt=MAX_PROMPTS_PER_TASK * MAX_GROUP_SIZE)]] = Field(
        default_factory=list,
        max_length=MAX_PROMPTS_PER_TASK * MAX_GROUP_SIZE,
        description="Positions in submission.rollouts that the validator must re-check, chosen by the ledger after "
        "the submission was stored; empty means every rollout. Rewards are recomputed for all of them.",
    )
    reaudit: bool = Field(
        default=False,
        description="An accepted submission audited again on the samples nobody recomputed (the run's "
        "reaudit_share): a rejection catches its worker after the fact.",
    )


class Verdict(WireModel):
    submission_id: str = Field(max_length=128)
    accepted: bool
    reasons: list[Annotated[str, Field(max_length=512)]] = Field(default_factory=list, max_length=64)
    rewards: list[Reward] = Field(
        default_factory=list,
        max_length=MAX_PROMPTS_PER_TASK * MAX_GROUP_SIZE,
        description="Recomputed from the task, per rollout.",
    )
    reward_components: dict[RewardName, list[Reward]] = Field(
        default_factory=dict,
        max_length=MAX_NAMED_REWARDS,
        description="Each named reward of the environment, per rollout (unweighted); their weighted sum is rewards.",
    )
    environment_error: str | None = Field(
        default=None,
        max_length=512,
        description="Set when the run's environment could not score the rollouts (a one-line summary of its "
        "failure): not the worker's fault; such a verdict accepts nothing and carries no rewards.",
    )


class EnvironmentIdentity(WireModel):
    """What pins an environment across roles: equal identities serve and score the same examples."""

    kind: Literal["builtin", "reasoning_gym", "verifiers", "python"]
    name: str = Field(max_length=128, description="The dataset, taskset, built-in or module:attribute.")
    arguments: dict[str, JsonValue] = Field(description="The resolved [environment] section.")
    package: str = Field(max_length=128, description="The distribution that implements it.")
    package_version: str = Field(max_length=128)
    config_hash: Sha256Hex = Field(description="SHA-256 of the canonical JSON of the other fields.")


LORA_BASE_VERSION = 0
"""A LoRA run's base model is its policy version 0; every later version is an adapter on it."""


class LoraPin(WireModel):
    """A LoRA run: version 0 is the base model, pinned by its hash, and each later version an adapter on it
    (PEFT's layout), which workers load in place on the base and validators prefill with."""

    base_hash: str = Field(
        pattern=r"^[0-9a-f]{64}$",
        description="blake3 over the base checkpoint's files (shardcast.format.manifest.checkpoint_digest): two runs "
        "with the same base_hash share one copy of the base on a worker.",
    )
    rank: int = Field(ge=1, le=1024)
    alpha: float = Field(gt=0, le=1e6)
    target_modules: list[str] = Field(min_length=1, max_length=64)
    """Module name suffixes the adapters sit on (``["all-linear"]``: every linear layer but the output head)."""


class AuditPolicy(WireModel):
    """How much of each submission validators recompute, a run setting every worker can read (signed in the
    run spec). Fixed: ``fixed_share`` of every submission's samples. Adaptive: a share that falls with the
    worker's record per (node, engine, software version): every sample until ``full_audit_results`` accepted
    submissions in a row, then ``1 / results`` of them, never below ``floor`` (``trusted_floor`` for the operator's
    ``trusted_nodes``), back to every sample after a rejection. At least one sample of every submission is
    always recomputed, chosen by the ledger after the submission is stored. ``reaudit_share`` of the accepted
    submissions with samples nobody recomputed are audited again later on those samples: a cheat found then
    costs the worker its record, its credit and its accepted work not yet trained."""

    adaptive: bool = False
    fixed_share: float = Field(default=1.0, gt=0, le=1)
    full_audit_results: int = Field(default=10, ge=1, le=1_000_000)
    floor: float = Field(default=0.05, gt=0, le=1)
    trusted_floor: float = Field(default=0.05, gt=0, le=1)
    trusted_nodes: list[NodeId] = Field(default_factory=list, max_length=1024)
    reaudit_share: float = Field(default=0.0, ge=0, le=1)


class TrainingPolicy(WireModel):
    """What the trainer trusts and refuses, a run setting every worker and validator can read (signed in the run
    spec; docs/trust-model.md, "What the trainer trusts"). ``behaviour_logprobs``: the importance ratio's
    denominator is recomputed by the trainer from the policy version that sampled each token (``recompute``), or is
    the sampling engine's number on samples a validator recomputed, the others untrained (``sampler``).
    ``breakers``: a step whose update trips a pre-step check is not applied and its groups are audited again in full.
    ``no_signal_filter``: groups whose rewards are all equal are credited, not trained. ``rollback``: a policy whose
    eval falls past the eval's noise is replaced by the best evaluated one."""

    behaviour_logprobs: Literal["recompute", "sampler"] = "sampler"
    breakers: bool = False
    no_signal_filter: bool = False
    rollback: bool = False


class RunSpec(WireModel):
    """What every role of a run must agree on, signed by the coordinator (``GET /v1/run-spec``)."""

    run_name: str = Field(max_length=128)
    environment: EnvironmentIdentity
    precision: Precision = "float32"
    """The dtype workers generate in and validators recompute in; validators audit with its TOPLOC calibration."""
    max_turns: int = Field(default=1, ge=1, le=MAX_EPISODE_TURNS)
    """Policy turns an episode may have: 1 for a single-turn environment; above 1 the environment answers the
    policy, and workers play each sample as an episode with it (the environment's ``[environment.episode]``)."""
    lora: LoraPin | None = None
    """A LoRA run's base and adapter shape; None: every version is a full checkpoint."""
    images: bool = False
    """The run's prompts show images (a vision-language policy): workers and validators render each prompt's
    images from its example with the run's environment, check them against the hashes the task pins, and give
    them to an engine that takes images."""
    audit: AuditPolicy = Field(default_factory=AuditPolicy)
    """How much of each submission validators recompute (docs/trust-model.md, "Adaptive audit")."""
    training: TrainingPolicy = Field(default_factory=TrainingPolicy)
    """What the trainer trusts and refuses (docs/trust-model.md, "What the trainer trusts")."""


class SignedRunSpec(WireModel):
    spec: RunSpec
    signer: NodeId
    signature_b64: str = Field(max_length=256)


class ShardEntry(WireModel):
    index: int = Field(ge=0, lt=1_000_000)
    offset: ByteCount = Field(description="Byte offset of the shard in the version's concatenated files.")
    size_bytes: ByteCount
    hash: str = Field(max_length=128)


class FileEntry(WireModel):
    path: str = Field(max_length=512, pattern=r"^[A-Za-z0-9_.\-/]+$")
    offset: ByteCount = Field(description="Byte offset of this file in the version's concatenated files.")
    size_bytes: ByteCount


class ResultFileEntry(WireModel):
    """One file of the checkpoint a patch version reconstructs, with the hash it must have (bit-exact)."""

    path: str = Field(max_length=512, pattern=r"^[A-Za-z0-9_.\-/]+$")
    size_bytes: ByteCount
    hash: str = Field(max_length=128, description="The file's hash, in the manifest's hash_algorithm.")


PATCH_ENCODING = "bitpatch-zstd-v1"
"""The value-patch format this release writes and reads (shardcast.format.patch).

A manifest naming another is refused."""
_PATCH_FIELDS = ("kind", "base_version", "encoding", "result_files")


class PolicyManifest(WireModel):
    """What the coordinator signs for each policy version; relays and clients verify against it.

    A ``full`` version's files are the checkpoint. A ``patch`` version's files are one patch file
    that turns ``base_version``'s checkpoint into this version's, in the named ``encoding``; the
    checkpoint it reconstructs is ``result_files``, each with its size and hash. A full manifest
    serializes without the four patch fields, so its signed bytes are what they always were.
    """

    version: PolicyVersion
    created_at: UnixTime
    hash_algorithm: Literal["blake3", "sha256"]
    shard_size_bytes: int = Field(gt=0, le=MAX_BYTES)
    total_size_bytes: ByteCount
    files: list[FileEntry] = Field(max_length=10000)
    shards: list[ShardEntry] = Field(max_length=1_000_000)
    kind: Literal["full", "patch"] = "full"
    base_version: PolicyVersion | None = None
    """Patch only: the version whose checkpoint the patch applies to (older than ``version``)."""
    encoding: str | None = Field(default=None, max_length=64, pattern=r"^[a-z0-9][a-z0-9.\-]*$")
    """Patch only: the patch format; this release reads and writes :data:`PATCH_ENCODING`."""
    result_files: list[ResultFileEntry] = Field(default_factory=list, max_length=10000)
    """Patch only: the reconstructed checkpoint's files, sorted by path."""
    run_name: str | None = Field(default=None, max_length=128, pattern=r"^[A-Za-z0-9_.\-]+$")
    """The run this version belongs to (the ``run_name`` of the coordinator's signed run spec), so one key signing
    for several runs cannot have one run's version taken for another's; absent (and not serialized) when the
    publisher names no run."""
    served_on: PolicyVersion | None = None
    """A LoRA run's adapter version: the version holding the base model it is served on (the run's v0), which
    origins and relays keep as long as they keep this one; absent (and not serialized) otherwise."""

    @model_validator(mode="after")
    def _kind_fields(self) -> PolicyManifest:
        if self.kind == "patch":
            if self.base_version is None or self.base_version >= self.version:
                raise ValueError("a patch version needs a base_version older than its version")
            if self.encoding is None or not self.result_files:
                raise ValueError("a patch version needs an encoding and result_files")
        elif self.base_version is not None or self.encoding is not None or self.result_files:
            raise ValueError("a full version has no base_version, encoding or result_files")
        if self.served_on is not None and self.served_on >= self.version:
            raise ValueError("an adapter version is served on an older version")
        return self

    @model_serializer(mode="wrap")
    def _omit_patch_fields_of_full(self, handler: SerializerFunctionWrapHandler) -> dict[str, object]:
        data: dict[str, object] = handler(self)
        if self.kind == "full":
            for name in _PATCH_FIELDS:
                data.pop(name, None)
        for name in ("run_name", "served_on"):  # manifests without them sign the bytes they always did
            if getattr(self, name) is None:
                data.pop(name, None)
        return data

    @property
    def result_size_bytes(self) -> int:
        """Bytes of the checkpoint this version stands for (the download itself for a full version)."""
        if self.kind == "full":
            return self.total_size_bytes
        return sum(entry.size_bytes for entry in self.result_files)


class SignedManifest(WireModel):
    manifest: PolicyManifest
    signer: NodeId
    signature_b64: str


class VersionInfo(WireModel):
    """One policy version a SHARDCAST origin or relay holds (``GET /versions``)."""

    version: PolicyVersion
    num_shards: int = Field(ge=0, le=1_000_000)
    num_shards_ready: int = Field(
        ge=0, le=1_000_000, description="Shards verified and servable now (relays fill in as they mirror)."
    )
    total_size_bytes: ByteCount


class VersionsResponse(WireModel):
    """What a SHARDCAST server holds; unsigned, so only a hint: the manifests are what is trusted."""

    role: Literal["origin", "relay"]
    latest: PolicyVersion | None = Field(description="The newest version whose signed manifest is held.")
    versions: list[VersionInfo] = Field(max_length=1024)


class Announcement(WireModel):
    """A gossip message; the body is a wire message of the named kind, signed by ``signer``."""

    kind: Literal["policy_version", "relay", "tasks"]
    body: dict[str, object]
    signer: NodeId
    signature_b64: str
    sent_at: UnixTime


class PolicyAnnouncement(WireModel):
    """Gossip body (kind ``policy_version``): the coordinator published a new policy version."""

    version: PolicyVersion
    manifest_sha256: Sha256Hex = Field(
        description="sha256 of the manifest's canonical JSON (what the signature covers)."
    )
    total_size_bytes: ByteCount
    origin_url: str | None = Field(default=None, max_length=512, pattern=r"^https?://")
    published_at: UnixTime


class RelayAnnouncement(WireModel):
    """Gossip body (kind ``relay``): a relay serves SHARDCAST at ``url``; signed by the relay's own key."""

    url: str = Field(max_length=512, pattern=r"^https?://")
    latest_version: PolicyVersion | None = None


class TaskAnnouncement(WireModel):
    """Gossip body (kind ``tasks``): the ledger has tasks to lease under the current policy."""

    num_tasks_open: Count
    current_policy_version: PolicyVersion


class P2PInfo(WireModel):
    """``GET /v1/p2p``: how to join the coordinator's libp2p network (all a node needs is its URL)."""

    peer_id: NodeId
    addrs: list[Annotated[str, Field(max_length=256)]] = Field(max_length=16, description="Multiaddrs with /p2p/.")
    topics: list[Annotated[str, Field(max_length=128)]] = Field(max_length=16)


class RunStatus(WireModel):
    run_name: str
    current_policy_version: PolicyVersion
    async_level: int
    num_workers_live: int
    num_validators_live: int
    num_tasks_open: int
    num_submissions_pending: int
    num_submissions_accepted: int
    num_submissions_rejected: int
    num_train_steps_done: int = Field(default=0, description="Training steps trained and published (orchestrator).")
    step_rewards: dict[RewardName, float] = Field(
        default_factory=dict,
        max_length=MAX_NAMED_REWARDS,
        description="Each named reward's batch mean in the newest trained step (the environment's rewards).",
    )
    run_ended: bool = Field(default=False, description="The RL loop has published its last step: nothing to do.")
    num_train_steps: int = Field(default=0, ge=0, description="The run's training steps in all (0: no RL loop).")
    step_s: float | None = Field(
        default=None, ge=0, description="Mean wall time between the newest published steps (None before two)."
    )
    step_completion_tokens_mean: float | None = Field(
        default=None, description="Mean completion length (tokens) of the newest trained step's batch."
    )
    step_stop_fraction: float | None = Field(
        default=None, description="Fraction of the newest trained step's rollouts that ended with EOS."
    )
    step_truncated_fraction: float | None = Field(
        default=None, description="Fraction of the newest trained step's rollouts cut at max_tokens without EOS."
    )
    step_loss: float | None = Field(default=None, description="The trainer's loss in the newest trained step.")
    step_entropy: float | None = Field(default=None, description="Mean policy entropy in the newest trained step.")
    step_mismatch_kl: float | None = Field(
        default=None, description="KL between sampling and training logprobs in the newest trained step."
    )
    step_grad_norm: float | None = Field(
        default=None, description="Gradient norm (before clipping) in the newest trained step."
    )
    step_out_of_band_fraction: float | None = Field(
        default=None, description="Share of the newest trained step's tokens whose importance ratio left the band."
    )
    step_breaker_trips: float | None = Field(
        default=None, description="Attempts of the newest trained step a breaker refused before one was applied."
    )
    step_zero_signal_fraction: float | None = Field(
        default=None, description="Share of the newest trained step's groups without reward spread (not trained)."
    )
    num_breaker_trips: int = Field(default=0, ge=0, description="Updates the breakers refused in the whole run.")
    num_rollbacks: int = Field(default=0, ge=0, description="Rollbacks to an earlier version in the whole run.")
    eval_step: int | None = Field(default=None, description="The newest trained step whose policy was evaluated.")
    eval_accuracy: float | None = Field(default=None, description="Its eval: fraction of exactly right answers.")
    eval_reward_mean: float | None = Field(default=None, description="Its eval: mean reward.")
    eval_stop_fraction: float | None = Field(default=None, description="Its eval: fraction ended with EOS.")
    eval_completion_tokens_mean: float | None = Field(default=None, description="Its eval: mean length (tokens).")
    num_submissions_environment_error: int = Field(
        default=0, description="Submissions the run's environment could not score (their tasks dropped)."
    )
    num_submissions_expired: int = Field(
        default=0, description="Pending submissions voided because the origin no longer keeps their policy version."
    )


# Ledger API responses and read-only views.

LeaseStateName = Literal["active", "submitted", "expired", "abandoned"]


class HeartbeatResponse(WireModel):
    current_policy_version: PolicyVersion
    heartbeat_interval_s: float = Field(gt=0, le=86400, description="When to send the next heartbeat.")


class LeaseState(WireModel):
    """Where a lease stands after a renewal or abandonment."""

    lease_id: str
    task_id: str
    state: LeaseStateName
    deadline: float


class PendingSubmissions(WireModel):
    submissions: list[PendingSubmission]


class VerdictResponse(WireModel):
    submission_id: str
    status: Literal["pending", "accepted", "rejected", "environment_error", "expired"] = Field(
        description="'pending' while fewer validators than the run requires agree."
    )
    worker_banned: bool


class PublishResponse(WireModel):
    version: PolicyVersion
    published_at: float


class NodeStats(WireModel):
    node_id: NodeId
    role: Role
    approved: bool
    banned: bool
    ban_reason: str | None
    num_accepted: int
    num_rejected: int
    last_seen: float
    num_votes_agreed: int = Field(default=0, description="A validator's votes that went with the decision.")
    num_votes_outvoted: int = Field(default=0, description="A validator's votes that the decision went against.")
    flagged: bool = Field(
        default=False, description="A validator that keeps voting against the decisions (handed fewer submissions)."
    )
    credit_samples: int = Field(default=0, description="A worker's verified work: samples of accepted submissions.")
    credit_tokens: int = Field(default=0, description="Completion tokens of those samples.")
    credit_lost_samples: int = Field(
        default=0, description="Verified samples a worker lost because work of its was caught cheating."
    )
    credit_lost_tokens: int = Field(default=0, description="Completion tokens of those samples.")


class RunStats(WireModel):
    status: RunStatus
    nodes: list[NodeStats]


class Event(WireModel):
    """One entry of the ledger's append-only event log."""

    event_id: int
    at: float
    kind: Literal[
        "register",
        "lease",
        "renew",
        "abandon",
        "expire",
        "submit",
        "hand_out",
        "vote",
        "verdict",
        "violation",
        "ban",
        "publish",
        "train_step",
        "void",
        "reaudit",
        "approve",
        "revoke",
        "breaker_trip",
        "rollback",
    ]
    node_id: str | None
    subject: str | None = Field(description="What the event is about: a lease, task, submission or version.")
    data: dict[str, object]


class EventPage(WireModel):
    events: list[Event]
    next_after: int = Field(description="Pass as `after` to read the events that follow.")


# The coordinator's dashboard (`GET /v1/dashboard`, public and read-only).


class DashboardNode(WireModel):
    """A worker or validator as the ledger last heard of it (no IP address, no hardware details)."""

    node_id: NodeId
    role: Role
    engine: EngineName | None
    policy_version: PolicyVersion | None = Field(description="The newest policy version the node reports holding.")
    versions_held: list[PolicyVersion]
    tokens_per_s: float = Field(ge=0, description="As reported in the node's last heartbeat.")
    num_accepted: int
    num_rejected: int
    last_seen: float
    live: bool = Field(description="Heard from within scheduling.worker_live_s and not banned.")
    banned: bool
    ban_reason: str | None
    num_votes_agreed: int = Field(default=0, description="A validator's votes that went with the decision.")
    num_votes_outvoted: int = Field(default=0, description="A validator's votes that the decision went against.")
    flagged: bool = Field(
        default=False, description="A validator that keeps voting against the decisions (handed fewer submissions)."
    )
    credit_samples: int = Field(default=0, description="A worker's verified work: samples of accepted submissions.")
    credit_tokens: int = Field(default=0, description="Completion tokens of those samples.")
    credit_lost_samples: int = Field(
        default=0, description="Verified samples a worker lost because work of its was caught cheating."
    )
    credit_lost_tokens: int = Field(default=0, description="Completion tokens of those samples.")


class DashboardVerdict(WireModel):
    """One validator verdict from the event log, with the mean of the rewards the validator recomputed."""

    event_id: int
    at: float
    submission_id: str
    worker_id: str
    validator_id: str | None
    policy_version: PolicyVersion | None
    engine: EngineName | None
    accepted: bool
    reasons: list[str]
    num_rollouts: int = Field(ge=0, description="Rollouts the verdict carried rewards for.")
    mean_reward: float | None


class VersionSpread(WireModel):
    """One published policy version: which nodes hold it, and what the rollouts made with it earned."""

    version: PolicyVersion
    published_at: float | None
    total_size_bytes: int | None
    num_live_holders: int = Field(ge=0, description="Live workers and validators that report holding it.")
    num_accepted: int = Field(ge=0, description="Accepted submissions made with this version.")
    num_rejected: int = Field(ge=0)
    mean_reward: float | None = Field(description="Mean recomputed reward over its accepted rollouts.")
    num_relays: int = Field(default=0, ge=0, description="Relays whose last answer lists it complete.")
    kind: Literal["full", "patch"] | None = Field(
        default=None, description="Published as a full checkpoint or a value patch (None: not recorded)."
    )
    base_version: PolicyVersion | None = Field(default=None, description="The version a patch applies to.")
    checkpoint_bytes: int | None = Field(
        default=None, description="Bytes of the checkpoint it stands for (a patch downloads total_size_bytes)."
    )


class DashboardRelay(WireModel):
    """A relay heard announcing itself on gossip, and what its ``GET /versions`` last said (untrusted hints)."""

    url: str = Field(description="As the relay announced it; text, never markup.")
    heard_at: float = Field(description="When its last announcement was accepted.")
    checked_at: float | None = Field(description="When the coordinator last asked it; None before the first try.")
    answered_at: float | None = Field(description="When it last gave a valid answer; None if it never did.")
    reachable: bool = Field(description="Its last answer was valid.")
    error: str | None = Field(description="Why the last try failed (connection failed, timed out, malformed...).")
    versions_held: list[PolicyVersion] = Field(description="Complete versions in its last valid answer.")
    versions_mirroring: list[PolicyVersion] = Field(description="Versions it was still mirroring then.")


class DashboardTrainStep(WireModel):
    """One trained RL step: the mean reward of its batch (from its ``train_step`` event)."""

    step: int = Field(ge=1)
    at: float = Field(description="When the step was recorded as trained.")
    reward_mean: float
    rewards: dict[RewardName, float] = Field(
        default_factory=dict, max_length=MAX_NAMED_REWARDS, description="Each named reward's batch mean."
    )
    completion_tokens_mean: float | None = Field(default=None, description="Mean completion length (tokens).")
    stop_fraction: float | None = Field(default=None, description="Fraction of the rollouts that ended with EOS.")
    truncated_fraction: float | None = Field(
        default=None, description="Fraction of the rollouts cut at max_tokens without EOS."
    )
    loss: float | None = Field(default=None, description="The trainer's loss on the step's batch.")
    entropy: float | None = Field(default=None, description="Mean entropy of the policy over the loss tokens.")
    mismatch_kl: float | None = Field(
        default=None, description="KL between the workers' sampling logprobs and the trainer's, per loss token."
    )
    grad_norm: float | None = Field(default=None, description="Gradient norm before clipping.")
    out_of_band_fraction: float | None = Field(
        default=None, description="Share of the trained tokens whose importance ratio left the breakers' band."
    )
    breaker_trips: float | None = Field(default=None, description="Attempts refused before this one was applied.")
    zero_signal_fraction: float | None = Field(
        default=None, description="Share of the batch's groups without reward spread (credited, not trained)."
    )
    kind: Literal["train", "skip", "restore"] = Field(
        default="train",
        description="Trained; skipped (a refused batch nothing explained); an earlier version restored.",
    )


class DashboardEval(WireModel):
    """The eval of one policy on the environment's eval split (its ``train_step`` event, state ``evaluated``)."""

    step: int = Field(ge=0, description="The policy version evaluated (0: the start policy).")
    at: float = Field(description="When the eval was recorded.")
    accuracy: float = Field(description="Fraction of samples with an exactly right answer.")
    reward_mean: float
    stop_fraction: float | None = None
    completion_tokens_mean: float | None = None


class DashboardTraining(WireModel):
    """The orchestrator's progress; absent until it records its first step."""

    current_step: int | None = Field(description="The newest step recorded but not yet published, if any.")
    num_steps_done: int = Field(ge=0, description="The newest step published.")
    steps: list[DashboardTrainStep] = Field(description="Trained steps, oldest first (the last few hundred).")
    evals: list[DashboardEval] = Field(default_factory=list, description="Evals of policies, oldest step first.")


class SeriesPoint(WireModel):
    """One point of a time series: Unix time and value."""

    at: float
    value: float


class DashboardAudit(WireModel):
    """The run's audit policy and the bound on what cheating gets through it (docs/trust-model.md)."""

    adaptive: bool
    lowest_share: float = Field(description="The smallest share of an untrusted submission's samples recomputed.")
    full_audit_results: int = Field(description="Accepted in a row before an adaptive audit starts sampling.")
    samples_per_submission: int
    detection_power: float = Field(description="The smallest share of any calibration attack's trials caught.")
    detection_trials: int
    cheated_fraction_bound: float = Field(
        description="The largest expected share of a cheating worker's trained samples that are cheated."
    )
    deterrent_share: float = Field(description="The audit share above which cheating a sample does not pay.")


class Dashboard(WireModel):
    """Everything the /dashboard page draws, in one read."""

    generated_at: float
    status: RunStatus
    nodes: list[DashboardNode] = Field(description="Most recently seen first.")
    verdicts: list[DashboardVerdict] = Field(description="The most recent verdicts, newest first.")
    rewards: list[DashboardVerdict] = Field(
        description="Verdicts with rewards, oldest first (the reward chart; the last few hundred)."
    )
    versions: list[VersionSpread] = Field(description="The newest published versions, newest first.")
    accepted_samples_per_s: list[SeriesPoint] = Field(description="Accepted rollouts per second, in time buckets.")
    tokens_per_s: list[SeriesPoint] = Field(
        description="Completion tokens submitted per second, in time buckets from the run's first event (the ledger's "
        "submit events: the whole run, whenever the page is opened)."
    )
    relays: list[DashboardRelay] = Field(default_factory=list, description="Relays heard on gossip, newest first.")
    training: DashboardTraining | None = Field(default=None, description="None while no training step is recorded.")
    audit: DashboardAudit | None = Field(default=None, description="None when the run spec is not known here.")
