-- Version 4: several clusters in one historian. jobs and node_events name the Slurm cluster
-- each row came from (sacct's / sacctmgr's Cluster, or [historian] cluster). Rows written
-- before keep '' (one unnamed cluster) until an ingest reads them again and names it.
-- The same statements on SQLite and PostgreSQL; no row is rewritten on either.

ALTER TABLE jobs ADD COLUMN cluster VARCHAR(64) DEFAULT '' NOT NULL;

ALTER TABLE node_events ADD COLUMN cluster VARCHAR(64) DEFAULT '' NOT NULL;
