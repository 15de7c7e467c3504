"""A pytest plugin that makes the suite fail loudly (issue 54); tests/conftest.py loads it.

- Every distribution in the package's ``test`` extra is required: one missing, or of a version
  outside its range, stops the run before any test with one line naming it and ``make install``.
- A skip whose reason is not in ``ALLOWED_SKIPS`` is turned into a failure where the report is
  made (in the xdist worker that ran it), so the controller, ``-rs`` and the exit status see a
  failure. Each allowed reason says why a run may go without that test.
"""

import importlib.metadata

import pytest
from packaging.requirements import Requirement

PACKAGE = "pileshuffle"
EXTRA = "test"

# A substring of the skip's reason -> why a run may go without that test. Keep it short.
ALLOWED_SKIPS = {
    "only on the emulator": "the gs:// tests run on a real bucket when PILESHUFFLE_TEST_BUCKET names one; "
    "there no outage or refusal can be injected and credentials are looked up as "
    "they should be (make test runs these tests on the emulator)",
    "needs root": "mounting a tmpfs and chattr +i need root; as root (CI, make test here) a refusal "
    "fails the test instead",
    "cannot create a memory cgroup: not root": "the container-budget run needs a memory cgroup of "
    "its own; as root (CI, make test here) a refusal fails",
    "no package index reachable": "the reader's install test downloads its dependencies; an offline "
    "machine cannot (with an index answering, a failed install fails)",
    "need memfd_create": "shared memory rings are Linux's (os.memfd_create); elsewhere batches travel "
    "inside the pickle, which the other handoff tests cover",
}


def missing_requirements() -> list:
    """``name (why)`` for each requirement of the test extra that is absent or out of range."""
    try:
        declared = importlib.metadata.requires(PACKAGE) or []
    except importlib.metadata.PackageNotFoundError:
        return [f"{PACKAGE} itself (not installed)"]
    missing = []
    for text in declared:
        requirement = Requirement(text)
        if requirement.marker is None or not requirement.marker.evaluate({"extra": EXTRA}):
            continue
        try:
            version = importlib.metadata.version(requirement.name)
        except importlib.metadata.PackageNotFoundError:
            missing.append(f"{requirement.name} (not installed)")
            continue
        if not requirement.specifier.contains(version, prereleases=True):
            missing.append(
                f"{requirement.name} ({version} installed, {requirement.specifier} wanted)"
            )
    return missing


def pytest_configure(config):
    missing = missing_requirements()
    if missing:
        raise pytest.UsageError(
            f"required test dependencies missing: {', '.join(missing)}; "
            f"install the test extra with `make install`"
        )


def skip_reason(report) -> str:
    """The reason a skipped report gives (pytest keeps it as ``(path, line, 'Skipped: why')``)."""
    longrepr = report.longrepr
    return str(longrepr[2] if isinstance(longrepr, (tuple, list)) else longrepr)


def fail_unlisted_skip(report):
    """Turn ``report`` into a failure if it is a skip whose reason is not allowed."""
    if not report.skipped or hasattr(report, "wasxfail"):
        return
    reason = skip_reason(report).removeprefix("Skipped: ")
    if any(allowed in reason for allowed in ALLOWED_SKIPS):
        return
    report.outcome = "failed"
    report.longrepr = (
        f"a skip that is not on the allow-list (ALLOWED_SKIPS in tests/suite_rules.py): "
        f"{reason}\nrequired dependencies are imported, not skipped; a real limit of "
        f"the environment goes on the list with its reason"
    )


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item, call):
    report = yield
    fail_unlisted_skip(report)
    return report


@pytest.hookimpl(wrapper=True)
def pytest_make_collect_report(collector):
    report = yield
    fail_unlisted_skip(report)
    return report
