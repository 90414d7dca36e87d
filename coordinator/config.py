"""The coordinator's config (`prime-coordinator start -c run.toml`)."""

from __future__ import annotations

import ipaddress
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import Field, field_validator, model_validator
from pydantic_settings import SettingsConfigDict

from environments.config import BuiltinEnvConfig, EnvironmentConfig
from runtime.children import LogLimits
from runtime.config import RoleConfig, Section
from runtime.p2p.config import P2PConfig
from trainer.config import BreakerConfig, LossConfig, TrainerSection


class ApiConfig(Section):
    host: str = "127.0.0.1"
    """Interface the ledger API binds; 0.0.0.0 to accept workers from other machines."""
    port: int = Field(default=8000, ge=0, le=65535)
    """TCP port of the ledger API (0 picks a free one)."""
    max_body_bytes: int = Field(default=16 * 1024 * 1024, gt=0)
    """Requests with a larger body are refused with 413 before they are read."""
    node_rate_per_s: float = Field(default=20.0, gt=0)
    """Signed requests one node may make per second on average (token bucket refill rate)."""
    node_burst: int = Field(default=40, ge=1)
    """Signed requests one node may make in a burst before it is told to slow down (429)."""
    ip_rate_per_s: float = Field(default=500.0, gt=0)
    """Requests one IP address may make per second on average, across all its node keys."""
    ip_burst: int = Field(default=1000, ge=1)
    """Requests one IP address may make in a burst before it is told to slow down (429)."""
    maintenance_interval_s: float = Field(default=5.0, gt=0)
    """How often expired leases are re-queued and expired nonces pruned in the background."""
    max_long_polls_per_node: int = Field(default=4, ge=0, le=64)
    """Long-polls (`wait_s` on a lease or the pending list) one node may have waiting at once; further ones are
    answered at once, like a plain request (one per engine of a worker is the most a node needs)."""
    long_poll_recheck_s: float = Field(default=2.0, ge=0.1, le=60.0)
    """How often a waiting long-poll asks the ledger again when no change woke it. Changes wake it at once, those
    of API replicas too (PostgreSQL's change feed); the re-check covers a feed that lost its connection."""
    num_threads: int = Field(default=4, ge=1, le=256)
    """Threads that run ledger calls. Few is faster: every call holds the GIL most of the time, so more
    threads only queue for it (bench/ledger_load.py on PostgreSQL here: p99 ~0.1 s with 4 threads, 18 s with 40)."""


class LedgerConfig(Section):
    url: str = ""
    """SQLAlchemy URL; empty means a SQLite file `ledger.db` in the data dir. PostgreSQL:
    `postgresql+psycopg://user@host:5432/db`."""
    sqlite_synchronous: Literal["NORMAL", "FULL"] = "NORMAL"
    """SQLite durability (WAL mode): NORMAL survives a killed process; FULL also a power cut, at an fsync per commit."""
    pool_size: int = Field(default=8, ge=1, le=256)
    """Database connections kept open by one coordinator process (PostgreSQL)."""


class SchedulingConfig(Section):
    async_level: int = Field(default=2, ge=0, le=16)
    """k: a submission made with a policy older than current - k is refused (0 = on-policy)."""
    lease_ttl_s: float = Field(default=120.0, gt=0)
    """A lease not renewed or submitted within this time is re-issued to another worker."""
    prompts_per_task: int = Field(default=8, ge=1, le=256)
    """Prompts in one leased task."""
    group_size: int = Field(default=8, ge=1, le=64)
    """Samples per prompt (GRPO group)."""
    max_leases_per_node: int = Field(default=2, ge=1)
    """Open leases one node may hold at once, once it earned them (see sources.new_identity_leases)."""
    max_open_leases: int = Field(default=4096, ge=1)
    """Open leases across the network; each live source (see the sources section) may hold an equal share."""
    temperature: float = Field(default=1.0, gt=0, le=10)
    """Sampling temperature handed out with every task."""
    max_tokens: int = Field(default=128, ge=1, le=32768)
    """Maximum completion length per sample handed out with every task."""
    worker_live_s: float = Field(default=60.0, gt=0)
    """A node that has not been heard from for this long no longer counts as live."""


