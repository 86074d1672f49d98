"""``hwpool info``: what the library detects on this machine, and from where; a doctor.

:func:`gather` builds one JSON-ready dict (the ``--json`` output); :func:`format_info` renders
the same dict as text, so the two can never disagree. The GPUs' live state (memory used,
utilisation, processes) is one reading of the watcher's sampler (``hwpool._watch``), imported
only where the hardware answered detection. ``problems`` lists every failure found (NVML,
nvidia-smi, a GPU left out, the live reading), each with its fix where one is known
(``hwpool._host._problems``); the driver, NVML and CUDA versions come first.
"""

from __future__ import annotations

import os
import pwd
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from .._host._detect import NVIDIA_SMI_TIMEOUT_S, GPUDetection, GPUSource, detect_gpus
from .._host._problems import fix_for
from .._host._sizing import effective_threads
from .._host._topology import CPUTopology, cpu_topology
from .._host._versions import driver_versions
from .._numa._place import file_page_nodes
from .._printable import printable
from .._wire._paths import SYSTEM_SOCKET_VAR, client_socket, system_socket
from ._env import autostart_from_env
from ._text import plural

if TYPE_CHECKING:
    from .._watch import Sample

__all__ = ["format_info", "gather", "live_json"]


def gather(files: Sequence[str] = ()) -> dict[str, Any]:
    """Everything ``hwpool info`` reports, as plain JSON types; ``files`` adds their page nodes.

    Raises ValueError (naming the variable) for a malformed environment variable, OSError
    (naming the file) for a file that cannot be opened.
    """
    topology = cpu_topology()
    team = effective_threads(topology=topology)
    found, order = _detect()
    gpus = _gpus_json(found)
    versions = driver_versions(NVIDIA_SMI_TIMEOUT_S)
    gpus["versions"] = {
        "driver": versions.driver, "nvml": versions.nvml, "cuda": versions.cuda,
        "source": versions.source, "problem": versions.problem,
    }  # fmt: skip
    gpus["live"] = live_json(found)
    info: dict[str, Any] = {"gpus": gpus, "cpus": _cpus_json(topology, team)}
    info["problems"] = problems_json(found, gpus["live"])
    if order:
        info["problems"].insert(0, {"where": "CUDA_VISIBLE_DEVICES", "problem": order,
                                    "fix": _ORDER_FIX})  # fmt: skip
    info["server"] = server_json(os.environ)
    if files:
        info["files"] = [_file_json(path) for path in files]
    return info


_ORDER_FIX = (
    "export CUDA_DEVICE_ORDER=PCI_BUS_ID (the GPUs above are read in that order), so that "
    "CUDA and nvidia-smi number the GPUs alike"
)


def _detect() -> tuple[GPUDetection, str]:
    """Detection as a pool would see it, and "" ; or, where a pool would refuse because
    indexes cannot be read in CUDA's own order (GPUs that differ, no CUDA driver to ask),
    detection in PCI bus order and the refusal: a doctor shows the GPUs and the problem."""
    try:
        return detect_gpus(describe=True), ""
    except ValueError as exc:
        if "CUDA_DEVICE_ORDER=PCI_BUS_ID" not in str(exc):
            raise
        by_bus = {**os.environ, "CUDA_DEVICE_ORDER": "PCI_BUS_ID"}
        return detect_gpus(by_bus, describe=True), str(exc)


_KINDS = {
    "system": "machine-wide", "HWPOOL_SOCKET": "named", "XDG_RUNTIME_DIR": "per-user",
    "default": "per-user",
}  # fmt: skip


def server_json(environ: Mapping[str, str]) -> dict[str, Any]:
    """Which server a plain ``hwpool run`` (and ``hwpool status``, ``hwpool.connect()``) would
    use, why, and whether its socket is there; ValueError for a malformed variable."""
    chosen = client_socket(None, environ)
    system = system_socket(environ)
    return {
        "socket": str(chosen.path),
        "kind": _KINDS[chosen.source],
        "source": chosen.source,
        "running": os.path.lexists(chosen.path),
        "autostart": chosen.per_user and autostart_from_env(environ),
        "system_socket": None if system is None else str(system),
    }


