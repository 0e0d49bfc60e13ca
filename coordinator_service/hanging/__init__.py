"""Hanging-transaction detection (KIP-664): ``rule`` decides, ``nodes`` asks the storage
nodes and writes markers, ``detector`` runs the passes and acts."""
