#!/usr/bin/env bash
# The README's two commands, and a few more.
#   ./dev.sh demo            set up .venv, generate a sample archive and run the main job on it (the
#                            replay_backfill DAG under 'airflow dags test')
#   ./dev.sh test [ARGS]     set up .venv and run the test suite (pytest ARGS)
#   ./dev.sh setup           only set up .venv from the lock file
#   ./dev.sh bench [ARGS]    run the benchmarks (benchmarks/)
#   ./dev.sh cluster         run a Spark standalone master and one worker on 127.0.0.1 (Ctrl-C stops both)
# Needs Python 3.11 and Java 17 on the machine; everything else is installed into .venv
# from uv.lock (uv itself is bootstrapped into .tools/).
set -euo pipefail
cd "$(dirname "$0")"

UV_VERSION=0.13.8

find_python() {
    for candidate in "${PYTHON:-}" python3.11 python3 python; do
        [ -n "$candidate" ] || continue
        # The interpreter's own path, not a launcher's (pyenv shims): uv rebuilds .venv whenever the
        # interpreter it is given differs from the one .venv was made with.
        if command -v "$candidate" >/dev/null 2>&1 &&
            "$candidate" -c 'import sys; sys.exit(0 if sys.version_info[:2] == (3, 11) else 1)' 2>/dev/null; then
            "$candidate" -c 'import sys; print(sys.executable)'
            return 0
        fi
    done
    echo "dev.sh: Python 3.11 is needed. Install it (Debian/Ubuntu: 'apt-get install python3.11 python3.11-venv';" \
        "macOS: 'brew install python@3.11'; or pyenv), or set PYTHON=/path/to/python3.11." >&2
    return 1
}

check_java() {
    local java="java"
    if [ -n "${JAVA_HOME:-}" ] && [ -x "$JAVA_HOME/bin/java" ]; then java="$JAVA_HOME/bin/java"; fi
    if ! command -v "$java" >/dev/null 2>&1; then
        echo "dev.sh: Java 17 is needed by PySpark and was not found. Install it (Debian/Ubuntu:" \
            "'apt-get install openjdk-17-jre-headless'; macOS: 'brew install openjdk@17') or set JAVA_HOME." >&2
        return 1
    fi
    local version
    version=$("$java" -version 2>&1 | sed -n 's/.*version "\([0-9]*\).*/\1/p' | head -n 1)
    if [ -z "$version" ] || [ "$version" -lt 17 ]; then
        echo "dev.sh: Java ${version:-?} found, PySpark 4 needs Java 17 or 21. Install openjdk-17 or set JAVA_HOME." >&2
        return 1
    fi
}

setup() {
    local python
    python=$(find_python)
    check_java
    if [ ! -x .tools/bin/uv ] || ! .tools/bin/uv --version | grep -q "$UV_VERSION"; then
        echo "dev.sh: bootstrapping uv $UV_VERSION into .tools/" >&2
        "$python" -m venv .tools
        .tools/bin/python -m pip install --quiet "uv==$UV_VERSION"
    fi
    # Bytecode is compiled once at install: machines that set PYTHONDONTWRITEBYTECODE would otherwise
    # compile Airflow, Spark and Great Expectations from source in every new process.
    .tools/bin/uv sync --frozen --all-extras --compile-bytecode --python "$python" --quiet
}

