#!/usr/bin/env bash
# Release builds (docs/development.md): static binaries (CGO_ENABLED=0) for
# linux and darwin on amd64 and arm64 with the version stamped in, man pages
# generated from the command tree, and SHA256SUMS, all in dist/.
#
#   scripts/release.sh                          # every target
#   scripts/release.sh linux/amd64 darwin/arm64 # only these
#
# The version comes from one place: the git tag at HEAD when there is one
# (a leading "v" dropped), else the VERSION file. `gemrecon version` prints it.
# RELEASE_TEST_FLAGS is passed to the `go test` that writes the man pages
# (CI gives -race, to reuse the test binary it has just built).
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="$PATH:/usr/local/go/bin"

version=$(git describe --tags --exact-match 2>/dev/null || cat VERSION)
version=${version#v}
version=$(echo "$version" | tr -d '[:space:]')
if [ -z "$version" ]; then echo "release: no version (tag HEAD, or write it in VERSION)" >&2; exit 1; fi
out=$(realpath -m "${DIST:-dist}")
targets=("$@")
if [ ${#targets[@]} -eq 0 ]; then targets=(linux/amd64 linux/arm64 darwin/amd64 darwin/arm64); fi

rm -rf "$out"
mkdir -p "$out"
for t in "${targets[@]}"; do
  os=${t%/*} arch=${t#*/}
  bin="$out/gemrecon_${version}_${os}_${arch}"
  echo "== $bin"
  CGO_ENABLED=0 GOOS=$os GOARCH=$arch go build -trimpath -ldflags "-s -w -X main.version=$version" -o "$bin" ./cmd/gemrecon
done

echo "== man pages"
# shellcheck disable=SC2086
GEMRECON_MAN_DIR="$out/man" go test ${RELEASE_TEST_FLAGS:-} -count=1 -run '^TestManPages$' ./cmd/gemrecon >/dev/null
tar -czf "$out/gemrecon_${version}_man.tar.gz" -C "$out" man
rm -rf "$out/man"

(cd "$out" && sha256sum gemrecon_* > SHA256SUMS)
echo "== $out (version $version)"
ls -l "$out"
