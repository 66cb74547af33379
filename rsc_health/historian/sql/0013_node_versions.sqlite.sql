-- Version 13: each node's driver and GPU firmware (VBIOS, InfoROM) as its heartbeats said
-- them, and since when, with what it said before: a change makes the node due for
-- qualification ([qualify] on_driver_change). A new table only: no existing row changes.

CREATE TABLE node_versions (
	node VARCHAR(128) NOT NULL,
	versions VARCHAR(512) NOT NULL,
	since DATETIME NOT NULL,
	last_seen DATETIME NOT NULL,
	previous VARCHAR(512),
	PRIMARY KEY (node)
);
