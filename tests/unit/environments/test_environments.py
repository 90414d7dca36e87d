"""Environments: built-ins, each adapter's prompts and scores, rendering, identity and the start-up refusals."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from pydantic import TypeAdapter, ValidationError

from environments.base import Example, Scores
from environments.builtin import BUILTIN, builtin_environment
from environments.builtin.reverse_text import lcs_length, lcs_ratio
from environments.config import EnvironmentConfig, PythonEnvConfig, ReasoningGymEnvConfig, VerifiersEnvConfig
from environments.episode import EpisodeError, MultiTurnEnvironment
from environments.loader import (
    check_deterministic,
    environment_identity,
    identity_mismatch,
    load_checked_environment,
    load_environment,
)
from environments.pinning import run_environment
from environments.render import prompt_text
from protocol.errors import ConfigError
from protocol.schemas import RunSpec

ENVS_DIR = Path(__file__).resolve().parents[2] / "envs"
TASKSETS_DIR = ENVS_DIR / "site"
SPELL = {"type": "reasoning_gym", "dataset": "spell_backward", "size": 50, "seed": 3, "args": {"max_word_len": 5}}


def parse(section: dict[str, Any]) -> EnvironmentConfig:
    return TypeAdapter(EnvironmentConfig).validate_python(section)


def test_builtin_examples_are_pure_functions_of_seed_and_index() -> None:
    for name in BUILTIN:
        first, second = builtin_environment(name, seed=3), builtin_environment(name, seed=3)
        assert [first.example(i) for i in range(20)] == [second.example(i) for i in range(20)]
        assert [first.example(i) for i in range(20)] != [builtin_environment(name, 4).example(i) for i in range(20)]
    with pytest.raises(ValueError, match="known: arithmetic, calculator, count_shapes, reverse_text, sort_digits"):
        builtin_environment("nope")


def test_builtin_eval_set_is_fixed_and_separate() -> None:
    environment = builtin_environment("reverse_text")
    evals = environment.eval_examples(50)
    assert evals == builtin_environment("reverse_text").eval_examples(50)
    train_prompts = {environment.example(i).prompt for i in range(2000)}
    assert sum(ex.prompt in train_prompts for ex in evals) <= 1


@pytest.mark.parametrize(
    ("a", "b", "length"), [("", "", 0), ("abc", "", 0), ("abcde", "ace", 3), ("abc", "cba", 1), ("hello", "hello", 5)]
)
def test_lcs_length(a: str, b: str, length: int) -> None:
    assert lcs_length(a, b) == length
    assert lcs_length(b, a) == length


def test_builtin_scores_are_named() -> None:
    reverse_text = builtin_environment("reverse_text")
    example = Example(index=0, prompt="reverse: abc de\n", answer="ed cba")
    assert reverse_text.score(example, " ed cba \n") == Scores({"lcs_ratio": 1.0}, {"lcs_ratio": 1.0})
    assert reverse_text.reward(example, "abc de") == pytest.approx(lcs_ratio("abc de", "ed cba"))
    arithmetic = builtin_environment("arithmetic")
    ex = arithmetic.example(4)
    assert arithmetic.score(ex, ex.answer or "").rewards == {"exact_match": 1.0}
    assert arithmetic.reward(ex, (ex.answer or "") + "0") == 0.0
    assert [e.index for e in arithmetic.sft_examples(10, 2)] == [10, 11]


def test_sort_digits_wants_the_exact_sorted_list_on_the_first_line() -> None:
    sort_digits = builtin_environment("sort_digits")
    example = Example(index=0, prompt="sort 3 9 1 4 1=", answer="1 1 3 4 9")
    drawn = sort_digits.draw(7, sort_digits.rng(7))
    assert isinstance(drawn.prompt, str)
    assert drawn.answer == " ".join(sorted(drawn.prompt.removeprefix("sort ").removesuffix("=").split()))
    assert sort_digits.score(example, " 1 1 3 4 9 \nanything after") == Scores.single("exact_match", 1.0)
    for wrong in ("1 3 4 9", "1 1 3 4 9 9", "9 4 3 1 1", "11349", "", "\n"):
        assert sort_digits.reward(example, wrong) == 0.0, wrong
    prompts = [str(sort_digits.example(i).prompt) for i in range(200)]
    assert all(p.startswith("sort ") and p.endswith("=") and len(p.split()) == 6 for p in prompts)
    assert len(set(prompts)) > 190  # 10^5 inputs: a run does not see the same few again and again


def test_scores_refuse_non_finite_and_mismatched_names() -> None:
    assert Scores({"a": 1.0, "b": 0.5}, {"a": 0.5, "b": 2.0}).total == pytest.approx(1.5)
    with pytest.raises(ValueError, match="not a finite number"):
        Scores.single("a", float("nan"))
    with pytest.raises(ValueError, match="name different rewards"):
        Scores({"a": 1.0}, {"b": 1.0})


def test_config_is_a_discriminated_union_refusing_unknown_fields() -> None:
    assert isinstance(parse(SPELL), ReasoningGymEnvConfig)
    assert isinstance(parse({"type": "python", "target": "tests.envs.words:KeywordEnvironment"}), PythonEnvConfig)
    with pytest.raises(ValidationError):
        parse({"type": "reasoning_gym", "dataset": "spell_backward", "sise": 3})
    with pytest.raises(ValidationError):
        parse({"type": "gym", "name": "x"})


def test_reasoning_gym_adapter_scores_with_the_datasets_own_score_answer() -> None:
    import reasoning_gym

    config = parse(SPELL)
    environment = load_checked_environment(config)
    dataset = reasoning_gym.create_dataset("spell_backward", size=50, seed=3, max_word_len=5)
    example = environment.example(53)  # row 3: index wraps at size
    assert example.data == dataset[3]
    assert example.prompt[-1].content == dataset[3]["question"]  # type: ignore[union-attr]
    assert environment.score(example, f" {dataset[3]['answer']}\n").rewards == {"score_answer": 1.0}
    assert environment.reward(example, "zzzz") == dataset.score_answer(answer="zzzz", entry=dataset[3])
    assert environment.eval_example(0).data != example.data and environment.eval_example(0).index < 0
    identity = environment_identity(config)
    assert (identity.kind, identity.name, identity.package, identity.package_version) == (
        "reasoning_gym",
        "spell_backward",
        "reasoning-gym",
        "0.1.25",
    )


def test_reasoning_gym_refuses_an_unknown_dataset() -> None:
    with pytest.raises(ConfigError, match="no_such_dataset"):
        load_environment(parse({"type": "reasoning_gym", "dataset": "no_such_dataset"}))


def test_a_multi_turn_environment_gets_its_signed_limits_and_must_replay() -> None:
    section = {"type": "python", "target": "tests.support.episodes:Counting", "episode": {"max_turns": 6}}
    environment = load_environment(parse(section))
    assert isinstance(environment, MultiTurnEnvironment) and environment.limits.max_turns == 6
    assert environment_identity(parse(section)).arguments["episode"] == {
        "max_turns": 6,
        "max_reply_chars": 2000,
        "reply_time_s": 1.0,
    }
    assert load_checked_environment(parse(section)).name == "counting"  # its replies are the transcript's alone
    drifting = {**section, "target": "tests.support.episodes:Drifting"}
    with pytest.raises(ConfigError, match="'drifting' is not replayable: the episode of example 0"):
        load_checked_environment(parse(drifting))
    chatty = {**section, "target": "tests.support.episodes:Chatty"}
    with pytest.raises(ConfigError, match=r"'chatty' .*5000 characters, over the 2000 limit"):
        load_checked_environment(parse(chatty))
    calculator = load_checked_environment(parse({"type": "builtin", "name": "calculator"}))
    assert isinstance(calculator, MultiTurnEnvironment) and calculator.limits.max_turns == 4
    with pytest.raises(ValidationError, match="max_turns"):
        parse({"type": "builtin", "episode": {"max_turns": 257}})


def test_python_adapter_loads_the_operators_class_with_its_arguments() -> None:
    config = parse({"type": "python", "target": "tests.envs.words:KeywordEnvironment", "args": {"limit": 2}})
    environment = load_checked_environment(config)
    example = environment.example(1)
    assert example.prompt == "reverse: dog\n"
    assert environment.score(example, "god") == Scores({"exact": 1.0, "short": 0.0}, {"exact": 0.75, "short": 0.25})
    identity = environment_identity(config)
    assert identity.package == "tests" and identity.package_version.startswith("source-sha256:")
    with pytest.raises(ConfigError, match="cannot be loaded"):
        load_environment(parse({"type": "python", "target": "no_such_module:Env"}))
    with pytest.raises(ConfigError, match=r"not an environments\.base\.Environment"):
        load_environment(parse({"type": "python", "target": "tests.envs.words:random"}))


def test_a_non_deterministic_reward_is_refused_naming_it() -> None:
    flaky = load_environment(parse({"type": "python", "target": "tests.envs.words:FlakyEnvironment"}))
    with pytest.raises(ConfigError, match="reward luck is not deterministic"):
        check_deterministic(flaky)


def test_identity_pins_arguments_and_versions() -> None:
    base = environment_identity(parse(SPELL))
    assert base == environment_identity(parse(SPELL))
    other_args = environment_identity(parse({**SPELL, "args": {"max_word_len": 6}}))
    assert other_args.config_hash != base.config_hash
    assert "set [environment] to the run's" in (identity_mismatch(base, other_args) or "")
    other_version = base.model_copy(update={"package_version": "0.1.24", "config_hash": "0" * 64})
    assert "install reasoning-gym==0.1.24" in (identity_mismatch(other_version, base) or "")
    assert identity_mismatch(base, base) is None


def test_a_node_loads_the_run_spec_environment_or_refuses_with_the_fix() -> None:
    spec = RunSpec(run_name="r", environment=environment_identity(parse(SPELL)))
    assert run_environment(spec, None).name == "spell_backward"
    with pytest.raises(ConfigError, match="set \\[environment\\]"):
        run_environment(spec, parse({**SPELL, "seed": 4}))
    newer = spec.model_copy(
        update={"environment": spec.environment.model_copy(update={"package_version": "9.9", "config_hash": "1" * 64})}
    )
    with pytest.raises(ConfigError, match=r"install reasoning-gym==9\.9"):
        run_environment(newer, None)


def test_chat_template_renders_system_prompt_messages_and_generation_prompt() -> None:
    class ChatTokenizer:
        chat_template = "{% for m in messages %}<{{ m.role }}>{{ m.content }}{% endfor %}<assistant>"

        def apply_chat_template(self, messages: list[dict[str, str]], **kwargs: Any) -> str:
            assert kwargs == {"tokenize": False, "add_generation_prompt": True}
            return "".join(f"<{m['role']}>{m['content']}" for m in messages) + "<assistant>"

    class PlainTokenizer:
        chat_template = None

    environment = load_environment(parse({**SPELL, "system_prompt": "Answer only."}))
    example = environment.example(0)
    question = example.prompt[-1].content  # type: ignore[union-attr]
    assert prompt_text(environment, example, ChatTokenizer()) == f"<system>Answer only.<user>{question}<assistant>"
    assert prompt_text(environment, example, PlainTokenizer()) == f"Answer only.\n{question}\n"
    reverse_text = builtin_environment("reverse_text")
    plain = reverse_text.example(0)
    assert prompt_text(reverse_text, plain, PlainTokenizer()) == plain.prompt
    assert prompt_text(reverse_text, plain, ChatTokenizer()) == f"<user>{plain.prompt}<assistant>"


def test_verifiers_v1_taskset_is_scored_offline_with_its_own_rewards(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(TASKSETS_DIR))
    config = parse({"type": "verifiers", "taskset": "vf_echo_taskset", "args": {"count": 8}, "eval_fraction": 0.25})
    assert isinstance(config, VerifiersEnvConfig)
    environment = load_checked_environment(config)
    example = environment.example(1)
    assert [(m.role, m.content) for m in example.prompt] == [("user", "reverse: dog")]  # type: ignore[union-attr]
    assert environment.score(example, "god") == Scores(
        {"exact": 1.0, "starts_right": 1.0}, {"exact": 0.75, "starts_right": 0.25}
    )
    assert environment.reward(example, "gxx") == pytest.approx(0.25)
    assert environment.example(7).data == environment.example(1).data  # 6 training tasks, 2 held out for eval
    assert environment.eval_example(0).prompt[-1].content == "reverse: hide"  # type: ignore[union-attr]
    identity = environment_identity(config)
    assert identity.kind == "verifiers" and "verifiers 0.3.1" in identity.package_version


def test_verifiers_taskset_needing_a_sandbox_is_refused_naming_the_reward(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(TASKSETS_DIR))
    with pytest.raises(ConfigError, match="reward 'tests_pass' needs a sandbox"):
        load_environment(parse({"type": "verifiers", "taskset": "vf_sandbox_taskset"}))
    with pytest.raises(ConfigError, match="cannot be loaded"):
        load_environment(parse({"type": "verifiers", "taskset": "no_such_taskset"}))


V0_ECHO = {"type": "verifiers", "api": "v0", "taskset": "vf0-echo-env"}


def test_verifiers_api_defaults_to_v1_and_refuses_others() -> None:
    v1 = parse({"type": "verifiers", "taskset": "vf_echo_taskset"})
    assert isinstance(v1, VerifiersEnvConfig) and v1.api == "v1"
    with pytest.raises(ValidationError):
        parse({**V0_ECHO, "api": "v2"})


def test_verifiers_v0_environment_is_scored_offline_with_its_rubric(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(TASKSETS_DIR))
    config = parse(V0_ECHO)
    environment = load_checked_environment(config)
    example = environment.example(1)
    assert [(m.role, m.content) for m in example.prompt] == [  # type: ignore[union-attr]
        ("system", "Reverse the word."),
        ("user", "reverse: on"),
        ("assistant", "no"),
        ("user", "reverse: dog"),
    ]
    assert example.answer == "god"
    weights = {"exact": 0.75, "starts_right": 0.25, "num_turns": 0.0}
    # the parser strips the completion; num_turns is the metric every v0 multi-turn env adds (weight 0)
    assert environment.score(example, " god\n") == Scores(
        {"exact": 1.0, "starts_right": 1.0, "num_turns": 1.0}, weights
    )
    assert environment.score(example, "gxx") == Scores({"exact": 0.0, "starts_right": 1.0, "num_turns": 1.0}, weights)
    assert environment.reward(example, "") == 0.0
    assert environment.example(7).data == example.data  # 6 training rows; the eval_dataset is the eval split
    assert environment.eval_example(0).prompt[-1].content == "reverse: hide"  # type: ignore[union-attr]
    assert environment.eval_example(0).answer == "edih"
    again = load_environment(config)
    assert [again.example(i) for i in range(8)] == [environment.example(i) for i in range(8)]
    identity = environment_identity(config)
    assert identity.kind == "verifiers" and identity.arguments["api"] == "v0"
    assert identity.package == "vf0_echo_env" and "verifiers 0.3.1 v0 API" in identity.package_version
    v1_identity = environment_identity(parse({**V0_ECHO, "api": "v1"}))
    assert v1_identity.config_hash != identity.config_hash
    assert "set [environment] to the run's" in (identity_mismatch(identity, v1_identity) or "")


def test_verifiers_v0_scores_are_the_rubrics_own(monkeypatch: pytest.MonkeyPatch) -> None:
    """The rewards equal what the environment's rubric computes itself on the same finished rollout."""
    import asyncio

    from environments.verifiers_v0 import VerifiersV0Environment

    monkeypatch.syspath_prepend(str(TASKSETS_DIR))
    environment = load_environment(parse(V0_ECHO))
    assert isinstance(environment, VerifiersV0Environment)
    for index, completion in [(0, "cba"), (2, "bxc"), (3, "nope")]:
        example = environment.example(index)
        state = environment._state(environment._row(example), completion)
        asyncio.run(environment.env.rubric.score_rollout(state))
        scores = environment.score(example, completion)
        assert dict(scores.rewards) == state["metrics"]
        assert scores.total == pytest.approx(state["reward"])


