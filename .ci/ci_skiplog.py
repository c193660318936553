"""A pytest plugin for CI: lists what a run skipped, so that a later pass can run just those.

Loaded with ``-p ci_skiplog`` (``.ci`` on ``PYTHONPATH``); writes one node id per line to the file
named by ``FUNCGRAD_CI_SKIPLOG``: tests skipped at setup or in the call, and modules or classes
skipped while collecting (``pytest.importorskip`` at module level). Expected failures (xfail) are
not skips and are left out. Under xdist only the controller writes.
"""
from __future__ import annotations

import os
from typing import Any

_config: Any = None


def pytest_configure(config: Any) -> None:
    global _config
    _config = config


def _record(nodeid: str) -> None:
    path = os.environ.get("FUNCGRAD_CI_SKIPLOG")
    if not path or (_config is not None and hasattr(_config, "workerinput")):
        return
    with open(path, "a", encoding="utf-8") as f:
        f.write(nodeid + "\n")


def pytest_runtest_logreport(report: Any) -> None:
    if report.skipped and not hasattr(report, "wasxfail"):
        _record(report.nodeid)


def pytest_collectreport(report: Any) -> None:
    if report.skipped and report.nodeid:
        _record(report.nodeid)
