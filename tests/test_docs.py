"""The documentation: the README's commands are real, and the site builds.

The README is what a new user pastes, so every command line in its code blocks is parsed by
the parser of the tool it names (an unknown or misspelt flag fails here, not on their
machine), the cheap ones run (`--help`, `kmeans` and `preprocess` on a few generated
images), and its links into docs/ point at pages and headings that exist. The site is built
with `mkdocs build --strict` (warnings as errors: a broken internal link, a page left out of
the nav, a docstring mkdocstrings cannot read), and its API reference has a page for every
public module of the package. The front pages' headline figures (the demo's mAP and time, the
suite's time) are those of docs/data/headline.json, their one home.
"""

import importlib
import importlib.util
import json
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
    assert {figure.name for figure in figures} == {
        "scaling",
        "detect",
        "prediction",
        "accuracy",
        "matrix",
        "recipe",
    }
    for figure in figures:
        assert figure.svg.startswith(b"<?xml") and b"<svg" in figure.svg


# ---------------------------------------------------------------------------------------
# Headline figures: one home, docs/data/headline.json

HEADLINE = DOCS / "data" / "headline.json"
# The pages that quote the demo's and the suite's latest figures as current.
FIGURE_PAGES = ("README.md", "docs/index.md", "docs/getting-started.md")
# What a clause that gives an older figure says; such a clause is not held to the file.
OLDER = ("for comparison", "earlier", "before", "against", "with YOLOv3's loss")
# A paragraph about these gives their figures (a table row counts as a paragraph).
TOPICS = re.compile(r"\bdemo\b|test suite|quick tier|\btests\b")
_NUMBER = r"\d+(?:\.\d+)?"
_NUMBERS = rf"((?:{_NUMBER}(?:,? (?:to|and|or) |, ))*{_NUMBER})"  # "23 to 33", "25.4 and 26.2"
FIGURES = {
    "map50": re.compile(r"mAP@0\.5 (\d\.\d+)"),
    "coco_ap": re.compile(r"COCO AP (\d\.\d+)"),
    "minutes": re.compile(rf"{_NUMBERS} minutes"),
    "seconds": re.compile(rf"{_NUMBERS} s\b"),
    "tests": re.compile(r"(\d+) tests"),
}


def _headline():
    return json.loads(HEADLINE.read_text(encoding="utf-8"))


def _allowed(headline):
    """``{kind: the values a page may give as current}``, from the file alone."""
    runs = (headline["demo"], headline["suite"], headline["quick_tier"])
    seconds = [run["wall_seconds"] for run in runs]
    return {
        "map50": {headline["demo"]["map50"]},
        "coco_ap": {headline["demo"]["coco_ap"]},
        # Minutes to one decimal, or rounded to the minute ("about 25 minutes").
        "minutes": {round(s / 60, 1) for s in seconds} | {round(s / 60) for s in seconds},
        "seconds": set(seconds),
        "tests": {headline["suite"]["passed"], headline["quick_tier"]["passed"]},
    }


def _current_clauses(markdown_text):
    """The clauses of the paragraphs about the demo, the suite or the tests that do not say
    they give an older figure. Clauses are cut at sentence ends, semicolons and brackets, so
    that "mAP@0.5 0.972 (COCO AP 0.665; 0.927 with YOLOv3's loss)" is three."""
    text = re.sub(r"```.*?```", "", markdown_text, flags=re.S)
    paragraphs = []
    for block in re.split(r"\n\s*\n", text):
        rows = [line for line in block.splitlines() if line.startswith("|")]
        paragraphs += rows or [" ".join(block.split())]
    for paragraph in paragraphs:
        if not TOPICS.search(paragraph):
            continue
        for clause in re.split(r"(?<=[a-z0-9)`])\.\s+|[;()|]", paragraph):
            if not any(marker in clause for marker in OLDER):
                yield clause


def _stray_figures(markdown_text, allowed):
    """``[(kind, value, clause)]`` of the figures given as current that the file does not
    hold."""
    stray = []
    for clause in _current_clauses(markdown_text):
        for kind, pattern in FIGURES.items():
            for match in pattern.finditer(clause):
                for value in re.findall(_NUMBER, match.group(1)):
                    if float(value) not in allowed[kind]:
                        stray.append((kind, value, clause.strip()))
    return stray


