#!/usr/bin/env bash
# A container image of gemrecon (docs/deploying.md): FROM scratch, the static
# linux binary alone at /gemrecon, run as uid 65532, with an empty /tmp. It is
# written as an OCI image layout, built without a daemon by umoci (Debian:
# apt-get install umoci), and tagged with the binary's version:
#
#   scripts/release.sh linux/amd64
#   scripts/image.sh dist/gemrecon_0.1.0_linux_amd64      # → dist/oci, tag 0.1.0
#   skopeo copy oci:dist/oci:0.1.0 docker://registry.example/gemrecon:0.1.0
#
# With --check it then runs the image as a container with runc (Debian:
# apt-get install runc): `gemrecon version` and `gemrecon init` on a
# database in its /tmp must succeed (CI does this).
set -euo pipefail
check=0
if [ "${1:-}" = "--check" ]; then check=1; shift; fi
bin=${1:?usage: scripts/image.sh [--check] dist/gemrecon_VERSION_linux_ARCH}
name=$(basename "$bin")                 # gemrecon_0.1.0_linux_amd64
version=${name#gemrecon_}; version=${version%_linux_*}
arch=${name##*_}
layout=$(dirname "$bin")/oci
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

rm -rf "$layout"
umoci init --layout "$layout"
umoci new --image "$layout:$version"
umoci unpack --image "$layout:$version" "$work/bundle" >/dev/null
install -m 0755 "$bin" "$work/bundle/rootfs/gemrecon"
install -d -m 1777 "$work/bundle/rootfs/tmp"
umoci repack --image "$layout:$version" "$work/bundle"
umoci config --image "$layout:$version" --architecture "$arch" --os linux \
  --config.entrypoint /gemrecon --config.user 65532:65532 --config.workingdir /tmp \
  --config.env GEMRECON_DB=/tmp/gemrecon.db
umoci gc --layout "$layout"
echo "== $layout:$version"

if [ $check -eq 1 ]; then
  rm -rf "$work/run"
  umoci unpack --image "$layout:$version" "$work/run" >/dev/null
  run() { # run ARGS...: the image's entrypoint with ARGS, as a container
    python3 - "$work/run/config.json" "$@" <<'PY'
import json, sys
path, args = sys.argv[1], sys.argv[2:]
c = json.load(open(path))
c["process"]["args"] = c["process"]["args"][:1] + args
c["process"]["terminal"] = False
json.dump(c, open(path, "w"))
PY
    runc run --bundle "$work/run" "gemrecon-image-check-$$"
  }
  run version | tee "$work/out"
  grep -q "^gemrecon $version " "$work/out"
  run init
  echo "== the image runs"
fi
