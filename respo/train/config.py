"""One flat, frozen training configuration: defaults < TOML file < command-line overrides.

Every field is defined once here, with a one-line ``help`` in its metadata; `respo train --help`
prints each flag with that line (generated from the dataclass, see `respo.cli`). `validate`
checks a config up front and raises `ConfigError` naming every problem at once.

Staleness vocabulary (the paper's, see docs/method.md): one rollout step samples
``reuse * prompts`` prompts x ``group_size`` responses with policy version v, splits them into ``reuse`` mini-batches of
``prompts`` prompts and takes one optimizer step per mini-batch, so mini-batch k is trained with
staleness k - 1. ``mode = "async"`` instead runs a rollout worker thread at most
``max_staleness`` versions behind (``staleness_policy`` drop or wait), whole responses or, with
``segment_tokens``, partial rollouts whose tokens come from several policy versions.

The parts of the loop read slices of a config, not the whole of it: `MicroBatching`, `Forward` (the training
forward), `Sampling`, `RolloutCorrection`, `Rollouts` (a mini-batch source's) and `AsyncWorker` (the async
worker's), each a small frozen dataclass built once by ``Slice.of(cfg)``, here, so only this module turns field
names into what a part reads.
"""

from __future__ import annotations

import dataclasses
import json
import math
import tomllib
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

from respo.core import ADVANTAGE_KINDS, AGG_MODES, build_objective
from respo.core.objectives import UnknownHyperparameterError, UnknownObjectiveError
from respo.errors import RespoError
from respo.core.mismatch import ROLLOUT_CORRECTIONS
from respo.runtime.engines import ENGINES
from respo.runtime.engines.vllm import ENGINE_DTYPES
from respo.runtime.precision import DTYPES, device_problem
from respo.train.async_ import STALENESS_POLICIES

__all__ = ["TrainConfig", "ConfigError", "load_config", "validate", "config_to_dict", "apply_overrides",
           "model_dir_problem", "RULES", "rule", "MicroBatching", "Forward", "Sampling", "RolloutCorrection",
           "Rollouts", "AsyncWorker"]

MODES = ("sync", "async")


class ConfigError(RespoError, ValueError):
    """A configuration that cannot run; the message lists every problem found."""


