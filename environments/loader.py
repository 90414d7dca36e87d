"""Building the configured environment, its identity for the run spec, and the start-up checks.

:func:`load_environment` builds the adapter the ``[environment]`` section names and refuses with
a one-line :class:`protocol.errors.ConfigError` what this process cannot serve or score (a
package that is not installed, a dataset that does not exist, a reward that needs a sandbox).
:func:`environment_identity` is what the coordinator signs into the run spec and what
validators compare with their own. :func:`check_deterministic` scores a few examples twice and
refuses an environment whose prompts or rewards differ between the two passes, or that raises
anything or scores with something other than finite numbers, in one line naming the exception.
A multi-turn environment also plays a few probe episodes twice (:func:`check_replayable`): one
whose replies differ, fail or break the run's episode limits is refused, since validators replay
every episode a worker submits.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import importlib.util
from pathlib import Path

from environments.base import Environment, Example, failure_summary, finite_scores
from environments.builtin import builtin_environment
from environments.config import (
    BuiltinEnvConfig,
    EnvironmentConfig,
    PythonEnvConfig,
    ReasoningGymEnvConfig,
    VerifiersEnvConfig,
)
from environments.episode import EnvironmentReplyError, EpisodeRun, MultiTurnEnvironment, PolicyTurn
from environments.python_env import load_python_environment
from environments.reasoning_gym_env import ReasoningGymEnvironment
from environments.verifiers_env import VerifiersEnvironment
from environments.verifiers_v0 import module_name
from environments.verifiers_v0_episodes import verifiers_v0_environment
from protocol.errors import ConfigError
from protocol.schemas import EnvironmentIdentity
from protocol.signing import canonical_json

PROJECT_PACKAGE = "prime-network"
ENVS_EXTRA = "pip install 'prime-network[envs]'"
"""What installs the ecosystem adapters' packages."""

SOURCE_VERSION = "source-sha256:"
"""The version of a module no installed distribution provides: a hash of its source file."""

DETERMINISM_EXAMPLES = 3
"""Examples scored twice at start-up."""


def _version(distribution: str) -> str | None:
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return None


def _require(distribution: str, module: str) -> str:
    version = _version(distribution)
    if version is None or importlib.util.find_spec(module) is None:
        raise ConfigError(f"the environment needs the {distribution} package, which is not installed: {ENVS_EXTRA}")
    return version


def load_environment(config: EnvironmentConfig) -> Environment:
    """The environment ``config`` names, with the section's truncation rule; ConfigError (one line, with the fix)
    when this process cannot have it."""
    environment = _load_adapter(config)
    environment.truncated = config.truncated
    if isinstance(environment, MultiTurnEnvironment):
        environment.limits = config.episode
    return environment


def _load_adapter(config: EnvironmentConfig) -> Environment:
    if isinstance(config, BuiltinEnvConfig):
        return builtin_environment(config.name, config.seed)
    if isinstance(config, ReasoningGymEnvConfig):
        _require("reasoning-gym", "reasoning_gym")
        try:
            return ReasoningGymEnvironment(config)
        except (ValueError, TypeError, KeyError) as exc:
            raise ConfigError(f"reasoning-gym dataset {config.dataset!r} with {config.args} is refused: {exc}") from exc
    if isinstance(config, VerifiersEnvConfig):
        _require("verifiers", "verifiers")
        if config.api == "v0":
            return verifiers_v0_environment(config)
        return VerifiersEnvironment(config)
    return load_python_environment(config)


def _module_package(module_name: str) -> tuple[str, str]:
    """(distribution, version) of the module's top-level package; a source hash when it is not installed."""
    top = module_name.split(".", 1)[0]
    distributions = importlib.metadata.packages_distributions().get(top, [])
    for distribution in distributions:
        version = _version(distribution)
        if version is not None:
            return distribution, version
    spec = importlib.util.find_spec(module_name)
    origin = Path(spec.origin) if spec is not None and spec.origin else None
    if origin is None or not origin.is_file():
        return top, "unknown"
    return top, SOURCE_VERSION + hashlib.sha256(origin.read_bytes()).hexdigest()[:16]


def environment_identity(config: EnvironmentConfig) -> EnvironmentIdentity:
    """The identity that pins ``config`` across roles (the packages must be importable to resolve versions)."""
    name: str
    if isinstance(config, BuiltinEnvConfig):
        name, package, version = config.name, PROJECT_PACKAGE, _version(PROJECT_PACKAGE) or "unknown"
    elif isinstance(config, ReasoningGymEnvConfig):
        name, package, version = config.dataset, "reasoning-gym", _version("reasoning-gym") or "missing"
    elif isinstance(config, VerifiersEnvConfig):
        name = config.taskset
        if config.api == "v0":
            module = module_name(config.taskset)
        else:
            module = config.taskset.rsplit("/", 1)[-1].split("@", 1)[0].replace("-", "_").lower()
        package, taskset_version = _module_package(module)
        version = f"{taskset_version}; verifiers {_version('verifiers') or 'missing'} {config.api} API"
    else:
        assert isinstance(config, PythonEnvConfig)
        name = config.target
        package, version = _module_package(config.target.partition(":")[0])
    arguments = config.model_dump(mode="json")
    fields = {"kind": config.type, "name": name, "arguments": arguments, "package": package, "package_version": version}
    return EnvironmentIdentity(config_hash=hashlib.sha256(canonical_json(fields)).hexdigest(), **fields)