def problems_json(found: GPUDetection, live: dict[str, Any] | None) -> list[dict[str, Any]]:
    """Every failure detection and the live reading found: ``where`` (NVML, nvidia-smi, a
    GPU), ``problem`` (the failure in the driver's words) and ``fix`` (None where unknown)."""
    nvml = found.nvml or ""
    said: list[tuple[str, str]] = []
    if nvml.startswith("NVML failed") or (
        found.source is GPUSource.DEFAULT and "not installed" in nvml
    ):
        said.append(("NVML", nvml))
    smi = found.nvidia_smi
    if smi is not None and (not smi.startswith("nvidia-smi listed") or "; nvidia-smi -L:" in smi):
        said.append(("nvidia-smi", smi))
    said += [(device, why) for device, why in found.failed]
    named = tuple(f"{device}: " for device, _ in found.failed)
    for part in (live or {}).get("problem", "").split("; "):
        if part and not part.startswith(named):  # a left-out GPU is said once
            said.append(("GPUs now", part))
    return [{"where": where, "problem": text, "fix": fix_for(text)} for where, text in said]


def live_json(found: GPUDetection) -> dict[str, Any] | None:
    """One reading of the GPUs now (NVML, else nvidia-smi, as the server's watcher reads
    them): per device its memory total and used, utilisation and processes (pid, user, MiB);
    None where no device has a UUID (the count came from a variable or a default: no
    hardware answered, so there is nothing to read)."""
    if not any(gpu.uuid for gpu in found.gpus):
        return None
    from .._watch import open_sampler  # noqa: PLC0415  (only info with GPUs needs the watcher)

    sampler, why = open_sampler()
    try:
        sample = sampler.sample()
    finally:
        sampler.close()
    return _sample_json(sample, why)


def _sample_json(sample: Sample, why: str) -> dict[str, Any]:
    """A :class:`Sample` as plain JSON types, each process with its user."""
    from .._watch import ProcFS  # noqa: PLC0415  (as above)

    procs = ProcFS()
    return {
        "source": sample.source,
        "why": why,
        "problem": sample.problem,
        "devices": [
            {
                "uuid": gpu.uuid,
                "memory_mib": gpu.total_mib,
                "memory_used_mib": gpu.used_mib,
                "memory_reserved_mib": gpu.reserved_mib,
                "memory_free_mib": gpu.free_mib,
                "utilization": gpu.utilization,
                "processes": None if gpu.processes is None else [
                    {"pid": p.pid, "user": _user(procs.uid(p.pid)), "memory_mib": p.used_mib}
                    for p in gpu.processes
                ],
            }
            for gpu in sample.gpus
        ],
    }  # fmt: skip


def _user(uid: int | None) -> str | None:
    """The name of ``uid`` (its number where it has none); None for a process gone."""
    if uid is None:
        return None
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return str(uid)


def _file_json(path: str) -> dict[str, Any]:
    """Where the page cache holds a sample of ``path``'s pages: NUMA node -> pages."""
    nodes = file_page_nodes(path)
    return {"path": path, "page_nodes": {str(node): n for node, n in sorted(nodes.items())}}


def _cpus_json(topology: CPUTopology, team: int) -> dict[str, Any]:
    return {
        "online": list(topology.online),
        "affinity": list(topology.affinity),
        "cgroup_quota": topology.cgroup_quota,
        "usable": topology.usable,
        "numa_nodes": [{"id": node.id, "cpus": list(node.cpus)} for node in topology.nodes],
        "smt_groups": [list(group) for group in topology.smt_groups],
        "big_cores": list(topology.big_cores),
        "cpu_pool_threads": team,
    }


