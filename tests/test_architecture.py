"""The house's rules (docs/architecture.md), read from the code's own imports: every import goes
down or sideways to a lower layer, the loader and the pipeline meet only in the bottom layers,
Beam stays out of the layers a training host installs, there are no import circles, no
module is longer than 400 lines and no function longer than a screen."""

import ast
import pathlib
import re
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "pileshuffle"
MAX_LINES = 400

# layer -> module prefixes (a module belongs to the longest prefix that names it); each package's
# __init__ docstring says the same in words ("May import: ...")
LAYERS = {
    # the package root's bottom: no layer above them
    0: [
        "errors",
        "names",
        "interrupt",
        "version",
    ],
    1: ["io"],  # local files, gs:// objects, checksums, marks
    2: ["records"],  # keys, fingerprints, CRC loops
    3: ["formats"],
    4: ["engine"],  # sources, pass-1 runs, piles, the Beam transforms, dedup, balance
    5: ["verify", "store"],
    6: ["quality"],
    7: ["planning"],
    8: ["commands"],
    9: ["cli", "pipeline", "__main__"],  # the public face: entry points
}
# the package's own __init__ (module ""): the public face, above every layer (it hands on
# ShuffleToPiles, WritePiles and WritePileStore), so no layer imports a name from it
FACE = 9
# beside layers 4-6: imports only layers 0-3, and only quality and commands import it
LOADER = "loader"
LOADER_READS = 3
WITHOUT_BEAM = [
    "errors",
    "names",
    "interrupt",
    "version",
    "io",
    "records",
    "formats",
    "loader",
    "engine.balance",
    "engine.sources",
    "engine.memory_runs",
    "engine.run_segments",
    "engine.dedup",
    "engine.duplicates",
    "engine.tuning",
    "engine.pile",
    "engine.pile_groups",
    "engine.output_files",
    "store.read",
    "verify",
    "planning.pile_bound",
    "io.memory_limit",
    "commands.help_style",
    "commands.options",
    "commands.report",
    "commands.info",
    "commands.verify",
]
ROOT_MODULES = 8  # the package root: the public face and what belongs to no layer


