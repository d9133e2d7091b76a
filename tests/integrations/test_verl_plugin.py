"""respo's losses reach verl through verl's ``verl.plugins`` entry point alone, and a failed registration is loud."""

import os
import subprocess
import sys

import pytest


def test_a_fresh_verl_process_sees_respos_losses_through_the_entry_point_alone(tmp_path):
    # nothing of respo imported, no VERL_USE_EXTERNAL_MODULES: `import verl` loads the plugin named in respo's
    # package metadata, which registers the losses (warnings as errors: the registration must not have failed)
    env = {k: v for k, v in os.environ.items() if k not in ("VERL_USE_EXTERNAL_MODULES", "VERL_USE_EXTERNAL_PLUGINS")}
    code = ("import sys, verl\n"
            "from verl.trainer.ppo.core_algos import POLICY_LOSS_REGISTRY\n"
            "print(sorted(k for k in ('respo', 'm2po', 'opsm') if k in POLICY_LOSS_REGISTRY))\n"
            "print('respo.integrations.verl' in sys.modules)\n")
    r = subprocess.run([sys.executable, "-W", "error::RuntimeWarning", "-c", code], capture_output=True, text=True,
                       cwd=tmp_path, env=env, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.splitlines() == ["['m2po', 'opsm', 'respo']", "True"]
    # verl's own switch turns plugin discovery off, and then respo's losses are not there
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path,
                       env={**env, "VERL_USE_EXTERNAL_PLUGINS": "none"}, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.splitlines() == ["[]", "False"]


def test_importing_respos_verl_module_first_registers_without_a_warning(tmp_path):
    # `import respo.integrations.verl` imports verl, whose plugin loading imports respo's plugin while respo's module
    # is still being initialised: the plugin leaves the registration to that module (no circular-import warning),
    # and the losses are registered once the import returns
    env = {k: v for k, v in os.environ.items() if k not in ("VERL_USE_EXTERNAL_MODULES", "VERL_USE_EXTERNAL_PLUGINS")}
    code = ("import respo.integrations.verl\n"
            "from verl.trainer.ppo.core_algos import POLICY_LOSS_REGISTRY\n"
            "print(sorted(k for k in ('respo', 'm2po', 'opsm') if k in POLICY_LOSS_REGISTRY))\n")
    r = subprocess.run([sys.executable, "-W", "always::RuntimeWarning", "-c", code], capture_output=True, text=True,
                       cwd=tmp_path, env=env, timeout=300)  # warnings shown (verl would swallow one raised as an error)
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.splitlines() == ["['m2po', 'opsm', 'respo']"]
    assert "could not register" not in r.stderr, r.stderr[-2000:]


def test_a_failed_registration_is_a_warning_naming_the_error(monkeypatch):
    # verl logs a plugin that raises at DEBUG only; respo's plugin says what failed instead
    import respo.integrations.verl as integration
    from respo.integrations.verl import plugin

    def broken():
        raise ValueError("the registry is gone")

    monkeypatch.setattr(integration, "register", broken)
    with pytest.warns(RuntimeWarning, match=r"respo could not register its policy losses with verl \(ValueError: "
                                            r"the registry is gone\); loss_mode=respo"):
        plugin.load()


def test_the_docstring_lists_the_losses_it_registers_from_the_registry():
    # the module docstring's list is the registry's entries of OBJECTIVES + CORRECTIONS (scripts/catalogue.py
    # writes it; tests/core/test_catalogue.py checks the places that need no verl)
    import importlib.util
    from pathlib import Path

    script = Path(__file__).parents[2] / "scripts" / "catalogue.py"
    spec = importlib.util.spec_from_file_location("catalogue_script", script)
    catalogue = sys.modules.setdefault("catalogue_script", importlib.util.module_from_spec(spec))
    spec.loader.exec_module(catalogue)
    place = next(p for p in catalogue.PLACES if p.needs == "verl")
    assert catalogue.written(place) == catalogue.expected(place), "run python scripts/catalogue.py"
    import respo.integrations.verl as integration

    assert catalogue.expected(place) in integration.__doc__
