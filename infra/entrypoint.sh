#!/bin/sh
# Runs fovea with the container's arguments. ECS hands secrets over as
# environment variables; fovea serve reads its TLS identity from files, so
# FOVEA_TLS_CERT_PEM / FOVEA_TLS_KEY_PEM (when set) are written to a private
# directory first and passed as --tls-cert / --tls-key, and FOVEA_SCHEMA_DDL
# (when set) as --schema-file.
set -eu
dir=$(mktemp -d)
umask 077
if [ -n "${FOVEA_SCHEMA_DDL:-}" ]; then
  printf '%s\n' "$FOVEA_SCHEMA_DDL" > "$dir/schema.sql"
  unset FOVEA_SCHEMA_DDL
  set -- "$@" --schema-file "$dir/schema.sql"
fi
if [ -n "${FOVEA_TLS_CERT_PEM:-}" ] && [ -n "${FOVEA_TLS_KEY_PEM:-}" ]; then
  printf '%s\n' "$FOVEA_TLS_CERT_PEM" > "$dir/cert.pem"
  printf '%s\n' "$FOVEA_TLS_KEY_PEM" > "$dir/key.pem"
  unset FOVEA_TLS_CERT_PEM FOVEA_TLS_KEY_PEM
  # exec: fovea gets SIGTERM from ECS directly (final checkpoint, lease released).
  exec fovea "$@" --tls-cert "$dir/cert.pem" --tls-key "$dir/key.pem"
fi
exec fovea "$@"