@dataclass(frozen=True)
class TrainConfig:
    """All settings of one training run (flat; every field overridable as ``--field value``).

    Sizes follow the paper's notation: B = ``prompts`` per mini-batch, G = ``group_size``
    responses per prompt, N = ``reuse`` (rollout-reuse ratio).

    Each field's ``metadata`` holds its one-line ``help`` (what ``respo train --help`` prints for its
    flag) and the rules it obeys (`RULES`; `rule` lists the fields of one), so a new setting is one
    line here:

    - ``"resumable": True``: it may change when a run is resumed (it changes neither the weights nor
      the per-update records); every other setting is part of the experiment
      (`respo.train.rundir.RESUMABLE`).
    - ``"reusable": True``: a sweep reuses a finished run made with another value of it (where the run
      ran, or a before-RL evaluation the sweep measured once for all its runs); resumable settings are
      reusable too (`respo.study.grid.REUSABLE`).
    - ``"protocol": True``: the held-out evaluation depends on it besides the policy, so a before-RL
      evaluation measured under another value does not stand for the run's
      (`respo.study.baseline.PROTOCOL_FIELDS`).
    - ``"seed_key": COLUMN``: the runs.csv column that records it; two finished rows equal in every such
      column are the same seed of the same run, which a table may count only once
      (`respo.study.tables._SEED_KEY`).
    """

    # --- task and policy ---
    task: str = field(default="addition", metadata={"help": "task spec for respo.runtime.tasks.get_task, e.g. addition, countdown, reasoning_gym:NAME, math:FILE", "seed_key": "task"})
    task_kwargs: dict = field(default_factory=dict, metadata={"help": "extra task settings as a JSON object / TOML table, e.g. {\"digits\": 3}; or one at a time, --task-kwarg digits=3", "seed_key": "task_kwargs"})
    model: str = field(default="tiny-dense", metadata={"help": "model preset (tiny-dense, tiny-moe), a packaged pretrained model (smollm2-135m-instruct) or a local Hugging Face model directory", "seed_key": "model"})
    warm_start: bool = field(default=True, metadata={"help": "presets and packaged models: start from the cached SFT warm start (respo.runtime.sft, respo.runtime.pretrained_sft) instead of random / shipped weights"})
    sft_kwargs: dict = field(default_factory=dict, metadata={"help": "warm-start SFT settings (a preset's respo.runtime.sft.SFTConfig fields, e.g. {\"max_steps\": 300}; a packaged model's respo.runtime.pretrained_sft.PretrainedSFTConfig fields, e.g. {\"dtype\": \"float32\"}); other values name another cached warm start"})
    cache_dir: str = field(default=".cache/respo", metadata={"help": "directory where warm starts are cached (shared with respo sft)", "resumable": True})
    out_dir: str = field(default="runs/default", metadata={"help": "run directory (metrics.jsonl, config.json, summary.json, ckpt/, final/)", "resumable": True})
    seed: int = field(default=0, metadata={"help": "seed of every random number generator of the run", "seed_key": "seed"})
    threads: int = field(default=0, metadata={"help": "torch intra-op threads (torch.set_num_threads); 0 keeps torch's default"})
    train_pool: int = field(default=4096, metadata={"help": "number of distinct training prompts (cycled, reshuffled every epoch)"})
    prompt_format: str = field(default="auto", metadata={"help": "how task prompts reach the model: auto (through the tokenizer's chat template with the task's answer instruction when it has one, else raw) | chat | raw", "protocol": True})

    # --- objective ---
    objective: str = field(default="respo", metadata={"help": "policy objective, any name in respo.OBJECTIVES; a new one given on the command line drops the --config file's objective_kwargs", "seed_key": "objective"})
    objective_kwargs: dict = field(default_factory=dict, metadata={"help": "the objective's hyperparameters as JSON / TOML, e.g. {\"pos\": [2.0, 0.5, 2.0]}; {} = the objective's defaults", "seed_key": "objective"})
    loss_agg_mode: str = field(default="", metadata={"help": "loss aggregation (token-mean, seq-mean-token-mean, ...); empty = the objective's published default", "seed_key": "loss_agg_mode"})
    adv_kind: str = field(default="grpo", metadata={"help": "group advantage estimator: grpo | drgrpo | rloo"})

    # --- batch and staleness ---
    prompts: int = field(default=16, metadata={"help": "B: prompts per mini-batch (one optimizer step)", "seed_key": "B"})
    group_size: int = field(default=8, metadata={"help": "G: sampled responses per prompt", "seed_key": "group_size"})
    reuse: int = field(default=1, metadata={"help": "N: mini-batches (optimizer steps) per rollout step in sync mode; staleness 0..N-1", "seed_key": "reuse"})
    micro_batch: int = field(default=0, metadata={"help": "sequences per forward/backward (gradient accumulation); 0 = the whole mini-batch"})
    updates: int = field(default=64, metadata={"help": "total optimizer steps (policy updates) of the run", "seed_key": "updates", "resumable": True})
    mode: str = field(default="sync", metadata={"help": "sync (reuse-N schedule) | async (rollout worker thread a bounded number of versions behind)"})
    sync_every: int = field(default=1, metadata={"help": "async: push the learner's weights to the rollout worker every K updates"})
    max_staleness: int = field(default=4, metadata={"help": "async: the most policy versions a trained batch's oldest token may be behind the learner (kept by staleness_policy)"})
    queue_size: int = field(default=2, metadata={"help": "async: rollout batches the worker may have waiting"})
    staleness_policy: str = field(default="drop", metadata={"help": "async: how max_staleness is kept: drop (a batch more than max_staleness versions behind when the learner reaches it is thrown away, counted as dropped) | wait (the worker holds back a new batch until it cannot end up more than max_staleness behind, counted as waited; nothing is dropped)"})
    segment_tokens: int = field(default=0, metadata={"help": "async: partial rollouts: the worker generates responses in segments of this many tokens and takes newly published weights between segments, so one response spans several policy versions (each token records its own); 0 = whole responses, one version each"})

    # --- sampling ---
    max_new_tokens: int = field(default=24, metadata={"help": "maximum response length in tokens", "protocol": True})
    temperature: float = field(default=1.0, metadata={"help": "sampling temperature of rollouts"})
    top_p: float = field(default=1.0, metadata={"help": "nucleus sampling threshold of rollouts (1 = off)"})

    # --- rollout engine and the training-inference mismatch ---
    rollout_engine: str = field(default="respo", metadata={"help": "what samples rollouts: respo (the embedded sampler on the trainer's model; log-probs equal the trainer's) | vllm (vLLM in its own process, weights synced before every rollout step)", "protocol": True, "seed_key": "engine"})
    engine_dtype: str = field(default="auto", metadata={"help": "vllm engine: auto (bfloat16 where this CPU runs it measurably faster than float32) | bfloat16 | float32", "protocol": True})
    engine_threads: int = field(default=1, metadata={"help": "vllm engine: CPU threads of the engine process (bound to the last cores this process may use)", "protocol": True})
    rollout_correction: str = field(default="off", metadata={"help": "correct the engine-trainer mismatch: off | token-tis | seq-tis (weights min(rho, C)) | token-mis | seq-mis (rho, 0 above C); rho = pi_trainer/pi_engine"})
    rollout_correction_threshold: float = field(default=2.0, metadata={"help": "C of rollout_correction: the truncation cap (tis) or rejection bound (mis)"})
    rollout_bypass: bool = field(default=False, metadata={"help": "use the engine's log-probs as old_logp (no recompute; log W then holds the mismatch too)"})

    # --- optimizer (AdamW, linear warm-up then constant) ---
    lr: float = field(default=1e-4, metadata={"help": "AdamW learning rate after warm-up", "seed_key": "lr"})
    warmup: int = field(default=10, metadata={"help": "updates of linear learning-rate warm-up"})
    weight_decay: float = field(default=0.1, metadata={"help": "AdamW weight decay"})
    grad_clip: float = field(default=1.0, metadata={"help": "maximum global gradient norm; 0 disables clipping"})
    adam_betas: tuple = field(default=(0.9, 0.999), metadata={"help": "AdamW (beta1, beta2) as a JSON list"})
    adam_eps: float = field(default=1e-8, metadata={"help": "AdamW epsilon"})
    max_nonfinite_steps: int = field(default=3, metadata={"help": "an update whose loss or gradient is not finite is skipped (no optimizer or scheduler step; skipped = 1 in metrics.jsonl); after this many in a row the run stops, with a checkpoint of its last good state", "resumable": True})

    # --- MoE ---
    routing_replay: bool = field(default=False, metadata={"help": "MoE only: replay the rollout's expert routing in the old-logp and training forwards", "seed_key": "routing_replay"})

    # --- evaluation, checkpoints, logging ---
    eval_prompts: int = field(default=128, metadata={"help": "held-out prompts for the periodic and final evaluation (0 = none)", "protocol": True})
    eval_k: int = field(default=4, metadata={"help": "samples per held-out prompt (mean@k, pass@k)", "protocol": True})
    eval_every: int = field(default=0, metadata={"help": "evaluate every this many updates (0 = only before and after training)", "resumable": True})
    eval_before: bool = field(default=True, metadata={"help": "also evaluate the initial policy", "reusable": True})
    checkpoint_every: int = field(default=0, metadata={"help": "updates between checkpoints (0 = only at exit)", "resumable": True})
    keep_checkpoints: int = field(default=2, metadata={"help": "number of newest checkpoints kept in ckpt/", "resumable": True})
    tensorboard: bool = field(default=True, metadata={"help": "also write TensorBoard events when tensorboard is installed", "resumable": True})
    progress: bool = field(default=True, metadata={"help": "show a tqdm progress bar", "resumable": True})

    @property
    def rollout_prompts(self) -> int:
        """Prompts sampled per rollout step: N * B (sync) or B (async)."""
        return self.prompts * (self.reuse if self.mode == "sync" else 1)

    @property
    def mini_batch_seqs(self) -> int:
        """Sequences per optimizer step: B * G."""
        return self.prompts * self.group_size

    # --- device, precision, speed ---
    device: str = field(default="cpu", metadata={"help": "where sampling, training, evaluation and SFT run: cpu | cuda | cuda:K | auto (CUDA when available)", "reusable": True})
    dtype: str = field(default="float32", metadata={"help": "compute dtype: float32 | bfloat16 (autocast with float32 master weights, float32 logits and log-probs)", "protocol": True})
    micro_batch_tokens: int = field(default=0, metadata={"help": "pack each mini-batch into micro-batches of at most this many padded tokens (rows x columns); 0 = use micro_batch"})
    share_prompts: bool = field(default=True, metadata={"help": "run each prompt once for the rows of a micro-batch that share it (a group's G responses), in the old-logp and training forwards; equal to one forward per row up to float rounding (config.json's forward names the path a run takes)"})
    compile: bool = field(default=False, metadata={"help": "torch.compile the training forward (pays off on long runs only; see benchmarks/bench_compile.py)"})


