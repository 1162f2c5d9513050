"""Pages of the documentation site that are generated, not written (mkdocs ``hooks:``).

Three things come from the code at build time, so that they cannot drift from it:

- the command-line reference, from each command's argparse parser: the commands are
  ``yolo3.commands.COMMANDS`` and each module's ``build_parser()`` (``tools/benchmark.py``,
  which lives only in a checkout, too);
- the Python API reference, one page per public module, found by walking the ``yolo3``
  package (and the packages setup.py maps into it from other folders), rendered from the
  docstrings by mkdocstrings;
- the benchmark plots, drawn by ``docs/plots.py`` from the JSON files in ``docs/data/``.

A module or command that is added, moved or renamed appears without an edit here or in
mkdocs.yml. The same file is also a griffe extension (``MappedPackages``) so that
mkdocstrings finds ``yolo3.callbacks``, which is installed from the top-level ``callbacks/``
folder rather than from ``yolo3/callbacks/``.
"""

import argparse
import ast
import importlib
import importlib.util
import io
import os
import pkgutil
import re
import sys
from contextlib import redirect_stdout
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = "yolo3"
API_DIR = "reference/api"
API_INDEX = f"{API_DIR}/index.md"
CLI_PAGE = "reference/cli.md"
BENCHMARKS_PAGE = "benchmarks.md"
PLOTS_DIR = "img/plots"
# Submodules documented elsewhere: each command module is a page of the CLI reference.
DOCUMENTED_AS_COMMANDS = ("yolo3.commands.",)
# Checkout-only scripts with a build_parser(), rendered after the installed commands.
CHECKOUT_TOOLS = {"benchmark": "tools/benchmark.py"}

if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))  # the checkout's yolo3, as the tests import it


# ---------------------------------------------------------------------------------------
# Which modules are public


def mapped_packages():
    """``{package: folder}`` of the packages setup.py installs under ``yolo3`` from another
    folder (its ``package_dir``), read from setup.py's source without running it."""
    tree = ast.parse((ROOT / "setup.py").read_text(encoding="utf-8"))
    for node in ast.walk(tree):
        if isinstance(node, ast.keyword) and node.arg == "package_dir":
            mapping = ast.literal_eval(node.value)
            return {
                name: ROOT / folder
                for name, folder in mapping.items()
                if name.startswith(f"{PACKAGE}.") and (ROOT / folder / "__init__.py").exists()
            }
    return {}


def is_public(name):
    parts = name.split(".")
    return not any(part.startswith("_") for part in parts) and not name.startswith(
        DOCUMENTED_AS_COMMANDS
    )


def public_modules():
    """Every public module of the package, sorted: the package itself, its submodules at any
    depth, and the packages mapped into it, leaving out names with a leading underscore and
    the command modules (the CLI reference covers those)."""
    package = importlib.import_module(PACKAGE)
    roots = {PACKAGE: list(package.__path__)}
    roots.update({name: [str(folder)] for name, folder in mapped_packages().items()})
    names = set(roots)
    for prefix, path in roots.items():
        for info in pkgutil.walk_packages(path, f"{prefix}."):
            names.add(info.name)
    return sorted(name for name in names if is_public(name))


def module_file(name):
    """The source file of a module, found without importing it (most import TensorFlow)."""
    mapped = mapped_packages()
    for package, folder in sorted(mapped.items(), key=lambda item: -len(item[0])):
        if name == package or name.startswith(f"{package}."):
            rest = name[len(package) :].lstrip(".").split(".") if name != package else []
            base = folder.joinpath(*rest) if rest else folder
            break
    else:
        base = ROOT.joinpath(*name.split("."))
    return base / "__init__.py" if base.is_dir() else base.with_suffix(".py")


def summary(path):
    """The first sentence-line of a module's docstring, read with ast."""
    docstring = ast.get_docstring(ast.parse(path.read_text(encoding="utf-8"))) or ""
    first = docstring.strip().split("\n\n")[0].replace("\n", " ")
    return _roles_to_code(first.replace("|", "\\|"))


def _roles_to_code(text):
    """Sphinx roles (``:func:`x` ``) as plain code: the docstrings use reStructuredText
    roles, which Markdown does not know."""
    return re.sub(r":(?:py:)?[a-z]+:`~?([^`]+)`", r"`\1`", text)


