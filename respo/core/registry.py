"""The registry of objectives: each objective is registered where its factory is defined, and every
list of objectives is read from here (``build_objective``, ``hyperparameters``, ``OBJECTIVES`` and the
``<name>_loss`` functions, ``respo hyperparameters``, the integrations, the catalogue in docs/method.md
and in the module docstrings, which ``scripts/catalogue.py`` writes from ``catalogue_block`` and
``catalogue_table``).

An objective is one factory and one registration, the ``objective`` decorator on it:

    @objective("cispo", family="ratio", summary="−sg(clip(r, 1−ε_l, 1+ε_h))·Â·logp",
               source="MiniMax-M1, arXiv 2506.13585; verl 0.9.1 loss_mode='cispo', ActorConfig ε = 0.2")
    def _cispo(clip_ratio_low: float = 0.2, clip_ratio_high: float = 0.2) -> TermFn:
        ...

The factory's keyword arguments are the objective's hyperparameters and their defaults the published
values (``ObjectiveSpec.hyperparameters``); it checks them (a bad value raises ``ValueError`` in one line)
and returns the term ``term(inputs, log_ratio, rho) -> Term`` the pipeline runs (``respo.core.objectives``).
The registration adds what the pipeline and the catalogue need besides: the one-line ``summary`` of the
loss, the ``source`` of its formula and defaults, its ``family`` (a section of the catalogue), its default
aggregation, whether its losses are per sequence, whether each row's loss scales with its advantages
(``scale_free``: a host that pre-scales the advantages, as SkyRL does, can run only those) and the extra
per-token tensors it reads. A factory that
wraps a pure function taking the same hyperparameters names it in ``same_defaults_as``, and a default
that differs between the two is refused when it is registered.

Names are unique: registering a name twice is refused (``unregister_objective`` removes one that is not
built in).
"""

from __future__ import annotations

import inspect
import re
import textwrap
from dataclasses import dataclass, field
from typing import Callable, Dict, List, Optional, Tuple, TypeVar

import torch

from respo.core.aggregation import AGG_MODES
from respo.core.checks import LossInputs

Metrics = Dict[str, torch.Tensor]


@dataclass(frozen=True)
class Term:
    """What one objective contributes to the pipeline.

    values: (B, T) per-token loss ℓ_it with grad, or (B,) per-sequence loss for a per-sequence objective.
    coef: detached gradient coefficient c, (B, T) per token or (B,) per sequence.
    metrics: extra detached metrics (clip fractions).
    log_w: (B,) log W when the term computed it (the diagnostics reuse it).
    """

    values: torch.Tensor
    coef: torch.Tensor
    metrics: Metrics = field(default_factory=dict)
    log_w: Optional[torch.Tensor] = None


# term(inputs, log_ratio (B, T) with grad, rho (B, T) or None) -> Term
TermFn = Callable[[LossInputs, torch.Tensor, Optional[torch.Tensor]], Term]
Factory = TypeVar("Factory", bound=Callable[..., TermFn])


def weigh(x: torch.Tensor, weight: Optional[torch.Tensor]) -> torch.Tensor:
    """x · weight, or x itself without a weight (a term's per-token loss times the rollout weight ρ)."""
    return x if weight is None else x * weight


#: The sections of the catalogue, in its order: family -> title.
FAMILIES: Dict[str, str] = {
    "sequence-weight": "Sequence-weight objectives (REINFORCE-shaped, a detached φ_i per sequence; log ρ folds into "
                       "log W)",
    "ratio": "Ratio objectives (a clip or gate on r = π_θ/π_old; ρ multiplies the per-token loss)",
    "correction": "Staleness corrections the frameworks ship (log w = logp − old_logp + log ρ)",
    "rule": "The frameworks' other policy-loss rules",
    "other": "Other objectives",
}  # fmt: skip

_NAME = re.compile(r"[a-z][a-z0-9_]*")


class UnknownObjectiveError(ValueError):
    """``name`` is not an objective; ``valid`` lists the objectives."""

    def __init__(self, name: object, valid: List[str]):
        self.name, self.valid = name, valid
        super().__init__(f"unknown objective {name!r}; valid objectives: {', '.join(valid)}")


