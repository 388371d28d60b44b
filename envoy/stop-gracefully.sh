#!/bin/bash
# Envoy under compose (compose.yaml), which has no preStop hook. Envoy exits at once on SIGTERM
# and cuts every stream it carries, so this runs it as a child and, on `docker compose stop`,
# `down` or `restart` (SIGTERM), first runs the Kubernetes pod's preStop hook
# (envoy-prestop.sh: drain the listeners, wait until no request is active or MAX_WAIT), and
# only then passes SIGTERM on. It exits with Envoy's status.
# Usage: stop-gracefully.sh envoy ARGS...   (PRESTOP: the hook, by default beside this file)
prestop=${PRESTOP:-$(dirname "$0")/envoy-prestop.sh}

"$@" &
child=$!
stopping=

on_stop() {
  [[ -n $stopping ]] && return
  stopping=1
  bash "$prestop"
  kill -TERM "$child" 2> /dev/null
}
trap on_stop TERM INT

while kill -0 "$child" 2> /dev/null; do
  wait "$child"  # returns early when a signal is trapped, and on_stop runs
done
wait "$child"  # Envoy's status, which bash keeps for a child it has reaped
