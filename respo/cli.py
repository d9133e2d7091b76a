"""``respo`` command line: ``train``, ``eval``, ``sft``, ``demo``, ``hyperparameters``.

Built on the standard library's argparse: the flags of ``respo train`` are generated from the
fields of `respo.train.config.TrainConfig` (one ``--field-name VALUE`` per field, parsed by the same
`coerce` as TOML values, its help line taken from the field's ``metadata["help"]``), so the
dataclass stays the single definition of every setting and no extra dependency is needed. Values
given on the command line override the ``--config`` TOML file.

Values may be negative numbers (``--lr -1e-4`` reads like ``--lr=-1e-4``). Task settings have one
spelling everywhere: ``--task-kwargs JSON`` or ``--task-kwarg KEY=VALUE`` (repeatable).

The flags of ``respo sft`` are generated the same way from `respo.runtime.sft.SFTConfig`; with
``--model`` it builds the pretrained warm start (`respo.runtime.pretrained_sft`) instead of a preset's.

Other modules add subcommands: every module listed in ``EXTENSIONS`` defines
``register(subparsers)`` and is called with the argparse subparsers (the study's ``sweep``/``report``).
They are part of the package, so a failure to import one is an error, not a missing command.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import json
import os
import re
import shlex
import sys
from pathlib import Path

from respo.errors import RespoError

__all__ = ["main", "build_parser", "run_sft", "sft_command", "write_record"]

EXTENSIONS = ("respo.study.cli",)
#: Any number with a leading minus sign (argparse's own pattern misses exponents such as -1e-4).
NEGATIVE_NUMBER = re.compile(r"^-(\d+\.?\d*|\.\d+)([eE][-+]?\d+)?$")


class _Parser(argparse.ArgumentParser):
    """argparse, reading every negative number (``-1e-4`` too) as a value rather than a flag."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._negative_number_matcher = NEGATIVE_NUMBER


class NotARunError(RespoError, FileNotFoundError):
    """``respo eval`` was given a path that is neither a run directory nor a model directory."""


def _add_config_flags(p: argparse.ArgumentParser) -> None:
    from respo import OBJECTIVES
    from respo.runtime.tasks import task_help
    from respo.runtime.tasks.args import add_task_kwargs_arguments
    from respo.train.config import TrainConfig

    g = p.add_argument_group("config fields (override the TOML file)")
    extra = {"objective": f" (one of {', '.join(OBJECTIVES)})", "task": f" (one of {task_help()})"}
    for f in dataclasses.fields(TrainConfig):
        if f.name == "task_kwargs":  # both spellings (JSON or KEY=VALUE), parsed to a dict here
            add_task_kwargs_arguments(g, f.metadata["help"].replace("%", "%%") + " (default: {})")
            continue
        default = f.default if f.default is not dataclasses.MISSING else f.default_factory()
        shown = json.dumps(default) if not isinstance(default, str) else repr(default) if not default else default
        # argparse expands %-formats in help strings; a literal % must be doubled
        text = (f.metadata.get("help", "") + extra.get(f.name, "")).replace("%", "%%")
        g.add_argument(f"--{f.name.replace('_', '-')}", dest=f"cfg__{f.name}", default=None, metavar="V",
                       help=f"{text} (default: {shown})")


def _overrides(args: argparse.Namespace) -> dict:
    out = {k[5:]: v for k, v in vars(args).items() if k.startswith("cfg__") and v is not None}
    if getattr(args, "task_kwargs", None) is not None:
        out["task_kwargs"] = args.task_kwargs
    return out


def _transformers_progress(show: bool) -> None:
    """Show or silence transformers' own progress bars ("Loading weights", "Writing model shards")."""
    from transformers.utils import logging as hf_logging

    if show:
        hf_logging.enable_progress_bar()
    else:
        hf_logging.disable_progress_bar()


def _scalars(ev):
    """An eval dict without its per-prompt lists (kept in summary.json, too long for the terminal)."""
    return None if ev is None else {k: v for k, v in ev.items() if not isinstance(v, list)}


