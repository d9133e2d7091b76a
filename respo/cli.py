"""``respo`` command line: ``train``, ``eval``, ``demo``.

Built on the standard library's argparse: the flags of ``respo train`` are generated from the
fields of `respo.train.config.TrainConfig` (one ``--field-name VALUE`` per field, parsed by the same
`coerce` as TOML values, its help line taken from the field's ``metadata["help"]``), so the
dataclass stays the single definition of every setting and no extra dependency is needed. Values
given on the command line override the ``--config`` TOML file.

Values may be negative numbers (``--lr -1e-4`` reads like ``--lr=-1e-4``). Task settings have one
spelling everywhere: ``--task-kwargs JSON`` or ``--task-kwarg KEY=VALUE`` (repeatable).

Other modules add subcommands: every module listed in ``EXTENSIONS`` defines
``register(subparsers)`` and is called with the argparse subparsers (the study's ``sweep``/``report``,
the runtime's ``sft``). They are part of the package, so a failure to import one is an error, not a
missing command.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import json
import re
import sys
from pathlib import Path

from respo.errors import RespoError

__all__ = ["main", "build_parser"]

EXTENSIONS = ("respo.study.cli", "respo.runtime.sft")
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
    """(model dir, task spec, task kwargs, max new tokens) for ``respo eval``: explicit flags first, then
    what a run directory's config.json or a warm start's respo_warm_start.json recorded."""
    src = Path(args.model)
    task_spec, task_kwargs, max_new = args.task, None, args.max_new_tokens
    if not (src / "config.json").is_file() and not (src / "respo_warm_start.json").is_file():
        raise NotARunError(f"not a run or model directory: {src}")
    if (src / "metrics.jsonl").is_file() and not (src / "final").is_dir():
        raise NotARunError(f"run directory {src} has no final/ policy yet (the run has not finished)")
    if (src / "config.json").is_file() and (src / "final").is_dir():  # a run directory
        run_cfg = json.loads((src / "config.json").read_text())
        task_spec = task_spec or run_cfg["task"]
        task_kwargs = run_cfg.get("task_kwargs", {})
        max_new = max_new or run_cfg["max_new_tokens"]
        src = src / "final"
    elif (src / "respo_warm_start.json").is_file():  # a warm-start directory: it records its task settings
        info = json.loads((src / "respo_warm_start.json").read_text())
        task_spec = task_spec or info["config"]["task"]
        task_kwargs = info["config"].get("task_kwargs", {})
        max_new = max_new or info.get("max_new_tokens")
    if args.task_kwargs is not None:  # explicit settings win over the recorded ones (parsed by argparse)
        task_kwargs = args.task_kwargs
    if task_kwargs is None:
        task_kwargs = {}
        print(f"respo eval: {src} records no task settings; using the defaults of task "
              f"{task_spec or 'addition'!r} (pass --task/--task-kwargs to choose)", file=sys.stderr)
    return src, task_spec, task_kwargs, max_new


def _cmd_eval(args: argparse.Namespace) -> int:
    import torch

    from respo.runtime.precision import DTYPES, device_problem, mixed_precision
    from respo.runtime.tasks import load_task
    from respo.train.config import ConfigError, apply_overrides, TrainConfig
    from respo.train.evaluate import evaluate_policy
    from respo.train.evaluate import EVAL_SEED
    from respo.train.policy import load_run_policy

    problem = device_problem(args.device) or (None if args.dtype in DTYPES else
                                              f"dtype {args.dtype!r} is unknown; choose one of {', '.join(DTYPES)}")
    if problem:
        raise ConfigError(f"respo eval: {problem}")
    src, task_spec, task_kwargs, max_new = _eval_source(args)
    cfg = apply_overrides(TrainConfig(), {"model": str(src), "task": task_spec or "addition",
                                          "task_kwargs": task_kwargs, "warm_start": False, "device": args.device})
    if args.threads:
        torch.set_num_threads(args.threads)
    task = load_task(cfg.task, cfg.task_kwargs)
    policy = load_run_policy(cfg)
    examples = task.examples("test", args.prompts, EVAL_SEED)
    generator = torch.Generator(device=next(policy.model.parameters()).device).manual_seed(args.seed)
    with mixed_precision(policy.model, args.dtype):
        out = evaluate_policy(policy.model, policy.tokenizer, task, examples, k=args.k, max_new_tokens=max_new or 24,
                              temperature=args.temperature, generator=generator, greedy=not args.no_greedy)
    print(json.dumps({"model": str(src), "task": cfg.task, **_scalars(out)}, indent=1))
    return 0


def _cmd_demo(args: argparse.Namespace) -> int:
    from respo.train.config import coerce
    from respo.demo import run_demo

    overrides = _overrides(args)
    _transformers_progress(coerce("progress", overrides.get("progress", True)))
    report = run_demo(overrides=overrides)
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
    p.add_argument("--dtype", default="float32", help="float32 or bfloat16 (autocast, float32 logits)")
    p.set_defaults(func=_cmd_eval)

    p = sub.add_parser("demo", help="warm start + off-policy ReSPO + before/after eval + report")
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
