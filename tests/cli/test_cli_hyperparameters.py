"""``respo hyperparameters``: every objective with its default aggregation, hyperparameters and source."""

import respo
from respo.cli import main
from respo.core.objectives import objective_source


def _blocks(out: str) -> dict:
    blocks, name = {}, None
    for line in out.splitlines():
        if not line.startswith("  "):
            name = line
            blocks[name] = []
        else:
            blocks[name].append(line.strip())
    return blocks


def test_lists_every_objective_with_its_source(capsys):
    assert main(["hyperparameters"]) == 0
    blocks = _blocks(capsys.readouterr().out)
    assert list(blocks) == list(respo.OBJECTIVES)
    for name, lines in blocks.items():
        assert lines[2] == f"source: {objective_source(name)}" and len(lines[2]) > len("source: "), name


def test_names_objectives_with_their_defaults(capsys):
    assert main(["hyperparameters", "dppo_tv", "gspo"]) == 0
    blocks = _blocks(capsys.readouterr().out)
    assert list(blocks) == ["dppo_tv", "gspo"]
    assert blocks["dppo_tv"][:2] == ["aggregation: token-mean", "hyperparameters: delta_low=0.15, delta_high=0.15, cap=10000.0"]
    assert blocks["gspo"][:2] == ["aggregation: seq-mean-token-mean", "hyperparameters: clip_ratio_low=0.0003, clip_ratio_high=0.0004"]
    assert "verl 0.9.1" in blocks["dppo_tv"][2] and "arXiv 2507.18071" in blocks["gspo"][2]
    assert main(["hyperparameters", "reinforce"]) == 0
    assert "hyperparameters: none" in capsys.readouterr().out


def test_an_unknown_objective_is_one_line(capsys):
    assert main(["hyperparameters", "grpo", "nope"]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and err.startswith("respo hyperparameters: error: unknown objective(s) nope; valid objectives:")


def test_the_guides_added_objective_is_called_and_listed(capsys):
    # docs/extending.md, "Adding an objective": one function and one registration, run as written; policy_loss
    # calls it (token-mean of −κ·Â·logp at κ = 2: −2·(log .5 + log .25)/2 = 2.0794) and `respo hyperparameters`
    # lists it with its default, source and loss
    import re
    from pathlib import Path

    from respo.core.registry import unregister_objective

    text = (Path(__file__).parents[2] / "docs" / "extending.md").read_text()
    section = text[text.index("## Adding an objective"): text.index("## Adding a task")]
    code = re.search(r"```python\n(.*?)```", section, flags=re.S).group(1)
    try:
        exec(compile(code, "docs/extending.md", "exec"), {"__name__": "extending_example"})
        assert respo.OBJECTIVES["scaled_reinforce"] is respo.scaled_reinforce_loss
    finally:
        if "scaled_reinforce" in respo.OBJECTIVES:
            unregister_objective("scaled_reinforce")
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "2.0794 2.0"
    assert out[1:] == ["scaled_reinforce", "  aggregation: token-mean", "  hyperparameters: kappa=0.5",
                       "  source: a worked example: REINFORCE with its step scaled by κ", "  loss: −κ·Â·logp"]
    assert "scaled_reinforce" not in respo.OBJECTIVES
