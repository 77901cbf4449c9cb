#!/usr/bin/env bash
# Install slurm-bt and everything it needs on a fresh Debian 12 machine (run as root), idempotently:
# Debian packages (Slurm 22.05, slurmdbd, munge, MariaDB, ...), a virtualenv at /opt/slurm-bt/venv
# with slurm-bt installed from this checkout, `bt-sbatch`/`slurm-bt` on PATH, and the dev cluster up.
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv="${SLURM_BT_VENV:-/opt/slurm-bt/venv}"
say() { printf 'install: %s\n' "$*"; }

if [ "$(id -u)" -ne 0 ]; then
  echo "install: run as root (it installs Debian packages and starts the dev cluster)" >&2
  exit 1
fi

# Container images (docs/containers.md, docs/admin.md): skopeo/umoci/squashfs-tools mirror an image into
# the cache, charliecloud + squashfuse run it unprivileged, docker-registry + apache2-utils (htpasswd)
# serve the dev cluster's registry; python3-lark/python3-requests are charliecloud's (ch-image) needs.
pkgs=(slurm-wlm slurmdbd munge mariadb-server python3-venv python3-dev bubblewrap openssh-server
      util-linux procps iproute2 passwd
      skopeo umoci charliecloud squashfs-tools squashfuse docker-registry apache2-utils python3-lark
      python3-requests)
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
done
if [ "${#missing[@]}" -gt 0 ]; then
  say "apt-get install ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
# GlusterFS (server + FUSE client): shared storage with root squash, for `devcluster.py up --shared gluster`
# and tests/integration/test_root_squash.py. Optional: installed where the Debian release carries it
# (the Slurm release roots of devcluster/releases.py are other releases, whose tests do not use it).
optional=()
for p in glusterfs-server glusterfs-client; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || optional+=("$p")
done
if [ "${#optional[@]}" -gt 0 ]; then
  export DEBIAN_FRONTEND=noninteractive
  [ "${#missing[@]}" -gt 0 ] || apt-get update -qq
  carried=1
  for p in "${optional[@]}"; do apt-cache show "$p" >/dev/null 2>&1 || carried=0; done  # one name at a time:
  if [ "$carried" = 1 ]; then  # given several, apt-cache show succeeds when any one exists
    say "apt-get install ${optional[*]}"
    apt-get install -y -qq --no-install-recommends "${optional[@]}" >/dev/null
  else
    say "not installing ${optional[*]}: this Debian release does not carry them"
  fi
fi

# Debian's python3 (not a per-user pyenv): job users on compute nodes must be able to run it.
if [ ! -x "$venv/bin/python" ]; then
  say "creating $venv"
  /usr/bin/python3 -m venv "$venv"
fi
say "pip install -e $repo[dev,s3,hf,gcs,azure,https,ssh,bench]"
# editable_mode=compat: a plain path entry in a .pth file. The default mode adds an import finder that imports
# pathlib, re and importlib.metadata in every interpreter start, ~12 ms on each `slurm-bt status`.
# -qq: setuptools warns that compat mode is transitional; errors are still shown.
"$venv/bin/python" -m pip install -qq --disable-pip-version-check --config-settings editable_mode=compat \
  -e "$repo[dev,s3,hf,gcs,azure,https,ssh,bench]"
for tool in bt-sbatch slurm-bt; do
  ln -sf "$venv/bin/$tool" "/usr/local/bin/$tool"
done
# The checkout's hook wrappers (prolog/, epilog/: the dev cluster's Prolog and Epilog) run this venv.
ln -sfn "$venv" "$repo/.bt-venv"
chmod -R a+rX "$venv"

# Azurite (Azure Blob emulator) for the azure:// storage tests (tests/servers/azurite.py), from npm into
# a private prefix. 3.35.0 is the newest release whose engines accept Debian 12's Node.js 18/20
# (3.36 needs node >= 21, 3.37 node >= 22).
azurite_prefix=/opt/slurm-bt/azurite
azurite_version=3.35.0
if ! command -v npm >/dev/null; then
  say "apt-get install nodejs npm"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends nodejs npm >/dev/null
fi
if [ ! -x "$azurite_prefix/node_modules/.bin/azurite-blob" ] \
   || ! grep -q "\"version\": \"$azurite_version\"" "$azurite_prefix/node_modules/azurite/package.json"; then
  say "npm install azurite@$azurite_version into $azurite_prefix"
  npm install --silent --no-audit --no-fund --prefix "$azurite_prefix" "azurite@$azurite_version"
fi

# devcluster/releases.py builds release roots with this script while the host's own cluster holds the
# ports, so it brings the cluster up later, inside the root's network namespace.
if [ -n "${SLURM_BT_INSTALL_NO_CLUSTER:-}" ]; then
  say "not bringing up the dev cluster (SLURM_BT_INSTALL_NO_CLUSTER is set)"
  exit 0
fi
say "bringing up the dev cluster"
/usr/bin/python3 "$repo/devcluster/devcluster.py" up
