"""The catalogue of objectives: one registry (``respo.core.registry``) every list of objectives reads, and the
places the catalogue is written (the module docstrings, docs/method.md) checked against it."""

import ast
import dataclasses
import importlib.util
import inspect
import re
import sys
from pathlib import Path

import pytest
import torch

import respo
import respo.core
from respo.core import corrections, objectives, registry, rules
from respo.core.registry import Term, get_spec, objective_names, register_objective, unregister_objective

ROOT = Path(__file__).parents[2]
_spec = importlib.util.spec_from_file_location("catalogue_script", ROOT / "scripts" / "catalogue.py")
catalogue = sys.modules.setdefault("catalogue_script", importlib.util.module_from_spec(_spec))
_spec.loader.exec_module(catalogue)
CORE_PLACES = [p for p in catalogue.PLACES if not p.needs]  # the verl place: tests/integrations/test_verl_plugin.py


def _toy_factory(kappa: float = 0.5):
    """−κ·Â·logp (a test double)."""

    def term(inputs, log_ratio, rho):
        return Term(-kappa * inputs.adv * inputs.logp, torch.full_like(inputs.logp, kappa))

    return term


@pytest.fixture
def toy():
    """A toy objective registered for one test."""
    register_objective("toy", _toy_factory, family="correction", summary="−κ·Â·logp", source="a test double")
    yield "toy"
    unregister_objective("toy")


@pytest.mark.parametrize("place", CORE_PLACES, ids=lambda p: p.path)
def test_every_place_the_catalogue_is_written_is_the_registry(place):
    assert catalogue.written(place) == catalogue.expected(place), f"{place.path}: run python scripts/catalogue.py"


def test_a_new_objective_or_another_default_makes_the_places_stale(monkeypatch):
    toy = {"summary": "−κ·Â·logp", "source": "a test double"}
    try:  # an objective of one's own is missing from the catalogue of every objective
        register_objective("toy", _toy_factory, family="correction", **toy)
        assert catalogue.stale(CORE_PLACES) == ["docs/method.md"]
    finally:
        unregister_objective("toy")
    assert catalogue.stale(CORE_PLACES) == []

    # a new correction in respo.core.corrections is missing there too
    def new_correction(kappa: float = 0.5):
        return _toy_factory(kappa)

    new_correction.__module__ = "respo.core.corrections"
    spec = registry.ObjectiveSpec("toy", new_correction, family="correction", **toy)
    monkeypatch.setitem(registry._REGISTRY, "toy", spec)
    assert catalogue.stale(CORE_PLACES) == ["respo/core/corrections.py", "docs/method.md"]
    monkeypatch.delitem(registry._REGISTRY, "toy")

    published = get_spec("grpo").factory

    def grpo(clip_ratio_low: float = 0.3, clip_ratio_high: float = 0.2, clip_ratio_c: float = 3.0):
        return published(clip_ratio_low, clip_ratio_high, clip_ratio_c)

    # grpo with another default clip (registered in respo.core.objectives)
    grpo.__module__ = "respo.core.objectives"
    monkeypatch.setitem(registry._REGISTRY, "grpo", dataclasses.replace(get_spec("grpo"), factory=grpo))
    assert catalogue.stale(CORE_PLACES) == ["respo/core/objectives.py", "docs/method.md"]


def test_the_script_writes_a_stale_place(tmp_path, toy):
    place = next(p for p in CORE_PLACES if p.path == "docs/method.md")
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "method.md").write_text((ROOT / "docs" / "method.md").read_text())
    assert catalogue.stale([place], tmp_path) == ["docs/method.md"]
    assert catalogue.write(place, tmp_path) and catalogue.stale([place], tmp_path) == []
    assert "| `toy` | −κ·Â·logp | `kappa=0.5` | `token-mean` | a test double |" in catalogue.written(place, tmp_path)
    assert not catalogue.write(place, tmp_path)  # nothing left to write


def _table_cells(line: str) -> list:
    return [c.strip() for c in re.split(r"(?<!\\)\|", line.strip())[1:-1]]