def test_verifiers_v0_loads_off_the_main_thread_and_keeps_the_signal_handlers(monkeypatch: pytest.MonkeyPatch) -> None:
    """v0 environments install SIGINT/SIGTERM handlers when built; validators load them in a worker thread."""
    import signal
    import threading

    monkeypatch.syspath_prepend(str(TASKSETS_DIR))
    before = signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)
    load_environment(parse(V0_ECHO))
    assert (signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)) == before
    loaded: list[Any] = []
    thread = threading.Thread(target=lambda: loaded.append(load_environment(parse(V0_ECHO))))
    thread.start()
    thread.join(timeout=120)
    assert loaded and loaded[0].example(0) == load_environment(parse(V0_ECHO)).example(0)


@pytest.mark.parametrize(
    ("kind", "refusal"),
    [
        ("judge", "reward 'judged' needs a judge model"),
        ("group", "reward 'relative' is a group reward"),
        ("missing", "reward 'runs_tests' needs test_cases, which validators cannot provide"),
        ("tools", "cannot be replayed by validators: environment ToolEnv is a ToolEnv: its tools are called"),
        ("clocked", "is not replayable: the episode of example 0"),
    ],
)
def test_verifiers_v0_environment_validators_cannot_score_or_replay_is_refused_with_the_reason(
    monkeypatch: pytest.MonkeyPatch, kind: str, refusal: str
) -> None:
    monkeypatch.syspath_prepend(str(TASKSETS_DIR))
    section = {"type": "verifiers", "api": "v0", "taskset": "vf0_refused_env", "args": {"kind": kind}}
    offline = "" if kind in ("tools", "clocked") else "cannot be scored offline by validators: "
    with pytest.raises(ConfigError, match=offline + refusal) as refused:
        load_checked_environment(parse({**section, "eval_fraction": 0.34}))
    assert "\n" not in refused.value.message