def _cmd_train(args: argparse.Namespace) -> int:
    from respo.study.run_report import write_run_report
    from respo.train.config import load_config
    from respo.train.trainer import train

    cfg = load_config(args.config, _overrides(args))
    _transformers_progress(cfg.progress)
    run_dir = train(cfg, resume=args.resume, overwrite=args.overwrite)
    if not (run_dir / "report.md").exists():  # a finished run left untouched keeps its report
        write_run_report(run_dir)
    summary = json.loads((run_dir / "summary.json").read_text())
    print(json.dumps({"run_dir": str(run_dir), "eval_before": _scalars(summary.get("eval_before")),
                      "eval_after": _scalars(summary.get("eval_after")), "wall_s": summary.get("wall_s")}, indent=1))
    return 0


def _eval_source(args: argparse.Namespace) -> tuple:
    """(model dir, task spec, task kwargs, max new tokens, run config) for ``respo eval``: explicit flags first,
    then what a run directory's config.json or a warm start's respo_warm_start.json recorded; the run config is
    the run directory's config.json ({} for a model or warm-start directory)."""
    src = Path(args.model)
    task_spec, task_kwargs, max_new, run_cfg = args.task, None, args.max_new_tokens, {}
    if not (src / "config.json").is_file() and not (src / "respo_warm_start.json").is_file():
        raise NotARunError(f"not a run or model directory: {src}")
    if (src / "metrics.jsonl").is_file() and not (src / "final").is_dir():
        raise NotARunError(f"run directory {src} has no final/ policy yet (the run has not finished)")
    if (src / "config.json").is_file() and (src / "final").is_dir():  # a run directory
        run_cfg = json.loads((src / "config.json").read_text())
        task_spec = task_spec or run_cfg["task"]
        task_kwargs = run_cfg.get("task_kwargs", {})
        max_new = run_cfg["max_new_tokens"] if max_new is None else max_new
        src = src / "final"
    elif (src / "respo_warm_start.json").is_file():  # a warm-start directory: it records its task settings
        info = json.loads((src / "respo_warm_start.json").read_text())
        task_spec = task_spec or info["config"]["task"]
        task_kwargs = info["config"].get("task_kwargs", {})
        max_new = info.get("max_new_tokens") if max_new is None else max_new
    if args.task_kwargs is not None:  # explicit settings win over the recorded ones (parsed by argparse)
        task_kwargs = args.task_kwargs
    if task_kwargs is None:
        task_kwargs = {}
        print(f"respo eval: {src} records no task settings; using the defaults of task "
              f"{task_spec or 'addition'!r} (pass --task/--task-kwargs to choose)", file=sys.stderr)
    return src, task_spec, task_kwargs, max_new, run_cfg


def _eval_protocol(args: argparse.Namespace, run_cfg: dict) -> dict:
    """How ``respo eval`` samples: the policy's compute dtype, the engine, its dtype and threads and the prompt
    format, from the flags,
    else what the run directory's config.json recorded (so a run is re-scored the way it scored itself),
    else the defaults (respo's sampler, prompts rendered as ``auto``)."""
    from respo.train.config import TrainConfig

    defaults = TrainConfig()
    return {name: getattr(args, name) if getattr(args, name) is not None else run_cfg.get(name, getattr(defaults, name))
            for name in ("dtype", "rollout_engine", "engine_dtype", "engine_threads", "prompt_format")}


def _eval_flag_problem(args: argparse.Namespace) -> str | None:
    """What is wrong with ``respo eval``'s numeric flags (the first problem), None when nothing is."""
    import math

    checks = (("--prompts", args.prompts, args.prompts >= 1, ">= 1"), ("--k", args.k, args.k >= 1, ">= 1"),
              ("--temperature", args.temperature, math.isfinite(args.temperature) and args.temperature > 0,
               "a finite number > 0"),
              ("--max-new-tokens", args.max_new_tokens, args.max_new_tokens is None or args.max_new_tokens >= 1,
               ">= 1 (or left out: the run's)"),
              ("--threads", args.threads, args.threads >= 0, ">= 0 (0 keeps torch's default)"),
              ("--engine-threads", args.engine_threads, args.engine_threads is None or args.engine_threads >= 1,
               ">= 1 (or left out: the run's)"))
    return next((f"{flag} must be {bound}, got {value}" for flag, value, ok, bound in checks if not ok), None)


