#!/bin/bash
# Print the prefix of a CPython 3.6 for the guest: XCP-ng 8.3's dom0 runs
# the plugins with Python 3.6, so the real-ZFS tests run them with one.
#
# ZFSNG_PY36 if set, else pyenv's newest 3.6.x. A machine without one gets
# 3.6.15 installed by pyenv (it must be there: the project does not build
# interpreters itself). Fails with a clear message otherwise.
set -euo pipefail
if [ -n "${ZFSNG_PY36:-}" ]; then
    prefix=$ZFSNG_PY36
else
    root=$(pyenv root 2>/dev/null || echo "${PYENV_ROOT:-$HOME/.pyenv}")
    prefix=$(ls -d "$root"/versions/3.6.* 2>/dev/null | sort -V | tail -n1 || true)
    if [ -z "$prefix" ] && command -v pyenv >/dev/null; then
        echo "python36.sh: installing CPython 3.6.15 with pyenv" >&2
        pyenv install -s 3.6.15 >&2
        prefix=$root/versions/3.6.15
    fi
fi
[ -n "$prefix" ] && [ -x "$prefix/bin/python3.6" ] || {
    echo "python36.sh: no CPython 3.6 found (set ZFSNG_PY36 to its prefix)" >&2
    exit 1
}
echo "$prefix"
