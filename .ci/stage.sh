#!/usr/bin/env bash
# .ci/stage.sh NAME COMMAND...: run one stage of `make test` and print its wall time,
# also when it fails (the exit status passes through), so every CI log shows where
# the time went and a slow stage shows up where it happens.
name=$1
shift
start=$(date +%s)
"$@"
status=$?
echo "make test: stage $name took $(($(date +%s) - start)) s (exit $status)"
exit $status
