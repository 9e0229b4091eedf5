#!/usr/bin/env bash
# Installs the pinned @agentuity/core client for the compatibility test (Node >= 20).
set -euo pipefail
cd "$(dirname "$0")"
npm ci --no-audit --no-fund