# --- slices: what one part of the loop reads, built once from a run's config (``Slice.of(cfg)``) ---


def _from(name: str):
    """A slice field that holds the config field (or property) ``name`` rather than the one of its own name."""
    return field(metadata={"from": name})


class _Slice:
    """A small frozen dataclass of the settings one part of the loop reads: each field holds the `TrainConfig` field
    (or property) of its name, or the one `_from` names; a field typed as another slice holds that slice."""

    @classmethod
    def of(cls, cfg: TrainConfig) -> typing.Self:
        """The slice of ``cfg``."""
        hints = typing.get_type_hints(cls)

        def value(f: dataclasses.Field) -> Any:
            kind = hints[f.name]
            if isinstance(kind, type) and issubclass(kind, _Slice):
                return kind.of(cfg)
            return getattr(cfg, f.metadata.get("from", f.name))

        return cls(**{f.name: value(f) for f in dataclasses.fields(cls)})


@dataclass(frozen=True)
class MicroBatching(_Slice):
    """How a mini-batch is cut into forward/backward chunks (`respo.train.forward.micro_batches`): ``rows`` rows
    each (``micro_batch``; 0 = the whole mini-batch) or, when ``tokens`` (``micro_batch_tokens``) is set, as many
    rows as fit that budget of padded tokens."""

    rows: int = _from("micro_batch")
    tokens: int = _from("micro_batch_tokens")