class SourcesConfig(Section):
    """Limits per client source, so that identities minted on one host do not multiply its share (docs/sybil.md).

    A source is the client's address cut to its network prefix; every key registered from it shares the
    source's registration bucket, its fair share of open leases and its probation budget."""

    ipv4_prefix: int = Field(default=24, ge=8, le=32)
    """IPv4 addresses in the same network of this many leading bits are one source (32: every address its own)."""
    ipv6_prefix: int = Field(default=64, ge=16, le=128)
    """IPv6 addresses in the same network of this many leading bits are one source (a /64 is usually one site)."""
    allow: list[Annotated[str, Field(max_length=64)]] = Field(default_factory=list, max_length=1024)
    """Networks (CIDR, e.g. `10.0.0.0/8`) the operator trusts: no registration cap, no probation, and each key
    counts as a source of its own (the ledger's behaviour without Sybil limits). configs/demo.toml lists loopback,
    where all the demo's nodes run; keep it empty on a public ledger."""
    trusted_proxies: list[Annotated[str, Field(max_length=64)]] = Field(default_factory=list, max_length=64)
    """Reverse proxies (addresses or CIDR networks) whose `X-Forwarded-For` names the client; empty: the client is
    the TCP peer and the header is ignored. Behind a proxy, list it here or every client is the proxy's source."""
    register_rate_per_s: float = Field(default=0.05, gt=0)
    """Registrations one address may make per second on average (token bucket refill; 0.05 is 3 a minute)."""
    register_burst: int = Field(default=16, ge=1)
    """Registrations one address may make at once before it is told to wait (429)."""
    prefix_register_rate_per_s: float = Field(default=0.2, gt=0)
    """Registrations one network prefix (all its addresses together) may make per second on average."""
    prefix_register_burst: int = Field(default=64, ge=1)
    """Registrations one network prefix may make at once before it is told to wait (429)."""
    new_identity_leases: int = Field(default=1, ge=1)
    """Open leases a new identity may hold; each accepted submission adds one and each rejected one takes one away,
    between 1 and scheduling.max_leases_per_node."""
    proven_after_accepted: int = Field(default=1, ge=0)
    """An identity is on probation until its accepted submissions exceed its rejected ones by this many."""
    probation_budget: int = Field(default=4, ge=1)
    """Unverified work (open leases plus submissions awaiting a verdict) that all identities on probation from one
    source may have at once, however many keys it registers."""
    max_requests_in_flight: int = Field(default=2, ge=1, le=1024)
    """Ledger calls (`/v1/...`) of one source the API works on at once; the source's further calls wait their turn,
    so a flood from one source cannot occupy the ledger's threads (api.num_threads) while other sources wait."""
    max_requests_waiting: int = Field(default=256, ge=0, le=100_000)
    """Requests of one source that may wait for their turn; beyond that they are refused with 429."""
    probation_share: float = Field(default=0.5, gt=0, le=1)
    """Share of scheduling.max_open_leases that all identities on probation, from every source together, may
    hold; the rest is for identities with accepted work. Each source gets at most an equal part of this pool."""
    probation_lease_max_s: float = Field(default=30.0, gt=0)
    """A lease of an identity on probation ends this many seconds after it was issued, renewed or not (at most
    scheduling.lease_ttl_s), so leases hoarded in the probation pool turn over for newcomers."""
    forfeit_memory_s: float = Field(default=600.0, ge=0)
    """For this long after one of its probation leases expired unsubmitted or was abandoned, a source may use only
    half of the probation pool (sources without such a record may use all of it)."""

    @field_validator("allow", "trusted_proxies")
    @classmethod
    def _networks(cls, value: list[str]) -> list[str]:
        for network in value:
            try:
                ipaddress.ip_network(network, strict=False)
            except ValueError:
                raise ValueError(f"{network!r} is not an IP address or CIDR network (e.g. 10.0.0.0/8)") from None
        return value


