"""Migration 0021 adds job_starts (when each node's prolog ran for a job of two or more nodes,
the spool's job_start records): a historian at version 20 keeps every row and ends with the
table a new one has."""

from __future__ import annotations

import pytest

from .table_migration import check_upgrade_adds


@pytest.mark.parametrize("dialect", ["sqlite", pytest.param("postgresql",
                                                            marks=pytest.mark.postgres)])
def test_upgrade_from_20_adds_job_starts_as_a_new_historian_has_it(dialect, tmp_path, request):
    check_upgrade_adds(request, tmp_path, dialect, "job_starts", drop=["job_starts"],
                       version=20, steps=[21])