@dataclass(frozen=True, eq=False)
class ObjectiveSpec:
    """One registered objective: its factory and what the pipeline and the catalogue read about it."""

    name: str
    factory: Callable[..., TermFn]  # hyperparameters (with their published defaults) -> term; checks them
    summary: str  # the loss in one line
    source: str  # the publication and the framework setting its formula and defaults are taken from
    family: str = "other"  # a key of FAMILIES
    default_agg: str = "token-mean"
    per_sequence: bool = False  # the term gives per-sequence losses (only ``default_agg`` is accepted)
    inputs: Tuple[str, ...] = ()  # extra (B, T) tensors the term reads from ``inputs.extra``
    optional_inputs: Tuple[str, ...] = ()  # extra (B, T) tensors a call may leave out
    # each row's loss scales with a positive factor on that row's advantages, ℓ_i(c·Â_i) = c·ℓ_i(Â_i) for c > 0
    # (False where a term not multiplied by Â, or a selection by a threshold on Â's scale, enters the loss)
    scale_free: bool = True

    @property
    def hyperparameters(self) -> Dict[str, object]:
        """The factory's keyword arguments with their published defaults."""
        return {p.name: p.default for p in inspect.signature(self.factory).parameters.values()}


_REGISTRY: Dict[str, ObjectiveSpec] = {}
_BUILT_IN: set = set()  # names registered by respo's own modules (not removable)


def register_objective(name: str, factory: Callable[..., TermFn], *, summary: str, source: str,
                       family: str = "other", default_agg: str = "token-mean", per_sequence: bool = False,
                       inputs: Tuple[str, ...] = (), optional_inputs: Tuple[str, ...] = (), scale_free: bool = True,
                       same_defaults_as: Optional[Callable] = None) -> ObjectiveSpec:  # fmt: skip
    """Register objective ``name`` made by ``factory`` (see the module docstring); returns its ``ObjectiveSpec``.

    Raises:
      ValueError: a name already registered or not of the form ``[a-z][a-z0-9_]*``, an empty summary or
        source, an unknown family or aggregation, a hyperparameter without a default, or one whose default
        differs from that of ``same_defaults_as``.
    """
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        raise ValueError(f"objective name {name!r} must be lower-case letters, digits and _, starting with a letter")
    if name in _REGISTRY:
        raise ValueError(f"objective {name!r} is already registered ({_where(_REGISTRY[name].factory)})")
    if not (summary.strip() and source.strip()):
        raise ValueError(f"objective {name!r}: summary and source must not be empty")
    if family not in FAMILIES:
        raise ValueError(f"objective {name!r}: family must be one of {tuple(FAMILIES)}, got {family!r}")
    if default_agg not in AGG_MODES:
        raise ValueError(f"objective {name!r}: default_agg must be one of {AGG_MODES}, got {default_agg!r}")
    spec = ObjectiveSpec(name, factory, summary, source, family, default_agg, per_sequence, tuple(inputs),
                         tuple(optional_inputs), scale_free)  # fmt: skip
    missing = [k for k, v in spec.hyperparameters.items() if v is inspect.Parameter.empty]
    if missing:
        raise ValueError(f"objective {name!r}: hyperparameter(s) {missing} need their published default")
    if same_defaults_as is not None:
        _check_same_defaults(spec, same_defaults_as)
    _REGISTRY[name] = spec
    if factory.__module__.startswith("respo."):
        _BUILT_IN.add(name)
    return spec


def objective(name: str, **registration) -> Callable[[Factory], Factory]:
    """Decorator form of ``register_objective``: registers the factory it decorates and returns it unchanged."""

    def decorate(factory: Factory) -> Factory:
        register_objective(name, factory, **registration)
        return factory

    return decorate


def unregister_objective(name: str) -> None:
    """Remove objective ``name``, registered outside respo (respo's own objectives stay)."""
    get_spec(name)
    if name in _BUILT_IN:
        raise ValueError(f"objective {name!r} is one of respo's own and cannot be removed")
    del _REGISTRY[name]