def _cmd_eval(args: argparse.Namespace) -> int:
    import torch

    from respo.runtime.precision import DTYPES, device_problem, mixed_precision
    from respo.runtime.tasks import load_task
    from respo.train.config import ConfigError, apply_overrides, sampling_problems, TrainConfig
    from respo.train.evaluate import evaluate_policy
    from respo.train.evaluate import EVAL_SEED
    from respo.train.policy import load_run_policy
    from respo.runtime.chat import render_for
    from respo.runtime.engines import make_engine

    problem = device_problem(args.device) or (None if args.dtype in (None, *DTYPES) else
                                              f"dtype {args.dtype!r} is unknown; choose one of {', '.join(DTYPES)}")
    problem = problem or _eval_flag_problem(args)
    if problem:
        raise ConfigError(problem)
    src, task_spec, task_kwargs, max_new, run_cfg = _eval_source(args)
    protocol = _eval_protocol(args, run_cfg)
    problems = sampling_problems(protocol, spell=lambda name: "--" + name.replace("_", "-"))
    if problems:
        raise ConfigError(problems[0])
    cfg = apply_overrides(TrainConfig(), {"model": str(src), "task": task_spec or "addition",
                                          "task_kwargs": task_kwargs, "warm_start": False, "device": args.device})
    if args.threads:
        torch.set_num_threads(args.threads)
    task = load_task(cfg.task, cfg.task_kwargs)
    policy = load_run_policy(cfg)
    # the prompts as a run with this model sees them (its chat template under "auto"), as its evaluations did
    task, examples = render_for(policy.tokenizer, protocol["prompt_format"], task,
                                task.examples("test", args.prompts, EVAL_SEED))
    generator = torch.Generator(device=next(policy.model.parameters()).device).manual_seed(args.seed)
    engine = None
    if protocol["rollout_engine"] != "respo":
        engine = make_engine(protocol["rollout_engine"], policy.model, policy.tokenizer, dtype=protocol["dtype"],
                             engine_dtype=protocol["engine_dtype"], threads=protocol["engine_threads"], verbose=False)
    try:
        if engine is not None:
            engine.sync_weights(policy.model)
        with mixed_precision(policy.model, protocol["dtype"]):
            out = evaluate_policy(policy.model, policy.tokenizer, task, examples, k=args.k,
                                  max_new_tokens=24 if max_new is None else max_new, temperature=args.temperature,
                                  generator=generator, greedy=not args.no_greedy, engine=engine)
    finally:
        if engine is not None:
            engine.close()
    sampler = {"dtype": protocol["dtype"], "engine": protocol["rollout_engine"], "prompt_format": protocol["prompt_format"]}
    if engine is not None:
        sampler.update(engine_dtype=engine.info.get("dtype", protocol["engine_dtype"]),
                       engine_threads=protocol["engine_threads"])
    print(json.dumps({"model": str(src), "task": cfg.task, **sampler, **_scalars(out)}, indent=1))
    return 0


