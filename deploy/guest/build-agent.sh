#!/usr/bin/env bash
# Builds the guest agent as one static program (glibc, statically linked: the guest image has
# no libraries) and prints where it is. `coderoom image build --agent PATH` puts it in the image.
#
#   usage: deploy/guest/build-agent.sh [debug|release]     (default release)
set -euo pipefail
cd "$(dirname "$0")/../.."
PROFILE=${1:-release}
FLAGS=()
[ "$PROFILE" = release ] && FLAGS+=(--release)
# --target keeps these flags off build scripts and proc macros (they run on the host).
RUSTFLAGS="-C target-feature=+crt-static -C strip=symbols" \
  cargo build --locked "${FLAGS[@]}" -q -p coderoom-sandbox --bin coderoom-agent \
  --target x86_64-unknown-linux-gnu >&2
echo "$PWD/target/x86_64-unknown-linux-gnu/$PROFILE/coderoom-agent"
