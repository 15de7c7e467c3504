"""docs/scaling.md's tables are generated from ``plan``'s model by bench/scaling_costs.py: the
committed tables must be what the script prints now, so a change to the model that moves a figure
fails here until `python bench/scaling_costs.py --write` regenerates them."""

import importlib.util
import pathlib

ROOT = pathlib.Path(__file__).resolve().parent.parent


def scaling_costs():
    spec = importlib.util.spec_from_file_location(
        "scaling_costs", ROOT / "bench" / "scaling_costs.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_committed_tables_are_what_the_script_prints():
    script = scaling_costs()
    text = (ROOT / "docs" / "scaling.md").read_text()
    generated = script.tables()
    markers = [line for line in text.splitlines() if script.BEGIN.match(line)]
    # prices, rates, files, shuffle, cheapest: once each
    assert len(markers) == len(generated) == 5, markers
    assert script.rewritten(text, generated) == text, "run `python bench/scaling_costs.py --write`"
    files = generated["files"].splitlines()
    total = next(line for line in files if line.startswith("| **total per TB**"))
    assert float(total.split("|")[-2].strip(" *$")) <= 3.0  # files mode at 100 TB, GETs included
    stale = text.replace(total, total.replace("**$", "**$1"))  # one figure changed by hand
    assert stale != text and script.rewritten(stale, generated) == text
