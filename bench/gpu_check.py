"""Real-GPU check: children started under leases see, and use, exactly their leased GPUs.

Run on a machine with NVIDIA GPUs (``python bench/gpu_check.py``; without a GPU it says why it
skips and exits 0). It starts child processes three ways: ``lease.popen()`` on a local
``GPUPool()``, ``hwpool run`` against a ``hwpool serve`` on a temporary socket, and
``hwpool run`` against a server that inherited a ``CUDA_VISIBLE_DEVICES`` list (so the
lease's id is that list's entry). Each child prints its ``CUDA_VISIBLE_DEVICES`` and what CUDA
reports inside it (``torch.cuda`` if installed, else the driver API through ctypes: device
count, name and UUID of device 0) and keeps a CUDA context open, while this script asks
nvidia-smi which GPU each child's process runs on (``--query-compute-apps``). nvidia-smi inside a
child lists every GPU: it reads NVML, which ignores ``CUDA_VISIBLE_DEVICES``; it is printed too.
Exit status 1 if a child ran on a GPU other than its lease's.

Then ``CUDA_VISIBLE_DEVICES`` as CUDA reads it (docs/gpus.md): for the forms a real machine can
show (empty, ``-1``, ``NoDevFiles``, an index out of range, a device twice, a UUID prefix, kinds
mixed, two MIG devices where MIG is on), what hwpool makes of it beside what the CUDA driver
enumerates in a child with that environment (``libcuda`` through ctypes); a mismatch counts as
a failure. A process that sees no GPU must get a ValueError from ``GPUPool()`` and exit 2
from ``hwpool serve``.

Last, the watcher against the real driver (NVML through ``nvidia-ml-py`` if it imports, else
nvidia-smi): a job on half a GPU (a shell, as ``hwpool run`` would start it) starts a
grandchild that calls ``hwpool.torch_limit()`` and allocates 256 MiB (torch, else cupy; the
check is skipped, saying so, when neither imports); the watcher must list that grandchild on
the leased GPU, under the job's lease, with at least that memory.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

import hwpool  # noqa: E402
from hwpool import GPUSource, detect_gpus  # noqa: E402
from hwpool._host._cuda import cuda_devices  # noqa: E402
from hwpool._watch import LeaseProcs, Watcher, open_sampler  # noqa: E402

BOUND = 60.0

CHILD = r"""
import ctypes, json, os, subprocess, sys
out = {"pid": os.getpid(), "CUDA_VISIBLE_DEVICES": os.environ.get("CUDA_VISIBLE_DEVICES"),
       "CUDA_DEVICE_ORDER": os.environ.get("CUDA_DEVICE_ORDER")}
try:
    smi = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=20)
    out["nvidia-smi -L"] = smi.stdout.strip().splitlines()
except (OSError, subprocess.SubprocessError) as exc:
    out["nvidia-smi -L"] = str(exc)
keep = None
try:
    import torch
    out["torch.cuda.device_count"] = torch.cuda.device_count()
    if torch.cuda.device_count():
        props = torch.cuda.get_device_properties(0)
        out["cuda:0"] = {"name": props.name, "uuid": str(getattr(props, "uuid", "?"))}
        keep = torch.ones(1 << 20, device="cuda:0")  # a context, and memory, on cuda:0
except ImportError:
    try:
        cuda = ctypes.CDLL("libcuda.so.1")
        count, dev, ctx = ctypes.c_int(), ctypes.c_int(), ctypes.c_void_p()
        name, uuid = ctypes.create_string_buffer(256), ctypes.create_string_buffer(16)
        assert cuda.cuInit(0) == 0, "cuInit failed"
        cuda.cuDeviceGetCount(ctypes.byref(count))
        out["driver device count"] = count.value
        if count.value:
            cuda.cuDeviceGet(ctypes.byref(dev), 0)
            cuda.cuDeviceGetName(name, 256, dev)
            (getattr(cuda, "cuDeviceGetUuid_v2", None) or cuda.cuDeviceGetUuid)(uuid, dev)
            h = uuid.raw.hex()
            text = f"GPU-{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"
            out["cuda:0"] = {"name": name.value.decode(), "uuid": text}
            assert cuda.cuCtxCreate_v2(ctypes.byref(ctx), 0, dev) == 0, "cuCtxCreate failed"
    except (OSError, AssertionError) as exc:
        out["cuda"] = f"no CUDA driver here ({exc})"
