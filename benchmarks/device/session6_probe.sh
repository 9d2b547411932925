#!/usr/bin/env bash
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD JAX_PLATFORMS=cuda,cpu HLOTK_CACHE_DIR=/tmp/hlotk_cache
timeout 40 python3 -m compileall -q -j 0 hlo passes codegen runtime benchmarks > /dev/null 2>&1
timeout 100 python3 benchmarks/device/session6_probe.py transformer 2>&1 | grep -v arn | tail -34
timeout 150 python3 benchmarks/device/session6_probe.py lstm 2>&1 | grep -v arn | tail -34
