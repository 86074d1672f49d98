"""Builders of fake Linux sysfs/procfs/cgroupfs trees for topology, sizing and NUMA tests.

``FakeSys(tmp_path)`` writes files under a root that ``cpu_topology(root)`` then reads. Every
method returns ``self`` so that a machine reads as one chain; the presets at the bottom build
the machines the tests share (a 2-socket SMT server, a big.LITTLE phone, an Intel hybrid
desktop, a container with a CPU quota).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

CPU_DIR = "sys/devices/system/cpu"
NODE_DIR = "sys/devices/system/node"


def cpu_list(cpus: Iterable[int]) -> str:
    """Format CPU numbers the way the kernel does: ``0-3,8,10-11``."""
    ordered = sorted(set(cpus))
    runs: list[str] = []
    start = prev = None
    for cpu in [*ordered, None]:
        if prev is not None and cpu == prev + 1:
            prev = cpu
            continue
        if start is not None:
            runs.append(str(start) if start == prev else f"{start}-{prev}")
        start = prev = cpu
    return ",".join(runs)


class FakeSys:
    """A fake filesystem root; see the module docstring."""

    def __init__(self, root: Path) -> None:
        self.root = Path(root)

    def write(self, relative: str, text: str) -> FakeSys:
        """Write ``text`` (plus a newline) at ``root/relative``, creating directories."""
        path = self.root / relative.lstrip("/")
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text + "\n")
        return self

    def cpus(self, online: Iterable[int], *, possible: Iterable[int] | None = None) -> FakeSys:
        """Online CPUs (and one ``cpuN`` directory each)."""
        online = sorted(online)
        self.write(f"{CPU_DIR}/online", cpu_list(online))
        self.write(f"{CPU_DIR}/possible", cpu_list(possible if possible is not None else online))
        for cpu in online:
            (self.root / CPU_DIR / f"cpu{cpu}").mkdir(parents=True, exist_ok=True)
        return self

    def node(self, node_id: int, cpus: Iterable[int], *, meminfo: str | None = None) -> FakeSys:
        """A NUMA node with its CPU list (and optionally its ``meminfo`` text)."""
        self.write(f"{NODE_DIR}/node{node_id}/cpulist", cpu_list(cpus))
        if meminfo is not None:
            self.write(f"{NODE_DIR}/node{node_id}/meminfo", meminfo)
        return self

    def smt(self, *groups: Sequence[int]) -> FakeSys:
        """SMT sibling groups: each CPU of a group lists the whole group as its siblings."""
        for group in groups:
            for cpu in group:
                topo = f"{CPU_DIR}/cpu{cpu}/topology"
                self.write(f"{topo}/thread_siblings_list", cpu_list(group))
                self.write(f"{topo}/core_cpus_list", cpu_list(group))
        return self

    def capacity(self, capacities: Mapping[int, int]) -> FakeSys:
        """``cpu_capacity`` per CPU (ARM big.LITTLE)."""
        for cpu, value in capacities.items():
            self.write(f"{CPU_DIR}/cpu{cpu}/cpu_capacity", str(value))
        return self

    def max_freq(self, freqs_khz: Mapping[int, int]) -> FakeSys:
        """``cpufreq/cpuinfo_max_freq`` per CPU, in kHz."""
        for cpu, value in freqs_khz.items():
            self.write(f"{CPU_DIR}/cpu{cpu}/cpufreq/cpuinfo_max_freq", str(value))
        return self

    def hybrid(self, core: Iterable[int], atom: Iterable[int]) -> FakeSys:
        """Intel hybrid PMU CPU lists: P-cores in ``cpu_core``, E-cores in ``cpu_atom``."""
        self.write("sys/devices/cpu_core/cpus", cpu_list(core))
        return self.write("sys/devices/cpu_atom/cpus", cpu_list(atom))

    def cgroup_v2(
        self,
        cpu_max: str | None = None,
        *,
        path: str = "/",
        ancestors: Mapping[str, str] | None = None,
        mountinfo: bool = True,
    ) -> FakeSys:
        """A unified (v2) hierarchy at /sys/fs/cgroup; the process sits in ``path``.

        ``cpu_max`` is written verbatim to the process's ``cpu.max`` (None: no file);
        ``ancestors`` maps other cgroup paths to their ``cpu.max`` text.
        """
        self.write("proc/self/cgroup", f"0::{path}")
        if mountinfo:
            self.write(
                "proc/self/mountinfo",
                "25 30 0:22 / /proc rw,nosuid - proc proc rw\n"
                "35 30 0:30 / /sys/fs/cgroup rw,nosuid shared:9 - cgroup2 cgroup2 rw,nsdelegate",
            )
        self.write("sys/fs/cgroup/cgroup.controllers", "cpuset cpu io memory pids")
        leaf = f"sys/fs/cgroup/{path.strip('/')}".rstrip("/")
        (self.root / leaf).mkdir(parents=True, exist_ok=True)
        if cpu_max is not None:
            self.write(f"{leaf}/cpu.max", cpu_max)
        for other, text in (ancestors or {}).items():
            self.write(f"sys/fs/cgroup/{other.strip('/')}/cpu.max".replace("//", "/"), text)
        return self

    def cgroup_v1(
        self,
        quota_us: str | None = None,
        period_us: str | None = "100000",
        *,
        path: str = "/",
        mount_point: str = "/sys/fs/cgroup/cpu,cpuacct",
        mount_root: str = "/",
        mountinfo: bool = True,
    ) -> FakeSys:
        """A v1 ``cpu,cpuacct`` hierarchy; files hold the given text verbatim (None: no file).

        ``mount_root`` is the subtree the mount shows (a container sees only its own cgroup).
        """
        self.write("proc/self/cgroup", f"5:memory:{path}\n4:cpu,cpuacct:{path}\n3:cpuset:{path}")
        if mountinfo:
            self.write(
                "proc/self/mountinfo",
                f"40 30 0:35 {mount_root} {mount_point} rw,nosuid shared:15 - cgroup cgroup "
                "rw,cpu,cpuacct\n"
                f"41 30 0:36 {mount_root} /sys/fs/cgroup/memory rw - cgroup cgroup rw,memory",
            )
        relative = path
        if mount_root != "/" and path.startswith(mount_root):
            relative = path[len(mount_root) :]
        leaf = f"{mount_point.strip('/')}/{relative.strip('/')}".rstrip("/")
        (self.root / leaf).mkdir(parents=True, exist_ok=True)
        if quota_us is not None:
            self.write(f"{leaf}/cpu.cfs_quota_us", quota_us)
        if period_us is not None:
            self.write(f"{leaf}/cpu.cfs_period_us", period_us)
        return self


def two_socket_smt_host(root: Path) -> FakeSys:
    """2 sockets x 4 cores x 2 threads: node0 = 0-3,8-11, node1 = 4-7,12-15, siblings (i, i+8)."""
    fake = FakeSys(root).cpus(range(16))
    fake.node(0, [*range(4), *range(8, 12)]).node(1, [*range(4, 8), *range(12, 16)])
    return fake.smt(*[(i, i + 8) for i in range(8)]).max_freq(dict.fromkeys(range(16), 3_000_000))


def big_little_phone(root: Path) -> FakeSys:
    """An 8-core phone: 4 little cores (capacity 325), 3 big (828) and 1 prime (1024)."""
    caps = {**dict.fromkeys(range(4), 325), **dict.fromkeys(range(4, 7), 828), 7: 1024}
    return FakeSys(root).cpus(range(8)).node(0, range(8)).capacity(caps)


def intel_hybrid_desktop(root: Path) -> FakeSys:
    """8 P-cores with HT (CPUs 0-15, siblings (2i, 2i+1)) and 8 E-cores (CPUs 16-23)."""
    fake = FakeSys(root).cpus(range(24)).node(0, range(24))
    fake.smt(*[(2 * i, 2 * i + 1) for i in range(8)], *[(c,) for c in range(16, 24)])
    # E-cores here clock at 3.9 GHz against 5.2 GHz: above 5/8, so frequency alone cannot tell.
    freqs = {**dict.fromkeys(range(16), 5_200_000), **dict.fromkeys(range(16, 24), 3_900_000)}
    return fake.max_freq(freqs).hybrid(core=range(16), atom=range(16, 24))


def container_with_quota(root: Path, cpu_max: str = "150000 100000") -> FakeSys:
    """A 4-CPU host seen from a cgroup v2 container with ``cpu.max`` (default 1.5 CPUs)."""
    return FakeSys(root).cpus(range(4)).cgroup_v2(cpu_max)