V0_GUESS = {"type": "verifiers", "api": "v0", "taskset": "vf0-guess-env"}


def test_a_verifiers_v0_multi_turn_env_is_replayed_from_the_transcript(monkeypatch: pytest.MonkeyPatch) -> None:
    from environments.episode import PolicyTurn, replay

    monkeypatch.syspath_prepend(str(TASKSETS_DIR))
    environment = load_checked_environment(parse(V0_GUESS))
    assert isinstance(environment, MultiTurnEnvironment)
    example = environment.example(1)
    assert example.answer == "5"
    episode = replay(environment, example, [PolicyTurn(t, False) for t in ("1", "9", "5")])
    assert [(m.role, m.content) for m in episode.messages[2:]] == [
        ("assistant", "1"),
        ("user", "higher"),
        ("assistant", "9"),
        ("user", "lower"),
        ("assistant", "5"),
    ]
    assert episode.ended_by == "environment"  # the environment's own max_turns (3), checked before a reply
    weights = {"correct": 1.0, "few_guesses": 0.5, "told_correct": 0.25, "num_turns": 0.0}
    scores = environment.score_episode(example, episode.messages)
    assert scores == Scores({"correct": 1.0, "few_guesses": 1 / 3, "told_correct": 0.0, "num_turns": 3.0}, weights)
    # a correct guess ends the game with the environment's final response, which the rubric sees
    quick = replay(environment, example, [PolicyTurn("7", False), PolicyTurn("5", False)])
    assert quick.ended_by == "environment" and quick.messages[-1].content == "5"
    assert environment.score_episode(example, quick.messages).rewards["told_correct"] == 1.0
    # every reply is rebuilt from the transcript: the state of an earlier call is never reused
    assert environment.reply(example, episode.messages[:3]) == environment.reply(example, episode.messages[:3])
    with pytest.raises(EpisodeError, match="ended the episode after policy turn 1 of 2"):
        replay(environment, example, [PolicyTurn("5", False), PolicyTurn("5", False)])


