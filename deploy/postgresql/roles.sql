-- rsc-health's PostgreSQL database and its roles, step 1 of 2 (step 2: grants.sql).
-- Run as a superuser, once per cluster (re-running changes nothing):
--   sudo -u postgres psql -v ON_ERROR_STOP=1 -v dbname=rsc_health -v owner=rsc_health \
--        -v node=rsc_health_node -v reader=rsc_health_reader -f deploy/postgresql/roles.sql
-- Every variable has the default shown (pass only the ones you change).
--
--   owner   owns the database and every table: `healthctl db upgrade` and the management
--           host's timers (ingest, attribute, lemons --apply, qualify, prune) run as it.
--           Owner, not a mere writer: the ingest ends big loads with ANALYZE, which only the
--           owner may run (anyone else gets a warning and the planner no statistics).
--   node    the compute nodes' `healthctl spool flush`: reads the schema version, writes its
--           own check results, runs, heartbeats, actions and exclusions; reads nothing else.
--   reader  read-only: `healthctl status`, `node`, `report`, `metrics export`, Grafana.
--
-- No passwords here (they would end up in shell history and this file's copies): give each
-- role one with `\password NAME` in psql, or authenticate by certificate in pg_hba.conf.

\if :{?dbname} \else \set dbname rsc_health \endif
\if :{?owner} \else \set owner rsc_health \endif
\if :{?node} \else \set node rsc_health_node \endif
\if :{?reader} \else \set reader rsc_health_reader \endif

SELECT format('CREATE ROLE %I LOGIN', r) FROM unnest(ARRAY[:'owner', :'node', :'reader']) AS r
 WHERE NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = r) \gexec

SELECT format('CREATE DATABASE %I OWNER %I ENCODING %L TEMPLATE template0', :'dbname', :'owner', 'UTF8')
 WHERE NOT EXISTS (SELECT 1 FROM pg_database WHERE datname = :'dbname') \gexec

-- Only these three may connect; TEMPORARY stays PostgreSQL's default.
REVOKE CONNECT ON DATABASE :"dbname" FROM PUBLIC;
GRANT CONNECT ON DATABASE :"dbname" TO :"owner", :"node", :"reader";

\connect :"dbname"
-- Before PostgreSQL 15 every role could create tables in `public`; nobody but the owner may.
REVOKE CREATE ON SCHEMA public FROM PUBLIC;
GRANT USAGE, CREATE ON SCHEMA public TO :"owner";
GRANT USAGE ON SCHEMA public TO :"node", :"reader";