print(json.dumps(out), flush=True)
sys.stdin.readline()  # hold the context until the parent has looked
"""


def main() -> int:
    """Run the three checks; 0 when every child ran on its lease's GPU (or when skipped)."""
    unset = ("CUDA_VISIBLE_DEVICES", "HWPOOL_NUM_GPUS", "HWPOOL_SOCKET")
    env = {k: v for k, v in os.environ.items() if k not in unset}
    found = detect_gpus(env)
    if found.source is not GPUSource.NVIDIA_SMI:
        print(f"gpu_check: skipped: no GPU found ({found.nvidia_smi})")
        return 0
    print(f"gpu_check: {found.count} GPUs: " + ", ".join(f"{g.index}={g.uuid}" for g in found.gpus))
    bad = check_local(env) + check_server(env, None) + check_server(env, found)
    bad += check_visible(env, found) + check_no_gpu(env)
    bad += check_watcher(env)
    print("gpu_check: " + ("every child ran on its lease's GPU" if not bad else f"{bad} wrong"))
    return 1 if bad else 0


def check_local(env: dict[str, str]) -> int:
    """A local GPUPool(): one whole-GPU lease per GPU, a child on each through lease.popen()."""
    print("\n== lease.popen() on a local GPUPool()")
    os.environ.clear()
    os.environ.update(env)
    pool = hwpool.GPUPool()
    leases = [pool.lease(1.0) for _ in range(pool.num_gpus)]
    children = []
    for lease in leases:
        lease.__enter__()
        children.append((lease.devices, lease.popen([sys.executable, "-c", CHILD], **PIPES)))
    try:
        return report(children)
    finally:
        for lease in leases:
            lease.__exit__(None, None, None)


PIPES: dict[str, Any] = {"stdin": subprocess.PIPE, "stdout": subprocess.PIPE, "text": True}


def check_server(env: dict[str, str], found: Any) -> int:
    """``hwpool run`` on a temporary server: half a GPU per child, two children per GPU.

    With ``found``, the server inherits ``CUDA_VISIBLE_DEVICES`` listing the GPUs by index
    in reverse, so each lease's id is an entry of that list (logical 0 is the last GPU).
    """
    directory = Path(tempfile.mkdtemp(prefix="hwgc", dir="/tmp"))
    socket = directory / "s.sock"
    server_env = dict(env, PYTHONPATH=str(ROOT / "src"))
    title = "hwpool run on a server that detected the GPUs"
    if found is not None:
        server_env["CUDA_VISIBLE_DEVICES"] = ",".join(str(g.index) for g in reversed(found.gpus))
        title = (
            f"hwpool run on a server with CUDA_VISIBLE_DEVICES={server_env['CUDA_VISIBLE_DEVICES']}"
        )
    print(f"\n== {title}")
    hw = [sys.executable, "-m", "hwpool"]
    server = subprocess.Popen([*hw, "serve", "--socket", str(socket)], env=server_env,
                              stderr=subprocess.DEVNULL)  # fmt: skip
    try:
        wait_for(socket)
        with hwpool.connect(socket) as probe:
            count = probe.num_gpus
            devices = [hwpool_device(g) for g in probe.gpus]
        children = []
        for _ in range(2 * count):
            child = subprocess.Popen(
                [*hw, "run", "--socket", str(socket), "--gpus", "0.5", "--", sys.executable,
                 "-c", CHILD], env=server_env, stderr=subprocess.PIPE, **PIPES,
            )  # fmt: skip
            children.append((None, child))
        return report(children, devices)
    finally:
        server.terminate()
        server.wait(BOUND)
        shutil.rmtree(directory, ignore_errors=True)


def visible_forms(found: Any) -> list[str]:
    """The ``CUDA_VISIBLE_DEVICES`` forms this machine can show (see docs/gpus.md)."""
    gpus = [g for g in found.gpus if not g.is_mig]
    migs = [g for g in found.gpus if g.is_mig]
    forms = ["0", f"0,{found.count + 5},1", "0,0", "0gpu", "0,,1"]
    if gpus and gpus[0].uuid:
        forms += [gpus[0].uuid, gpus[0].uuid[:12], f"{gpus[0].uuid},0", f"0,{gpus[0].uuid}"]
    if len(gpus) > 1:
        forms += [",".join(str(i) for i in reversed(range(len(gpus)))), "1,0,1"]
    if len(migs) > 1:
        forms += [f"{migs[0].uuid},{migs[1].uuid}", str(migs[0].uuid)[:12]]
    return forms