def module_name(path: pathlib.Path) -> str:
    parts = list(path.relative_to(PACKAGE).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules() -> dict:
    return {module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def imports(path: pathlib.Path):
    """``(module imported, at module level?)`` of every pileshuffle and apache_beam import."""
    tree = ast.parse(path.read_text())
    top = set(map(id, tree.body))
    here = (
        module_name(path).split(".")
        if path.name == "__init__.py"
        else module_name(path).split(".")[:-1]
    )
    for node in ast.walk(tree):
        names = []
        if isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(
                    here[: len(here) - node.level + 1] + ([node.module] if node.module else [])
                )
                base = f"pileshuffle.{base}" if base else "pileshuffle"
            names = [f"{base}.{a.name}" for a in node.names]
        elif isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        for name in names:
            if name.startswith(("pileshuffle", "apache_beam")):
                yield name, id(node) in top


def owner(name: str, known) -> str:
    """The pileshuffle module an imported name belongs to (``pileshuffle.x.y`` -> x.y or x)."""
    parts = name.split(".")[1:]
    while parts and ".".join(parts) not in known:
        parts.pop()
    return ".".join(parts)


def layer_of(module: str):
    if module == "":
        return FACE
    if module == LOADER or module.startswith(LOADER + "."):
        return LOADER
    best = None
    for layer, prefixes in LAYERS.items():
        for prefix in prefixes:
            if (module == prefix or module.startswith(prefix + ".")) and (
                best is None or len(prefix) > len(best[1])
            ):
                best = (layer, prefix)
    return None if best is None else best[0]


def edges():
    known = modules()
    for module, path in known.items():
        for name, at_top in imports(path):
            if name.startswith("pileshuffle"):
                target = owner(name, known)
                if target != module:  # "" is the package's own __init__
                    yield module, target, at_top


def test_every_module_has_a_layer():
    assert [m for m in modules() if m and layer_of(m) is None] == []


def test_imports_never_climb_a_layer():
    climbs = []
    for module, target, _ in edges():
        a, b = layer_of(module), layer_of(target)
        if a == LOADER and b != LOADER and b > LOADER_READS:
            climbs.append(f"{module} -> {target} (the loader reads only layers 0-{LOADER_READS})")
        elif b == LOADER and a != LOADER and a < 6:
            climbs.append(f"{module} -> {target} (only quality and commands use the loader)")
        elif LOADER not in (a, b) and b > a:
            climbs.append(f"{module} (layer {a}) -> {target} (layer {b})")
    assert climbs == []


def test_no_import_circles():
    graph = {}
    for module, target, _ in edges():
        graph.setdefault(module, set()).add(target)
    state, circles = {}, []

    def visit(node, path):
        state[node] = "open"
        for nxt in graph.get(node, ()):
            if state.get(nxt) == "open":
                circles.append(path[path.index(nxt) :] + [nxt])
            elif nxt not in state:
                visit(nxt, path + [nxt])
        state[node] = "done"

    for node in sorted(graph):
        if node not in state:
            visit(node, [node])
    assert circles == []


@pytest.mark.parametrize("prefix", WITHOUT_BEAM)
def test_beam_stays_out_of_what_a_training_host_imports(prefix):
    found = [
        f"{m} imports {name}"
        for m, path in modules().items()
        if m == prefix or m.startswith(prefix + ".")
        for name, at_top in imports(path)
        if name.startswith("apache_beam") and at_top
    ]
    assert found == []


def test_the_commands_that_build_no_pipeline_import_no_beam():
    """``info``, ``verify``, ``expire`` and ``gc`` import nothing of Beam, through any module: each
    starts in a fraction of a second (Beam's import was about 1 s of each), and ``info`` and
    ``verify`` run where the reader alone is installed (tests/test_reader_install.py)."""
    done = subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys, pileshuffle.commands.info, pileshuffle.commands.verify,"
            " pileshuffle.commands.expire;"
            "print(sorted(m for m in sys.modules if m.startswith('apache_beam'))[:3])",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert (done.returncode, done.stdout.strip()) == (0, "[]"), done.stderr


def test_no_module_is_longer_than_the_limit():
    long = {
        m: n for m, p in modules().items() if (n := len(p.read_text().splitlines())) > MAX_LINES
    }
    bench = {
        p.name: n
        for p in (ROOT / "bench").glob("*.py")
        if (n := len(p.read_text().splitlines())) > MAX_LINES
    }
    assert (long, bench) == ({}, {})


# a screen: a function longer than this is read in parts, and its parts want names
MAX_FUNCTION_LINES = 50
# declarations read one entry after another, which names for parts would not help
DECLARATIONS = {
    ("commands/quality.py", "parse"),  # an argparse parser: one option after another
    ("commands/store_options.py", "append_options"),  # the same
}


def test_no_function_is_longer_than_a_screen():
    """Every function of the package fits ``MAX_FUNCTION_LINES`` (its docstring included), the
    ``DECLARATIONS`` apart."""
    long = []
    for module in PACKAGE.rglob("*.py"):
        name = str(module.relative_to(PACKAGE))
        for node in ast.walk(ast.parse(module.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                lines = node.end_lineno - node.lineno + 1
                if lines > MAX_FUNCTION_LINES and (name, node.name) not in DECLARATIONS:
                    long.append((name, node.name, lines))
    assert long == []


def test_the_package_root_holds_only_the_face_and_the_bottom():
    root = sorted(p.stem for p in PACKAGE.glob("*.py"))
    assert len(root) <= ROOT_MODULES, root


def test_every_package_says_what_it_may_import():
    silent = [
        str(p.relative_to(ROOT))
        for p in PACKAGE.rglob("__init__.py")
        if p.parent != PACKAGE
        and "may import" not in (ast.get_docstring(ast.parse(p.read_text())) or "").lower()
    ]
    assert silent == []


def test_the_layer_drawing_in_docs_names_every_module():
    """docs/architecture.md's drawing of the layers (its first code block) names every module of
    the package: a module added, moved or renamed is drawn where it now lives."""
    drawing = (ROOT / "docs" / "architecture.md").read_text().split("```")[1]
    unnamed = [
        str(p.relative_to(PACKAGE))
        for p in sorted(PACKAGE.rglob("*.py"))
        if p.name != "__init__.py" and not re.search(rf"\b{re.escape(p.stem)}\b", drawing)
    ]
    assert unnamed == []
