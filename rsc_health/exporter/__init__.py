"""The historian's view in Prometheus' text format (`healthctl metrics export`)."""
