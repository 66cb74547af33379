"""Collectors: read one node's state under a root directory. Standard library + pynvml only,
because the prolog runs them on every job start."""
