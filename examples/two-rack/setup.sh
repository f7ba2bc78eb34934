#!/bin/sh
# Makes what the two-rack example needs besides its configs, in this folder:
#   pki/    a development CA and one certificate per role (URI SAN = the role's base URI; D1)
#   keys/   the tenants' Scope Keys and the acme tenant's API key (readable by their owner only)
#   model/  the reference model (kvsp model init) and model.json, its Compatibility Descriptor
# and writes the Scope IDs into the configs and the policy.  Production brings its own CA and keys:
# see docs/deploy.md.  KVSP overrides the command (e.g. KVSP="python3 -m control.cli"); MODEL_JSON names
# an existing descriptor to use instead of making the model (model/ must then be provided separately).
set -eu
cd "$(dirname "$0")"
KVSP=${KVSP:-kvsp}
PYTHON=${PYTHON:-python3}
D=kvsp.example

$KVSP certs pki \
  --role pc=https://pc.$D:7400/pc/ --role fe=https://fe.$D:7500/fe/ \
  --role holder-a=https://holder-a.rack-a.$D:7420/holder-a/ --role relay-a=https://relay-a.rack-a.$D:7430/relay-a/ \
  --role ii-a1=https://ii-a1.rack-a.$D:7410/ii-a1/ --role ii-a2=https://ii-a2.rack-a.$D:7410/ii-a2/ \
  --role holder-b=https://holder-b.rack-b.$D:7420/holder-b/ --role relay-b=https://relay-b.rack-b.$D:7430/relay-b/ \
  --role ii-b1=https://ii-b1.rack-b.$D:7410/ii-b1/ --role ii-b2=https://ii-b2.rack-b.$D:7410/ii-b2/ >/dev/null

umask 077
mkdir -p keys
for tenant in public acme; do
  [ -f keys/$tenant.scope.key ] || $PYTHON -c 'import secrets; print(secrets.token_hex(32))' > keys/$tenant.scope.key
done
[ -f keys/acme.apikey ] || $PYTHON -c 'import secrets; print("sk-kvsp-" + secrets.token_hex(24))' > keys/acme.apikey
umask 022

scope_id() {
  $PYTHON -c 'import sys; from kvsp.keys import ScopeKey
print(ScopeKey(bytes.fromhex(open(sys.argv[1]).read().strip())).scope_id.hex())' "$1"
}
public=$(scope_id keys/public.scope.key)
acme=$(scope_id keys/acme.scope.key)
for f in *.toml rack-*/*.toml; do
  sed "s/@SCOPE_ID_PUBLIC@/$public/g; s/@SCOPE_ID_ACME@/$acme/g" "$f" > "$f.new" && mv "$f.new" "$f"
done

if [ -n "${MODEL_JSON:-}" ]; then
  cp "$MODEL_JSON" model.json
else
  [ -f model/config.json ] || $KVSP model init model >/dev/null
  $KVSP model descriptor model > model.json
fi
echo "ready: scopes public=$public acme=$acme; copy this folder to every host (see docs/deploy.md)"
