"""``--help`` as a user reads it: every option that has a default shows it, read from the
rendered text rather than from the formatter's pieces (argparse prints no help at all for
an option declared without one, so a check of the help string alone passes while the page
shows nothing)."""

import argparse
import importlib

import pytest

from yolo3.commands import COMMANDS, train


def _entries(parser):
    """``{option: its help as printed, on one line}`` for every option ``--help`` shows."""
    lines = parser.format_help().splitlines()
    formatter = parser._get_formatter()
    entries = {}
    for action in parser._actions:
        if not action.option_strings or action.help == argparse.SUPPRESS:
            continue
        header = "  " + formatter._format_action_invocation(action)
        (start,) = [i for i, line in enumerate(lines) if (line + " ").startswith(header + " ")]
        text = [lines[start][len(header) :]]
        # The help goes on under the option, indented further, until the next option,
        # a blank line or a group's title.
        for line in lines[start + 1 :]:
            if not line.startswith("   "):
                break
            text.append(line)
        entries[action.option_strings[-1]] = " ".join(" ".join(text).split())
    return entries


def _with_subcommands(name, parser):
    yield name, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for command, sub in action.choices.items():
                yield from _with_subcommands(f"{name} {command}", sub)


def _command_parsers():
    for name, module in COMMANDS.items():
        parser = importlib.import_module(f"yolo3.commands.{module}").build_parser()
        yield from _with_subcommands(f"yolo3 {name}", parser)


@pytest.fixture(autouse=True)
def _fixed_width(monkeypatch):
    # argparse wraps to the terminal: one width, so that a default is never split oddly.
    monkeypatch.setenv("COLUMNS", "100")


@pytest.mark.parametrize(
    "option", ["--epochs", "--warmup-epochs", "--optimizer", "--lr-schedule", "--seed"]
)
def test_train_help_shows_defaults_of_options_declared_without_help(option):
    parser = train.build_parser()
    (action,) = [a for a in parser._actions if option in a.option_strings]
    assert action.default is not None
    assert f"default: {action.default}" in _entries(parser)[option]


def test_train_help_shows_the_epochs_default_next_to_the_flag():
    lines = train.build_parser().format_help().splitlines()
    (line,) = [line for line in lines if line.strip().startswith("--epochs ")]
    assert line.split() == ["--epochs", "EPOCHS", "default:", "50"]


def test_every_option_with_a_default_shows_it_in_help():
    missing = []
    for name, parser in _command_parsers():
        entries = _entries(parser)
        for action in parser._actions:
            if (
                not action.option_strings
                or action.help == argparse.SUPPRESS
                or action.default in (None, argparse.SUPPRESS)
                or isinstance(action, (argparse._StoreTrueAction, argparse._StoreFalseAction))
            ):
                continue
            text = entries[action.option_strings[-1]]
            if "default" not in text.lower():
                missing.append(f"{name} {action.option_strings[-1]}: {text!r}")
    assert not missing, "\n".join(missing)
