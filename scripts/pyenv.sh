#!/usr/bin/env bash
# A Python venv with the official `openai` client from PyPI for tests/serve_client.py:
# scripts/pyenv.sh DIR makes DIR (once) and prints its python; prints nothing (exit 1) when it
# cannot (no venv module, no network): the test then uses python3 and plain HTTP.
set -u
dir=${1:?usage: scripts/pyenv.sh DIR}
if [ -x "$dir/bin/python" ] && "$dir/bin/python" -c 'import openai' 2>/dev/null; then
    echo "$dir/bin/python"
    exit 0
fi
rm -rf "$dir.tmp"
python3 -m venv "$dir.tmp" >/dev/null 2>&1 || exit 1
timeout 180 "$dir.tmp/bin/pip" install -q --disable-pip-version-check openai >/dev/null 2>&1 || { rm -rf "$dir.tmp"; exit 1; }
rm -rf "$dir" && mv "$dir.tmp" "$dir" || exit 1
echo "$dir/bin/python"
