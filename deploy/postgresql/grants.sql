-- rsc-health's PostgreSQL grants, step 2 of 2 (step 1: roles.sql). Run as a superuser after
-- the owner has created or migrated the schema, and again after every `healthctl db upgrade`
-- (a migration may add a table the nodes write):
--   healthctl --db postgresql+psycopg://rsc_health@DBHOST/rsc_health db upgrade
--   sudo -u postgres psql -v ON_ERROR_STOP=1 -v dbname=rsc_health -v owner=rsc_health \
--        -v node=rsc_health_node -v reader=rsc_health_reader -f deploy/postgresql/grants.sql
-- The same variables and defaults as roles.sql. tests/historian/test_postgres_roles.py runs
-- both files, flushes a real spool as the node role and proves what each role may not do.

\if :{?dbname} \else \set dbname rsc_health \endif
\if :{?owner} \else \set owner rsc_health \endif
\if :{?node} \else \set node rsc_health_node \endif
\if :{?reader} \else \set reader rsc_health_reader \endif
\connect :"dbname"
-- One transaction: a flush running while this is re-run sees the old grants or the new ones.
BEGIN;

-- The node role: exactly what `healthctl spool flush` does.
--   schema_version    every flush's first transaction reads it (a node of another release
--                     must not write); without it every flush fails (issue 26).
--   check_results     check intervals: the node reads its open ones, extends or closes them
--                     and opens new ones (keyed by the spool record's id: no sequence).
--   check_days, node_runs, heartbeat_days
--                     daily rollups and heartbeats: read, insert, update.
--   gpu_names         each GPU's index and bus id as the node's heartbeat last said them
--                     (one GPU name everywhere): read, insert, update.
--   node_versions     the node's driver and GPU firmware as its heartbeat said them, and
--                     when they changed (qualification's trigger): read, insert, update.
--   node_actions, job_exclusions
--                     keyed inserts (ON CONFLICT (key) DO NOTHING): INSERT, and SELECT on the
--                     key columns alone, which PostgreSQL asks of an ON CONFLICT target; so a
--                     node cannot read what other nodes did nor rsc-health's lemon drains.
--   telemetry_samples each sweep's telemetry sample, a keyed insert as above on (time, node).
--   job_ends          when the node's epilog ran for a job: an insert keyed on (node, job_id,
--                     time) and named by no conflict target, so INSERT alone.
--   job_starts        when the node's prolog ran for a job of two or more nodes, and which
--                     nodes it named (count and digest): keyed and inserted as job_ends.
-- Nothing else: no tickets, jobs, attributions, qualification results, no DELETE anywhere.
REVOKE ALL ON ALL TABLES IN SCHEMA public FROM :"node";
REVOKE ALL ON ALL SEQUENCES IN SCHEMA public FROM :"node";
GRANT SELECT ON schema_version TO :"node";
GRANT SELECT, INSERT, UPDATE ON check_results, check_days, node_runs, heartbeat_days, gpu_names,
  node_versions TO :"node";
GRANT INSERT ON node_actions, job_exclusions, telemetry_samples, job_ends, job_starts
  TO :"node";
GRANT SELECT (time, node) ON telemetry_samples TO :"node";
GRANT SELECT (id) ON node_actions TO :"node";
GRANT SELECT (job_id, node) ON job_exclusions TO :"node";

-- The reader role: every table, read only, now and for tables later migrations add.
GRANT SELECT ON ALL TABLES IN SCHEMA public TO :"reader";
ALTER DEFAULT PRIVILEGES FOR ROLE :"owner" IN SCHEMA public GRANT SELECT ON TABLES TO :"reader";
COMMIT;
