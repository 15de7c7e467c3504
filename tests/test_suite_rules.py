"""The suite fails loudly (issue 54; the rules are tests/suite_rules.py): a skip whose reason is not
on the allow-list fails the run, also when xdist's workers run the test and also at collection;
an allowed skip is listed (``-rs``) and passes; a test dependency that is missing or out of its
range stops the run before any test, naming it and ``make install``. Each case is a real pytest
run, in a subprocess, on a tiny generated test file."""

import os
import subprocess
import sys

import pytest

TESTS = os.path.dirname(os.path.abspath(__file__))
XDIST = ["-n", "2", "--dist", "loadfile"]  # as `make test` runs

PASSING = "def test_passes():\n    assert True\n"
SKIPPING = "import pytest\n\n\ndef test_skips():\n    pytest.skip({reason!r})\n"


def pytest_run(folder, *args, pythonpath=()):
    """``pytest -q -rfEs ARGS`` on ``folder`` with the suite's rules as its only plugin of ours:
    (exit code, everything it printed)."""
    (folder / "pytest.ini").write_text("[pytest]\n")
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-p",
            "suite_rules",
            "-p",
            "no:cacheprovider",
            "-q",
            "-rfEs",
            *args,
            str(folder),
        ],
        capture_output=True,
        text=True,
        cwd=folder,
        timeout=300,
        env={**os.environ, "PYTHONPATH": os.pathsep.join([*pythonpath, TESTS])},
    )
    return done.returncode, done.stdout + done.stderr


def last_line(said: str) -> str:
    """pytest's closing line without its time: ``1 failed, 1 passed``."""
    return said.strip().splitlines()[-1].rsplit(" in ", 1)[0]


def write_tests(folder, **files):
    for name, text in files.items():
        (folder / f"{name}.py").write_text(text)
    return folder


@pytest.mark.parametrize("how", [[], XDIST], ids=["one-process", "xdist"])
def test_a_skip_not_on_the_allow_list_fails_the_run(tmp_path, how):
    reason = "tensorflow is not installed, never mind"
    write_tests(tmp_path, test_a=PASSING, test_b=SKIPPING.format(reason=reason))
    code, said = pytest_run(tmp_path, *how)
    assert code == 1 and last_line(said) == "1 failed, 1 passed", said
    assert (
        f"a skip that is not on the allow-list (ALLOWED_SKIPS in tests/suite_rules.py): {reason}"
        in said
    ), said


@pytest.mark.parametrize("how", [[], XDIST], ids=["one-process", "xdist"])
def test_an_allowed_skip_is_listed_and_passes(tmp_path, how):
    reason = "mounting a tmpfs needs root and failed: permission denied"
    write_tests(tmp_path, test_a=PASSING, test_b=SKIPPING.format(reason=reason))
    code, said = pytest_run(tmp_path, *how)
    assert code == 0 and last_line(said) == "1 passed, 1 skipped", said
    assert f"SKIPPED [1] test_b.py:5: {reason}" in said, said


def test_a_module_skipped_at_collection_fails_the_run(tmp_path):
    write_tests(
        tmp_path,
        test_a=PASSING,
        test_b="import pytest\n\nnothing = pytest.importorskip('no_such_module_for_the_suite')\n",
    )
    code, said = pytest_run(tmp_path)
    assert code == pytest.ExitCode.INTERRUPTED and last_line(said) == "1 error", said
    assert "ERROR test_b.py - a skip that is not on the allow-list" in said, said
    assert "could not import 'no_such_module_for_the_suite'" in said, said


def test_a_skip_mark_fails_the_run(tmp_path):
    write_tests(
        tmp_path,
        test_a=PASSING,
        test_c="import pytest\n\n\n@pytest.mark.skipif(True, reason='not today')\ndef test_c():\n    pass\n",
    )
    code, said = pytest_run(tmp_path)
    assert code == 1 and last_line(said) == "1 passed, 1 error", said  # in the test's setup
    assert (
        "ERROR test_c.py::test_c - a skip that is not on the allow-list" in said
        and "not today" in said
    ), said


def test_a_missing_or_outdated_test_dependency_stops_the_run_before_any_test(tmp_path):
    """The package's metadata seen first on the path declares one test dependency that is not
    installed and one whose installed version is out of range (and one of another extra)."""
    site = tmp_path / "site"
    (site / "pileshuffle-0.1.0.dist-info").mkdir(parents=True)
    (site / "pileshuffle-0.1.0.dist-info" / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: pileshuffle\nVersion: 0.1.0\nProvides-Extra: test\n"
        'Requires-Dist: no-such-distribution-for-the-suite>=1; extra == "test"\n'
        'Requires-Dist: pytest>=999; extra == "test"\n'
        'Requires-Dist: another-missing-one; extra == "pipeline"\n'
    )
    folder = tmp_path / "tests"
    folder.mkdir()
    code, said = pytest_run(write_tests(folder, test_a=PASSING), pythonpath=[str(site)])
    assert code == pytest.ExitCode.USAGE_ERROR, said
    assert (
        "required test dependencies missing: no-such-distribution-for-the-suite (not installed), "
        in said
    ), said
    assert (
        f"pytest ({pytest.__version__} installed, >=999 wanted)" in said
        and "`make install`" in said
    ), said
    assert "another-missing-one" not in said and "passed" not in said, said