class TrustConfig(Section):
    validators_open: bool = False
    """When false, only keys in `approved_validators` may register as validators."""
    approved_validators: list[Annotated[str, Field(min_length=40, max_length=64)]] = Field(default_factory=list)
    """Node ids of operator-approved validators."""
    ban_after_rejections: int = Field(default=3, ge=1)
    """A worker whose submissions were rejected this many times is banned."""
    max_clock_skew_s: float = Field(default=60.0, gt=0)
    """Signed requests whose timestamp is further than this from the server clock are refused."""


class AdaptiveAuditConfig(Section):
    """Audit by record (BOINC's adaptive replication): a worker's submissions are recomputed whole until it has
    `full_audit_results` accepted in a row for its engine and software version, then `1 / results` of their
    samples, never below `floor`; a rejection starts its record over. Signed into the run spec; the bound on
    what cheating gets through is on the dashboard (docs/trust-model.md, "Adaptive audit")."""

    enabled: bool = False
    """Audit by record instead of `validation.audit_fraction` of every submission."""
    full_audit_results: int = Field(default=10, ge=1, le=1_000_000)
    """Accepted submissions in a row before a worker's submissions are sampled instead of recomputed whole."""
    floor: float = Field(default=0.05, gt=0, le=1)
    """The smallest share of a submission's samples recomputed (at least one sample always is)."""
    trusted_nodes: list[Annotated[str, Field(min_length=40, max_length=64)]] = Field(default_factory=list)
    """Node ids of the operator's own workers: audited at `trusted_floor` from their first submission."""
    trusted_floor: float = Field(default=0.05, gt=0, le=1)
    """The share of a trusted worker's samples recomputed (at least one sample always is)."""
    reaudit_share: float = Field(default=0.05, ge=0, le=1)
    """Share of accepted submissions, with samples nobody recomputed, that validators audit again later on those
    samples (picked from the run secret at acceptance): a cheat found then voids the worker's credit, record and
    accepted work not yet trained."""


class ValidationConfig(Section):
    audit_fraction: float = Field(default=1.0, gt=0, le=1)
    """Share of each submission's samples validators re-check (at least one), picked by the ledger from the
    run secret after the submission is stored, so workers cannot predict them; 1.0 checks every sample.
    With `validation.adaptive` enabled the share follows each worker's record instead."""
    adaptive: AdaptiveAuditConfig = AdaptiveAuditConfig()
    """Audit by record: less of the work of workers with a long record of accepted submissions."""
    validators_per_submission: int = Field(default=1, ge=1, le=16)
    """Verdicts from distinct validators that must agree before a submission is accepted or rejected."""
    builtin_enabled: bool = False
    """Run a validator next to the coordinator (single-machine runs): its key is created in the data dir
    and approved automatically; it logs to `builtin-validator.log` in the data dir."""
    hand_out_ttl_s: float = Field(default=900.0, gt=0, le=7 * 86400.0)
    """A validator's verdict counts only on a submission the ledger handed to it (its pending list) within this
    many seconds; a verdict on any other submission is refused (docs/trust-model.md)."""
    hand_out_claim_s: float = Field(default=0.0, ge=0, le=86400.0)
    """0: every validator is handed every undecided submission. Above 0, a submission handed to as many validators as
    it needs verdicts (`validators_per_submission`) is handed to no other for this many seconds from their first
    hand-out: validators split the pending list instead of auditing the same submissions. Set it when the validators
    are ones you trust to answer (`trust.approved_validators`): one that takes submissions and never judges them
    holds each from the others that long."""
    flag_after_outvoted: int = Field(default=3, ge=1)
    """A validator is flagged once this many of its votes disagreed with the decision and they are more than
    max_outvoted_fraction of its decided votes; a flagged validator is handed flagged_hand_outs submissions at
    a time."""
    max_outvoted_fraction: float = Field(default=0.2, ge=0, le=1)
    """Share of a validator's decided votes that may disagree with the decision before it is flagged."""
    flagged_hand_outs: int = Field(default=1, ge=0, le=256)
    """Submissions a flagged validator is handed per pending list (0: none until the operator looks)."""