@dataclass(frozen=True)
class Forward(_Slice):
    """What the training forward reads (`respo.train.forward`), the same on the update and the ``old_logp`` side:
    its micro-batches, compute ``dtype``, the sampling ``temperature`` the log-probs are taken at, MoE
    ``routing_replay``, ``share_prompts``, ``compile``, and ``group_size`` (rows that may share a prompt)."""

    micro: MicroBatching
    dtype: str
    temperature: float
    routing_replay: bool
    share_prompts: bool
    compile: bool
    group_size: int


@dataclass(frozen=True)
class Sampling(_Slice):
    """How a rollout's responses are drawn (`respo.train.rollout.sample_rollout`): ``group_size`` responses per
    prompt of at most ``max_new_tokens`` tokens, at ``temperature`` and ``top_p``."""

    group_size: int
    max_new_tokens: int
    temperature: float
    top_p: float


@dataclass(frozen=True)
class RolloutCorrection(_Slice):
    """The engine–trainer mismatch settings: the correction ``kind`` (``rollout_correction``) with its
    ``threshold`` C, and ``bypass`` (``rollout_bypass``: the engine's log-probs serve as ``old_logp``)."""

    kind: str = _from("rollout_correction")
    threshold: float = _from("rollout_correction_threshold")
    bypass: bool = _from("rollout_bypass")

    @property
    def correcting(self) -> bool:
        """A correction factor ρ = π_trainer/π_engine enters the loss."""
        return self.kind != "off"

    @property
    def from_engine(self) -> bool:
        """The engine's log-probs reach the loss (a correction or the bypass), so its non-finite rows are dropped."""
        return self.correcting or self.bypass


@dataclass(frozen=True)
class Rollouts(_Slice):
    """What a mini-batch source reads (`respo.train.sources`): ``prompts`` sampled per rollout step (N*B in sync
    mode, B in async mode) from a pool of ``train_pool``, ``mini_batch`` rows (B*G) per update, how responses are
    sampled, how ``old_logp`` is recomputed and whether the engine's log-probs stand in for it."""

    prompts: int = _from("rollout_prompts")
    train_pool: int
    mini_batch: int = _from("mini_batch_seqs")
    sampling: Sampling
    forward: Forward
    correction: RolloutCorrection


