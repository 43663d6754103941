"""The reference model: the archive, progress, lateness and windows computed the naive way.

Pure Python over pyarrow rows (``model.run_reference``), written from docs/archive.md and
docs/semantics.md in the words of ``replay.core.vocabulary`` and checked against the engine by
the tests. It imports ``replay.core`` only, and nothing but the tests imports it.
"""
