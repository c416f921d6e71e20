"""The base layer: what every app and the project stand on, importing none of them.

Errors and their vocabulary, the tenant and operator database paths, the
request context, logging, outages, the process's own facts, JSON that cannot
fail, state shared between worker processes, timestamps, the usage event,
and the admin's helpers. ``recall/tests/test_architecture.py`` fails on an
import from here into an app or the project.
"""
