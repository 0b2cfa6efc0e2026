#!/usr/bin/env bash
# Source on the GPU machine (no package index there): installs the carried wheels (.whl/, made with
# `../shared/tools/offline-wheels.sh .whl pytest-xdist==3.8.0 execnet==2.1.1`; xdist for the gpu-tests stage)
# into /tmp/site and puts them and this checkout on PYTHONPATH.
# Once per machine: a second stage in the same call (or a later call on the warm machine) skips the install.
if [ ! -f /tmp/site/.jaxrose-wheels ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    || return 1
  touch /tmp/site/.jaxrose-wheels
fi
export PYTHONPATH=/tmp/site:$PWD${PYTHONPATH:+:$PYTHONPATH}
export PYTHONUNBUFFERED=1
jaxrose() { python3 -m jaxrose.cli "$@"; }
