"""The run loop of ``replay run``: the batch plan, deduplication and arrival order, the ledger,
resume from the checkpoint, and the micro-batch loop with its commits (``loop.run``).
"""
