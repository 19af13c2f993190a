#!/usr/bin/env bash
# A local 3-primary Redis Cluster for the test suite (the `redis-cluster` case of the
# contract tests): 127.0.0.1 ports 7000-7002, no replicas, no persistence.
#
#   scripts/redis-cluster.sh start    start the nodes and create the cluster (idempotent)
#   scripts/redis-cluster.sh stop     shut the nodes down and remove their work dir
#   scripts/redis-cluster.sh status   print cluster_state (exit 1 when not ok)
#
# Work dir (configs, node files, logs): ${TMPDIR:-/tmp}/fencing-redis-cluster.
# Needs redis-server and redis-cli 7.0 or newer on PATH.
set -euo pipefail

HOST=127.0.0.1
PORTS=(7000 7001 7002)
DIR="${TMPDIR:-/tmp}/fencing-redis-cluster"

cli() { # port args...
  local port=$1
  shift
  redis-cli -h "$HOST" -p "$port" "$@"
}

alive() { # port
  [ "$(cli "$1" ping 2>/dev/null)" = "PONG" ]
}

state() { # port -> cluster_state value (empty when the node does not answer)
  cli "$1" cluster info 2>/dev/null | tr -d '\r' | sed -n 's/^cluster_state://p'
}

known_nodes() { # port -> how many nodes this node knows
  cli "$1" cluster info 2>/dev/null | tr -d '\r' | sed -n 's/^cluster_known_nodes://p'
}

healthy() {
  local port
  for port in "${PORTS[@]}"; do
    [ "$(state "$port")" = "ok" ] || return 1
    [ "$(known_nodes "$port")" = "${#PORTS[@]}" ] || return 1
  done
}

start_node() { # port
  local port=$1 work="$DIR/$1"
  alive "$port" && return 0
  mkdir -p "$work"
  redis-server --bind "$HOST" --port "$port" --daemonize yes \
    --cluster-enabled yes --cluster-config-file "nodes-$port.conf" \
    --cluster-node-timeout 5000 --save '' --appendonly no \
    --dir "$work" --logfile "$work/redis.log" --pidfile "$work/redis.pid"
  for _ in $(seq 1 50); do
    alive "$port" && return 0
    sleep 0.1
  done
  echo "redis-cluster: node $port did not start (see $work/redis.log)" >&2
  return 1
}

start() {
  if healthy; then
    echo "redis-cluster: already up on $HOST:${PORTS[0]}-${PORTS[-1]}"
    return 0
  fi
  local port
  for port in "${PORTS[@]}"; do
    start_node "$port"
  done
  # create the cluster unless its slots are already assigned (a node that knows the
  # others and holds slots was created before: it only needs time to converge)
  local assigned
  assigned=$(cli "${PORTS[0]}" cluster info | tr -d '\r' | sed -n 's/^cluster_slots_assigned://p')
  if [ "$assigned" != "16384" ]; then
    local addresses=()
    for port in "${PORTS[@]}"; do
      if [ "$(cli "$port" dbsize)" != "0" ] || [ "$(known_nodes "$port")" != "1" ]; then
        echo "redis-cluster: node $port is not empty or already in a cluster;" \
          "run '$0 stop' and start again" >&2
        return 1
      fi
      addresses+=("$HOST:$port")
    done
    redis-cli --cluster create "${addresses[@]}" --cluster-replicas 0 --cluster-yes >"$DIR/create.log"
  fi
  for _ in $(seq 1 100); do
    if healthy; then
      echo "redis-cluster: up on $HOST:${PORTS[0]}-${PORTS[-1]}"
      return 0
    fi
    sleep 0.2
  done
  echo "redis-cluster: the cluster did not reach cluster_state:ok (see $DIR)" >&2
  return 1
}

stop() {
  local port
  for port in "${PORTS[@]}"; do
    if alive "$port"; then
      cli "$port" shutdown nosave >/dev/null 2>&1 || true
    fi
  done
  for port in "${PORTS[@]}"; do
    for _ in $(seq 1 50); do
      alive "$port" || break
      sleep 0.1
    done
  done
  rm -rf "$DIR"
  echo "redis-cluster: stopped"
}

status() {
  local port ok=0
  for port in "${PORTS[@]}"; do
    echo "$HOST:$port cluster_state:$(state "$port" || true)"
  done
  healthy || ok=1
  return "$ok"
}

case "${1:-}" in
start) start ;;
stop) stop ;;
status) status ;;
*)
  echo "usage: $0 start|stop|status" >&2
  exit 2
  ;;
esac
