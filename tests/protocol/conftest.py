"""The protocol tests talk to real processes (the installed plugins, a
real NBD server, threads relaying between them): one that hangs must fail
on its own, not hold the whole run to CI's limit. Each test gets a bound
(pytest-timeout, from the project's test requirements)."""

import pytest

TEST_TIMEOUT = 120   # seconds: the slowest protocol test takes a few


def pytest_collection_modifyitems(items):
    for item in items:
        if item.get_closest_marker("timeout") is None:
            item.add_marker(pytest.mark.timeout(TEST_TIMEOUT))
