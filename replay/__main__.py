"""``python -m replay ...``: the ``replay`` command, also as a file that spark-submit can run.

``spark-submit <site-packages>/replay/__main__.py run --config job.yaml`` starts Replay's driver
on the master spark-submit was given (the Airflow DAGs' ``spark_submit`` engine does this through
the Spark provider's ``SparkSubmitHook``): ``replay.engine.spark.get_session`` keeps that master and
ignores the job's ``spark.master``.
"""

from __future__ import annotations

import os
import sys

if not __package__ and sys.path and os.path.abspath(sys.path[0]) == os.path.dirname(os.path.abspath(__file__)):
    # Run as a file, Python put this package's own folder first on the import path, where its
    # modules would shadow top-level ones of the same name: import Replay as the installed package.
    sys.path.pop(0)

from replay.cli import main

if __name__ == "__main__":
    main()
