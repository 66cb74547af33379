-- Version 4: several clusters in one historian. jobs and node_events name the Slurm cluster
-- each row came from (sacct's / sacctmgr's Cluster, or [historian] cluster). Rows written
-- before keep '' (one unnamed cluster) until an ingest reads them again and names it.
-- Slurm reservations (sacctmgr show reservation) join them: a MAINT reservation's nodes are out
-- for planned maintenance, which the lemon features do not count.
-- No existing row is rewritten.

ALTER TABLE jobs ADD COLUMN cluster VARCHAR(64) DEFAULT '' NOT NULL;

ALTER TABLE node_events ADD COLUMN cluster VARCHAR(64) DEFAULT '' NOT NULL;

CREATE TABLE reservations (
	id INTEGER NOT NULL,
	cluster VARCHAR(64) NOT NULL,
	name VARCHAR(128) NOT NULL,
	start DATETIME NOT NULL,
	"end" DATETIME,
	flags TEXT NOT NULL,
	nodelist TEXT NOT NULL,
	PRIMARY KEY (id),
	CONSTRAINT uq_reservations UNIQUE (cluster, name, start)
);
