"""`prime-trainer sft` and `prime-trainer eval` end to end on the built-in model (in-process)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from protocol.errors import ConfigError
from trainer.cli import app


def test_sft_then_eval(tiny_model_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "sft"
    sets = ["--set", f'model="{tiny_model_dir}"', "--set", "num_steps=3", "--set", "eval_examples=8"]
    result = CliRunner().invoke(app, ["sft", *sets, "--output-dir", str(out)])
    assert result.exit_code == 0, result.output
    assert (out / "policy" / "model.safetensors").is_file()
    assert (out / "checkpoints" / "latest").read_text().strip() == "step_3"
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records if "loss" in r] == [1, 2, 3]
    assert "eval_completion_loss" in records[-1]

    report_path = tmp_path / "eval" / "report.json"
    argv = ["eval", "--model", str(out / "policy"), "--num-examples", "6", "--output", str(report_path)]
    result = CliRunner().invoke(app, argv)
    assert result.exit_code == 0, result.output
    report = json.loads(next(line for line in result.output.splitlines() if line.startswith("{")))
    assert json.loads(report_path.read_text()) == report  # the same report, in the file the coordinator reads
    assert report["num_examples"] == 6
    assert 0.0 <= report["accuracy"] <= report["reward_mean"] + 1e-9 <= 1.0 + 1e-9
    assert report["mean_completion_tokens"] > 0


def test_eval_of_a_missing_model_fails_clearly(tmp_path: Path) -> None:
    result = CliRunner().invoke(app, ["eval", "--model", str(tmp_path / "none")])
    # in-process the ConfigError surfaces as such; the installed command turns it into one line and exit code 2
    assert isinstance(result.exception, ConfigError)
    assert "does not exist" in str(result.exception)


def test_lora_sft_writes_the_adapter_and_the_merged_model(tiny_model_dir: Path, tmp_path: Path) -> None:
    """With [lora] on, policy/ is a PEFT adapter that PEFT loads on the base, and merged/ is that same model as
    an ordinary checkpoint: both give the same logits."""
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    out = tmp_path / "sft"
    sets = ["--set", f'model="{tiny_model_dir}"', "--set", "num_steps=2", "--set", "lora.enabled=true"]
    sets += ["--set", "lora.rank=4", "--set", "optimizer.lr=0.01"]
    result = CliRunner().invoke(app, ["sft", *sets, "--output-dir", str(out)])
    assert result.exit_code == 0, result.output
    assert sorted(p.name for p in (out / "policy").iterdir()) == ["adapter_config.json", "adapter_model.safetensors"]
    assert json.loads((out / "policy" / "adapter_config.json").read_text())["r"] == 4

    ids = torch.tensor([[5, 17, 300, 2, 9, 44]])
    base = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    base_logits = base(ids).logits
    adapted = PeftModel.from_pretrained(base, out / "policy").eval()
    merged = AutoModelForCausalLM.from_pretrained(out / "merged", dtype=torch.float32).eval()
    with torch.no_grad():
        want = adapted(ids).logits
        torch.testing.assert_close(merged(ids).logits, want, atol=1e-5, rtol=1e-5)
    assert (want - base_logits).abs().max() > 1e-4  # the adapter trained: not the base

    reports = []
    for model in (out / "policy", out / "merged"):  # the adapter on its base, and the merged model: one policy
        argv = ["eval", "--model", str(model), "--num-examples", "4", "--set", "max_tokens=8"]
        result = CliRunner().invoke(app, argv)
        assert result.exit_code == 0, result.output
        report = json.loads(next(line for line in result.output.splitlines() if line.startswith("{")))
        reports.append({k: v for k, v in report.items() if k != "model"})
    assert reports[0] == reports[1]


def test_start_checkpoint_builds_any_named_builtin_ahead_of_time(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PRIME_BUILTIN_DIR", str(tmp_path / "cache"))
    result = CliRunner().invoke(app, ["start-checkpoint", "tiny-qwen2", "builtin:small-qwen3"])
    assert result.exit_code == 0, result.output
    assert result.stdout.split() == [str(tmp_path / "cache" / "tiny-qwen2"), str(tmp_path / "cache" / "small-qwen3")]
    assert (tmp_path / "cache" / "small-qwen3" / "model.safetensors").is_file()

    out = tmp_path / "elsewhere"
    result = CliRunner().invoke(app, ["start-checkpoint", "builtin:tiny-qwen2", "--output-dir", str(out)])
    assert result.exit_code == 0, result.output
    assert (out / "model.safetensors").read_bytes() == (
        tmp_path / "cache" / "tiny-qwen2" / "model.safetensors"
    ).read_bytes()


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["builtin:gpt5"], "'builtin:gpt5' is not a built-in model; the built-ins are builtin:tiny-qwen2, "),
        (["tiny-qwen2", "small-qwen3", "--output-dir", "x"], "--output-dir takes one model, and 2 are named"),
    ],
)
def test_start_checkpoint_refuses_what_it_cannot_build_in_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, argv: list[str], message: str
) -> None:
    monkeypatch.setenv("PRIME_BUILTIN_DIR", str(tmp_path / "cache"))
    result = CliRunner().invoke(app, ["start-checkpoint", *argv])
    assert result.exit_code == 2, result.output
    assert message in result.output and len(result.output.strip().splitlines()) == 1, result.output
    assert not (tmp_path / "cache").exists()
