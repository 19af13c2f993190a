#!/usr/bin/env bash
# `fencing bench` with the client and this machine's own database servers on separate
# CPUs, as they are when the database runs on its own machine:
#
#   scripts/bench-pinned.sh --store postgresql://... --store redis://... [bench options]
#
# The client runs on CPU 0; every local PostgreSQL, MariaDB/MySQL and Redis server
# process (and each thread and backend it starts later) on CPUs 1 and up, until the
# bench ends; then the servers may use every CPU again. Why: on a small machine the
# scheduler sometimes wakes a server backend on the client's own CPU, where it preempts
# the client once per round trip and doubles the client's CPU time for that stretch (the
# README's Benchmarks section shows it measured, and that why it hits one side of a
# contest and not the other is not known). Needs taskset (util-linux) and at least 2 CPUs; servers on other machines are
# not touched (there is nothing to pin).
set -euo pipefail
cd "$(dirname "$0")/.."

cpus=$(nproc)
if [ "$cpus" -lt 2 ]; then
  echo "bench-pinned: needs at least 2 CPUs, this machine has $cpus" >&2
  exit 2
fi
servers=$(pgrep -x -d ' ' 'postgres|mariadbd|mysqld|redis-server' || true)

pin() { # cpu-list: every thread of every server process (PostgreSQL's backends are
  # processes named postgres; the ones forked later inherit the postmaster's CPUs)
  local pid
  for pid in $servers; do
    taskset -a -p -c "$1" "$pid" >/dev/null 2>&1 || true
  done
}

trap 'pin "0-$((cpus - 1))"' EXIT
pin "1-$((cpus - 1))"
taskset -c 0 "${VENV:-.venv}/bin/fencing" bench "$@"