def test_headline_file_names_its_runs():
    headline = _headline()
    for run in ("demo", "suite", "quick_tier"):
        assert {"command", "machine", "wall_seconds"} <= set(headline[run]), run
    assert {"map50", "coco_ap", "date"} <= set(headline["demo"])
    # The suite's figure is of the command the README tells a new user to run.
    assert headline["suite"]["command"] == _code_blocks(_readme())[0].splitlines()[1]


@pytest.mark.parametrize("page", FIGURE_PAGES)
def test_front_pages_give_the_headline_figures(page):
    text = (ROOT / page).read_text(encoding="utf-8")
    stray = _stray_figures(text, _allowed(_headline()))
    assert not stray, (
        f"{page} gives figures that docs/data/headline.json does not hold (update the file "
        f"from a new run, or say the figure is older, e.g. 'for comparison'): {stray}"
    )


def test_front_pages_state_the_demo_and_suite_figures():
    headline = _headline()
    demo, suite = headline["demo"], headline["suite"]
    for page in ("README.md", "docs/getting-started.md"):
        text = " ".join((ROOT / page).read_text(encoding="utf-8").split())
        # Three decimals, as every page gives them (0.750, not 0.75).
        assert f"mAP@0.5 {demo['map50']:.3f} (COCO AP {demo['coco_ap']:.3f})" in text, page
        assert f"({demo['wall_seconds']} s)" in text, page
        assert f"{suite['passed']} tests in {round(suite['wall_seconds'] / 60, 1)} minutes" in text


def test_the_check_catches_a_page_that_drifts():
    allowed = _allowed(_headline())
    drifted = "The demo took 6.0 minutes and reached mAP@0.5 0.927 (COCO AP 0.504)."
    assert {kind for kind, _, _ in _stray_figures(drifted, allowed)} == {
        "minutes",
        "map50",
        "coco_ap",
    }
    older = "The demo reached mAP@0.5 0.927 with YOLOv3's loss, for comparison."
    assert _stray_figures(older, allowed) == []
    suite = "The test suite: 700 tests in 97 minutes; the quick tier 2.4 minutes."
    assert {(kind, value) for kind, value, _ in _stray_figures(suite, allowed)} == {
        ("tests", "700"),
        ("minutes", "97"),
        ("minutes", "2.4"),
    }
    # A range whose first figure is the file's (the suite's own time) and whose second is not.
    seconds = _headline()["suite"]["wall_seconds"]
    minutes = round(seconds / 60, 1)
    ranges = f"The whole test suite took {minutes} to 33 minutes ({seconds} and 1500.0 s)."
    assert {value for _, value, _ in _stray_figures(ranges, allowed)} == {"33", "1500.0"}


def test_development_tiers_and_latest_run_match_the_file():
    headline = _headline()
    text = (DOCS / "development.md").read_text(encoding="utf-8")
    tiers = text.split("Two tiers", 1)[1].split("\n\n", 2)[1]  # the list of the two commands
    assert _stray_figures(tiers, _allowed(headline)) == []
    # The suite/demo table's last row is the latest run: the file is updated with it.
    rows = [line for line in text.splitlines() if line.startswith("| ") and "minutes (" in line]
    last = rows[-1]
    assert f"({headline['suite']['wall_seconds']} s" in last
    assert f"| {headline['suite']['passed']} |" in last
    assert f"({headline['demo']['wall_seconds']} s)" in last


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
    for plot in ("scaling", "detect", "prediction", "accuracy", "matrix", "recipe"):
        assert f"img/plots/{plot}.svg" in benchmarks


@pytest.mark.slow
def test_api_reference_has_every_public_module(site):
    missing = []
    for name in sorted(_public_modules_on_disk()):
        page = site / "reference" / "api" / name / "index.html"
        if not page.is_file() or 'class="doc doc-' not in page.read_text(encoding="utf-8"):
            missing.append(name)
    assert not missing, f"modules without an API page: {missing}"
