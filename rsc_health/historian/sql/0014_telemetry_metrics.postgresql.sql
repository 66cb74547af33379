-- Version 14: four more metrics of the telemetry vocabulary (model.Metric, issue 25 item 1):
-- nvlink_data_rate, remapped_rows, remap_low_banks, ib_error_rate. Their value and component
-- columns in telemetry_samples, and the stat columns of the two rates in both rollup tables
-- (the levels remapped_rows and remap_low_banks are not rolled up: model.LEVELS), NULL in
-- every existing row (no sweep sampled them): no existing value changes.

ALTER TABLE telemetry_samples ADD COLUMN nvlink_data_rate FLOAT(24);
ALTER TABLE telemetry_samples ADD COLUMN nvlink_data_rate_c VARCHAR(32);
ALTER TABLE telemetry_samples ADD COLUMN remapped_rows FLOAT(24);
ALTER TABLE telemetry_samples ADD COLUMN remapped_rows_c VARCHAR(32);
ALTER TABLE telemetry_samples ADD COLUMN remap_low_banks FLOAT(24);
ALTER TABLE telemetry_samples ADD COLUMN remap_low_banks_c VARCHAR(32);
ALTER TABLE telemetry_samples ADD COLUMN ib_error_rate FLOAT(24);
ALTER TABLE telemetry_samples ADD COLUMN ib_error_rate_c VARCHAR(32);

ALTER TABLE telemetry_job_rollups ADD COLUMN nvlink_data_rate_n INTEGER;
ALTER TABLE telemetry_job_rollups ADD COLUMN nvlink_data_rate_mean FLOAT(24);
ALTER TABLE telemetry_job_rollups ADD COLUMN nvlink_data_rate_min FLOAT(24);
ALTER TABLE telemetry_job_rollups ADD COLUMN nvlink_data_rate_max FLOAT(24);
ALTER TABLE telemetry_job_rollups ADD COLUMN nvlink_data_rate_past INTEGER;
ALTER TABLE telemetry_job_rollups ADD COLUMN nvlink_data_rate_worst VARCHAR(16);
ALTER TABLE telemetry_job_rollups ADD COLUMN ib_error_rate_n INTEGER;
ALTER TABLE telemetry_job_rollups ADD COLUMN ib_error_rate_mean FLOAT(24);
ALTER TABLE telemetry_job_rollups ADD COLUMN ib_error_rate_min FLOAT(24);
ALTER TABLE telemetry_job_rollups ADD COLUMN ib_error_rate_max FLOAT(24);
ALTER TABLE telemetry_job_rollups ADD COLUMN ib_error_rate_past INTEGER;
ALTER TABLE telemetry_job_rollups ADD COLUMN ib_error_rate_worst VARCHAR(16);

ALTER TABLE telemetry_day_rollups ADD COLUMN nvlink_data_rate_n INTEGER;
ALTER TABLE telemetry_day_rollups ADD COLUMN nvlink_data_rate_mean FLOAT(24);
ALTER TABLE telemetry_day_rollups ADD COLUMN nvlink_data_rate_min FLOAT(24);
ALTER TABLE telemetry_day_rollups ADD COLUMN nvlink_data_rate_max FLOAT(24);
ALTER TABLE telemetry_day_rollups ADD COLUMN nvlink_data_rate_past INTEGER;
ALTER TABLE telemetry_day_rollups ADD COLUMN nvlink_data_rate_worst VARCHAR(16);
ALTER TABLE telemetry_day_rollups ADD COLUMN ib_error_rate_n INTEGER;
ALTER TABLE telemetry_day_rollups ADD COLUMN ib_error_rate_mean FLOAT(24);
ALTER TABLE telemetry_day_rollups ADD COLUMN ib_error_rate_min FLOAT(24);
ALTER TABLE telemetry_day_rollups ADD COLUMN ib_error_rate_max FLOAT(24);
ALTER TABLE telemetry_day_rollups ADD COLUMN ib_error_rate_past INTEGER;
ALTER TABLE telemetry_day_rollups ADD COLUMN ib_error_rate_worst VARCHAR(16);