def _gpus_json(found: GPUDetection) -> dict[str, Any]:
    return {
        "count": found.count,
        "source": str(found.source),
        "detail": found.detail,
        "nvidia_smi": found.nvidia_smi,
        "nvml": found.nvml,
        "devices": [
            {
                "index": gpu.index,
                "device_id": gpu.device_id,
                "uuid": gpu.uuid,
                "memory_mib": gpu.memory_mib,
                "memory_used_mib": gpu.memory_used_mib,
                "memory_reserved_mib": gpu.memory_reserved_mib,
                "memory_free_mib": gpu.memory_free_mib,
                "name": gpu.name,
                "parent": gpu.parent,
                "memory_group": gpu.memory_group,  # MIG: the GPU instance whose memory it shares
            }
            for gpu in found.gpus
        ],
        "failed": [{"device": device, "error": error} for device, error in found.failed],
    }


def format_info(info: dict[str, Any]) -> str:
    """The text form of :func:`gather`'s dict."""
    lines = _gpu_lines(info["gpus"]) + _live_lines(info["gpus"])
    if "problems" in info:
        lines += problem_lines(info["problems"])
    lines += _cpu_lines(info["cpus"])
    if "server" in info:
        lines.append(server_line(info["server"]))
    for entry in info.get("files", []):
        nodes = entry["page_nodes"]
        where = ", ".join(f"node {node}: {n}" for node, n in nodes.items())
        where = where or "none cached (or the file is empty)"
        lines.append(f"{entry['path']}: sampled pages in the page cache by NUMA node: {where}")
    return "\n".join(lines)


def server_line(server: dict[str, Any]) -> str:
    """One line: the server a plain ``hwpool run`` uses, and why."""
    where = f"Server: hwpool run uses {server['socket']}"
    if server["kind"] == "machine-wide":
        return f"{where} (the machine-wide server; {SYSTEM_SOCKET_VAR} names another place)"
    if server["kind"] == "named":
        return f"{where} (from HWPOOL_SOCKET)"
    system = server["system_socket"]
    none = f"no machine-wide server at {system}" if system else f"{SYSTEM_SOCKET_VAR} is empty"
    if server["running"]:
        state = "running"
    elif server["autostart"]:
        state = "not running: hwpool run starts one"
    else:
        state = "not running; autostart is off"
    return f"{where} (per-user, {state}; {none})"


def _source(source: str, detail: str) -> str:
    """``source: nvidia-smi``, with the detail where it adds to the source (not
    ``source: nvidia-smi; nvidia-smi``): ``source: nvidia-smi (NVML failed at init (...))``,
    ``source: env; HWPOOL_NUM_GPUS=2``."""
    if not detail or detail == source:
        return f"source: {source}"
    if detail.startswith(f"{source} "):
        return f"source: {detail}"
    return f"source: {source}; {detail}"


def problem_lines(problems: list[dict[str, Any]]) -> list[str]:
    """``Problems: none found``, or one line per problem with its fix under it."""
    if not problems:
        return ["Problems: none found"]
    lines = [f"Problems: {len(problems)}"]
    for entry in problems:
        lines.append(f"  {entry['where']}: {printable(entry['problem'])}")
        if entry["fix"]:
            lines.append(f"    fix: {entry['fix']}")
    return lines


def _versions_line(versions: dict[str, Any]) -> str:
    """``  driver 590.48.01, NVML 590.48, CUDA 13.1 (from nvidia-smi)``."""
    if versions["source"] == "none":
        return f"  driver: unknown ({printable(versions['problem'])})"
    parts = [
        f"{label} {printable(versions[key]) if versions[key] else 'unknown'}"
        for key, label in (("driver", "driver"), ("nvml", "NVML"), ("cuda", "CUDA"))
    ]
    return f"  {', '.join(parts)} (from {versions['source']})"