def api_page(name):
    return f"{API_DIR}/{name}.md"


def api_markdown(name):
    return f"# `{name}`\n\n::: {name}\n"


def api_index_markdown(names):
    rows = "\n".join(f"| [`{name}`]({name}.md) | {summary(module_file(name))} |" for name in names)
    return (
        "# Python API\n\n"
        "One page per public module of the `yolo3` package, generated from its docstrings "
        "when the site is built. The commands' own modules (`yolo3.commands.NAME`) are "
        "described by the [command-line reference](../cli.md).\n\n"
        "| module | what it holds |\n| --- | --- |\n" + rows + "\n"
    )


# ---------------------------------------------------------------------------------------
# The command-line reference


def command_parsers():
    """``[(program, summary, parser)]`` for every ``yolo3`` command, in ``yolo3 --help``'s
    order."""
    from yolo3 import commands  # noqa: PLC0415

    result = []
    for name, module_name in commands.COMMANDS.items():
        module = importlib.import_module(f"{commands.__name__}.{module_name}")
        parser = module.build_parser()
        parser.prog = f"yolo3 {name}"
        result.append((f"yolo3 {name}", commands.summary(name), parser))
    return result


def checkout_tool_parser(name):
    """The parser of a script in ``tools/`` that is not installed (the tools folder is not
    a package, so it is loaded from its file)."""
    path = ROOT / CHECKOUT_TOOLS[name]
    spec = importlib.util.spec_from_file_location(f"_docs_tool_{name}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    parser = module.build_parser()
    parser.prog = f"python {CHECKOUT_TOOLS[name]}"
    return parser


def _help_text(parser):
    # argparse wraps to the terminal's width: fix it, so that the page is the same anywhere.
    previous = os.environ.get("COLUMNS")
    os.environ["COLUMNS"] = "100"
    try:
        buffer = io.StringIO()
        with redirect_stdout(buffer):
            parser.print_help()
        return buffer.getvalue().rstrip()
    finally:
        if previous is None:
            os.environ.pop("COLUMNS", None)
        else:
            os.environ["COLUMNS"] = previous


def _subparsers(parser):
    for action in parser._actions:  # argparse keeps its subcommands only here
        if isinstance(action, argparse._SubParsersAction):
            return action.choices
    return {}


def _parser_markdown(title, text, parser, level):
    hashes = "#" * level
    lines = [f"{hashes} `{title}`", ""]
    if text:
        lines += [text, ""]
    lines += ["```text", _help_text(parser), "```", ""]
    for sub_name, sub_parser in _subparsers(parser).items():
        lines.append(_parser_markdown(f"{title} {sub_name}", "", sub_parser, level + 1))
    return "\n".join(lines)


def cli_markdown():
    return "\n".join(
        _parser_markdown(program, _roles_to_code(text), parser, 2)
        for program, text, parser in command_parsers()
    )


def checkout_tool_markdown(name):
    parser = checkout_tool_parser(name)
    # The tool's own heading is on the page; its subcommands follow one level down.
    lines = ["```text", _help_text(parser), "```", ""]
    for sub_name, sub_parser in _subparsers(parser).items():
        lines.append(_parser_markdown(f"{parser.prog} {sub_name}", "", sub_parser, 3))
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------
# mkdocs hooks

_state = {}


def _replace_nav_entry(nav, target, replacement):
    """Replaces the nav entry whose page is ``target`` by ``replacement`` (a title and a
    list of pages), at any depth."""
    for index, item in enumerate(nav):
        if isinstance(item, dict):
            ((title, value),) = item.items()
            if value == target:
                nav[index] = {title: replacement}
                return True
            if isinstance(value, list) and _replace_nav_entry(value, target, replacement):
                return True
    return False


def on_config(config, **kwargs):
    modules = public_modules()
    _state["modules"] = modules
    pages = [{"Overview": API_INDEX}] + [{name: api_page(name)} for name in modules]
    if config.nav and not _replace_nav_entry(config.nav, API_INDEX, pages):
        raise ValueError(f"mkdocs.yml's nav has no entry for {API_INDEX}")
    return config


def on_files(files, config, **kwargs):
    from mkdocs.structure.files import File  # noqa: PLC0415

    modules = _state["modules"]
    files.append(File.generated(config, API_INDEX, content=api_index_markdown(modules)))
    for name in modules:
        files.append(File.generated(config, api_page(name), content=api_markdown(name)))
    plots = _load_plots()
    _state["plots"] = plots.draw_all(ROOT / "docs" / "data")
    for figure in _state["plots"]:
        files.append(File.generated(config, f"{PLOTS_DIR}/{figure.name}.svg", content=figure.svg))
    return files


def _load_plots():
    spec = importlib.util.spec_from_file_location("_docs_plots", ROOT / "docs" / "plots.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def on_page_markdown(markdown, page, config, files, **kwargs):
    uri = page.file.src_uri
    if uri == CLI_PAGE:
        markdown = markdown.replace("<!-- cli-reference -->", cli_markdown())
        for name in CHECKOUT_TOOLS:
            markdown = markdown.replace(
                f"<!-- cli-reference: {name} -->", checkout_tool_markdown(name)
            )
    if uri == BENCHMARKS_PAGE:
        from_page = "img/plots"
        markdown = markdown.replace(
            "<!-- plots -->",
            "\n\n".join(figure.markdown(from_page) for figure in _state["plots"]),
        )
    return markdown


def on_page_content(html, page, config, files, **kwargs):
    # mkdocstrings renders the docstrings' reStructuredText roles as ":func:<code>x</code>";
    # keep the code, drop the role.
    if page.file.src_uri.startswith(f"{API_DIR}/"):
        html = re.sub(r":(?:py:)?[a-z]+:(<code>)~?", r"\1", html)
    return html


# ---------------------------------------------------------------------------------------
# griffe extension (mkdocs.yml: mkdocstrings' python handler, extensions)


try:
    import griffe
except ImportError:  # the hooks alone, without mkdocstrings installed
    griffe = None

if griffe is not None:

    class MappedPackages(griffe.Extension):
        """Attaches the packages setup.py maps into ``yolo3`` from other folders, which
        griffe, reading the source tree, would not find under ``yolo3/``."""

        def on_package(self, *, pkg, loader, **kwargs):
            if pkg.name != PACKAGE:
                return
            for name, folder in mapped_packages().items():
                parent_path, _, child = name.rpartition(".")
                parent = pkg if parent_path == PACKAGE else pkg[parent_path[len(PACKAGE) + 1 :]]
                module = griffe.load(
                    folder,
                    search_paths=[str(ROOT)],
                    extensions=griffe.load_extensions(ProseRaises()),
                )
                module.name = child
                module.parent = parent
                parent.set_member(child, module)

    class ProseRaises(griffe.Extension):
        """Reads the project's ``Raises:`` sections, which are sentences that start with the
        exception's name (``ValueError naming the file when ...``), as Google-style items
        (``ValueError: naming the file when ...``), so that mkdocstrings shows them in full
        instead of dropping what it cannot split."""

        def on_instance(self, *, obj, **kwargs):
            if obj.docstring is not None and "Raises:" in obj.docstring.value:
                obj.docstring.value = prose_raises_to_items(obj.docstring.value)


# An exception's name opening a sentence (``ValueError naming ...``), or any class name
# written Google's way, with a colon (``RunFailed: the run ...``).
_EXCEPTION_START = re.compile(
    r"^([A-Z]\w*(?:Error|Exception|Warning|Exit)|[A-Z]\w*(?=:))\b:?\s*(.*)$"
)


def prose_raises_to_items(docstring):
    """The ``Raises:`` sections of ``docstring`` with each sentence that starts with an
    exception name made an item, and the lines that continue it indented under it."""
    lines = docstring.split("\n")
    out, in_raises, section_indent = [], False, 0
    for line in lines:
        stripped = line.strip()
        indent = len(line) - len(line.lstrip())
        if stripped == "Raises:":
            in_raises, section_indent = True, indent
            out.append(line)
            continue
        if in_raises and stripped and indent <= section_indent:
            in_raises = False
        if in_raises and stripped:
            match = _EXCEPTION_START.match(stripped)
            item_indent = " " * (section_indent + 4)
            if match:
                out.append(f"{item_indent}{match.group(1)}: {match.group(2)}".rstrip())
            else:
                out.append(f"{item_indent}    {stripped}")
            continue
        out.append(line)
    return "\n".join(out)