def check_visible(env: dict[str, str], found: Any) -> int:
    """Each form: the UUIDs hwpool's pool would hold beside those the CUDA driver enumerates."""
    print("\n== CUDA_VISIBLE_DEVICES: hwpool beside the CUDA driver (libcuda in a child)")
    bad = 0
    for form in visible_forms(found):
        where = dict(env, CUDA_VISIBLE_DEVICES=form)
        try:
            mine = [str(g.uuid or g.device_id)[4:] for g in detect_gpus(where).gpus]
        except ValueError as exc:
            mine = [f"refused: {exc}"]
        cuda, what = cuda_devices(where)
        same = None if cuda is None else mine == list(cuda)
        bad += same is False
        print(json.dumps({"CUDA_VISIBLE_DEVICES": form, "hwpool": mine,
                          "cuda": what if cuda is None else list(cuda), "same": same}))  # fmt: skip
    return bad


def check_no_gpu(env: dict[str, str]) -> int:
    """Empty, ``-1`` and ``NoDevFiles``: CUDA sees no device, ``GPUPool()`` raises ValueError,
    ``hwpool serve`` exits 2."""
    print("\n== no visible GPU: GPUPool() refuses, hwpool serve exits 2")
    bad = 0
    refuse = "import hwpool\ntry:\n    hwpool.GPUPool()\nexcept ValueError as e:\n    print(e)\n"
    refuse += "else:\n    raise SystemExit('GPUPool() made a pool')\n"
    for form in ("", "-1", "NoDevFiles"):
        where = dict(env, CUDA_VISIBLE_DEVICES=form, PYTHONPATH=str(ROOT / "src"))
        cuda, what = cuda_devices(where)
        pool = subprocess.run([sys.executable, "-c", refuse], env=where, capture_output=True,
                              text=True, timeout=BOUND, check=False)  # fmt: skip
        socket = Path(tempfile.mkdtemp(prefix="hwgc", dir="/tmp")) / "s.sock"
        serve = subprocess.run([sys.executable, "-m", "hwpool", "serve", "--socket", str(socket)],
                               env=where, capture_output=True, text=True, timeout=BOUND,
                               check=False)  # fmt: skip
        shutil.rmtree(socket.parent, ignore_errors=True)
        ok = pool.returncode == 0 and serve.returncode == 2 and cuda in (None, ())
        bad += not ok
        seen = what if cuda is None else list(cuda)
        print(json.dumps({"CUDA_VISIBLE_DEVICES": form, "cuda": seen,
                          "GPUPool()": (pool.stdout or pool.stderr).strip()[:160],
                          "hwpool serve exit": serve.returncode, "ok": ok}))  # fmt: skip
    return bad


ALLOC_MIB = 256
ALLOC = rf"""
import json, os, sys
try:
    import torch, hwpool
    limit = hwpool.torch_limit()  # the lease's share, from HWPOOL_LEASE
    keep = torch.empty({ALLOC_MIB} << 20, dtype=torch.uint8, device="cuda:0")
    torch.cuda.synchronize()
    how = "torch"
except ImportError:
    import cupy
    limit, how = None, "cupy"
    keep = cupy.empty({ALLOC_MIB} << 20, dtype=cupy.uint8)
    cupy.cuda.Device(0).synchronize()
out = {{"pid": os.getpid(), "with": how, "torch_limit": limit,
       "XLA_PYTHON_CLIENT_MEM_FRACTION": os.environ.get("XLA_PYTHON_CLIENT_MEM_FRACTION")}}
print(json.dumps(out), flush=True)
sys.stdin.readline()  # hold the memory until the parent has looked
"""


def check_watcher(env: dict[str, str]) -> int:
    """The watcher sees a leased job's grandchild, with its memory, under the job's lease."""
    print("\n== the watcher (real driver) sees a leased job's memory under its lease")
    if not any(importlib.util.find_spec(name) for name in ("torch", "cupy")):
        print("skipped: neither torch nor cupy imports here, so nothing allocates GPU memory")
        return 0
    os.environ.clear()
    paths = [str(ROOT / "src"), *filter(None, [env.get("PYTHONPATH")])]  # hwpool, and torch's
    os.environ.update(env, PYTHONPATH=os.pathsep.join(paths))
    pool = hwpool.GPUPool()
    sampler, why = open_sampler()
    print(why)
    watcher = Watcher(sampler)
    lease = pool.lease(0.5)
    with lease:
        uuids = frozenset(str(pool.gpus[gpu].uuid) for gpu in lease.gpus)
        # a shell that forks the allocating python (the ": " after it keeps sh from exec'ing)
        job = lease.popen(["sh", "-c", '"$0" -c "$1"; :', sys.executable, ALLOC], **PIPES)
        try:
            return watch_for(watcher, job, uuids)
        finally:
            job.communicate("\n", timeout=BOUND)
            watcher.close()


