#!/usr/bin/env bash
# Installs the pinned @openai/codex npm package into a project-local prefix (never globally),
# for the codex backend's integration tests and for `[agent] codex = "..."`.
#
#   tests/codex/install.sh            # -> ${CARGO_TARGET_DIR:-target}/codex/node_modules/.bin/codex
#   FK_AGENTD_CODEX_PREFIX=DIR tests/codex/install.sh
#
# The pin lives in one place, the Rust constant that `fk-agentd doctor` checks.
set -euo pipefail
cd "$(dirname "$0")/../.."

pin=$(sed -n 's/^pub const CODEX_VERSION: &str = "\(.*\)";$/\1/p' src/agent/codex/mod.rs)
if [ -z "$pin" ]; then
    echo "install.sh: cannot read CODEX_VERSION from src/agent/codex/mod.rs" >&2
    exit 2
fi
prefix=${FK_AGENTD_CODEX_PREFIX:-${CARGO_TARGET_DIR:-target}/codex}
bin="$prefix/node_modules/.bin/codex"
if [ -x "$bin" ] && [ "$("$bin" --version 2>/dev/null | awk '{print $NF}')" = "$pin" ]; then
    echo "codex $pin already installed at $bin"
    exit 0
fi
if ! command -v npm >/dev/null 2>&1; then
    echo "install.sh: npm is missing (install Node.js 18+ first)" >&2
    exit 3
fi
mkdir -p "$prefix"
npm install --prefix "$prefix" --no-audit --no-fund --loglevel=error "@openai/codex@$pin"
echo "codex $("$bin" --version) installed at $bin"
