"""The contract in pure Python: errors, time, the vocabulary, the job model, progress and window kinds.

Nothing here imports Spark, pyarrow or any other folder of Replay: these modules say what the
rules are (docs/semantics.md, docs/configuration.md); ``engine`` and ``runner`` apply them,
``reference`` restates them naively.
"""