@dataclass(frozen=True)
class AsyncWorker(_Slice):
    """What the async rollout worker reads (`respo.train.sources.AsyncSource`): its generator's ``seed`` (the run's,
    offset), the learner publishing weights every ``sync_every`` updates, at most ``queue_size`` finished batches
    waiting, the bound ``max_staleness`` kept by ``staleness_policy``, and ``segment_tokens`` (0: whole responses;
    otherwise partial rollouts in segments of that many tokens)."""

    seed: int
    sync_every: int
    queue_size: int
    max_staleness: int
    staleness_policy: str
    segment_tokens: int


#: The rule keys a field's metadata may hold besides ``help`` (`TrainConfig`'s docstring says what each means).
RULES = ("resumable", "reusable", "protocol", "seed_key")


def rule(name: str) -> dict[str, Any]:
    """``{field: value}`` of every `TrainConfig` field whose metadata holds rule ``name`` (one of `RULES`),
    in field order."""
    if name not in RULES:
        raise ValueError(f"unknown field rule {name!r}; choose one of {', '.join(RULES)}")
    return {f.name: f.metadata[name] for f in dataclasses.fields(TrainConfig) if name in f.metadata}


def config_to_dict(cfg: TrainConfig) -> dict[str, Any]:
    """A JSON-ready dict of every field (tuples become lists)."""
    return json.loads(json.dumps(dataclasses.asdict(cfg)))


_FIELDS = {f.name: f for f in dataclasses.fields(TrainConfig)}
_FLOAT_FIELDS = tuple(name for name, f in _FIELDS.items() if isinstance(f.default, float))


def _field_type(name: str) -> type:
    default = _FIELDS[name].default
    if default is dataclasses.MISSING:
        return dict
    return type(default)


def coerce(name: str, value: Any) -> Any:
    """Convert a TOML or command-line value for field ``name`` to the field's type.

    Strings from the command line are parsed: bools accept true/false/1/0/yes/no, dicts and
    tuples accept JSON (``'{"digits": 3}'``, ``'[0.9, 0.95]'``).
    """
    if name not in _FIELDS:
        raise ConfigError(f"unknown config field {name!r}; known fields: {', '.join(sorted(_FIELDS))}")
    kind = _field_type(name)
    try:
        if kind is bool:
            if isinstance(value, str):
                low = value.strip().lower()
                if low in ("true", "1", "yes", "on"):
                    return True
                if low in ("false", "0", "no", "off"):
                    return False
                raise ValueError(f"expected true/false, got {value!r}")
            if not isinstance(value, bool):
                raise ValueError(f"expected a bool, got {value!r}")
            return value
        if kind in (dict, tuple):
            if isinstance(value, str):
                value = json.loads(value)
            if kind is dict:
                if not isinstance(value, Mapping):
                    raise ValueError(f"expected a table/dict, got {value!r}")
                return dict(value)
            if not isinstance(value, (list, tuple)):
                raise ValueError(f"expected a list, got {value!r}")
            return tuple(value)
        if kind is int:
            if isinstance(value, bool) or (isinstance(value, float) and not value.is_integer()):
                raise ValueError(f"expected an integer, got {value!r}")
            return int(value)
        if kind is float:
            if isinstance(value, bool):
                raise ValueError(f"expected a number, got {value!r}")
            return float(value)
        return str(value) if not isinstance(value, str) else value
    except (ValueError, TypeError, json.JSONDecodeError) as err:
        raise ConfigError(f"config field {name!r}: {err}") from None


def apply_overrides(cfg: TrainConfig, overrides: Mapping[str, Any]) -> TrainConfig:
    """Return ``cfg`` with ``overrides`` (field -> raw value) applied; unknown fields raise."""
    return dataclasses.replace(cfg, **{k.replace("-", "_"): coerce(k.replace("-", "_"), v) for k, v in overrides.items()})


