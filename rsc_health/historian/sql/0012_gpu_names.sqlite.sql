-- Version 12: the bus id of each node's GPU index, from the nodes' heartbeats
-- (rsc_health.gpuname: one name for one GPU). A new table only: no existing row changes.

CREATE TABLE gpu_names (
	node VARCHAR(128) NOT NULL,
	idx INTEGER NOT NULL,
	bus_id VARCHAR(32) NOT NULL,
	last_seen DATETIME NOT NULL,
	PRIMARY KEY (node, idx)
);
