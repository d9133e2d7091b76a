"""The setting rules are metadata on the `TrainConfig` fields; the sets the trainer, the sweep and the
tables use are derived from them. The members are pinned to the sets each module spelled out by hand
before the rules moved onto the fields."""

import dataclasses

import pytest

from respo.study import baseline, grid, tables
from respo.train import rundir
from respo.train.config import RULES, TrainConfig, rule


def test_resumable_is_the_hand_written_set():
    assert set(rundir.RESUMABLE) == {"updates", "out_dir", "cache_dir", "progress", "tensorboard",
                                     "checkpoint_every", "keep_checkpoints", "eval_every", "max_nonfinite_steps"}
    assert len(rundir.RESUMABLE) == 9  # no field twice


def test_reusable_is_resumable_plus_device_and_eval_before():
    assert set(grid.REUSABLE) == set(rundir.RESUMABLE) | {"device", "eval_before"}
    assert len(grid.REUSABLE) == 11


def test_protocol_fields_are_the_hand_written_set():
    # the evaluation samples through the run's engine, so the engine's settings are part of its protocol
    assert set(baseline.PROTOCOL_FIELDS) == {"eval_prompts", "eval_k", "max_new_tokens", "prompt_format", "dtype",
                                             "rollout_engine", "engine_dtype", "engine_threads"}
    assert len(baseline.PROTOCOL_FIELDS) == 8


def test_seed_key_is_the_hand_written_set_of_runs_csv_columns():
    assert set(tables._SEED_KEY) == {"model", "task", "task_kwargs", "objective", "loss_agg_mode", "reuse",
                                     "group_size", "B", "lr", "seed", "routing_replay", "updates", "engine"}
    assert len(tables._SEED_KEY) == 13  # objective and objective_kwargs share the objective column
    assert rule("seed_key")["prompts"] == "B" and rule("seed_key")["objective_kwargs"] == "objective"
    assert set(tables._SEED_KEY) <= set(tables.COLUMNS)  # every key is a column runs.csv records


def test_every_field_has_help_and_only_known_rules():
    for f in dataclasses.fields(TrainConfig):
        assert f.metadata.get("help"), f.name
        assert set(f.metadata) - {"help"} <= set(RULES), f.name


def test_a_resumable_setting_is_not_part_of_a_seed_and_an_unknown_rule_is_refused():
    assert not set(rule("resumable")) & (set(rule("seed_key")) - {"updates"})  # a longer run continues its seed
    with pytest.raises(ValueError, match="unknown field rule 'resumeable'"):
        rule("resumeable")