def load_config(path: str | Path | None = None, overrides: Mapping[str, Any] | None = None) -> TrainConfig:
    """Defaults, then the TOML file at ``path`` (flat keys; a ``[train]`` table is also accepted),
    then ``overrides``; the result is validated and its task is built once, so a bad task fails here,
    before anything is written.

    An override that changes ``objective`` drops the file's ``objective_kwargs`` (they belong to the
    file's objective) unless ``objective_kwargs`` is overridden too.

    Raises:
        ConfigError: unreadable file, unknown key, wrong type, or any `validate` failure.
        TaskError: the task cannot be built (unknown spec, missing or malformed file, bad setting).
    """
    cfg = TrainConfig()
    if path is not None:
        p = Path(path)
        if not p.is_file():
            raise ConfigError(f"config file {str(p)!r} does not exist")
        try:
            data = tomllib.loads(p.read_text())
        except tomllib.TOMLDecodeError as err:
            raise ConfigError(f"config file {str(p)!r} is not valid TOML: {err}") from None
        if set(data) == {"train"} and isinstance(data["train"], dict):
            data = data["train"]
        cfg = apply_overrides(cfg, data)
    if overrides:
        overrides = {k.replace("-", "_"): v for k, v in overrides.items()}
        new_objective = "objective" in overrides and coerce("objective", overrides["objective"]) != cfg.objective
        if new_objective and "objective_kwargs" not in overrides:
            overrides["objective_kwargs"] = {}
        cfg = apply_overrides(cfg, overrides)
    validate(cfg)
    _check_sft_kwargs(cfg)
    _check_task(cfg)
    return cfg


def _check_sft_kwargs(cfg: TrainConfig) -> None:
    from respo.runtime.packaged import is_packaged
    from respo.runtime.pretrained_sft import PretrainedSFTConfig
    from respo.runtime.sft import SFTConfig

    fixed = ("task", "task_kwargs", "preset", "model", "seed")  # taken from the run's own fields
    settings = PretrainedSFTConfig if is_packaged(cfg.model) else SFTConfig
    allowed = sorted(set(settings.__dataclass_fields__) - set(fixed))
    unknown = sorted(set(cfg.sft_kwargs) - set(allowed))
    if unknown:
        raise ConfigError(f"sft_kwargs has unknown setting(s) {', '.join(unknown)}; it accepts {', '.join(allowed)}")


def _check_task(cfg: TrainConfig) -> None:
    """Build the task once so a bad spec, file or setting is a one-line `TaskError` before the run starts."""
    from respo.runtime.tasks import load_task

    load_task(cfg.task, cfg.task_kwargs)


def _is_preset(model: str) -> bool:
    try:
        from respo.runtime.models import PRESETS
    except ImportError:  # runtime not importable: only the documented preset names
        return model in ("tiny-dense", "tiny-moe")
    return model in PRESETS


def _is_packaged(model: str) -> bool:
    from respo.runtime.packaged import is_packaged

    return is_packaged(model)


def _packaged_problem(model: str) -> str | None:
    """Why the packaged model ``model`` cannot be used (its package missing), None when it can or is no packaged model."""
    from respo.runtime.packaged import is_packaged, packaged_problem

    return packaged_problem(model) if is_packaged(model) else None


