#!/usr/bin/env bash
# Run hwpool's NUMA tests on a real two-node Linux kernel inside a small VM.
#
# Uses the shared run-in-numa-vm script (path in NUMA_VM_SCRIPT, default
# ../shared/numa-vm/run-in-numa-vm from the repository root). PYTHON (default /tmp/venv/bin/python)
# must resolve to a real interpreter binary, not a pyenv shim script: shims are very slow under
# the VM's emulation. The guest sees the host's root read-only, so the test data file is written
# on the host under /var/tmp (plain 9p in the guest, whose page cache can be dropped, unlike the
# guest's tmpfs /tmp). Extra arguments go to pytest. Exit status: pytest's, 125 if no VM.
set -euo pipefail
root=$(cd "$(dirname "$0")/../../.." && pwd)
vm=${NUMA_VM_SCRIPT:-$root/../shared/numa-vm/run-in-numa-vm}
python=${PYTHON:-/tmp/venv/bin/python}
if [ ! -x "$vm" ]; then
  echo "numa_vm: $vm not found (set NUMA_VM_SCRIPT)" >&2
  exit 125
fi
if [ "$(head -c 4 "$(readlink -f "$python")" | tr -d '\0')" != $'\x7fELF' ]; then
  echo "numa_vm: $python is not an interpreter binary (a pyenv shim?); set PYTHON" >&2
  exit 125
fi
data=$(mktemp -d /var/tmp/hwpool-numa-vm.XXXXXX)
trap 'rm -rf "$data"' EXIT
head -c $((4 << 20)) /dev/urandom >"$data/weights.bin"
cd "$root"
export PYTHONPATH=src PYTHONUNBUFFERED=1 HWPOOL_NUMA_TEST_FILE="$data/weights.bin"
export NUMA_VM_APPEND=${NUMA_VM_APPEND:-numa_balancing=disable}
echo "numa_vm: $vm -- $python -m pytest -q -p no:cacheprovider -rs tests/numa/ $*"
"$vm" -- "$python" -m pytest -q -p no:cacheprovider -rs tests/numa/ "$@"
