"""The coordinator's database: table definitions, engine setup and migrations."""
