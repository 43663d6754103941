#!/usr/bin/env bash
# The README's two commands, and a few more.
#   ./dev.sh demo            set up .venv, generate a sample archive and run the main job on it
#   ./dev.sh test [ARGS]     set up .venv and run the test suite (pytest ARGS)
#   ./dev.sh setup           only set up .venv from the lock file
#   ./dev.sh bench [ARGS]    run the benchmarks (benchmarks/)
# Needs Python 3.11 and Java 17 on the machine; everything else is installed into .venv
# from uv.lock (uv itself is bootstrapped into .tools/).
set -euo pipefail
cd "$(dirname "$0")"

UV_VERSION=0.13.8

find_python() {
    for candidate in "${PYTHON:-}" python3.11 python3 python; do
        [ -n "$candidate" ] || continue
        if command -v "$candidate" >/dev/null 2>&1 &&
            "$candidate" -c 'import sys; sys.exit(0 if sys.version_info[:2] == (3, 11) else 1)' 2>/dev/null; then
            command -v "$candidate"
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
    .tools/bin/uv sync --frozen --all-extras --python "$python" --quiet
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
        .venv/bin/replay run --config examples/demo.yaml
        .venv/bin/replay validate data/demo/out
        .venv/bin/replay publish data/demo/out
        .venv/bin/replay report --output data/demo/out --checkpoint data/demo/ckpt --to data/demo/report
        .venv/bin/replay digest data/demo/out
        echo "dev.sh: archive in data/demo/archive, outputs in data/demo/out (see 'replay show data/demo/out --table windows'), checkpoint in data/demo/ckpt ('replay status --checkpoint data/demo/ckpt'), report in data/demo/report/index.html, Data Docs in data/demo/out/_validation/gx/uncommitted/data_docs/local_site/index.html." >&2
        ;;
    test)
        setup
        .venv/bin/python -m pytest "$@"
        ;;
    bench)
        setup
        .venv/bin/python benchmarks/run.py "$@"
        ;;
    *)
        sed -n '2,8p' "$0" | sed 's/^# \{0,1\}//'
        [ "$cmd" = help ] || exit 2
        ;;
esac
