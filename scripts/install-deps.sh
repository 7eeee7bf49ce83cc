#!/usr/bin/env bash
# Debian 12 packages mm3 builds and tests with (see docs/building.md).
set -euo pipefail
SUDO=""
[ "$(id -u)" = 0 ] || SUDO=sudo
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends \
  build-essential cmake ninja-build pkg-config clang \
  libyaml-dev libjansson-dev libpcre2-dev libutf8proc-dev libzstd-dev libb2-dev \
  libcmocka-dev libmicrohttpd-dev liburing-dev libflac-dev libmp3lame-dev libopusenc-dev \
  curl sox libsndfile1-dev procps libclang-rt-dev nginx >/dev/null
# nginx: test_e2e_router runs the binary itself as the test's user, in its own folder (the
# `nginx` package is the smallest with the upstream, least_conn and proxy modules on
# bookworm and trixie). Where systemd runs, the package also enables and starts its
# own service on port 80; the tests do not use it (`systemctl disable --now nginx`).
