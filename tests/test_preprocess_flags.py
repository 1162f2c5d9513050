"""``yolo3 preprocess``'s flags are generated from its config (:mod:`yolo3.flags`): one flag
per setting, at the setting's default, read back into the same config; ``yolo3 train --data``
takes the dataset's flags and no other."""

import argparse
import dataclasses

import pytest

from yolo3 import flags
from yolo3.commands import preprocess as command
from yolo3.commands import train
from yolo3.data.augment import AugmentConfig
from yolo3.data.preprocess import PreprocessConfig

# The flags of yolo3 preprocess that are no setting: how a run goes, not what it writes
# (--output is checked while parsing; --data-format comes with --data).
OWN_FLAGS = {"-h", "--help", "--output", "--data-format", "--workers", "--strict"}
OWN_FLAGS |= {"--overwrite", "--progress", "--quiet", "--no-progress", "--verify"}


def _options(parser):
    return {option for action in parser._actions for option in action.option_strings}


def _config(argv):
    args = command.build_parser().parse_args(argv)
    return command.dataset_config(args, augment=flags.from_args(AugmentConfig, args))


def test_every_setting_is_one_flag_whose_default_is_the_settings_default():
    generated = {flags.flag_of(field) for field in flags.settings(PreprocessConfig)}
    assert "--jitter" in generated and "--mosaic" in generated  # AugmentConfig's, and its own
    assert _options(command.build_parser()) == generated | OWN_FLAGS
    defaults = PreprocessConfig(output="o", data="d", input_size=(416, 416))
    assert _config(["--data", "d", "--output", "o"]) == defaults


def test_flags_are_read_back_into_the_config(tmp_path):
    classes = tmp_path / "classes.txt"
    classes.write_text("cat\ndog\n")
    argv = ["--annotations", "a.txt", "b.txt", "--classes", str(classes), "--output", "o"]
    argv += ["--input-size", "320x416", "--format", "raw", "--scale", "0.5", "1.5"]
    argv += ["--flip", "0", "--mosaic", "0.5", "--seed", "7"]
    assert _config(argv) == PreprocessConfig(
        output="o",
        annotations=("a.txt", "b.txt"),
        classes=("cat", "dog"),  # the file's names, not its path
        input_size=(320, 416),
        image_format="raw",
        augment=AugmentConfig(scale=(0.5, 1.5), flip=0.0),
        mosaic=0.5,
        seed=7,
    )


def test_train_data_takes_the_dataset_flags_and_no_other():
    by_group = {}
    for field in flags.settings(PreprocessConfig):
        by_group.setdefault(flags.group_of(field), set()).add(flags.flag_of(field))
    shared = by_group.pop("dataset") | by_group.pop("validation")
    options = _options(train.build_parser())
    assert shared <= options
    # train's own --flip and --seed are TrainConfig's; none of the others is a train flag.
    assert set().union(*by_group.values()) & options == {"--flip", "--seed"}
    args = train.build_parser().parse_args(["--data", "d", "--flip", "0.2"])
    assert command.dataset_config(args, output="c").augment == AugmentConfig()


@dataclasses.dataclass(frozen=True)
class _Inner:
    rate: float = flags.setting(0.5, group="b", help="a rate")


@dataclasses.dataclass(frozen=True, kw_only=True)
class _Toy:
    path: str = flags.setting(group="a")  # required
    sizes: tuple[int, ...] = flags.setting((1,), group="a", nargs="+")
    inner: _Inner = _Inner()
    mode: str = flags.setting("x", group="b", choices=("x", "y"), aliases=("--kind",))
    names: tuple = flags.setting((), group="c", read=lambda args: ("read",))
    note: str = "no flag"


def test_settings_become_flags_of_their_groups_in_order():
    parser = argparse.ArgumentParser()
    flags.add_arguments({"a": parser, "b": parser}, _Toy)  # group c's are another command's
    in_order = [option for action in parser._actions for option in action.option_strings]
    # The nested config's flag in its place; an alias after its flag, out of --help.
    assert in_order == ["-h", "--help", "--path", "--sizes", "--rate", "--mode", "--kind"]
    assert "--kind" not in parser.format_help()
    args = parser.parse_args(["--path", "p", "--sizes", "2", "3", "--rate", "0.1", "--kind", "y"])
    toy = flags.from_args(_Toy, args, inner=flags.from_args(_Inner, args))
    assert toy == _Toy(path="p", sizes=(2, 3), inner=_Inner(0.1), mode="y", names=("read",))
    with pytest.raises(SystemExit):
        parser.parse_args(["--sizes", "2"])  # --path is required
    with pytest.raises(ValueError, match="^--mode: one of x, y$"):
        flags.check_choices(_Toy(path="p", mode="z"))