def test_method_md_tables_quote_the_registered_defaults():
    # Every table of docs/method.md with a "defaults" column: a `key=value` in that column of an objective's row,
    # with key one of its hyperparameters, is the registered default (`a=b=v` sets both a and b).
    lines = (ROOT / "docs" / "method.md").read_text().splitlines()
    checked = 0
    for i, line in enumerate(lines):
        if not (line.startswith("| name |") and "defaults" in line):
            continue
        column = next(k for k, cell in enumerate(_table_cells(line)) if "defaults" in cell)
        for row in lines[i + 2:]:
            if not row.startswith("|"):
                break
            cells = _table_cells(row)
            names = re.findall(r"`([a-z0-9_]+)`", cells[0])
            assert names and all(n in respo.OBJECTIVES for n in names), row
            for name in names:
                hp = respo.hyperparameters(name)
                for quoted in re.findall(r"`([^`]+)`", cells[column]):
                    *keys, value = quoted.split("=")
                    if keys and all(k in hp for k in keys):
                        for key in keys:
                            assert ast.literal_eval(value) == hp[key], (name, quoted, hp[key])
                            checked += 1
    assert checked > 60  # the catalogue table's and the tables of the corrections and the rules


def test_the_loss_functions_are_the_registry():
    # one `<name>_loss` per registered objective, in respo, respo.core and respo.core.objectives, and nothing else
    names = objective_names()
    assert list(respo.OBJECTIVES) == names and len(respo.OBJECTIVES) == len(names) == len(set(names))
    for name in names:
        fn = respo.OBJECTIVES[name]
        assert fn is respo.get_objective(name) is getattr(respo, f"{name}_loss") is getattr(respo.core, f"{name}_loss")
        assert fn is getattr(objectives, f"{name}_loss") and fn.__name__ == f"{name}_loss"
        assert f"{name}_loss" in respo.__all__ and f"{name}_loss" in respo.core.__all__
        assert fn.__doc__ == get_spec(name).factory.__doc__
        own = [p for p in inspect.signature(fn).parameters.values() if p.kind is p.KEYWORD_ONLY]
        assert {p.name: p.default for p in own if p.name in respo.hyperparameters(name)} == respo.hyperparameters(name)
    assert sorted(n.removesuffix("_loss") for n in objectives.LOSS_FUNCTIONS) == sorted(names)
    with pytest.raises(AttributeError):
        respo.no_such_loss  # noqa: B018
    with pytest.raises(KeyError):
        respo.OBJECTIVES["no_such"]


def test_an_objective_registered_later_gets_every_alias(toy):
    logp = torch.log(torch.tensor([[0.5, 0.25]], dtype=torch.float64)).requires_grad_()
    args = (logp, logp.detach(), torch.tensor([1.0], dtype=torch.float64), torch.ones(1, 2, dtype=torch.float64))
    # token-mean of −κ·Â·logp at κ = 2: −2·(log .5 + log .25)/2 = 2.0794
    loss, metrics = respo.policy_loss("toy", *args, kappa=2.0)
    assert loss.item() == pytest.approx(2.0794415416798357) and metrics["coef_mean"].item() == 2.0
    assert respo.toy_loss(*args, kappa=2.0)[0].item() == loss.item() == respo.core.toy_loss(*args, kappa=2.0)[0].item()
    assert respo.build_objective("toy", kappa=2.0)(*args)[0].item() == loss.item()
    assert "toy" in respo.OBJECTIVES and respo.OBJECTIVES["toy"] is respo.get_objective("toy") is objectives.toy_loss
    assert respo.hyperparameters("toy") == {"kappa": 0.5} and objectives.objective_source("toy") == "a test double"
    with pytest.raises(ValueError, match="unknown hyperparameter"):
        respo.build_objective("toy", tau=1.0)


def test_registrations_are_checked():
    common = {"summary": "−Â·logp", "source": "a test double"}
    with pytest.raises(ValueError, match="'grpo' is already registered"):
        register_objective("grpo", _toy_factory, **common)
    with pytest.raises(ValueError, match="lower-case letters"):
        register_objective("Toy-1", _toy_factory, **common)
    with pytest.raises(ValueError, match="family must be one of"):
        register_objective("toy", _toy_factory, family="kernel", **common)
    with pytest.raises(ValueError, match="default_agg must be one of"):
        register_objective("toy", _toy_factory, default_agg="mean", **common)
    with pytest.raises(ValueError, match="summary and source"):
        register_objective("toy", _toy_factory, summary=" ", source="a test double")
    with pytest.raises(ValueError, match=r"hyperparameter\(s\) \['kappa'\] need their published default"):
        register_objective("toy", lambda kappa: _toy_factory(kappa), **common)
    # a factory wrapping a function with other defaults is refused: the two must agree
    with pytest.raises(ValueError, match=r"'toy': cap=3.0 in .* but 2.0 in respo.core.corrections.tis"):
        register_objective("toy", lambda level="sequence", cap=3.0: None, same_defaults_as=corrections.tis, **common)
    with pytest.raises(ValueError, match="one of respo's own"):
        unregister_objective("grpo")
    assert "toy" not in respo.OBJECTIVES


