#!/usr/bin/env bash
# The README's two commands, and a few more.
#   ./dev.sh demo            set up .venv, generate a sample archive and run the main job on it (the
#                            replay_backfill DAG under 'airflow dags test')
#   ./dev.sh test [ARGS]     set up .venv and run the test suite (pytest ARGS)
#   ./dev.sh setup           only set up .venv from the lock file
#   ./dev.sh bench [ARGS]    run the benchmarks (benchmarks/)
#   ./dev.sh cluster         run a Spark standalone master and one worker on 127.0.0.1 (Ctrl-C stops both)
#   ./dev.sh airflow         run Airflow as teams do, on 127.0.0.1: a throwaway Postgres metadata database,
#                            the api-server (UI and the "Replays" page, behind Airflow's login), scheduler
#                            (LocalExecutor), dag-processor and triggerer on dags/ and plugins/, and the kept
#                            driver of the DAGs' engine kept_driver (Ctrl-C stops all)
# Needs Python 3.11 and Java 17 on the machine (and Postgres's server for 'airflow': Debian's
# 'postgresql' package); everything else is installed into .venv from uv.lock (uv itself is
# bootstrapped into .tools/).
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
    # Spark's JVM starts from a class-data archive of the classes it loads (seconds less per command
    # and per test that starts one): made once per Java runtime, in .venv (REPLAY_JVM_ARCHIVE names
    # another file, or 'off'). Without it runs work, their JVM starts slower.
    if [ "${REPLAY_JVM_ARCHIVE:-}" != "off" ]; then
        .venv/bin/replay jvm-archive --if-missing >/dev/null ||
            echo "dev.sh: no JVM class-data archive was made; Spark's JVM starts without one" >&2
    fi
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
        # distribution, what docker/compose.yaml's spark-master and spark-worker services run. Jobs reach
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
    airflow)
        # Airflow as teams run it, without Docker. Postgres (Debian's 'postgresql' package: initdb and
        # pg_ctl from /usr/lib/postgresql/*/bin, or PG_BIN) runs a throwaway cluster in a temporary
        # directory on a free port of 127.0.0.1, as the 'postgres' system user (or 'nobody') when run
        # as root; 'airflow db migrate' creates the metadata database in it. Then the api-server, the
        # scheduler (LocalExecutor), the dag-processor and the triggerer run with dags/ and plugins/,
        # sharing one JWT secret, and a kept driver ('replay driver serve', home <dir>/driver, which the
        # services' REPLAY_DRIVER names) for the DAGs' engine kept_driver. Airflow's SimpleAuthManager has
        # one user, admin, with a password made up at start (printed). Settings: REPLAY_DRIVER_MASTER (the
        # kept driver's Spark master, default local[*]), AIRFLOW__API__PORT (default 8088), AIRFLOW__REPLAY__ROOT
        # (default data/), AIRFLOW_STACK_DIR (AIRFLOW_HOME, logs, env.sh; default a temporary
        # directory, removed at the end), AIRFLOW__WORKERS__EXECUTION_API_TIMEOUT (default 30 s,
        # not Airflow's 5: the api-server shares this machine's cores with Spark). 'source
        # <dir>/env.sh' points the airflow CLI at the stack.
        # Ctrl-C or SIGTERM stops every service, then Postgres. If one fails to start, the script
        # names it, prints the end of its log and stops the others.
        setup
        pg_bin=${PG_BIN:-}
        if [ -z "$pg_bin" ]; then
            pg_bin=$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n 1 || true)
        fi
        if [ -z "$pg_bin" ] && command -v initdb >/dev/null 2>&1; then pg_bin=$(dirname "$(command -v initdb)"); fi
        if [ -z "$pg_bin" ] || [ ! -x "$pg_bin/initdb" ] || [ ! -x "$pg_bin/pg_ctl" ]; then
            echo "dev.sh: Postgres's server (initdb, pg_ctl) is needed and was not found. Install it" \
                "(Debian/Ubuntu: 'apt-get install postgresql'; macOS: 'brew install postgresql@16') or set PG_BIN." >&2
            exit 1
        fi
        py=.venv/bin/python
        port=${AIRFLOW__API__PORT:-8088}
        free_port() { "$py" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
        pg_port=$(free_port)
        if [ -n "${AIRFLOW_STACK_DIR:-}" ]; then
            mkdir -p "$AIRFLOW_STACK_DIR"
            stack_dir=$(cd "$AIRFLOW_STACK_DIR" && pwd)
            own_stack_dir=
        else
            stack_dir=$(mktemp -d "${TMPDIR:-/tmp}/replay-airflow.XXXXXX")
            own_stack_dir=1
        fi
        # Postgres's own directory, directly in the temporary directory: its user must reach it.
        pg_dir=$(mktemp -d "${TMPDIR:-/tmp}/replay-postgres.XXXXXX")
        if [ "$(id -u)" = 0 ]; then
            # Postgres refuses to run as root.
            pg_user=postgres
            id -u "$pg_user" >/dev/null 2>&1 || pg_user=nobody
            chown "$pg_user:" "$pg_dir"
            as_pg() { runuser -u "$pg_user" -- "$@"; }
        else
            as_pg() { "$@"; }
        fi
        # A random secret of ${1:-24} bytes; the API's JWT key takes 48 (64 characters, what HS512 asks for).
        secret() { "$py" -c "import secrets; print(secrets.token_urlsafe(${1:-24}))"; }
        pg_password=$(secret)
        admin_password=$(secret)
        names=()
        pids=()
        pg_started=
        stop() {
            trap "" INT TERM  # a second Ctrl-C must not cut the clean-up short
            if [ ${#pids[@]} -gt 0 ]; then
                kill "${pids[@]}" 2>/dev/null || true
                # Services get 30 s to stop their own workers; then whatever is left is killed.
                for _ in $(seq 60); do
                    alive=
                    for pid in "${pids[@]}"; do kill -0 "$pid" 2>/dev/null && alive=1; done
                    [ -n "$alive" ] || break
                    sleep 0.5
                done
                kill -9 "${pids[@]}" 2>/dev/null || true
                wait "${pids[@]}" 2>/dev/null || true
            fi
            if [ -n "$pg_started" ]; then
                as_pg "$pg_bin/pg_ctl" -D "$pg_dir/data" -m fast -w stop >/dev/null 2>&1 || true
            fi
            rm -rf "$pg_dir"
            [ -z "$own_stack_dir" ] || rm -rf "$stack_dir"
            echo "dev.sh: Airflow and Postgres stopped" >&2
        }
        trap stop EXIT
        trap 'exit 130' INT
        trap 'exit 143' TERM
        failed() {  # NAME LOG: say which part failed and show the end of its log
            echo "dev.sh: $1 failed to start; the end of its log ($2):" >&2
            tail -n 40 "$2" >&2 || true
            exit 1
        }

        echo "dev.sh: starting Postgres ($("$pg_bin/postgres" --version)) on 127.0.0.1:$pg_port" >&2
        printf '%s\n' "$pg_password" >"$pg_dir/password"
        [ "$(id -u)" != 0 ] || chown "$pg_user:" "$pg_dir/password"
        as_pg "$pg_bin/initdb" -D "$pg_dir/data" -U airflow --pwfile="$pg_dir/password" --auth=scram-sha-256 \
            -E UTF8 --locale=C >"$pg_dir/initdb.log" 2>&1 || failed "Postgres (initdb)" "$pg_dir/initdb.log"
        rm -f "$pg_dir/password"
        touch "$pg_dir/postgres.log"
        [ "$(id -u)" != 0 ] || chown "$pg_user:" "$pg_dir/postgres.log"
        pg_started=1
        as_pg "$pg_bin/pg_ctl" -D "$pg_dir/data" -l "$pg_dir/postgres.log" -w -t 60 \
            -o "-c listen_addresses=127.0.0.1 -c port=$pg_port -c unix_socket_directories='$pg_dir'" \
            start >/dev/null 2>&1 || failed Postgres "$pg_dir/postgres.log"
        PGPASSWORD=$pg_password "$pg_bin/createdb" -h 127.0.0.1 -p "$pg_port" -U airflow airflow \
            >"$pg_dir/createdb.log" 2>&1 || failed "Postgres (createdb)" "$pg_dir/createdb.log"

        home="$stack_dir/home"
        logs="$stack_dir/logs"
        mkdir -p "$home" "$logs"
        db="postgresql+psycopg://airflow:$pg_password@127.0.0.1:$pg_port/airflow"
        passwords="$stack_dir/passwords.json"
        printf '{"admin": "%s"}\n' "$admin_password" >"$passwords"
        chmod 600 "$passwords"
        export AIRFLOW_HOME="$home" \
            AIRFLOW__CORE__LOAD_EXAMPLES=False \
            AIRFLOW__CORE__DAGS_FOLDER="$PWD/dags" \
            AIRFLOW__CORE__PLUGINS_FOLDER="$PWD/plugins" \
            AIRFLOW__CORE__EXECUTOR=LocalExecutor \
            AIRFLOW__CORE__PARALLELISM="${AIRFLOW__CORE__PARALLELISM:-4}" \
            AIRFLOW__CORE__AUTH_MANAGER=airflow.api_fastapi.auth.managers.simple.simple_auth_manager.SimpleAuthManager \
            AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS=admin:admin \
            AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE="$passwords" \
            AIRFLOW__CORE__EXECUTION_API_SERVER_URL="http://127.0.0.1:$port/execution/" \
            AIRFLOW__DATABASE__SQL_ALCHEMY_CONN="$db" \
            AIRFLOW__DATABASE__SQL_ALCHEMY_CONN_ASYNC="$db" \
            AIRFLOW__API__HOST=127.0.0.1 \
            AIRFLOW__API__PORT="$port" \
            AIRFLOW__API__BASE_URL="http://127.0.0.1:$port" \
            AIRFLOW__API__WORKERS="${AIRFLOW__API__WORKERS:-1}" \
            AIRFLOW__WORKERS__EXECUTION_API_TIMEOUT="${AIRFLOW__WORKERS__EXECUTION_API_TIMEOUT:-30}" \
            AIRFLOW__API__SECRET_KEY="$(secret 48)" \
            AIRFLOW__API_AUTH__JWT_SECRET="$(secret 48)" \
            AIRFLOW__LOGGING__WORKER_LOG_SERVER_PORT="$(free_port)" \
            AIRFLOW__LOGGING__TRIGGER_LOG_SERVER_PORT="$(free_port)" \
            AIRFLOW__REPLAY__ROOT="${AIRFLOW__REPLAY__ROOT:-$PWD/data}" \
            AIRFLOW_CONN_SPARK_MASTER="${AIRFLOW_CONN_SPARK_MASTER:-spark://127.0.0.1:7077}" \
            PYTHONPATH="$PWD/plugins${PYTHONPATH:+:$PYTHONPATH}" \
            REPLAY_DRIVER="$stack_dir/driver" \
            REPLAY_LOG_DIR="$stack_dir/logs/replay"
        # For another shell's airflow CLI (airflow dags list, airflow backfill create ...) and replay CLI.
        (umask 077 && env | grep -E '^(AIRFLOW_HOME|AIRFLOW__[A-Z_]+|AIRFLOW_CONN_[A-Z_]+|PYTHONPATH|REPLAY_DRIVER)=' | sort |
            while IFS='=' read -r key value; do printf 'export %s=%q\n' "$key" "$value"; done >"$stack_dir/env.sh")

        echo "dev.sh: airflow db migrate (log in $logs/migrate.log)" >&2
        .venv/bin/airflow db migrate >"$logs/migrate.log" 2>&1 || failed "airflow db migrate" "$logs/migrate.log"

        for service in api-server scheduler dag-processor triggerer; do
            .venv/bin/airflow "$service" >"$logs/$service.log" 2>&1 &
            pids+=($!)
            names+=("$service")
        done
        # The kept driver: one warm Spark driver the tasks of engine kept_driver send their runs to.
        .venv/bin/replay driver serve --dir "$REPLAY_DRIVER" --master "${REPLAY_DRIVER_MASTER:-local[*]}" \
            >"$logs/replay-driver.log" 2>&1 &
        driver_pid=$!
        pids+=("$driver_pid")
        names+=(replay-driver)
        # Up when the api-server answers and reports a heartbeat from each of the other three, and its
        # execution API (the tasks' calls) has answered once: the api-server builds that API at its first
        # request, which took 5.5 to 7 s on 2 cores, 10 s under load, longer than Airflow's
        # default wait of a task for an answer. Paid here, no task's first call pays it.
        health="http://127.0.0.1:$port/api/v2/monitor/health"
        deadline=$((SECONDS + ${AIRFLOW_STACK_TIMEOUT:-180}))
        until "$py" - "$health" "http://127.0.0.1:$port/execution/health" <<'PYEOF' 2>/dev/null
import json, sys, urllib.request
state = json.load(urllib.request.urlopen(sys.argv[1], timeout=5))
parts = ("metadatabase", "scheduler", "triggerer", "dag_processor")
if not all(state[p]["status"] == "healthy" for p in parts):
    sys.exit(1)
sys.exit(0 if json.load(urllib.request.urlopen(sys.argv[2], timeout=120))["status"] == "healthy" else 1)
PYEOF
        do
            for i in "${!pids[@]}"; do
                kill -0 "${pids[$i]}" 2>/dev/null || failed "${names[$i]}" "$logs/${names[$i]}.log"
            done
            if [ "$SECONDS" -ge "$deadline" ]; then
                echo "dev.sh: Airflow not healthy after ${AIRFLOW_STACK_TIMEOUT:-180} s ($health):" >&2
                curl -s "$health" >&2 2>/dev/null || true
                for service in "${names[@]}"; do
                    echo "--- $service ($logs/$service.log)" >&2
                    tail -n 15 "$logs/$service.log" >&2
                done
                exit 1
            fi
            sleep 1
        done
        # Up when it answers on its home (it starts its JVM beside Airflow's services, and is up first as a rule).
        until .venv/bin/replay driver status --dir "$REPLAY_DRIVER" >/dev/null 2>&1; do
            kill -0 "$driver_pid" 2>/dev/null || failed replay-driver "$logs/replay-driver.log"
            [ "$SECONDS" -lt "$deadline" ] || failed "replay-driver (not answering)" "$logs/replay-driver.log"
            sleep 1
        done
        echo "dev.sh: Airflow is up: UI http://127.0.0.1:$port (the Replays page: http://127.0.0.1:$port/replay/)" >&2
        echo "dev.sh: user admin, password $admin_password; the kept driver's home: $REPLAY_DRIVER" >&2
        echo "dev.sh: metadata database $db; AIRFLOW_HOME and logs in $stack_dir; 'source $stack_dir/env.sh'" \
            "points the airflow CLI at this stack; Ctrl-C stops it" >&2
        # Whichever service stops first, the others (and Postgres) are stopped with it.
        set +e
        wait -n "${pids[@]}"
        code=$?
        set -e
        for i in "${!pids[@]}"; do
            if ! kill -0 "${pids[$i]}" 2>/dev/null; then
                echo "dev.sh: ${names[$i]} exited ($code); the end of its log:" >&2
                tail -n 40 "$logs/${names[$i]}.log" >&2 || true
            fi
        done
        exit 1
        ;;
    *)
        sed -n '2,16p' "$0" | sed 's/^# \{0,1\}//'
        [ "$cmd" = help ] || exit 2
        ;;
esac
