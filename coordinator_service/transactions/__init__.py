"""Transactional ids: their records, the rules over them, their storage and lifecycle."""
