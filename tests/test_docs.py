"""The documentation: the README's commands are real, and the site builds.

The README is what a new user pastes, so every command line in its code blocks is parsed by
the parser of the tool it names (an unknown or misspelt flag fails here, not on their
machine), the cheap ones run (`--help`, `kmeans` and `preprocess` on a few generated
images), and its links into docs/ point at pages and headings that exist. The site is built
with `mkdocs build --strict` (warnings as errors: a broken internal link, a page left out of
the nav, a docstring mkdocstrings cannot read), and its API reference has a page for every
public module of the package.
"""

import importlib
import importlib.util
import pkgutil
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
from markdown.extensions.toc import slugify

from yolo3 import commands

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
DOCS = ROOT / "docs"
MAX_README_LINES = 250
# The checkout-only scripts with a parser of their own, besides train.py and the commands.
CHECKOUT_TOOLS = {"tools/benchmark.py": ROOT / "tools" / "benchmark.py"}
# Programs the README shows whose arguments are not ours to check.
FOREIGN = {"pip", "pytest", "jupyter", "sbatch", "srun"}


def _readme():
    return README.read_text(encoding="utf-8")


def _code_blocks(text, language="bash"):
    return re.findall(rf"```{language}\n(.*?)```", text, re.S)


def _command_lines(block):
    """The block's commands: continuation lines joined, comments dropped, ``a && b`` split."""
    joined = block.replace("\\\n", " ")
    for line in joined.splitlines():
        tokens = shlex.split(line, comments=True)
        while tokens:
            if "&&" in tokens:
                cut = tokens.index("&&")
                yield tokens[:cut]
                tokens = tokens[cut + 1 :]
            else:
                yield tokens
                tokens = []


def _load_file(path):
    spec = importlib.util.spec_from_file_location(f"_readme_{path.stem}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _parser(program):
    """The argparse parser of ``program`` (``yolo3 NAME``, ``train.py``, ``tools/X.py``)."""
    if program in CHECKOUT_TOOLS:
        return _load_file(CHECKOUT_TOOLS[program]).build_parser()
    name = Path(program).stem if program.endswith(".py") else program
    name = name.replace("_", "-")
    assert name in commands.COMMANDS, f"the README runs {program}, which is no command"
    module = importlib.import_module(f"yolo3.commands.{commands.COMMANDS[name]}")
    return module.build_parser()


def _tool_invocation(tokens):
    """``(program, args)`` of a command line that runs one of our tools, else None. Leading
    ``VAR=value`` settings are skipped; ``yolo3 launch ... -- COMMAND`` gives the launcher's
    line here and COMMAND through :func:`_invocations`."""
    while tokens and re.match(r"^[A-Z_][A-Z0-9_]*=", tokens[0]):
        tokens = tokens[1:]
    if not tokens:
        return None
    head = Path(tokens[0]).name
    if head == "yolo3" and len(tokens) > 1:
        return tokens[1], tokens[2:]
    if head.startswith("python") and len(tokens) > 1 and tokens[1].endswith(".py"):
        script = tokens[1]
        if script in CHECKOUT_TOOLS or script == "train.py" or script.startswith("tools/"):
            return script, tokens[2:]
    return None


def _invocations(tokens):
    found = _tool_invocation(tokens)
    if found is None:
        return []
    program, args = found
    if "--" in args and Path(program).stem == "launch":
        cut = args.index("--")
        return [(program, args[:cut]), *_invocations(args[cut + 1 :])]
    return [found]


def _readme_invocations():
    return [
        (program, args, " ".join(tokens))
        for block in _code_blocks(_readme())
        for tokens in _command_lines(block)
        for program, args in _invocations(tokens)
    ]


def _all_option_strings():
    options = set()
    programs = [*commands.COMMANDS, *CHECKOUT_TOOLS]
    for program in programs:
        parser = _parser(program)
        stack = [parser]
        while stack:
            current = stack.pop()
            for action in current._actions:
                options.update(action.option_strings)
                if hasattr(action, "choices") and isinstance(action.choices, dict):
                    stack.extend(action.choices.values())
    return options


def test_readme_is_a_front_page():
    assert len(_readme().splitlines()) <= MAX_README_LINES


def test_readme_keeps_the_two_fresh_machine_commands_and_ci_runs_the_second():
    first_block = _code_blocks(_readme())[0].splitlines()
    assert first_block[0] == (
        'python3 -m venv .venv && .venv/bin/pip install -e ".[test]" && '
        ".venv/bin/python tools/demo.py"
    )
    test_command = first_block[1]
    assert test_command == ".venv/bin/python -m pytest -q -n 2 --dist loadfile --durations=25"
    ci_lines = (ROOT / ".ci" / "run").read_text(encoding="utf-8").splitlines()
    assert test_command in ci_lines, "CI must run the README's test command as it is written"


def test_readme_commands_parse_with_their_tools_parsers():
    invocations = _readme_invocations()
    programs = {program for program, _, _ in invocations}
    assert {"train", "detect", "convert", "kmeans", "preprocess"} <= programs
    for program, args, line in invocations:
        parser = _parser(program)
        try:
            parser.parse_args(args)
        except SystemExit as exit_:
            pytest.fail(f"README: {line!r} does not parse ({program}: exit {exit_.code})")


def test_every_flag_in_the_readme_exists():
    # Flags quoted in the prose and tables too: each is an option of some command.
    options = _all_option_strings()
    spans = re.findall(r"`([^`\n]+)`", re.sub(r"```.*?```", "", _readme(), flags=re.S))
    flags = {token.split("=")[0] for span in spans for token in span.split()}
    flags = {flag for flag in flags if re.match(r"^--[a-z]", flag)}  # not the bare "--"
    unknown = sorted(flags - options)
    assert not unknown, f"README flags no command has: {unknown}"


def test_help_of_each_command_the_readme_shows(capsys):
    for program in sorted({program for program, _, _ in _readme_invocations()}):
        parser = _parser(program)
        with pytest.raises(SystemExit) as exit_:
            parser.parse_args(["--help"])
        assert exit_.value.code == 0
        assert "usage:" in capsys.readouterr().out


def test_readme_mkdocs_command_exists():
    mkdocs = Path(sys.executable).with_name("mkdocs")
    lines = [
        tokens
        for block in _code_blocks(_readme())
        for tokens in _command_lines(block)
        if Path(tokens[0]).name == "mkdocs"
    ]
    assert lines, "the README shows how to build and serve the site"
    for tokens in lines:
        result = subprocess.run(
            [str(mkdocs), *tokens[1:2], "--help"], capture_output=True, text=True
        )
        assert result.returncode == 0, result.stderr


def test_readme_kmeans_and_preprocess_run_on_generated_data(tmp_path, monkeypatch):
    # The "train on your data" lines, pasted as they are, in a folder that holds a tiny
    # generated data set at the paths they name.
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "argv", list(sys.argv))
    generate = ["make-demo-dataset", "--output", "data", "--train", "16", "--val", "4"]
    assert commands.main(generate) == 0
    ran = set()
    for program, args, line in _readme_invocations():
        if program in ("kmeans", "preprocess") and "data/train.txt" in args:
            status = commands.main([program, *args])
            assert status == 0, f"README: {line!r} exited {status}"
            ran.add(program)
    assert ran == {"kmeans", "preprocess"}
    assert len((tmp_path / "data" / "anchors.txt").read_text().split(",  ")) == 9  # -k 9
    assert (tmp_path / "records" / "mine" / "manifest.json").exists()


