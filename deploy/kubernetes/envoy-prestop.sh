#!/bin/bash
# Envoy's preStop hook (deployment.yaml). Envoy exits at once on SIGTERM and cuts every stream
# it carries, so the kubelet sends SIGTERM only once this returns:
# 1. Envoy's listeners drain gracefully: for `--drain-time-s` each response says `connection:
#    close` (HTTP/2: GOAWAY), so a client's pooled connections are replaced by new ones, which
#    the Service sends to the other pods; then the listeners close.
# 2. It waits until no request is active on the listener (streams and requests still queued at
#    the control plane), for at most MAX_WAIT seconds: keep it below the pod's
#    terminationGracePeriodSeconds, and above the longest answer you stream.
# bash's /dev/tcp, as the Envoy image has no curl. docs/deployment.md, "Shutdown".
admin_host=${ENVOY_ADMIN_HOST:-127.0.0.1}
admin_port=${ENVOY_ADMIN_PORT:-9901}
max_wait=${MAX_WAIT:-290}
active_stat=${ACTIVE_STAT:-http.llm_ingress.downstream_rq_active}

admin() {  # METHOD PATH: the body of the admin API's answer (nothing when it is unreachable)
  exec 3<>"/dev/tcp/$admin_host/$admin_port" || return 1
  printf '%s %s HTTP/1.1\r\nhost: envoy\r\nconnection: close\r\n\r\n' "$1" "$2" >&3
  cat <&3
  exec 3<&-
}

admin POST '/drain_listeners?graceful&inboundonly' > /dev/null
deadline=$((SECONDS + max_wait))
while ((SECONDS < deadline)); do
  active=$(admin GET "/stats?filter=^${active_stat}\$" | sed -n 's/^.*: \([0-9][0-9]*\)\r*$/\1/p')
  [[ -z $active || $active == 0 ]] && exit 0  # nothing open, or Envoy gone
  sleep 1
done
