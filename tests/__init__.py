"""The tests, in folders that mirror the code: ``tests/core/`` tests ``replay/core/``, and so on for ``reference``,
``store``, ``engine``, ``runner`` and ``quality``; ``airflow/`` tests ``dags/`` and ``plugins/``; ``project/`` the
repository as a whole; the top-level modules' tests (``cli``, ``generate``) are here.

Every folder is a package, so test modules are imported by their full name (``tests.engine.test_cluster``)
and helpers as ``from tests._archives import ...``. Helpers shared across folders are ``tests/_*.py``; a
folder's own helpers are in it (``tests/airflow/_stack.py``).
"""