def watch_for(watcher: Any, job: subprocess.Popen[str], uuids: frozenset[str]) -> int:
    """Sample until the job's allocating grandchild shows up; 0 when it does, under lease 1."""
    assert job.stdout is not None
    report_line = job.stdout.readline()
    print(report_line.strip() or "the job reported nothing")
    if not report_line:
        return 1
    pid = json.loads(report_line)["pid"]
    lease = LeaseProcs(lease=1, gpus=uuids, pids=frozenset({job.pid}))
    deadline = time.monotonic() + BOUND
    while True:
        report = watcher.observe([lease], [], time.monotonic())
        mine = [a for a in report.processes if a.process.pid == pid]
        if mine or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    for item in report.processes:
        print(f"  pid {item.process.pid} on {item.process.gpu}: {item.process.used_mib} MiB, "
              f"lease {item.lease}, user {item.user}")  # fmt: skip
    if report.sample.problem:
        print(f"  the sample says: {report.sample.problem}")
    if not mine:
        print(f"FAIL: the watcher does not list pid {pid}")
        return 1
    found = mine[0]
    used = found.process.used_mib
    ok = found.lease == 1 and found.process.gpu in uuids
    if used is None:
        print("  (the driver cannot say this process's memory here: only attribution checked)")
    else:
        ok = ok and used >= ALLOC_MIB
    print(("ok" if ok else "FAIL") + f": pid {pid} on {found.process.gpu}, lease {found.lease}")
    return 0 if ok else 1


def hwpool_device(info: Any) -> str:
    return str(info.uuid or info.device_id)


def wait_for(socket: Path) -> None:
    deadline = time.monotonic() + BOUND
    while not socket.exists():
        if time.monotonic() > deadline:
            raise SystemExit(f"gpu_check: no server on {socket}")
        time.sleep(0.05)


def report(children: list[tuple[Any, subprocess.Popen[str]]], devices: Any = None) -> int:
    """Read each child's report, ask nvidia-smi where each child's process is, compare."""
    seen = []
    for expected, child in children:
        assert child.stdout is not None
        line = child.stdout.readline()
        seen.append((expected, json.loads(line) if line else {"error": "no report"}))
    where = compute_apps()
    bad = 0
    for expected, info in seen:
        visible = info.get("CUDA_VISIBLE_DEVICES")
        want = expected[0] if expected else visible
        ran_on = where.get(info.get("pid"))
        ok = None if ran_on is None else ran_on == want_uuid(want)  # None: no CUDA context
        bad += ok is False
        info["nvidia-smi says the process runs on"] = ran_on
        print(json.dumps({**info, "ok": ok}))
    for _, child in children:
        child.communicate("\n", timeout=BOUND)
    if devices is not None:
        print(f"(the server's devices: {devices})")
    return bad


def want_uuid(device: str | None) -> str:
    """The UUID of ``device`` (a UUID already, or an nvidia-smi index)."""
    if device is None or device.startswith(("GPU-", "MIG-")):
        return str(device)
    found = detect_gpus({"PATH": os.environ.get("PATH", "")})
    return next((str(g.uuid) for g in found.gpus if g.device_id == device), device)


def compute_apps() -> dict[int, str]:
    """pid -> the UUID of the GPU it has a context on, as nvidia-smi reports it."""
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-compute-apps=pid,gpu_uuid", "--format=csv,noheader"],
            capture_output=True, text=True, timeout=20, check=False,
        ).stdout  # fmt: skip
    except (OSError, subprocess.SubprocessError):
        return {}
    apps = {}
    for line in out.splitlines():
        pid, _, uuid = line.partition(",")
        if pid.strip().isdigit():
            apps[int(pid)] = uuid.strip()
    return apps


if __name__ == "__main__":
    sys.exit(main())
