#!/bin/bash
# Envoy's preStop hook (deployment.yaml). Envoy exits at once on SIGTERM and cuts every stream
# it carries, so the kubelet sends SIGTERM only once this returns:
# 1. Envoy's listeners drain gracefully: for `--drain-time-s` (MIN_WAIT, 10 s) each response
#    says `connection: close` (HTTP/2: GOAWAY), so clients' pooled connections are replaced by
#    new ones, which the Service, as it drops the pod, sends to the other pods; then the
#    listeners close. This waits that long in any case.
# 2. Then it waits until no request is active on the listener (streams, and requests still
#    queued at the control plane), for at most MAX_WAIT seconds in all: keep it below the pod's
#    terminationGracePeriodSeconds, and above the longest answer you stream.
# bash's /dev/tcp, as the Envoy image has no curl; each call to the admin API gives up after
# 3 s. docs/deployment.md, "Shutdown".
admin_host=${ENVOY_ADMIN_HOST:-127.0.0.1}
admin_port=${ENVOY_ADMIN_PORT:-9901}
min_wait=${MIN_WAIT:-10}
max_wait=${MAX_WAIT:-290}
active_stat=${ACTIVE_STAT:-http.llm_ingress.downstream_rq_active}

admin() {  # METHOD PATH: the admin API's answer (nothing when it is unreachable or stalls)
  timeout 3 bash -c 'exec 3<>"/dev/tcp/$0/$1" || exit 1
    printf "%s %s HTTP/1.1\r\nhost: envoy\r\nconnection: close\r\n\r\n" "$2" "$3" >&3
    cat <&3' "$admin_host" "$admin_port" "$1" "$2"
}

start=$SECONDS
admin POST '/drain_listeners?graceful&inboundonly' > /dev/null
while ((SECONDS - start < max_wait)); do
  active=$(admin GET "/stats?filter=^${active_stat}\$" | sed -n 's/^.*: \([0-9][0-9]*\)\r*$/\1/p')
  if [[ -z $active ]] && ! admin GET /ready > /dev/null; then
    exit 0  # Envoy is gone
  fi
  if [[ $active == 0 ]] && ((SECONDS - start >= min_wait)); then
    exit 0
  fi
  sleep 1
done