def _add_sft_flags(p: argparse.ArgumentParser) -> None:
    """The warm-start flags: task, preset or model, cache, and one ``--field-name`` per `SFTConfig` field."""
    from respo.runtime.sft import DEFAULT_CACHE_DIR, DEFAULT_TASK, SFTConfig
    from respo.runtime.tasks import task_help
    from respo.runtime.tasks.args import TASK_KWARGS_HELP, add_task_kwargs_arguments

    p.add_argument("--task", default=DEFAULT_TASK, help=f"task spec: {task_help()} (default: addition)")
    add_task_kwargs_arguments(p, f"{TASK_KWARGS_HELP} (default for addition: digits=5, scratchpad=true)")
    p.add_argument("--preset", default="tiny-dense", help="model preset (tiny-dense, tiny-moe)")
    p.add_argument("--model", default=None,
                   help="a packaged pretrained model (smollm2-135m-instruct) or a model directory to warm-start "
                        "instead of a preset: SFT through its chat template (respo.runtime.pretrained_sft)")
    p.add_argument("--cache-dir", default=DEFAULT_CACHE_DIR,
                   help=f"directory of cached warm starts, one per settings hash (default: {DEFAULT_CACHE_DIR}, "
                        "where respo train looks)")
    p.add_argument("--seed", type=int, default=0, help="seed of initialisation, data order and evaluation samples")
    p.add_argument("--threads", type=int, default=None,
                   help="torch threads (default: torch's; 1 is faster when other processes share the cores)")
    p.add_argument("--force", action="store_true", help="retrain even if cached")
    p.add_argument("--device", default="cpu", help="where SFT runs: cpu, cuda, cuda:K or auto (not part of the cache key)")
    p.add_argument("--record", default=None, metavar="FILE",
                   help="also write the warm start's record to FILE (atomically): its cached respo_warm_start.json "
                        "and, as \"command\", this command without --cache-dir and --record")
    defaults = SFTConfig()
    for name, f in SFTConfig.__dataclass_fields__.items():
        if name in _SFT_RUN_FIELDS:
            continue
        kind = {"int": int, "float": float, "int | None": int, "float | None": float}.get(str(f.type), str)
        p.add_argument(f"--{name.replace('_', '-')}", type=kind, default=None,
                       help=f"SFTConfig.{name} (default: {getattr(defaults, name)})")


#: `SFTConfig` fields given by their own flags (or, for model_overrides, only through the library).
_SFT_RUN_FIELDS = ("task", "task_kwargs", "preset", "seed", "model_overrides")
#: Flags that say where a warm start is kept or recorded, not what it is: left out of its recorded command.
_WHERE_FLAGS = ("cache_dir", "record")


def sft_command(args: argparse.Namespace) -> str:
    """The ``respo sft`` command of parsed ``respo sft`` flags: every flag whose value differs from its default,
    in the parser's order, except `_WHERE_FLAGS`; an absolute path is written as its last part."""
    p = argparse.ArgumentParser(add_help=False)
    _add_sft_flags(p)
    words, seen = ["python", "-m", "respo", "sft"], set()
    for action in p._actions:
        dest = action.dest
        if dest in seen or dest in _WHERE_FLAGS:
            continue
        seen.add(dest)
        value = getattr(args, dest, action.default)
        if value == action.default:
            continue
        flag = action.option_strings[0]
        if isinstance(action, argparse._StoreTrueAction):
            words.append(flag)
        elif dest == "task_kwargs":
            words += ["--task-kwargs", json.dumps(value, sort_keys=True)]
        else:
            text = str(value)
            words += [flag, Path(text).name if os.path.isabs(text) else text]
    return shlex.join(words)


def write_record(path: Path, args: argparse.Namespace, record_file: str | Path) -> dict:
    """Write ``{"command": sft_command(args), **<path>/respo_warm_start.json}`` to ``record_file`` atomically
    (a temporary file beside it, renamed); the record. A top-level value that is an absolute path (``source``,
    where the pretrained model was read from) is written as its last part, as in the command."""
    from respo.fileio import write_text_atomic
    from respo.runtime.sft import INFO_FILE

    info = json.loads((Path(path) / INFO_FILE).read_text())
    record = {"command": sft_command(args), **{k: Path(v).name if isinstance(v, str) and os.path.isabs(v) else v
                                               for k, v in info.items()}}
    write_text_atomic(record_file, json.dumps(record, indent=1) + "\n")
    return record


