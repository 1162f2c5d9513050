"""Settings written once: a config dataclass's field is its command-line flag too.

A field declared with :func:`setting` holds its type and default, and in its metadata
everything a command needs to offer it as a flag: the group it is listed in, its help, its
choices, its metavar and how its text is parsed. :func:`add_arguments` generates the flags of
a config class (``yolo3 train``'s :class:`yolo3.engine.config.TrainConfig`, ``yolo3
preprocess``'s :class:`yolo3.data.preprocess.PreprocessConfig`) and :func:`from_args` builds
the config back from the parsed arguments.

This module imports nothing of the library, so that every floor of it (the data pipeline as
much as the engine) can declare its settings here.
"""

import argparse
import dataclasses
import types
import typing


def setting(default=dataclasses.MISSING, *, group, help=None, flag=None, **cli):
    """A dataclass field offered as a flag.

    Args:
        default: the field's default (none: a required setting).
        group: the key of the group it is listed in: :func:`add_arguments` is given the
            argparse group of each key.
        help: the flag's help.
        flag: the flag, when it is not the field's name with hyphens.
        **cli: more of the flag's description: ``choices``, ``metavar``, ``parse`` (the
            argparse ``type``; default: from the field's type), ``action`` (``store_true``
            or ``store_false``), ``cli_default`` (the flag's default, where it differs from
            the field's or the field has none), ``aliases`` (earlier spellings, kept working
            out of ``--help``), ``nargs`` and ``const``; for a setting whose flags are made
            elsewhere, ``add`` (``add(group, help=...)`` puts them on the group, e.g.
            ``--progress`` and ``--quiet``) and ``read`` (``read(args)``: the field's value
            from the parsed arguments, e.g. a classes file's names from its path).
    """
    metadata = {"group": group, "help": help, "flag": flag, **cli}
    return dataclasses.field(default=default, metadata={"cli": metadata})


def _cli(field):
    """The flag's description of a :func:`setting` field; None for any other field."""
    return field.metadata.get("cli")


def flag_of(field):
    """The flag of a :func:`setting` field, e.g. ``--batch-size``."""
    return _cli(field)["flag"] or "--" + field.name.replace("_", "-")


def group_of(field):
    """The key of the group a :func:`setting` field's flag is listed in."""
    return _cli(field)["group"]


def argument_type(parse):
    """``parse`` as an argparse ``type=``: its ValueError message becomes argparse's error."""

    def convert(text):
        try:
            return parse(text)
        except ValueError as err:
            raise argparse.ArgumentTypeError(str(err)) from None

    convert.__name__ = parse.__name__
    return convert


def _value_type(field):
    """What argparse converts a flag's text with: the field's type without ``None`` (of a
    tuple, the type of its items, which the flag takes one by one); None for text."""
    kinds = field.type.__args__ if isinstance(field.type, types.UnionType) else (field.type,)
    (kind,) = [kind for kind in kinds if kind is not type(None)]
    if typing.get_origin(kind) is tuple:
        kind = typing.get_args(kind)[0]
    return None if kind is str else kind


def _is_nested(field):
    """Whether ``field`` holds a config of its own, whose settings are flags in its place."""
    return isinstance(field.type, type) and dataclasses.is_dataclass(field.type)


def _options(field):
    """``add_argument``'s keyword arguments for a :func:`setting` field."""
    cli = _cli(field)
    options = {"dest": field.name, "help": cli["help"]}
    if cli.get("action"):
        return {**options, "action": cli["action"]}
    options["type"] = cli.get("parse") or _value_type(field)
    for key in ("choices", "metavar", "nargs", "const"):
        if cli.get(key) is not None:
            options[key] = cli[key]
    if field.default is dataclasses.MISSING and "cli_default" not in cli:
        options["required"] = True
    else:
        options["default"] = cli.get("cli_default", field.default)
    return options


def _add_flag(group, field):
    """Puts the flag of a :func:`setting` field (and its earlier spellings) on ``group``."""
    cli = _cli(field)
    if cli.get("add"):
        cli["add"](group, help=cli["help"])
        return
    options = _options(field)
    group.add_argument(flag_of(field), **options)
    for alias in cli.get("aliases", ()):
        # An earlier spelling: kept working for a release, out of --help.
        group.add_argument(alias, **{**options, "help": argparse.SUPPRESS})


def settings(config_class):
    """The :func:`setting` fields of ``config_class``, in order; a field that holds a config of
    its own stands for that config's settings, in its place."""
    for field in dataclasses.fields(config_class):
        if _is_nested(field):
            yield from settings(field.type)
        elif _cli(field):
            yield field


def add_arguments(groups, config_class):
    """Adds a flag for each of :func:`settings` of ``config_class`` whose group is a key of
    ``groups`` (``{key: an argparse parser or group}``), in their order. Settings of other
    groups are left out: another command's flags, or this one's added by a later call."""
    for field in settings(config_class):
        if group_of(field) in groups:
            _add_flag(groups[group_of(field)], field)


def from_args(config_class, args, **given):
    """The ``config_class`` of arguments parsed with :func:`add_arguments`' flags.

    A field is, in this order: its value in ``given`` (a flag named otherwise, a nested
    config built by the caller); what its setting's ``read`` makes of ``args``; the
    argument of its name (a list, as ``nargs`` gives it, as a tuple); else its default. A
    nested config is not read from ``args`` here, since its flags may be missing from a
    parser that has others of their names (``yolo3 train --data`` has no augmentation flags,
    but a ``--flip`` of its own).
    """
    values = dict(given)
    for field in dataclasses.fields(config_class):
        read = (_cli(field) or {}).get("read")
        if field.name in values:
            continue
        if read:
            values[field.name] = read(args)
        elif hasattr(args, field.name):
            value = getattr(args, field.name)
            values[field.name] = tuple(value) if isinstance(value, list) else value
    return config_class(**values)


def check_choices(config):
    """ValueError naming the flag of the first setting of ``config`` whose value is not one
    of its ``choices`` (None passes where it is the field's default)."""
    for field in dataclasses.fields(config):
        choices = (_cli(field) or {}).get("choices")
        value = getattr(config, field.name)
        if choices and value not in choices and not (value is None and field.default is None):
            raise ValueError(f"{flag_of(field)}: one of {', '.join(map(str, choices))}")
