"""Serving capacity: a serving plan (``spec``, ``load``) and the per-iteration cost of a
replica (``cost``); the event engine that serves requests is ``simcore.engine.serving``."""
