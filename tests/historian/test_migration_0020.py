"""Migration 0020 adds job_ends (when each node's epilog ran for a job, the spool's job_end
records): a historian at version 19 keeps every row and ends with the table a new one has."""

from __future__ import annotations

import pytest

from .table_migration import check_upgrade_adds


@pytest.mark.parametrize("dialect", ["sqlite", pytest.param("postgresql",
                                                            marks=pytest.mark.postgres)])
def test_upgrade_from_19_adds_job_ends_as_a_new_historian_has_it(dialect, tmp_path, request):
    check_upgrade_adds(request, tmp_path, dialect, "job_ends",
                       drop=["job_ends", "job_starts"],  # job_starts: what 0021 adds
                       version=19, steps=[20, 21])