def test_each_correction_and_rule_has_the_defaults_of_its_function():
    # the objectives registered beside a pure function take their defaults from it (checked at registration)
    pairs = {"tis": corrections.tis, "mis": corrections.mis, "icepop": corrections.icepop, "m2po": corrections.m2po,
             "decoupled": corrections.decoupled, "opsm": corrections.opsm, "dppo_tv": corrections.dppo_tv,
             "dppo_kl": corrections.dppo_kl, "clip_cov": rules.clip_cov, "prime_rl": rules.prime_rl}  # fmt: skip
    call_args = {"log_rho", "groups", "prox_logp", "staleness"}
    for name, fn in pairs.items():
        theirs = {p.name: p.default for p in inspect.signature(fn).parameters.values()
                  if p.kind is p.KEYWORD_ONLY and p.name not in call_args}  # fmt: skip
        assert respo.hyperparameters(name) == theirs, name
        assert get_spec(name).factory.__module__ == fn.__module__, name  # registered where it is defined


def test_the_catalogue_is_in_families():
    assert objective_names()[:5] == ["respo", "vespo", "reshaped", "topr", "reinforce"]
    assert objective_names(family="ratio") == ["grpo", "gspo", "cispo", "sapo", "gmpo", "luspo"]
    assert objective_names(family="correction") == ["tis", "mis", "icepop", "m2po", "decoupled", "opsm", "dppo_tv",
                                                    "dppo_kl", "klrs"]  # fmt: skip
    assert set(objective_names(family="rule")) == {"gpg", "dro", "kl_cov", "clip_cov", "prime_rl", "two_sided",
                                                   "geo_mask", "product_mask", "outlier_mask"}  # fmt: skip
    assert all(get_spec(n).family in registry.FAMILIES for n in objective_names())


def _grad_at(name: str, logp0, old, adv, mask) -> torch.Tensor:
    """∂/∂logp of ``name``'s token-sum loss (clip_cov's random draw on a fixed global seed)."""
    x = logp0.clone().requires_grad_(True)
    extra = {"prox_logp": old} if name == "decoupled" else {}
    torch.manual_seed(5)
    loss, _ = respo.policy_loss(name, x, old, adv, mask, loss_agg_mode="token-sum", **extra)
    loss.backward()
    return x.grad


@pytest.mark.parametrize("name", [n for n in objective_names() if not get_spec(n).per_sequence])
def test_scale_free_says_whether_each_rows_loss_scales_with_its_advantages(name):
    # A host that hands the loss advantages already divided by its reduction's counts (SkyRL: Â/N_tokens
    # for token_mean, Â_i/(B·T_i) for sequence_mean) gets the published loss only where
    # ℓ_i(c_i·Â_i) = c_i·ℓ_i(Â_i) for every c_i > 0, i.e. where the gradient at c·Â is c_i times the gradient
    # at Â, row by row. 16 × 512 tokens (kl_cov and clip_cov pick k = ⌊2e-4·8192⌋ = 1 token), log r ~ N(0, 0.5²)
    # so the clips, masks and the covariance band are met; c_i in [0.05, 3]. For dro and prime_rl the term on
    # (log r)² carries no Â; for kl_cov the κ·|log r| of its selected token carries none; clip_cov's band
    # [1, 5] is on the scale of Â·(log π − mean), so scaling Â moves tokens in and out of it.
    g = torch.Generator().manual_seed(3)
    B, T = 16, 512
    old = -torch.rand(B, T, generator=g, dtype=torch.float64) * 3
    logp = old + 0.5 * torch.randn(B, T, generator=g, dtype=torch.float64)
    mask = torch.ones(B, T, dtype=torch.float64)
    adv = torch.randn(B, 1, generator=g, dtype=torch.float64).expand(B, T).contiguous()
    c = 0.05 + 2.95 * torch.rand(B, 1, generator=g, dtype=torch.float64)
    scaled = _grad_at(name, logp, old, c * adv, mask)
    times_c = c * _grad_at(name, logp, old, adv, mask)
    same = torch.allclose(scaled, times_c, rtol=1e-9, atol=1e-12)
    assert same == get_spec(name).scale_free, (name, (scaled - times_c).abs().max().item())
