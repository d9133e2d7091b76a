"""The command line documents itself: every flag has a one-line description; extensions that fail to import are errors."""

import argparse
import dataclasses

import pytest

import respo.cli as cli
from respo.train.config import TrainConfig


def _subparsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    return next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices


def test_every_config_field_documents_itself():
    undocumented = [f.name for f in dataclasses.fields(TrainConfig) if not f.metadata.get("help", "").strip()]
    assert undocumented == []


def test_every_train_flag_has_a_one_line_description_from_its_field():
    train = _subparsers(cli.build_parser())["train"]
    flags = {a.option_strings[0]: a.help for a in train._actions if a.option_strings and a.option_strings[0] != "-h"}
    for f in dataclasses.fields(TrainConfig):
        flag = "--" + f.name.replace("_", "-")
        assert flag in flags, flag
        text = flags[flag]
        # the field's own description comes first, then the default: not only "(default: ...)"
        assert text.startswith(f.metadata["help"].replace("%", "%%")), flag
        assert "\n" not in f.metadata["help"], flag
        assert text.endswith(")") and "(default: " in text, flag
    assert flags["--lr"] == "AdamW learning rate after warm-up (default: 0.0001)"
    assert flags["--resume"].strip() and flags["--config"].strip()


def test_every_flag_of_every_command_has_help():
    missing = [(name, a.option_strings) for name, sub in _subparsers(cli.build_parser()).items()
               for a in sub._actions if a.option_strings and not (a.help or "").strip()]
    assert missing == []


def test_help_renders_for_every_command(capsys):
    for name in _subparsers(cli.build_parser()):
        with pytest.raises(SystemExit) as ex:
            cli.build_parser().parse_args([name, "--help"])
        assert ex.value.code == 0
        assert "usage: respo " + name in capsys.readouterr().out


def test_commands_of_every_extension_are_present():
    assert {"train", "eval", "demo", "sweep", "report", "sft"} <= set(_subparsers(cli.build_parser()))


def test_an_extension_that_fails_to_import_is_an_error(monkeypatch):
    monkeypatch.setattr(cli, "EXTENSIONS", cli.EXTENSIONS + ("respo.no_such_module",))
    with pytest.raises(ModuleNotFoundError, match="respo.no_such_module"):
        cli.build_parser()