def test_verifiers_v0_non_deterministic_reward_or_missing_module_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(TASKSETS_DIR))
    section = {
        "type": "verifiers",
        "api": "v0",
        "taskset": "vf0_refused_env",
        "args": {"kind": "flaky"},
        "eval_fraction": 0.34,
    }
    with pytest.raises(ConfigError, match="reward luck is not deterministic"):
        load_checked_environment(parse(section))
    with pytest.raises(ConfigError, match="v0 environment 'no-such-env' cannot be loaded"):
        load_environment(parse({**V0_ECHO, "taskset": "no-such-env"}))
    with pytest.raises(ConfigError, match="v0 environment 'vf_echo_taskset' cannot be loaded"):
        load_environment(parse({**V0_ECHO, "taskset": "vf_echo_taskset"}))  # a v1 taskset: no load_environment
    import sys

    monkeypatch.setitem(sys.modules, "verifiers.legacy.utils.env_utils", None)  # as in verifiers 0.4.0: no v0
    with pytest.raises(ConfigError, match=r"needs verifiers' v0 API .*pip install verifiers==0\.3\.1"):
        load_environment(parse(V0_ECHO))


@pytest.mark.parametrize(
    "path", sorted((Path(__file__).resolve().parents[3] / "configs" / "environments").glob("*.toml"))
)
def test_every_example_environment_section_parses(path: Path) -> None:
    import tomllib

    section = tomllib.loads(path.read_text())["environment"]
    kind, _, variant = path.stem.partition("-")  # verifiers-v0.toml: the verifiers adapter with api = "v0"
    parsed = parse(section)
    assert parsed.type == kind
    if kind == "verifiers" and variant:
        assert isinstance(parsed, VerifiersEnvConfig) and parsed.api == variant
    if variant == "calculator":  # builtin-calculator.toml: the multi-turn built-in, with its episode limits
        assert parsed.episode.max_turns == 4


@pytest.mark.parametrize(
    ("fault", "summary"),
    [
        ("raise", "ZeroDivisionError: division by zero\x1b[2J\x1b[31m"),
        ("nan", "reward 'ratio' is nan, not a finite number"),
        ("inf", "reward 'ratio' is inf, not a finite number"),
        ("text", "reward 'ratio' is 'many', not a finite number"),
    ],
)
def test_a_reward_that_raises_anything_or_scores_a_non_number_is_refused_in_one_line(fault: str, summary: str) -> None:
    section = {"type": "python", "target": "tests.envs.words:FaultyEnvironment", "args": {"fault": fault}}
    faulty = load_environment(parse({**section, "args": {"fault": fault, "max_chars": -1}}))
    with pytest.raises(ConfigError) as refused:
        check_deterministic(faulty)
    assert refused.value.message.startswith("environment 'faulty' cannot score train example 0")
    assert refused.value.message.endswith(summary) and "\n" not in refused.value.message
    check_deterministic(load_environment(parse(section)))  # failing only past the probes: passes at start-up