def _is_number(value: Any) -> bool:
    """A real number (an int or float, not a bool)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def model_dir_problem(path: Path) -> str | None:
    """Why directory ``path`` is no Hugging Face model directory, None when it may be one: it needs a
    ``config.json`` holding a JSON object with a ``model_type`` (what transformers reads to choose the model
    class). A respo run directory's ``config.json`` is named as such, with the path of its trained policy."""
    config = path / "config.json"
    if not config.is_file():
        return f"model directory {str(path)!r} has no config.json"
    try:
        data = json.loads(config.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        return f"model directory {str(path)!r}: config.json is not readable JSON ({err})"
    if isinstance(data, dict) and "model_type" in data:
        return None
    if isinstance(data, dict) and "objective" in data and "out_dir" in data:
        return (f"model directory {str(path)!r} is a respo run directory, not a model's; its trained policy is "
                f"{str(path / 'final')!r}")
    return f"model directory {str(path)!r}: config.json is not a Hugging Face model config (it has no model_type)"


def _objective_problem(cfg: TrainConfig) -> str | None:
    """What is wrong with the objective, its hyperparameters and its aggregation, asked of the core
    (`build_objective` checks the names and values, `Objective.agg_mode` the aggregation)."""
    try:
        objective = build_objective(cfg.objective, **cfg.objective_kwargs)
    except UnknownObjectiveError as err:
        return f"objective {cfg.objective!r} is unknown; choose one of {', '.join(err.valid)}"
    except UnknownHyperparameterError as err:
        return (f"objective {cfg.objective!r} has no hyperparameter(s) {', '.join(err.unknown)}; "
                f"it accepts {', '.join(sorted(err.valid)) or 'none'}")
    except (ValueError, TypeError) as err:
        return f"objective {cfg.objective!r} rejects objective_kwargs {cfg.objective_kwargs}: {err}"
    if cfg.loss_agg_mode in AGG_MODES:  # an unknown mode is reported on its own
        try:
            objective.agg_mode(cfg.loss_agg_mode)
        except ValueError as err:
            return f"objective {cfg.objective!r} rejects loss_agg_mode {cfg.loss_agg_mode!r}: {err}"
    return None


SAMPLING_FIELDS = ("prompt_format", "rollout_engine", "engine_dtype")


def sampling_problems(settings: dict, spell=lambda name: name) -> list[str]:
    """What is wrong with the sampling settings (``SAMPLING_FIELDS``) that `validate` checks in a config and
    ``respo eval`` checks in what it resolved from its flags and the run; ``spell`` names a field the way the
    caller's user wrote it (a config field, a command-line flag)."""
    choices = {"prompt_format": ("auto", "chat", "raw"), "rollout_engine": ENGINES, "engine_dtype": ENGINE_DTYPES}
    listed = {"prompt_format": "auto, chat or raw"}
    return [f"{spell(name)} {settings[name]!r} is unknown; choose {listed.get(name) or 'one of ' + ', '.join(choices[name])}"
            for name in SAMPLING_FIELDS if settings[name] not in choices[name]]


def validate(cfg: TrainConfig) -> None:
    """Check ``cfg`` can run; raise one `ConfigError` listing every problem (one line when there is one)."""
    errs: list[str] = []
    positive = ("prompts", "updates", "max_new_tokens", "train_pool", "eval_k", "sync_every", "queue_size",
                "keep_checkpoints", "max_nonfinite_steps")
    for name in positive:
        if getattr(cfg, name) < 1:
            errs.append(f"{name} must be >= 1, got {getattr(cfg, name)}")
    if cfg.reuse < 1:
        errs.append(f"reuse (N, mini-batches per rollout step) must be >= 1, got {cfg.reuse}")
    for name in ("micro_batch", "eval_prompts", "eval_every", "checkpoint_every", "warmup", "threads", "max_staleness"):
        if getattr(cfg, name) < 0:
            errs.append(f"{name} must be >= 0, got {getattr(cfg, name)}")
    if cfg.adv_kind not in ADVANTAGE_KINDS:
        errs.append(f"adv_kind {cfg.adv_kind!r} is unknown; choose one of {', '.join(ADVANTAGE_KINDS)}")
    elif cfg.group_size < 2:
        errs.append(f"group_size (G) must be >= 2 with group advantages ({cfg.adv_kind}), got {cfg.group_size}")
    if cfg.micro_batch > 0 and cfg.mini_batch_seqs % cfg.micro_batch:
        errs.append(f"micro_batch {cfg.micro_batch} does not divide the mini-batch of prompts*group_size = "
                    f"{cfg.prompts}*{cfg.group_size} = {cfg.mini_batch_seqs} sequences")
    if cfg.mode not in MODES:
        errs.append(f"mode {cfg.mode!r} is unknown; choose sync or async")
    if cfg.mode == "async" and cfg.reuse != 1:
        errs.append(f"reuse (N) applies to sync mode only; async mode consumes one mini-batch per rollout, got reuse={cfg.reuse}")
    if cfg.mode == "async" and cfg.max_staleness < cfg.sync_every - 1:
        errs.append(f"max_staleness {cfg.max_staleness} < sync_every - 1 = {cfg.sync_every - 1}: between weight syncs "
                    f"the learner would outrun every sample the worker can produce and wait forever")
    if cfg.staleness_policy not in STALENESS_POLICIES:
        errs.append(f"staleness_policy {cfg.staleness_policy!r} is unknown; choose drop or wait")
    if cfg.segment_tokens < 0:
        errs.append(f"segment_tokens must be >= 0, got {cfg.segment_tokens}")
    elif cfg.segment_tokens and cfg.mode != "async":
        errs.append(f"segment_tokens (partial rollouts) applies to async mode only: in sync mode the weights do "
                    f"not change during a rollout step, got segment_tokens={cfg.segment_tokens} with mode={cfg.mode}")
    elif cfg.segment_tokens and cfg.routing_replay:
        errs.append("routing_replay with segment_tokens: a partial rollout re-routes its prefix at every segment, so "
                    "no single recorded routing exists to replay; set segment_tokens = 0")
    if cfg.loss_agg_mode and cfg.loss_agg_mode not in AGG_MODES:
        errs.append(f"loss_agg_mode {cfg.loss_agg_mode!r} is unknown; choose one of {', '.join(AGG_MODES)}")
    # Numbers: every float field finite (inf passed "lr > 0" and NaN passed "weight_decay >= 0"), then its range.
    nonfinite = [name for name in _FLOAT_FIELDS if not math.isfinite(getattr(cfg, name))]
    errs += [f"{name} must be a finite number, got {getattr(cfg, name)}" for name in nonfinite]
    ranges = {"lr": (cfg.lr > 0, "> 0"), "weight_decay": (cfg.weight_decay >= 0, ">= 0"),
              "grad_clip": (cfg.grad_clip >= 0, ">= 0 (0 disables)"), "adam_eps": (cfg.adam_eps > 0, "> 0"),
              "temperature": (cfg.temperature > 0, "> 0"), "top_p": (0 < cfg.top_p <= 1, "in (0, 1]")}
    errs += [f"{name} must be {bound}, got {getattr(cfg, name)}" for name, (ok, bound) in ranges.items()
             if not ok and name not in nonfinite]
    if len(cfg.adam_betas) != 2 or not all(_is_number(b) and 0 <= b < 1 for b in cfg.adam_betas):
        errs.append(f"adam_betas must be two numbers in [0, 1), got {list(cfg.adam_betas)}")
    if _packaged_problem(cfg.model):
        errs.append(_packaged_problem(cfg.model))
    elif not _is_preset(cfg.model) and not _is_packaged(cfg.model):
        p = Path(cfg.model)
        if not p.is_dir():
            errs.append(f"model {cfg.model!r} is neither a preset (tiny-dense, tiny-moe), a packaged model "
                        f"(smollm2-135m-instruct) nor an existing model directory")
        else:
            problem = model_dir_problem(p)
            if problem:
                errs.append(problem)
    if cfg.micro_batch_tokens < 0:
        errs.append(f"micro_batch_tokens must be >= 0, got {cfg.micro_batch_tokens}")
    if cfg.micro_batch_tokens and cfg.micro_batch:
        errs.append(f"micro_batch ({cfg.micro_batch} rows) and micro_batch_tokens ({cfg.micro_batch_tokens} tokens) "
                    f"both size micro-batches; set one of them to 0")
    if cfg.dtype not in DTYPES:
        errs.append(f"dtype {cfg.dtype!r} is unknown; choose one of {', '.join(DTYPES)}")
    errs += sampling_problems({name: getattr(cfg, name) for name in SAMPLING_FIELDS})
    if cfg.engine_threads < 1:
        errs.append(f"engine_threads must be >= 1, got {cfg.engine_threads}")
    if cfg.rollout_correction not in ROLLOUT_CORRECTIONS:
        errs.append(f"rollout_correction {cfg.rollout_correction!r} is unknown; choose one of {', '.join(ROLLOUT_CORRECTIONS)}")
    if math.isfinite(cfg.rollout_correction_threshold) and not cfg.rollout_correction_threshold > 0:
        errs.append(f"rollout_correction_threshold must be > 0, got {cfg.rollout_correction_threshold}")
    if cfg.rollout_engine == "vllm" and cfg.routing_replay:
        errs.append("routing_replay needs the rollout's expert routing, which only the respo engine records; "
                    "use --rollout-engine respo")
    if cfg.compile and cfg.mode != "sync":
        errs.append("compile applies to sync mode only (the async worker runs its own model copy uncompiled)")
    device_error = device_problem(cfg.device)
    if device_error:
        errs.append(device_error)
    objective_problem = _objective_problem(cfg)
    if objective_problem:
        errs.append(objective_problem)
    if len(errs) == 1:  # one problem, one line
        raise ConfigError(f"1 problem in the training config: {errs[0]}")
    if errs:
        raise ConfigError(f"{len(errs)} problem(s) in the training config:\n  - " + "\n  - ".join(errs))
