"""Run names and objective labels (respo.study.names) follow the core's published kernels."""

from respo.study import aggregate, grid, names


def test_kernel_specs_are_the_core_defaults():
    # ReSPO (α, β, λ): φ⁺ = respo(2, 0.5, 2), φ⁻ = respo(1, 0.5, 2); VESPO (k, λ): φ⁺ = vespo(2, 3), φ⁻ = vespo(3, 2)
    assert (names.RESPO_POS, names.RESPO_NEG) == ("respo(2,0.5,2)", "respo(1,0.5,2)")
    assert (names.VESPO_POS, names.VESPO_NEG) == ("vespo(2,3)", "vespo(3,2)")
    assert names.kernel_spec("respo", (1.0, 0.5, 0.0)) == "respo(1,0.5,0)"


def test_labels_of_reshaped_pairs():
    assert names.objective_label("reshaped", {"pos_kernel": "respo(2, 0.5, 2)", "neg_kernel": "vespo(3,2)"}) == "respo+/vespo-"
    assert names.objective_label("reshaped", {"neg_kernel": "respo(1,0.5,0)"}) == "respo+/respo0-"  # pos: the core default
    assert names.objective_label("reshaped", {"neg_kernel": "unit"}) == "respo(2,0.5,2)+/unit-"
    assert names.objective_label("grpo") == "grpo"
    assert names.objective_label("respo", {"neg": (1, 0.5, 0)}) == "respo(neg=(1, 0.5, 0))"


def test_run_name_and_one_definition():
    ov = {"objective": "reshaped", "objective_kwargs": {"pos_kernel": "respo(2,0.5,2)", "neg_kernel": "vespo(3,2)"},
          "reuse": 32, "lr": 3e-5, "seed": 1, "updates": 64}
    assert names.run_name(ov) == "tiny-dense_respopos.vesponeg_N32_G8_lr3e-05_s1_u64"
    # the sweep's grid and the tables' runs use these very objects (no second copy to drift)
    assert grid.run_name is names.run_name and aggregate.objective_label is names.objective_label
    assert grid.ABLATION_KERNELS is names.ABLATION_KERNELS and grid.LONG_KERNELS is names.LONG_KERNELS
