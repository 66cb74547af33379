-- Version 16: the telemetry rollups keep a row's sample count once. `sweeps` is the most
-- samples any metric of the row had (every metric sampled every sweep, mostly); a metric's
-- `<metric>_n` is NULL when it equals `sweeps`, read back as `sweeps`
-- (historian/telemetry.py): 4 bytes less per such metric and row, the storage budget at 16,000
-- nodes (benchmarks/bench_telemetry_storage.py). Rows written before keep every `_n` and a
-- NULL `sweeps`, read as before. No existing row is rewritten.

ALTER TABLE telemetry_job_rollups ADD COLUMN sweeps INTEGER;
ALTER TABLE telemetry_day_rollups ADD COLUMN sweeps INTEGER;