def identity_mismatch(expected: EnvironmentIdentity, found: EnvironmentIdentity) -> str | None:
    """Why ``found`` is not the run's environment ``expected`` (None: it is), naming what to change."""
    if expected.config_hash == found.config_hash:
        return None
    if (expected.kind, expected.name, expected.arguments) != (found.kind, found.name, found.arguments):
        return (
            f"the run's environment is {expected.kind} {expected.name!r} with {dict(expected.arguments)}, "
            f"this node's is {found.kind} {found.name!r} with {dict(found.arguments)}: set [environment] to the run's"
        )
    if expected.package_version.startswith(SOURCE_VERSION) or found.package_version.startswith(SOURCE_VERSION):
        return (
            f"the run's environment code is {expected.package} {expected.package_version}, this node's is "
            f"{found.package} {found.package_version}: run the coordinator's version of {expected.package}"
        )
    if (expected.package, expected.package_version) != (found.package, found.package_version):
        return (
            f"the run's environment comes from {expected.package} {expected.package_version}, this node has "
            f"{found.package} {found.package_version}: install {expected.package}=={expected.package_version}"
        )
    return f"the run's environment hash is {expected.config_hash[:12]}, this node's is {found.config_hash[:12]}"


def _probe_completions(example: Example) -> list[str]:
    completions = ["", "0", "the answer"]
    if example.answer is not None:
        completions.insert(0, example.answer)
    return completions


def check_deterministic(environment: Environment, num_examples: int = DETERMINISM_EXAMPLES) -> None:
    """ConfigError unless examples and their scores come out the same twice (train and eval streams)."""
    indices = [("train", i) for i in range(num_examples)] + [("eval", i) for i in range(num_examples)]
    for split, i in indices:

        def fetch(split: str = split, i: int = i) -> Example:
            return environment.example(i) if split == "train" else environment.eval_example(i)

        try:
            first, second = fetch(), fetch()
        except Exception as exc:  # the environment's own code: whatever it raises is its failure
            raise ConfigError(
                f"environment {environment.name!r} cannot build {split} example {i}: {failure_summary(exc)}"
            ) from exc
        if first != second:
            raise ConfigError(f"environment {environment.name!r}: {split} example {i} differs between two reads")
        for completion in _probe_completions(first):
            try:
                scores = [finite_scores(environment.score(first, completion)) for _ in range(2)]
            except Exception as exc:  # the environment's own code: whatever it raises is its failure
                raise ConfigError(
                    f"environment {environment.name!r} cannot score {split} example {i} "
                    f"(completion {completion!r}): {failure_summary(exc)}"
                ) from exc
            once, twice = scores
            if dict(once.rewards) != dict(twice.rewards) or dict(once.weights) != dict(twice.weights):
                changed = sorted(
                    k for k in {*once.rewards, *twice.rewards} if once.rewards.get(k) != twice.rewards.get(k)
                )
                raise ConfigError(
                    f"environment {environment.name!r}: reward {', '.join(changed) or 'weights'} is not deterministic "
                    f"({split} example {i} scored twice: {dict(once.rewards)} then {dict(twice.rewards)}); "
                    "validators could not agree on it"
                )


def _probe_episode(environment: MultiTurnEnvironment, example: Example, turn: str) -> tuple[object, ...]:
    """The episode whose every policy turn is ``turn`` (until the environment or the turn limit ends it): its
    transcript, how it ended and its scores."""
    run = EpisodeRun(environment, example)
    while run.ended_by is None:
        run.add_turn(PolicyTurn(turn, False))
    scores = finite_scores(environment.score_episode(example, run.messages))
    return run.messages, run.ended_by, dict(scores.rewards), dict(scores.weights)


def check_replayable(environment: MultiTurnEnvironment, num_examples: int = DETERMINISM_EXAMPLES) -> None:
    """ConfigError unless a few probe episodes play out the same twice: the same replies, the same end, the same
    scores, every reply within the run's episode limits. Validators replay every episode a worker submits; an
    environment whose replies vary (a clock, the network, a random draw, state kept between calls) would have
    honest workers rejected."""
    for i in range(num_examples):
        example = environment.example(i)
        for turn in [*_probe_completions(example), *environment.probe_turns(example)]:
            try:
                once, twice = _probe_episode(environment, example, turn), _probe_episode(environment, example, turn)
            except EnvironmentReplyError as exc:
                raise ConfigError(f"environment {environment.name!r} (example {i}, turns {turn!r}): {exc}") from exc
            except Exception as exc:  # the environment's own code: whatever it raises is its failure
                raise ConfigError(
                    f"environment {environment.name!r} cannot score the episode of example {i} "
                    f"(turns {turn!r}): {failure_summary(exc)}"
                ) from exc
            if once != twice:
                raise ConfigError(
                    f"environment {environment.name!r} is not replayable: the episode of example {i} with turns "
                    f"{turn!r} played out differently twice; validators replay every episode, so its replies must "
                    "be a function of the transcript alone (no clock, network, randomness or kept state)"
                )


def load_checked_environment(config: EnvironmentConfig) -> Environment:
    """:func:`load_environment`, then :func:`check_deterministic` (and for a multi-turn environment
    :func:`check_replayable`): what a role runs at start-up."""
    environment = load_environment(config)
    check_deterministic(environment)
    if isinstance(environment, MultiTurnEnvironment):
        check_replayable(environment)
    return environment