cmd=${1:-help}
[ $# -gt 0 ] && shift
case "$cmd" in
    setup)
        setup
        ;;
    demo)
        setup
        rm -rf data/demo
        .venv/bin/replay generate data/demo/archive --origins 4 --tuples 200000 --buffer-tuples 500 \
            --keys 50 --files 4 --gaps 1 --duplicates 3 --late-fraction 0.01 --multi-chunk-fraction 0.2 "$@"
        # The main job is the replay_backfill DAG, run by Airflow without a server: a throwaway
        # AIRFLOW_HOME with a SQLite metadata database, local Spark inside the task, and the
        # [replay] roots at data/demo (the params' paths are relative to them).
        demo_root="$PWD/data/demo"
        export AIRFLOW_HOME="$demo_root/airflow" AIRFLOW__CORE__LOAD_EXAMPLES=False \
            AIRFLOW__CORE__DAGS_FOLDER="$PWD/dags" AIRFLOW__CORE__PLUGINS_FOLDER="$PWD/plugins" \
            AIRFLOW__REPLAY__ROOT="$demo_root"
        mkdir -p "$AIRFLOW_HOME"
        echo "dev.sh: creating the Airflow metadata database in data/demo/airflow" >&2
        .venv/bin/airflow db migrate >"$AIRFLOW_HOME/migrate.log" 2>&1 ||
            { tail -n 40 "$AIRFLOW_HOME/migrate.log" >&2; exit 1; }
        echo "dev.sh: airflow dags test replay_backfill (plan, replay, validate, publish, report; log in data/demo/airflow/dags-test.log)" >&2
        .venv/bin/airflow dags test replay_backfill \
            --conf '{"archive": "archive", "output": "out", "checkpoint": "ckpt", "micro_batch": {"max_buffers": 2000}}' \
            >"$AIRFLOW_HOME/dags-test.log" 2>&1 || { grep -E "ERROR|Error|error" "$AIRFLOW_HOME/dags-test.log" | tail -n 20 >&2; exit 1; }
        grep -E "replay_airflow.operators" "$AIRFLOW_HOME/dags-test.log" | sed -e 's/^[^ ]* *\[info *\] //' -e 's/ \[airflow.task.*$//' >&2 || true
        .venv/bin/replay status --checkpoint data/demo/ckpt
        .venv/bin/replay digest data/demo/out
        echo "dev.sh: archive in data/demo/archive; outputs in data/demo/out (published: 'replay show data/demo/out --table windows'); checkpoint in data/demo/ckpt; report in data/demo/out/_report/index.html; Data Docs in data/demo/out/_validation/gx/uncommitted/data_docs/local_site/index.html; Airflow home (SQLite database, task logs) in data/demo/airflow." >&2
        ;;
    test)
        setup
        .venv/bin/python -m pytest "$@"
        ;;
    bench)
        setup
        .venv/bin/python benchmarks/run.py "$@"
        ;;
    cluster)
        # A Spark standalone cluster without Docker: the master and one worker from the pyspark
        # distribution, what docker/compose.yaml's spark service runs. Jobs reach
        # it with 'replay run --spark-master spark://127.0.0.1:7077' (or spark.master in the job file).
        # Spark's own variables set ports and sizes: SPARK_MASTER_HOST, SPARK_MASTER_PORT,
        # SPARK_MASTER_WEBUI_PORT, SPARK_WORKER_WEBUI_PORT, SPARK_WORKER_CORES, SPARK_WORKER_MEMORY,
        # SPARK_WORKER_DIR (default data/spark-cluster/work). The master's state is at its web UI's /json/.
        setup
        spark_home=$(.venv/bin/python -c 'import os, pyspark; print(os.path.dirname(pyspark.__file__))')
        host=${SPARK_MASTER_HOST:-127.0.0.1}
        port=${SPARK_MASTER_PORT:-7077}
        ui=${SPARK_MASTER_WEBUI_PORT:-8080}
        export SPARK_WORKER_DIR=${SPARK_WORKER_DIR:-$PWD/data/spark-cluster/work}
        mkdir -p "$SPARK_WORKER_DIR"
        pids=()
        stop() { [ ${#pids[@]} -eq 0 ] || { kill "${pids[@]}" 2>/dev/null || true; wait "${pids[@]}" 2>/dev/null || true; }; }
        trap stop EXIT
        trap 'exit 130' INT
        trap 'exit 143' TERM
        "$spark_home/bin/spark-class" org.apache.spark.deploy.master.Master \
            --host "$host" --port "$port" --webui-port "$ui" &
        pids+=($!)
        "$spark_home/bin/spark-class" org.apache.spark.deploy.worker.Worker "spark://$host:$port" \
            --host "$host" --webui-port "${SPARK_WORKER_WEBUI_PORT:-8081}" --work-dir "$SPARK_WORKER_DIR" &
        pids+=($!)
        echo "dev.sh: Spark master spark://$host:$port (web UI http://$host:$ui) with one worker; Ctrl-C stops both" >&2
        # Whichever stops first, the other is stopped with it.
        wait -n
        ;;
    *)
        sed -n '2,10p' "$0" | sed 's/^# \{0,1\}//'
        [ "$cmd" = help ] || exit 2
        ;;
esac