def _where(fn: Callable) -> str:
    return f"{fn.__module__}.{fn.__qualname__}"


def _check_same_defaults(spec: ObjectiveSpec, fn: Callable) -> None:
    """Every hyperparameter of ``spec`` is a keyword argument of ``fn`` with the same default."""
    theirs = inspect.signature(fn).parameters
    for key, default in spec.hyperparameters.items():
        if key not in theirs or theirs[key].default != default:
            got = theirs[key].default if key in theirs else "no such argument"
            raise ValueError(f"objective {spec.name!r}: {key}={default!r} in {_where(spec.factory)} but {got!r} in "
                             f"{_where(fn)}; the two must agree")  # fmt: skip


def get_spec(name: str) -> ObjectiveSpec:
    """The registration of objective ``name``; ``UnknownObjectiveError`` (a ``ValueError``) if there is none."""
    try:
        return _REGISTRY[name]
    except (KeyError, TypeError):
        raise UnknownObjectiveError(name, sorted(_REGISTRY)) from None


def objective_names(family: Optional[str] = None, module: Optional[str] = None) -> List[str]:
    """The registered objectives in catalogue order (by family, then as registered), or those of one family, or
    those registered in one module (where their factory is defined)."""
    order = list(FAMILIES)
    names = sorted(_REGISTRY, key=lambda n: order.index(_REGISTRY[n].family))  # stable: registration order within
    return [n for n in names if (family is None or _REGISTRY[n].family == family)
            and (module is None or _REGISTRY[n].factory.__module__ == module)]  # fmt: skip


# --------------------------------------------------------------------------------------------------
# The catalogue as text: the module docstrings' lists and docs/method.md's table
# --------------------------------------------------------------------------------------------------


def format_hyperparameters(name: str) -> str:
    """``k=v, …`` of objective ``name``'s hyperparameters and defaults (empty when it has none)."""
    return ", ".join(f"{k}={v!r}" for k, v in get_spec(name).hyperparameters.items())


def catalogue_block(names: List[str], *, indent: int = 4, width: int = 116, by_family: bool = False,
                    brief: bool = False) -> str:  # fmt: skip
    """The objectives ``names`` as a docstring's list: per objective its summary, its defaults and default
    aggregation, its source (``brief``: its defaults and default aggregation alone); ``by_family`` puts each
    family's title above its objectives."""
    pad, col = " " * indent, 15
    lines: List[str] = []
    family = None
    for name in names:
        spec = get_spec(name)
        if by_family and spec.family != family:
            family = spec.family
            lines += textwrap.wrap(FAMILIES[family] + ":", width, initial_indent=pad[:-2], subsequent_indent=pad)
        defaults = f"{format_hyperparameters(name) or 'no hyperparameters'}; {spec.default_agg}"
        texts = [defaults] if brief else [spec.summary, defaults, spec.source]
        first = f"{pad}{name:<{col - 1}} "
        for i, text in enumerate(texts):
            lead = first if i == 0 else pad + " " * col
            lines += textwrap.wrap(text, width, initial_indent=lead, subsequent_indent=pad + " " * col,
                                   break_on_hyphens=False)  # fmt: skip
    return "\n".join(lines)


def catalogue_table(names: List[str]) -> str:
    """The objectives ``names`` as a Markdown table: name, loss, defaults, default aggregation, source."""

    def md(text: str) -> str:
        return text.replace("``", "`").replace("|", "\\|")

    rows = ["| name | loss | defaults | aggregation | source |", "|---|---|---|---|---|"]
    for name in names:
        spec = get_spec(name)
        defaults = ", ".join(f"`{k}={v!r}`" for k, v in spec.hyperparameters.items()) or "none"
        rows.append(f"| `{name}` | {md(spec.summary)} | {defaults} | `{spec.default_agg}` | {md(spec.source)} |")
    return "\n".join(rows)


__all__ = [
    "FAMILIES", "ObjectiveSpec", "Term", "TermFn", "UnknownObjectiveError", "catalogue_block", "catalogue_table",
    "format_hyperparameters", "get_spec", "objective", "objective_names", "register_objective",
    "unregister_objective", "weigh",
]  # fmt: skip
