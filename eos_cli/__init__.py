"""The ``eos`` command line."""
