"""The limit variables of ``swiftcommon.envs``: each is the default of a flag of the same name,
typed like the flag's default, named in that flag's ``--help``, refused when not a number."""

import pytest

from swiftcommon import envs


def test_a_limit_variable_is_the_default_of_its_flag(monkeypatch):
    from gateway.cli import parse_args
    from worker.args import build_parser

    monkeypatch.setenv("SWIFTSERVE_MAX_TOOLS", "7")
    monkeypatch.setenv("SWIFTSERVE_HEADER_TIMEOUT", "2.5")
    assert envs.limit("SWIFTSERVE_MAX_TOOLS", 128) == 7
    assert build_parser().parse_args([]).max_tools == 7
    assert build_parser().parse_args(["--max-tools", "9"]).max_tools == 9          # the flag wins
    assert parse_args(["--workers", "http://w:1"]).header_timeout == 2.5
    monkeypatch.setenv("SWIFTSERVE_MAX_TOOLS", "many")
    with pytest.raises(ValueError, match="SWIFTSERVE_MAX_TOOLS"):
        envs.limit("SWIFTSERVE_MAX_TOOLS", 128)
    with pytest.raises(KeyError):
        envs.limit("SWIFTSERVE_NOT_A_LIMIT", 1)


def test_every_limit_variable_is_named_in_a_help(capsys):
    from gateway.cli import parse_args
    from worker.args import build_parser

    text = build_parser().format_help()
    with pytest.raises(SystemExit):
        parse_args(["--help"])
    text += capsys.readouterr().out
    flat = " ".join(text.split())
    for var in envs.LIMIT_VARIABLES:
        assert var in flat, var
