"""Programs shipped to run as site checks (the `site` family, rsc_health/checks/site.py)."""
