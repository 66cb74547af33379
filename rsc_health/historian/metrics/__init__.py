"""Reliability metrics after the RSC paper (section III, Appendix A): one module per metric."""
