"""Long fuzz runs of the stateful test machines: ``python -m fuzz --minutes N``."""
