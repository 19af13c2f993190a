"""Backends: thin drivers over one small contract (see ``fencing.backends._contract``)."""
