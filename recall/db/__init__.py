"""A PostgreSQL backend that starts the embedded server on first use.

Settings select it when DATABASE_URL is unset. Nothing is started until Django
first builds a connection, so commands that never touch the database (``help``,
``check --deploy`` without a database) stay fast.
"""
