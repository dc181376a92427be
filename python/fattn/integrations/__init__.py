"""Adapters that plug fattn into other libraries; each imports its library only when imported."""