def run_sft(args: argparse.Namespace):
    """``respo sft``: build (or find in the cache) the warm start the flags describe, print a JSON summary line and,
    with ``--record FILE``, write its record (`write_record`); the `WarmStart` (a preset) or the warm start's
    directory (``--model``). Every flag is checked before anything is built."""
    import torch

    from respo.runtime.precision import device_problem
    from respo.runtime.sft import DEFAULT_TASK, DEFAULT_TASK_KWARGS, INFO_FILE, SFTConfig, SFTSettingsError
    from respo.runtime.tasks import load_task

    record = args.record
    if record is not None and not Path(record).parent.is_dir():
        raise SFTSettingsError(f"--record {record}: directory {Path(record).parent} does not exist")
    problem = device_problem(args.device)
    if problem:
        raise SFTSettingsError(problem)
    if args.threads is not None and args.threads < 0:
        raise SFTSettingsError(f"--threads must be >= 0 (0 keeps torch's default), got {args.threads}")
    load_task(args.task, DEFAULT_TASK_KWARGS if args.task_kwargs is None and args.task == DEFAULT_TASK
              else args.task_kwargs)  # a bad task is a one-line error before anything is trained
    settings = {name: getattr(args, name) for name in SFTConfig.__dataclass_fields__
                if name not in _SFT_RUN_FIELDS and getattr(args, name, None) is not None}
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.model:
        from respo.runtime.pretrained_sft import PretrainedSFTConfig, warm_start_pretrained

        unknown = sorted(set(settings) - set(PretrainedSFTConfig.__dataclass_fields__))
        if unknown:
            raise SFTSettingsError(f"--model {args.model}: the pretrained warm start has no setting(s) "
                                   f"{', '.join('--' + u.replace('_', '-') for u in unknown)}")
        path = warm_start_pretrained(args.model, args.task, args.cache_dir, task_kwargs=args.task_kwargs,
                                     force=args.force, seed=args.seed, device=args.device, **settings)
        info = json.loads((path / INFO_FILE).read_text())
        print(json.dumps({"path": str(path), **{k: info[k] for k in ("pass_rate", "mean_response_tokens", "steps",
                                                                   "stopped_by", "train_seconds")}}))
        result = path
    else:
        from respo.runtime.sft import warm_start

        result = warm_start(args.task, args.preset, args.cache_dir, seed=args.seed, task_kwargs=args.task_kwargs,
                            force=args.force, verbose=True, device=args.device, **settings)
        print(json.dumps({"path": str(result.path), "pass_rate": result.pass_rate,
                          "greedy_pass_rate": result.greedy_pass_rate, "steps": result.steps,
                          "stopped_by": result.stopped_by, "train_seconds": result.train_seconds,
                          "reused": result.reused}))
        path = result.path
    if record is not None:
        write_record(path, args, record)
    return result


def _cmd_sft(args: argparse.Namespace) -> int:
    run_sft(args)
    return 0


def _cmd_hyperparameters(args: argparse.Namespace) -> int:
    """Each objective (all, or those named) with its default aggregation, hyperparameters, source and loss."""
    from respo.core.objectives import OBJECTIVES
    from respo.core.registry import format_hyperparameters, get_spec

    names = args.objectives or list(OBJECTIVES)
    unknown = [n for n in names if n not in OBJECTIVES]
    if unknown:
        raise RespoError(f"unknown objective(s) {', '.join(unknown)}; valid objectives: {', '.join(sorted(OBJECTIVES))}")
    for name in names:
        spec = get_spec(name)
        print(f"{name}\n  aggregation: {spec.default_agg}\n  hyperparameters: {format_hyperparameters(name) or 'none'}\n"
              f"  source: {spec.source}\n  loss: {spec.summary}")  # fmt: skip
    return 0