class PolicyConfig(Section):
    start_checkpoint: str = "builtin:tiny-qwen2-reverse-start"
    """Published as policy version 0 on the first start: a local HF checkpoint directory, a Hugging Face hub id
    (`ORG/NAME`, or `ORG/NAME@REVISION` to pin one; resolved through the Hugging Face cache, `HF_HUB_OFFLINE`
    honoured) or a `builtin:` name. The run's one model setting: the trainer starts from it too."""
    store_dir: Path | None = None
    """The SHARDCAST origin store; empty means `policies/` in the data dir."""
    shard_size_bytes: int = Field(default=32 * 1024 * 1024, ge=4096)
    """Size of the shards a policy version is cut into."""
    keep_versions: int | None = Field(default=None, ge=1)
    """Versions kept in the origin store; empty means async_level + 2 (never fewer than async_level + 1). The
    versions a kept value patch's chain stands on, down to a full version, are kept as well. A submission still
    pending when its version falls out of the newest this many is expired (no validator could fetch it) and its
    task re-issued, at no cost to its worker."""
    patches_enabled: bool = True
    """Publish a version as a value patch against the previous one when the patch saves at least 10% of the
    checkpoint's bytes (and the previous version is still in the origin store); off: every version is full."""
    full_every: int = Field(default=10, ge=1, le=1_000_000)
    """Versions that are a multiple of this are always published full, bounding the chain of patches a client
    without a recent version downloads. The dtype published is orchestrator.trainer.checkpoint.export_dtype
    (bfloat16 makes patches small)."""
    vocab_size: int | None = Field(default=None, ge=1, le=2**31)
    """The policy's vocabulary size: a submission with a token id at or above it is refused at the door and
    counted against its worker. Empty: read from the start checkpoint's config.json when the coordinator starts."""


class ArchiveConfig(Section):
    """What `prime-coordinator archive` moves out of the ledger database into Parquet files (docs/retention.md)."""

    dir: Path | None = None
    """Where archive files are written; empty means `archive/` in the data dir."""
    keep_versions: int = Field(default=50, ge=0, le=1_000_000)
    """Bodies (tokens, logprobs, proofs) of decided submissions made with a policy more than this many versions
    (plus scheduling.async_level) older than the current one, and not in one of the last this many published
    steps, are archived; newer ones stay in the database. Undecided submissions are never archived."""
    keep_events_s: float = Field(default=7 * 86400.0, ge=0)
    """Events younger than this (seconds) stay in the database; older ones are archived."""
    rows_per_file: int = Field(default=10_000, ge=1, le=1_000_000)
    """Rows in one archive file (each is written whole before its rows leave the database)."""


class ChildLogsConfig(Section):
    """How large the log of each child the coordinator starts may grow (trainer service, validators, demo nodes)."""

    max_mib: float = Field(default=16.0, gt=0, le=1024 * 1024)
    """A child's log file is moved to `<name>.log.1` once it passes this many MiB."""
    backups: int = Field(default=3, ge=0, le=1000)
    """Rotated files kept per child (`.1` newest); the oldest goes at the next rotation."""

    def limits(self) -> LogLimits:
        return LogLimits(max_bytes=max(1, int(self.max_mib * (1 << 20))), backups=self.backups)


class CoordinatorP2PConfig(P2PConfig):
    watch_interval_s: float = Field(default=0.1, gt=0, le=60)
    """How often the ledger is checked for a newly published policy version to announce on gossip."""


