-- rsc-health: outside a transaction
-- Version 19: each check family's first all-clear row by one index probe (the report's
-- check deployments, metrics.deployments), where a GROUP BY read every ok row: millions at
-- a year of sweeps.
--
-- CONCURRENTLY, so the flushes and ingests that write check_results go on while it builds
-- (a plain CREATE INDEX holds off every writer until it is done). CONCURRENTLY cannot run
-- inside a transaction: the line above makes migrate() run these statements one by one,
-- then record the version in a transaction of its own. A build that was stopped leaves an
-- INVALID index under this name; the DROP makes running the migration again build it anew.
DROP INDEX CONCURRENTLY IF EXISTS ix_check_results_check_status_time;
CREATE INDEX CONCURRENTLY ix_check_results_check_status_time ON check_results ("check", status, time);
