"""The kept driver: one long-lived process with a warm SparkSession that runs ``replay run``'s jobs
sent by clients (``replay driver serve``; ``replay run --driver DIR``).

A cold ``replay run`` spends most of its time starting the JVM and compiling Spark's code for the
first time; a driver that outlives the command pays that once, and every run it serves after its
first starts from the warm figures (docs/driver.md). ``home`` is where a driver says how to reach
it, ``server`` the driver, ``client`` what a command calls.
"""