class TrainerLaunchConfig(Section):
    """How the coordinator launches its torchrun trainer job (`[orchestrator.trainer_launch]`): ranks, nodes,
    rendezvous. What the trainer trains with is `[orchestrator.trainer]`, the trainer role's own section."""

    nproc: int = Field(default=2, ge=1, le=64)
    """Trainer ranks on this machine (`torchrun --nproc-per-node`); FSDP2 with gloo on CPU, NCCL on GPUs."""
    cpus: list[int] = Field(default=[], max_length=1024)
    """CPU cores the trainer ranks are pinned to (empty: not pinned); bench/async_bench.py pins them."""
    nnodes: int = Field(default=1, ge=1, le=1024)
    """Machines the trainer job spans (`torchrun --nnodes`); the coordinator launches node rank 0 and each other
    machine runs `prime-trainer node` with its node rank. Above 1, `data_dir/train` must be on a filesystem shared
    by every node, at the same path."""
    master_addr: str = Field(default="127.0.0.1", min_length=1, max_length=253)
    """Address of this machine that the other trainer nodes dial for torchrun's rendezvous (`--master-addr`)."""
    master_port: int = Field(default=0, ge=0, le=65535)
    """Rendezvous TCP port on this machine (`--master-port`); 0 picks a free one, which works with one node only:
    with `nnodes` > 1 set a fixed port that every node is given."""

    @model_validator(mode="after")
    def _check_nodes(self) -> TrainerLaunchConfig:
        if self.nnodes > 1 and self.master_port == 0:
            raise ValueError(
                f"orchestrator.trainer_launch.nnodes is {self.nnodes}: set orchestrator.trainer_launch.master_port "
                "to a fixed port that the other trainer nodes dial (0, a free port, works with one node only)"
            )
        return self


MOVED_TRAINER_KEYS = {f"trainer_{name}": name for name in TrainerLaunchConfig.model_fields}
"""The flat ``orchestrator.trainer_*`` keys of earlier configs and their names in ``orchestrator.trainer_launch``."""


class WandbConfig(Section):
    """Weights & Biases logging of every metrics row (needs the `tracking` extra)."""

    mode: Literal["disabled", "online", "offline"] = "disabled"
    """disabled: no W&B; online: log to the W&B server (log in with `wandb login` or WANDB_API_KEY first);
    offline: write the W&B run files under `dir` only (`wandb sync` uploads them later)."""
    project: str = Field(default="prime-network", min_length=1, max_length=128)
    """The W&B project the run is logged to."""
    entity: str | None = Field(default=None, min_length=1, max_length=128)
    """The W&B team or user that owns the project (empty: the logged-in user's default)."""
    dir: Path | None = None
    """Where W&B writes its run files (a `wandb/` folder inside); empty means the data dir."""


class TrackingConfig(Section):
    """Copies of every `metrics.jsonl` row in TensorBoard and W&B (`pip install 'prime-network[tracking]'`)."""

    tensorboard: bool = False
    """Write every step's and eval's metrics as TensorBoard scalars (`tensorboard --logdir DIR` shows them)."""
    tensorboard_dir: Path | None = None
    """Where the TensorBoard event files go; empty means `tensorboard/` in the data dir."""
    wandb: WandbConfig = WandbConfig()
    """Log the same metrics to Weights & Biases (off unless wandb.mode is online or offline)."""


class CanaryConfig(Section):
    """Rollback on an eval that falls (`orchestrator.eval_every_steps` must be set): when a policy's held-out accuracy
    is below the best evaluated version's by more than `noise_z` standard errors of the difference of the two
    (`sqrt(p (1 - p) (1/n1 + 1/n2))`, `p` the two versions' pooled accuracy, `n` each eval's examples), the best
    version's weights are published as the next version and the steps after it are marked rolled back."""

    enabled: bool = True
    """Roll back on a fall (false: evals are only reported)."""
    noise_z: float = Field(default=3.0, gt=0, le=100)
    """How many standard errors a fall must exceed: 3 keeps a run whose accuracy only wobbles from rolling back."""
    action: Literal["continue", "pause"] = "continue"
    """After a rollback: go on training from the restored version, or pause the run (the coordinator stops; start it
    again to go on)."""
    lr_scale: float = Field(default=1.0, gt=0, le=1)
    """The learning rate is multiplied by this at each rollback (1: unchanged)."""
    hold_steps: bool = False
    """Hold each step until the evals due so far are in, so that a fall is acted on at the next step (the loop waits
    for every eval); false: evals run beside training and a rollback comes as soon as the fall is known."""


