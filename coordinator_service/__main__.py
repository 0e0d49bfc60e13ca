"""``python -m coordinator_service --port 8080 ...``: the same flags as ``eos coordinator``."""

from coordinator_service.cli import standalone

if __name__ == "__main__":
    standalone()()
