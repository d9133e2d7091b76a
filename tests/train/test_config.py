"""Config: defaults < TOML < overrides, types coerced, every problem reported up front."""

import json

import pytest

from respo.train.config import ConfigError, TrainConfig, apply_overrides, config_to_dict, load_config, validate


def test_layering_toml_then_overrides(tmp_path):
    p = tmp_path / "c.toml"
    p.write_text('objective = "respo"\nreuse = 4\nlr = 3e-5\n[objective_kwargs]\npos = [2.0, 0.5, 2.0]\n')
    cfg = load_config(p, {"reuse": "8", "warm_start": "false"})
    assert (cfg.objective, cfg.reuse, cfg.lr, cfg.warm_start) == ("respo", 8, 3e-5, False)
    assert cfg.objective_kwargs == {"pos": [2.0, 0.5, 2.0]}  # a TOML table becomes the kwargs dict
    assert cfg.rollout_prompts == 8 * cfg.prompts and cfg.mini_batch_seqs == cfg.prompts * cfg.group_size


def test_train_table_accepted_and_json_round_trip(tmp_path):
    p = tmp_path / "c.toml"
    p.write_text('[train]\nprompts = 4\nadam_betas = [0.9, 0.95]\n')
    cfg = load_config(p)
    assert cfg.prompts == 4 and cfg.adam_betas == (0.9, 0.95)
    d = config_to_dict(cfg)
    json.dumps(d)
    assert apply_overrides(TrainConfig(), d) == cfg


def test_cli_strings_are_coerced():
    cfg = apply_overrides(TrainConfig(), {"objective-kwargs": '{"pos": [2.0, 0.5, 2.0]}', "progress": "no",
                                          "temperature": "0.7", "updates": "3"})
    assert cfg.objective_kwargs == {"pos": [2.0, 0.5, 2.0]} and cfg.progress is False
    assert cfg.temperature == 0.7 and cfg.updates == 3


@pytest.mark.parametrize("overrides, needle", [
    ({"reuse": 0}, "reuse (N"),
    ({"group_size": 1}, "group_size (G) must be >= 2"),
    ({"micro_batch": 5}, "micro_batch 5 does not divide"),  # 16*8 = 128 rows, 128 % 5 = 3
    ({"objective": "ppo-typo"}, "objective 'ppo-typo' is unknown"),
    ({"model": "/nonexistent/model/dir"}, "neither a preset"),
    ({"lr": -1.0}, "lr must be > 0"),
    ({"mode": "sometimes"}, "mode 'sometimes'"),
    ({"mode": "async", "reuse": 4}, "sync mode only"),
    ({"adv_kind": "ppo"}, "adv_kind 'ppo'"),
    ({"objective_kwargs": {"no_such_knob": 1.0}}, "no_such_knob"),
])
def test_each_problem_is_named(overrides, needle):
    with pytest.raises(ConfigError, match=None) as err:
        validate(apply_overrides(TrainConfig(), overrides))
    assert needle in str(err.value)


def test_bad_hyperparameter_value_is_caught_when_the_objective_is_built():
    # ReSPO's positive branch needs alpha > 0: alpha = -1 must fail before training.
    with pytest.raises(ConfigError, match="rejects objective_kwargs"):
        validate(apply_overrides(TrainConfig(), {"objective_kwargs": {"pos": [-1.0, 0.5, 2.0]}}))


def test_all_problems_reported_at_once():
    with pytest.raises(ConfigError) as err:
        validate(apply_overrides(TrainConfig(), {"reuse": 0, "lr": 0.0, "temperature": 0.0}))
    assert str(err.value).startswith("3 problem(s)")


def test_unknown_field_and_wrong_type():
    with pytest.raises(ConfigError, match="unknown config field 'reuse_ratio'"):
        apply_overrides(TrainConfig(), {"reuse_ratio": 2})
    with pytest.raises(ConfigError, match="'updates': expected an integer"):
        apply_overrides(TrainConfig(), {"updates": 2.5})
    with pytest.raises(ConfigError, match="does not exist"):
        load_config("/nonexistent.toml")


def test_model_dir_without_config(tmp_path):
    with pytest.raises(ConfigError, match="has no config.json"):
        validate(apply_overrides(TrainConfig(), {"model": str(tmp_path)}))


def test_objective_checks_come_from_the_core():
    # gmpo aggregates per sequence: the core's Objective rejects token-mean, and validate reports it.
    with pytest.raises(ConfigError, match="objective 'gmpo' rejects loss_agg_mode 'token-mean'.*per sequence"):
        validate(apply_overrides(TrainConfig(), {"objective": "gmpo", "loss_agg_mode": "token-mean"}))
    with pytest.raises(ConfigError, match="rejects objective_kwargs.*clip_ratio_c must be > 1"):
        validate(apply_overrides(TrainConfig(), {"objective": "grpo", "objective_kwargs": {"clip_ratio_c": 0.5}}))
    with pytest.raises(ConfigError, match="it accepts neg, pos"):
        validate(apply_overrides(TrainConfig(), {"objective_kwargs": {"tau": 1.0}}))
    validate(apply_overrides(TrainConfig(), {"objective": "gmpo", "loss_agg_mode": "seq-mean-token-mean"}))


@pytest.mark.parametrize("name, value", [("lr", "inf"), ("lr", "-inf"), ("temperature", "inf"), ("top_p", "nan"),
                                         ("weight_decay", "nan"), ("weight_decay", "inf"), ("grad_clip", "nan"),
                                         ("adam_eps", "inf"), ("adam_eps", "nan")])
def test_every_number_must_be_finite(name, value):
    # inf passed `lr > 0` and nan passed `weight_decay < 0`: each is refused, naming the field and value.
    with pytest.raises(ConfigError) as err:
        validate(apply_overrides(TrainConfig(), {name: value}))
    assert f"{name} must be a finite number, got {value}" in str(err.value)
    assert str(err.value).startswith("1 problem in the training config: ")  # once, not also as "must be > 0"
    assert "\n" not in str(err.value)


def test_adam_eps_must_be_positive():
    with pytest.raises(ConfigError, match=r"adam_eps must be > 0, got -1e-08"):
        validate(apply_overrides(TrainConfig(), {"adam_eps": -1e-8}))
    with pytest.raises(ConfigError, match=r"adam_betas must be two numbers in \[0, 1\), got \[0.9, nan\]"):
        validate(apply_overrides(TrainConfig(), {"adam_betas": "[0.9, NaN]"}))