class OrchestratorConfig(Section):
    """The RL loop in the coordinator (coordinator/loop/orchestrator.py) and its trainer (trainer/service.py)."""

    enabled: bool = False
    """Run the RL loop: batches of accepted rollouts, a torchrun trainer kept up across steps, a policy per step."""
    num_steps: int = Field(default=10, ge=1)
    """RL steps to train; step s publishes policy version s (the start checkpoint is v0)."""
    groups_per_step: int = Field(default=4, ge=1)
    """Accepted submissions (each `prompts_per_task` prompts x `group_size` samples) in one step's batch."""
    steps_ahead: int | None = Field(default=None, ge=1, le=17)
    """Steps' worth of groups generated ahead of training (leased, awaiting a verdict or accepted, not yet trained
    on); unset: `scheduling.async_level` + 1, so generation never waits for the trainer, though groups the next steps
    cannot take in time go stale unused. 1 generates the next step's groups while the current one trains and
    nothing more: nothing is wasted, which pays where workers share the trainer's cores (the demo). Never more
    than async_level + 1."""
    trainer_launch: TrainerLaunchConfig = TrainerLaunchConfig()
    """How the trainer job is launched: ranks per machine, pinned CPUs, machines, torchrun's rendezvous."""
    trainer: TrainerSection = TrainerSection()
    """Optimizer, parallelism, packing, checkpoint settings; its `model` is policy.start_checkpoint (anything else
    is refused) so the trainer starts from exactly the weights published as v0."""
    loss: LossConfig = LossConfig()
    """The GRPO-family policy loss of every step: how off-policy tokens are masked or clipped, KL weight."""
    normalize_std: bool = False
    """Divide group advantages by the group's reward std (original GRPO)."""
    poll_interval_s: float = Field(default=0.5, gt=0)
    """How often the loop looks at the ledger and the trainer's files while it waits."""
    progress_interval_s: float = Field(default=5.0, gt=0)
    """How often a progress line (step, live workers and validators, reward, accepted/rejected, tokens/s,
    staleness, the batch's mean length and stop/truncated fractions, the newest eval) is printed."""
    exit_when_done: bool = True
    """Stop the coordinator (and its local network) once `num_steps` are trained and published."""
    end_grace_s: float = Field(default=30.0, ge=0, le=3600)
    """After the last step, how long the API keeps answering so live workers and validators hear that the run
    ended (they submit or audit what they hold, then exit 0); it stops sooner once every live node has heard."""
    keep_step_files: int = Field(default=0, ge=0, le=1_000_000)
    """Published steps whose batch file, exported policy, done marker and metrics stay in `data_dir/train`
    (0: removed as soon as the step is published; the ledger keeps each step's submissions and metrics, the
    origin store the policy). Files of steps not yet published are never removed."""
    eval_every_steps: int = Field(default=0, ge=0, le=1_000_000)
    """Evaluate the published policy on the environment's eval split every this many steps, the start policy
    (v0) and the last one too (0: off). Each eval runs `prime-trainer eval` in a child process on a copy of
    the step's policy while the loop goes on; its accuracy, reward, stop fraction and length are recorded with
    the step (console, dashboard, /metrics, `data_dir/metrics.jsonl`)."""
    eval_num_examples: int = Field(default=32, ge=1, le=100_000)
    """Eval split examples of each eval, one sample each at the run's temperature and max_tokens."""
    canary: CanaryConfig = CanaryConfig()
    """Roll the run back to its best evaluated version when an eval falls by more than the eval's noise."""
    breakers: BreakerConfig = BreakerConfig()
    """Checks of each step's update before the trainer applies it; a refused step's groups are audited again in
    full, and the step is trained on what stands or skipped (docs/trust-model.md)."""
    max_consecutive_trips: int = Field(default=3, ge=1, le=1000)
    """After this many refused attempts in a row without an applied step the run pauses: the coordinator stops with
    one line saying why (its state kept; start it again to go on)."""
    reaudit_timeout_s: float = Field(default=600.0, gt=0, le=86400.0)
    """How long a refused step waits for the full re-audit of its groups; undecided by then, the refusal is
    unexplained and the step is skipped."""
    claim_tolerance: float = Field(default=0.05, gt=0, le=100)
    """With behaviour log-probabilities recomputed by the trainer: a submission whose claimed log-probabilities
    differ from the recomputed ones by more than this on a trained token is audited again in full (the claim never
    entered the loss, so the step goes on)."""
    no_signal_filter: bool = True
    """Groups (a prompt's samples) whose rewards are all equal carry no advantage: they are credited to their worker
    but not trained, and a submission with no other group does not count towards `groups_per_step`."""
    no_signal_scan: int = Field(default=3, ge=1, le=100)
    """Bounds the filter: once a step has set aside (`no_signal_scan` - 1) x `groups_per_step` submissions without
    signal it takes the next ones whatever they carry, so a run of easy prompts cannot stall it."""
    rest_after: int = Field(default=3, ge=0, le=1000)
    """A prompt (the same token ids) whose groups carried no signal this many times in a row rests: the ledger issues
    no task with it for `rest_groups` further tasks (0: never rests). Only environments whose prompts repeat (a
    finite dataset read again) are affected."""
    rest_groups: int = Field(default=1000, ge=1, le=1_000_000_000)
    """How many tasks a resting prompt sits out."""
    tracking: TrackingConfig = TrackingConfig()
    """Copies of every `data_dir/metrics.jsonl` row in TensorBoard and W&B (both off by default)."""

    @model_validator(mode="before")
    @classmethod
    def _refuse_moved_keys(cls, data: Any) -> Any:
        if isinstance(data, dict):
            for old, new in MOVED_TRAINER_KEYS.items():
                if old in data:
                    raise ValueError(f"orchestrator.{old} moved: set orchestrator.trainer_launch.{new} instead")
        return data


