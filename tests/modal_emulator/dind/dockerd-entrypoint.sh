#!/bin/sh
# dockerd inside an emulated Modal sandbox. The inner containers' cgroups go under this
# container's own (the host's cgroup tree is mounted read-write by the emulator: this engine runs
# no privileged containers), and they resolve names with the host's resolvers
# (VERO_MODAL_EMULATOR_DNS: this container's own resolver is Docker's 127.0.0.11, which inner
# bridge networks cannot use). /etc/docker/daemon.json (Harbor's gVisor overlay writes one) is
# read by dockerd as usual.
set -eu
parent="$(sed -n 's/^[0-9]*:cpuset:\(.*\)$/\1/p' /proc/self/cgroup | head -n 1)"
set -- --host=unix:///var/run/docker.sock
if [ -n "$parent" ] && [ "$parent" != "/" ]; then
  set -- "$@" --cgroup-parent="$parent/inner"
fi
for server in ${VERO_MODAL_EMULATOR_DNS:-}; do
  set -- "$@" --dns="$server"
done
exec dockerd "$@"
