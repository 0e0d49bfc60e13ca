"""Alembic migrations of the coordinator's database (``eos db upgrade``)."""