class LocalNetworkConfig(Section):
    """A whole network on 127.0.0.1 started (and stopped) by the coordinator: the one-command demo."""

    enabled: bool = False
    """Start a relay, workers and a validator as child processes once the API answers."""
    engines: list[Literal["vllm", "hf"]] = Field(default=["vllm", "hf"], max_length=8)
    """One CPU worker per entry, with that inference engine."""
    num_validators: int = Field(default=1, ge=0, le=8)
    """Validators to start (0: none; then nothing is accepted unless one joins from elsewhere)."""
    relay_enabled: bool = True
    """Workers fetch policies through a local relay (else straight from the coordinator's origin)."""
    cpus: list[int] = Field(default=[], max_length=1024)
    """CPU cores the relay, workers and validators are pinned to (empty: not pinned)."""


class CoordinatorConfig(RoleConfig):
    """Everything an operator sets for one run."""

    model_config = SettingsConfigDict(env_prefix="PRIME_COORDINATOR_")

    run_name: str = Field(default="demo", pattern=r"^[A-Za-z0-9_.\-]+$")
    """Name of the run, signed into the run spec; a ledger created under another name refuses to start with it."""
    data_dir: Path = Path("runs/coordinator")
    """Run directory, relative to where the coordinator starts: node key, ledger (SQLite), train dir, policy
    versions, logs. The demo (configs/demo.toml) sets `runs/demo`; give every run a directory of its own."""
    environment: EnvironmentConfig = BuiltinEnvConfig()
    """Where prompts and rewards come from (see environments.config); pinned in the signed run spec."""
    precision: Literal["auto", "float32", "bfloat16", "float16"] = "auto"
    """The dtype the run computes in, signed into the run spec: workers' engines generate in it, validators
    recompute in it (auditing with its TOPLOC calibration, toploc/calibration/), and the trainer publishes its
    policies in it (orchestrator.trainer.checkpoint.export_dtype, unless set) from float32 master weights.
    `auto`: bfloat16 where the coordinator sees a CUDA GPU, else float32. A precision without a calibration for
    every generating engine is refused at start-up."""
    api: ApiConfig = ApiConfig()
    """The ledger API (HTTP): bind address and port, body size limit, per-node and per-IP rate limits, threads."""
    ledger: LedgerConfig = LedgerConfig()
    """The ledger database: SQLite in the data dir (default) or a PostgreSQL URL, its durability and pool."""
    scheduling: SchedulingConfig = SchedulingConfig()
    """What a leased task holds (prompts, samples, sampling settings), lease lifetimes and limits, staleness."""
    trust: TrustConfig = TrustConfig()
    """Which validators may register, when a worker is banned, and the clock skew signed requests may have."""
    sources: SourcesConfig = SourcesConfig()
    """Sybil limits per client source (network prefix): registration rates, probation, requests in flight."""
    policy: PolicyConfig = PolicyConfig()
    """The start checkpoint (policy version 0), the SHARDCAST origin store and how many versions it keeps."""
    p2p: CoordinatorP2PConfig = CoordinatorP2PConfig()
    """The libp2p gossip network on which the coordinator announces each published policy version."""
    validation: ValidationConfig = ValidationConfig()
    """How much of each submission validators re-check, how many must agree, and the built-in validator."""
    orchestrator: OrchestratorConfig = OrchestratorConfig()
    """The RL loop: steps, batch size, the torchrun trainer it keeps up (its launch and training settings)."""
    local_network: LocalNetworkConfig = LocalNetworkConfig()
    """A relay, workers and validators on 127.0.0.1 started as children of the coordinator (the demo)."""
    archive: ArchiveConfig = ArchiveConfig()
    """What `prime-coordinator archive` moves out of the ledger database into Parquet files, and where to."""
    child_logs: ChildLogsConfig = ChildLogsConfig()
    """Size (MiB) and rotation of the log file of each child process the coordinator starts."""

    @model_validator(mode="after")
    def _check(self) -> CoordinatorConfig:
        if self.ledger.url and not self.ledger.url.startswith(("sqlite", "postgresql")):
            raise ValueError("ledger.url must be a sqlite:// or postgresql+psycopg:// URL")
        keep = self.policy.keep_versions
        if keep is not None and keep < self.scheduling.async_level + 1:
            raise ValueError(
                f"policy.keep_versions ({keep}) must be at least scheduling.async_level + 1 "
                f"({self.scheduling.async_level + 1}): workers may still use that many versions"
            )
        if self.local_network.enabled and self.api.host not in ("127.0.0.1", "localhost", "::1"):
            raise ValueError("local_network runs on loopback: set api.host to 127.0.0.1")
        trainer = self.orchestrator.trainer
        if "model" in trainer.model_fields_set and trainer.model != self.policy.start_checkpoint:
            raise ValueError(
                f"orchestrator.trainer.model ({trainer.model!r}) is not a setting of a run: the trainer starts from "
                "the weights published as v0; set policy.start_checkpoint instead"
            )
        # one model setting per run: what `config show` prints for the trainer is what it trains
        self.orchestrator.trainer.model = self.policy.start_checkpoint
        return self

    @property
    def policy_store_dir(self) -> Path:
        return self.policy.store_dir or self.data_dir / "policies"

    @property
    def policy_keep_versions(self) -> int:
        return self.policy.keep_versions or self.scheduling.async_level + 2

    @property
    def archive_dir(self) -> Path:
        return self.archive.dir or self.data_dir / "archive"

    @property
    def ledger_url(self) -> str:
        return self.ledger.url or f"sqlite:///{self.data_dir / 'ledger.db'}"

    @property
    def final_policy_dir(self) -> Path:
        """The last step's policy as a full HF checkpoint (whatever ``policy.full_every`` published it as; a LoRA
        run's with the adapter merged into the base)."""
        return self.data_dir / "final-policy"

    @property
    def final_adapter_dir(self) -> Path:
        """A LoRA run's last adapter (PEFT's layout; load it on the start checkpoint)."""
        return self.data_dir / "final-adapter"