def _headings(markdown_text):
    text = re.sub(r"```.*?```", "", markdown_text, flags=re.S)
    return {slugify(title.strip(), "-") for title in re.findall(r"^#+ (.+)$", text, re.M)}


def test_readme_links_into_docs_resolve():
    links = re.findall(r"\]\((docs/[^)#\s]+)(?:#([^)\s]+))?\)", _readme())
    assert links
    for target, anchor in links:
        path = ROOT / target
        assert path.is_file(), f"README links to {target}, which does not exist"
        if anchor:
            headings = _headings(path.read_text(encoding="utf-8"))
            assert anchor in headings, f"README links to {target}#{anchor}: no such heading"


def test_plots_draw_from_the_committed_json():
    plots = _load_file(DOCS / "plots.py")
    json_files = sorted((DOCS / "data").glob("*.json"))
    assert json_files
    for path in json_files:
        assert path.with_suffix(".md").exists(), f"{path.name} needs its sidecar (command, machine)"
    figures = plots.draw_all(DOCS / "data")
    assert {figure.name for figure in figures} == {"scaling", "detect", "prediction", "accuracy"}
    for figure in figures:
        assert figure.svg.startswith(b"<?xml") and b"<svg" in figure.svg


def _public_modules_on_disk():
    """Public modules of the installed package found by importing and walking it, not by
    the docs' own code: ``yolo3`` and ``yolo3.callbacks`` (installed from callbacks/), less
    the command modules (the CLI reference has those)."""
    names = set()
    for package_name in ("yolo3", "yolo3.callbacks"):
        package = importlib.import_module(package_name)
        names.add(package_name)
        for info in pkgutil.walk_packages(package.__path__, f"{package_name}."):
            names.add(info.name)
    return {
        name
        for name in names
        if not any(part.startswith("_") for part in name.split("."))
        and not name.startswith("yolo3.commands.")
    }


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    site_dir = tmp_path_factory.mktemp("site")
    mkdocs = Path(sys.executable).with_name("mkdocs")
    result = subprocess.run(
        [str(mkdocs), "build", "--strict", "--site-dir", str(site_dir)],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    assert result.returncode == 0, f"mkdocs build --strict failed:\n{result.stderr[-6000:]}"
    return site_dir


@pytest.mark.slow
def test_site_builds_strict_with_every_page(site):
    for page in ("index.html", "getting-started/index.html", "benchmarks/index.html"):
        assert (site / page).is_file()
    cli = (site / "reference" / "cli" / "index.html").read_text(encoding="utf-8")
    for name in commands.COMMANDS:
        assert f"yolo3 {name}" in cli
    benchmarks = (site / "benchmarks" / "index.html").read_text(encoding="utf-8")
    for plot in ("scaling", "detect", "prediction", "accuracy"):
        assert f"img/plots/{plot}.svg" in benchmarks


@pytest.mark.slow
def test_api_reference_has_every_public_module(site):
    missing = []
    for name in sorted(_public_modules_on_disk()):
        page = site / "reference" / "api" / name / "index.html"
        if not page.is_file() or 'class="doc doc-' not in page.read_text(encoding="utf-8"):
            missing.append(name)
    assert not missing, f"modules without an API page: {missing}"
