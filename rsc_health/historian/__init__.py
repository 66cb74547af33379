"""The historian: the SQL-backed memory of the cluster (results, accounting, events, metrics)."""