def _cmd_demo(args: argparse.Namespace) -> int:
    from respo.train.config import coerce
    from respo.demo import run_demo

    overrides = _overrides(args)
    _transformers_progress(coerce("progress", overrides.get("progress", True)))
    objectives = None
    if args.objectives is not None:
        objectives = [o.strip() for o in args.objectives.split(",") if o.strip()]
    report = run_demo(overrides=overrides, objectives=objectives)
    print(f"report: {report}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    from respo.runtime.tasks import task_help
    from respo.runtime.tasks.args import TASK_KWARGS_HELP, add_task_kwargs_arguments

    parser = _Parser(prog="respo", description="Stable off-policy RL for LMs under rollout staleness (ReSPO).")
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("train", help="train a policy (sync reuse-N or async)",
                       description="Train with any objective; every config field is a flag.")
    p.add_argument("--config", help="TOML file with config fields (see configs/)")
    p.add_argument("--resume", action="store_true", help="continue from the newest checkpoint in --out-dir")
    p.add_argument("--overwrite", action="store_true",
                   help="delete a previous run in --out-dir and start again (without it, a used --out-dir is refused)")
    _add_config_flags(p)
    p.set_defaults(func=_cmd_train)

    p = sub.add_parser("eval", help="held-out mean@k / pass@k of a run or model directory")
    p.add_argument("model", help="a run directory (uses its final/ policy and task) or a model directory")
    p.add_argument("--task", default=None,
                   help=f"task spec: {task_help()} (default: the run's or warm start's task, else addition)")
    add_task_kwargs_arguments(p, f"{TASK_KWARGS_HELP} (default: the run's or warm start's)")
    p.add_argument("--prompts", type=int, default=256, help="held-out prompts to evaluate")
    p.add_argument("--k", type=int, default=8, help="samples per prompt")
    p.add_argument("--temperature", type=float, default=1.0, help="sampling temperature")
    p.add_argument("--max-new-tokens", type=int, default=None,
                   help="maximum response length (default: the run's or warm start's, else 24)")
    p.add_argument("--seed", type=int, default=1234, help="seed of the sampling generator")
    p.add_argument("--threads", type=int, default=0, help="torch intra-op threads; 0 keeps torch's default")
    p.add_argument("--no-greedy", action="store_true", help="skip the greedy-decoding accuracy")
    p.add_argument("--device", default="cpu", help="where to sample: cpu, cuda, cuda:K or auto")
    p.add_argument("--dtype", default=None,
                   help="float32 or bfloat16 (autocast, float32 logits) (default: the run's, else float32)")
    p.add_argument("--rollout-engine", default=None,
                   help="what samples: respo (the embedded sampler) or vllm (default: the run's engine, else respo)")
    p.add_argument("--engine-dtype", default=None,
                   help="vllm engine: auto, bfloat16 or float32 (default: the run's, else auto)")
    p.add_argument("--engine-threads", type=int, default=None,
                   help="vllm engine: CPU threads of the engine process (default: the run's, else 1)")
    p.add_argument("--prompt-format", default=None,
                   help="auto (the tokenizer's chat template when it has one), chat or raw (default: the run's, else auto)")
    p.set_defaults(func=_cmd_eval)

    p = sub.add_parser("sft", help="warm-start a preset or a packaged model on task demonstrations (cached)",
                       description="Warm start: supervised fine-tuning on task demonstrations to a measured, "
                                   "mid-range pass rate (cached, one directory per settings hash).")
    _add_sft_flags(p)
    p.set_defaults(func=_cmd_sft)

    p = sub.add_parser("hyperparameters", help="every objective's hyperparameters, defaults and source",
                       description="Each objective with its default aggregation, its hyperparameters with their "
                                   "published defaults, the publication and framework setting they come from, "
                                   "and its loss in one line.")
    p.add_argument("objectives", nargs="*", help="objectives to list (default: all)")
    p.set_defaults(func=_cmd_hyperparameters)

    p = sub.add_parser("demo", help="three objectives side by side at high staleness: before/after eval, "
                                    "the starvation diagnostic, one report and figure")
    p.add_argument("--objectives", default=None, metavar="A,B,...",
                   help="the objectives to put side by side, comma-separated (default: vespo,respo,respo+/vespo-); "
                        "--objective X runs X alone")
    _add_config_flags(p)  # --out-dir (default runs/demo) is the report directory
    p.set_defaults(func=_cmd_demo)

    for mod in EXTENSIONS:
        importlib.import_module(mod).register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:

    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except RespoError as err:
        print(f"respo {args.command}: error: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt as err:  # train() has written a checkpoint at the last update boundary
        print(f"respo {args.command}: interrupted ({err})", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
