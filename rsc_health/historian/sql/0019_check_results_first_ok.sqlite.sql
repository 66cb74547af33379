-- Version 19: each check family's first all-clear row by one index probe (the report's
-- check deployments, metrics.deployments), where a GROUP BY read every ok row: millions at
-- a year of sweeps. SQLite has one writer at a time: writers wait (busy_timeout) while it
-- builds.
CREATE INDEX ix_check_results_check_status_time ON check_results ("check", status, time);
