"""The Spark data plane: the session, the archive's files and metadata scan, buffers, windows,
aggregations and the one pass that does a micro-batch's tuple work and writes its tables.

Everything that touches tuples runs here, in Spark; only per-buffer records reach the driver.
"""