def _gpu_lines(gpus: dict[str, Any]) -> list[str]:
    lines = [f"GPUs: {gpus['count']} ({_source(gpus['source'], gpus['detail'])})"]
    if gpus.get("versions"):
        lines.append(_versions_line(gpus["versions"]))
    for dev in gpus["devices"]:
        extra = [
            dev[key] for key in ("name", "uuid") if dev.get(key) and dev[key] != dev["device_id"]
        ]
        if dev["memory_mib"] is not None:
            extra.append(f"{dev['memory_mib']} MiB")
        if dev.get("memory_used_mib") is not None:
            extra.append(f"{dev['memory_used_mib']} MiB in use")
        if dev.get("memory_reserved_mib") is not None:
            extra.append(f"{dev['memory_reserved_mib']} MiB reserved")
        if dev.get("memory_free_mib") is not None and dev.get("memory_reserved_mib") is not None:
            extra.append(f"{dev['memory_free_mib']} MiB free")
        if dev.get("parent"):
            extra.append(f"MIG instance of {dev['parent']}")
        suffix = f" ({', '.join(extra)})" if extra else ""
        lines.append(f"  GPU {dev['index']}: device {dev['device_id']}{suffix}")
    for failed in gpus.get("failed", ()):
        lines.append(f"  left out: {failed['device']}: {printable(failed['error'])}")
    return lines


def _live_lines(gpus: dict[str, Any]) -> list[str]:
    """The live reading, nvidia-smi-like: a line per device, one per process under it."""
    live = gpus.get("live")
    if live is None:
        return []
    read = live["why"].removeprefix("watching ")  # "with nvidia-smi (pynvml not installed...)"
    lines = [f"GPUs now, read {read}:" + (f" {live['problem']}" if live["problem"] else "")]
    index = {dev["uuid"]: dev["index"] for dev in gpus["devices"] if dev.get("uuid")}
    for dev in live["devices"]:
        name = f"GPU {index[dev['uuid']]}" if dev["uuid"] in index else dev["uuid"]
        used, total = _mib(dev["memory_used_mib"]), _mib(dev["memory_mib"])
        busy = (
            "utilisation unknown" if dev["utilization"] is None else f"{dev['utilization']}% busy"
        )
        held = dev.get("memory_reserved_mib")
        held_said = "" if held is None else f" (+{held} MiB reserved)"
        lines.append(f"  {name}: {used} / {total} used{held_said}, {busy}")
        if dev["processes"] is None:
            lines.append("    processes: unknown (the driver did not list them)")
        for proc in dev["processes"] or ():
            user = proc["user"] or "(gone)"
            lines.append(
                f"    pid {proc['pid']:>7}  {printable(user):<12} {_mib(proc['memory_mib'])}"
            )
    return lines


def _mib(mib: int | None) -> str:
    """``1536 MiB``; ``? MiB`` where unknown (unknown is not zero)."""
    return f"{'?' if mib is None else mib} MiB"


def _cpu_lines(cpus: dict[str, Any]) -> list[str]:
    quota = cpus["cgroup_quota"]
    smt = [group for group in cpus["smt_groups"] if len(group) > 1]
    big = cpus["big_cores"]
    team = cpus["cpu_pool_threads"]
    lines = [
        f"CPUs: {cpus['usable']} usable (online {cpu_list(cpus['online'])}; "
        f"affinity {cpu_list(cpus['affinity'])}; "
        f"cgroup quota {'none' if quota is None else plural(quota, 'CPU')})",
        f"  SMT: {f'{len(smt)} cores with siblings' if smt else 'off or absent'}",
        f"  big cores: {cpu_list(big) if big else 'none (homogeneous CPU)'}",
    ]
    lines += [f"  NUMA node {n['id']}: CPUs {cpu_list(n['cpus'])}" for n in cpus["numa_nodes"]]
    lines.append(
        f"CPUPool.from_env(): team of {plural(team, 'thread')}"
        + (f" ({plural(team - 1, 'worker')} + the caller)" if team > 1 else " (None: serial)")
    )
    return lines


def cpu_list(cpus: list[int]) -> str:
    """CPU numbers in the kernel's list form: ``[0, 1, 2, 5]`` -> ``0-2,5``."""
    ranges: list[str] = []
    for cpu in sorted(cpus):
        if ranges and cpu == int(ranges[-1].split("-")[-1]) + 1:
            ranges[-1] = f"{ranges[-1].split('-')[0]}-{cpu}"
        else:
            ranges.append(str(cpu))
    return ",".join(ranges) if ranges else "-"
