"""Config tree: defaults, YAML + dotted overrides, unknown keys with suggestions, bounds, cross-field
checks, and the CLI failing fast (exit code 2) on a bad config."""

from __future__ import annotations

import os
import subprocess
import textwrap
from pathlib import Path

import pytest
from pydantic import BaseModel

from agentrl.algo import ADVANTAGES
from agentrl.config import Config, ConfigError, apply_override, build_config, load_config

REPO = Path(__file__).resolve().parents[1]


def write_yaml(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "cfg.yaml"
    path.write_text(textwrap.dedent(text))
    return path


# ---------------------------------------------------------------- defaults and loading


def test_defaults_validate_and_have_documented_values():
    cfg = load_config(None)
    assert cfg == Config()
    assert cfg.env.import_path == "envs.guess_number:GuessNumberEnv"
    assert cfg.rollout.n_samples == 8
    assert cfg.buffer.batch_size == 64
    assert cfg.buffer.batch_size % cfg.rollout.n_samples == 0
    assert cfg.buffer.max_staleness == 1
    assert cfg.algo.advantage.type == "grpo" and cfg.algo.kl.type == "none" and cfg.algo.correction.type == "tis"
    assert cfg.learner.zero_stage == 0
    assert cfg.model.path is None


def test_every_leaf_field_has_a_description():
    def walk(model, prefix=""):
        for name, field in model.model_fields.items():
            ann = field.annotation
            if isinstance(ann, type) and issubclass(ann, BaseModel):
                yield from walk(ann, prefix + name + ".")
            else:
                yield prefix + name, field.description

    missing = [key for key, desc in walk(Config) if not desc]
    assert missing == []


def test_yaml_file_loads_nested_values(tmp_path):
    path = write_yaml(tmp_path, """
        rollout:
          n_samples: 4
          temperature: 0.7
          max_turns: 6
        buffer:
          batch_size: 12
          max_staleness: 0
        env:
          import_path: envs.guess_number:GuessNumberEnv
          kwargs: {max_turns: 5}
        model:
          default:
            hidden_size: 192
        train:
          save_model: false
    """)
    cfg = load_config(path)
    assert cfg.rollout.n_samples == 4
    assert cfg.rollout.temperature == 0.7
    assert cfg.rollout.max_turns == 6
    assert cfg.buffer.batch_size == 12
    assert cfg.buffer.max_staleness == 0
    assert cfg.env.kwargs == {"max_turns": 5}
    assert cfg.model.default.hidden_size == 192
    assert cfg.train.save_model is False
    # untouched fields keep their defaults
    assert cfg.rollout.top_p == 1.0
    assert cfg.model.default.num_layers == 4


def test_empty_yaml_file_means_defaults(tmp_path):
    assert load_config(write_yaml(tmp_path, "")) == Config()


def test_overrides_parse_ints_floats_bools_nulls_and_nested(tmp_path):
    path = write_yaml(tmp_path, """
        rollout: {n_samples: 4, temperature: 0.7}
        buffer: {batch_size: 8}
        model: {path: /some/model}
    """)
    cfg = load_config(path, [
        "rollout.n_samples=2",  # overrides the file
        "rollout.top_p=0.95",
        "buffer.max_staleness=3",
        "train.eval_before=false",
        "train.eval_after=true",
        "model.default.num_layers=2",
        "model.path=null",
        "env.kwargs.max_turns=7",
        "algo.clip_high=0.28",
    ])
    assert cfg.rollout.n_samples == 2 and isinstance(cfg.rollout.n_samples, int)
    assert cfg.rollout.temperature == 0.7  # from the file, not overridden
    assert cfg.rollout.top_p == 0.95
    assert cfg.buffer.batch_size == 8
    assert cfg.buffer.max_staleness == 3
    assert cfg.train.eval_before is False
    assert cfg.train.eval_after is True
    assert cfg.model.default.num_layers == 2
    assert cfg.model.path is None
    assert cfg.env.kwargs == {"max_turns": 7}
    assert cfg.algo.clip_high == 0.28


def test_apply_override_builds_nested_dicts():
    data: dict = {"rollout": {"n_samples": 4}}
    apply_override(data, "rollout.top_p=0.5")
    apply_override(data, "a.b.c=[1, 2]")
    apply_override(data, "s=x=y")  # only the first '=' splits
    assert data == {"rollout": {"n_samples": 4, "top_p": 0.5}, "a": {"b": {"c": [1, 2]}}, "s": "x=y"}


def test_malformed_overrides_raise():
    with pytest.raises(ConfigError, match="must look like dotted.key=value"):
        load_config(None, ["rollout.n_samples"])
    with pytest.raises(ConfigError, match="'n_samples' is not a section"):
        load_config(None, ["rollout.n_samples=4", "rollout.n_samples.x=1"])


def test_top_level_must_be_a_mapping(tmp_path):
    with pytest.raises(ConfigError, match="the top level must be a mapping"):
        load_config(write_yaml(tmp_path, "- 1\n- 2\n"))


# ---------------------------------------------------------------- unknown keys


def test_unknown_nested_key_in_yaml_names_key_and_suggestion(tmp_path):
    path = write_yaml(tmp_path, "rollout:\n  n_sampels: 4\n")
    with pytest.raises(ConfigError) as err:
        load_config(path)
    msg = str(err.value)
    assert "'rollout.n_sampels'" in msg
    assert "did you mean 'rollout.n_samples'" in msg


def test_unknown_nested_key_via_override():
    with pytest.raises(ConfigError) as err:
        load_config(None, ["rollout.n_sampels=4"])
    assert str(err.value) == "unknown config key 'rollout.n_sampels'; did you mean 'rollout.n_samples'?"


def test_unknown_top_level_key():
    with pytest.raises(ConfigError) as err:
        build_config({"rollot": {"n_samples": 4}})
    assert str(err.value) == "unknown config key 'rollot'; did you mean 'rollout'?"


def test_top_level_key_missing_its_section_suggests_the_dotted_key():
    with pytest.raises(ConfigError) as err:
        build_config({"max_staleness": 2})
    assert "did you mean 'buffer.max_staleness'" in str(err.value)


def test_unknown_deeply_nested_key():
    with pytest.raises(ConfigError) as err:
        load_config(None, ["model.default.hiden_size=128"])
    msg = str(err.value)
    assert "'model.default.hiden_size'" in msg
    assert "did you mean 'model.default.hidden_size'" in msg


def test_unknown_key_without_close_match_lists_valid_keys():
    with pytest.raises(ConfigError) as err:
        build_config({"zzzzzz": 1})
    msg = str(err.value)
    assert "'zzzzzz'" in msg
    for section in ("algo", "buffer", "data", "engine", "env", "learner", "model", "rollout", "train",
                    "weight_sync"):
        assert f"'{section}'" in msg


def test_env_kwargs_are_free_form():
    cfg = build_config({"env": {"kwargs": {"anything_at_all": {"nested": 1}}}})
    assert cfg.env.kwargs == {"anything_at_all": {"nested": 1}}


# ---------------------------------------------------------------- bounds and cross-field checks


@pytest.mark.parametrize("override, path, why", [
    ("buffer.max_staleness=-1", "buffer.max_staleness", "greater than or equal to 0"),
    ("learner.zero_stage=4", "learner.zero_stage", "less than or equal to 3"),
    ("rollout.temperature=0", "rollout.temperature", "greater than or equal to 0.00001"),
    ("rollout.top_p=1.5", "rollout.top_p", "less than or equal to 1"),
    ("rollout.n_samples=0", "rollout.n_samples", "greater than or equal to 1"),
    ("model.default.hidden_size=100", "model.default.hidden_size", "multiple of 64"),
    ("rollout.n_samples=abc", "rollout.n_samples", "valid integer"),
    ("engine.dtype=float64", "engine.dtype", "float32"),
    ("algo.mode=sideways", "algo.mode", "decoupled"),
])
def test_out_of_bounds_values_name_the_field(override, path, why):
    with pytest.raises(ConfigError) as err:
        load_config(None, [override])
    msg = str(err.value)
    assert f"{path}:" in msg
    assert why in msg


def test_several_errors_are_reported_together():
    with pytest.raises(ConfigError) as err:
        load_config(None, ["buffer.max_staleness=-1", "learner.zero_stage=4"])
    msg = str(err.value)
    assert "buffer.max_staleness:" in msg and "learner.zero_stage:" in msg


def test_batch_size_must_be_a_multiple_of_n_samples():
    with pytest.raises(ConfigError) as err:
        load_config(None, ["rollout.n_samples=4", "buffer.batch_size=10"])
    msg = str(err.value)
    assert "buffer.batch_size=10 must be a multiple of rollout.n_samples=4" in msg
    # the boundary: an exact multiple is fine
    assert load_config(None, ["rollout.n_samples=4", "buffer.batch_size=12"]).buffer.batch_size == 12


def test_unknown_advantage_lists_valid_names():
    with pytest.raises(ConfigError) as err:
        load_config(None, ["algo.advantage=grpoo"])
    msg = str(err.value)
    assert "algo.advantage.type='grpoo' is not one of" in msg
    assert str(sorted(ADVANTAGES)) in msg
    assert {"gae", "grpo", "dr_grpo", "rloo", "reinforce_pp", "reinforce_pp_baseline"} <= set(ADVANTAGES)


def test_unknown_policy_loss_errors():
    with pytest.raises(ConfigError, match=r"algo.policy_loss='nope' is not one of"):
        load_config(None, ["algo.policy_loss=nope"])


@pytest.mark.parametrize("name", sorted(ADVANTAGES))
def test_every_registered_advantage_is_accepted(name):
    assert load_config(None, [f"algo.advantage={name}"]).algo.advantage.type == name


# ---------------------------------------------------------------- the CLI fails fast


def test_train_cli_exits_2_on_bad_config_before_starting_anything(tmp_path):
    bad = write_yaml(tmp_path, "rollout:\n  n_sampels: 4\n")
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.run(
        [str(REPO / ".venv" / "bin" / "python"), "-m", "agentrl.train", "--config", str(bad),
         "buffer.max_staleness=2", "train.out_dir=" + str(tmp_path / "run")],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2, proc.stderr
    assert "config error: unknown config key 'rollout.n_sampels'; did you mean 'rollout.n_samples'?" in proc.stderr
    assert not (tmp_path / "run").exists()  # nothing was started or written


@pytest.mark.parametrize("data, message", [
    ({"cluster": {"backend": "ray", "engine_num_gpus": 1, "tensor_parallel_size": 2}},
     "cluster.engine_num_gpus=1 must equal cluster.tensor_parallel_size=2"),
    ({"cluster": {"backend": "ray", "learner_num_gpus": 0.5}}, "cluster.learner_num_gpus=0.5 must be 0 or 1"),
])
def test_gpu_placements_a_node_would_refuse_are_config_errors(data, message):
    with pytest.raises(ConfigError, match=message):
        build_config(data)


def test_weight_transport_is_validated_with_the_valid_values_named():
    assert build_config({}).weight_sync.transport == "auto"
    with pytest.raises(ConfigError, match="auto.*collective.*file"):
        build_config({"weight_sync": {"transport": "nccl"}})


def test_stage_configs_carry_no_toy_model_keys():
    from agentrl.config.stages import StageConfig

    assert list(StageConfig.model_fields["model"].annotation.model_fields) == ["path", "allow_download"]
    with pytest.raises(ConfigError) as err:
        load_config(None, ["model.default.seed=1"], StageConfig)
    assert str(err.value).startswith("model.default moved: use model.path (a folder of `python -m agentrl.models "
                                     "prepare default")
    assert load_config(None, ["model.default.seed=1"]).model.default.seed == 1  # the RL tree keeps them
