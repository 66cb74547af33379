"""Lemon nodes (paper IV-A): per-node features over a sliding window, verdicts, and the loop
back into Slurm (drain + repair ticket).

features.py  the paper's seven signals plus extras, one DataFrame row per node
verdicts.py  threshold rules over the features, with the evidence behind each verdict
apply.py     drain + ticket through the Slurm interface, dry run by default
(The threshold tuning over simulator ground truth is the lab's: rsc_health/sim/tune.py.)
"""
