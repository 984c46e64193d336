"""Where a job's control group goes and what is read from it (`agent/cgroups.py`): the choice
of hierarchy from the machine's texts, the limits written, the OOM rule and the usage read.

Pure: the texts are this machine's kind and the others'; the groups are plain folders of a
temporary directory holding the files the kernel would (the real kernel's groups are tested
with real agents in tests/test_agent_limits.py).
"""

from __future__ import annotations

import os
from pathlib import Path

from tiny_scheduler.agent import cgroups
from tiny_scheduler.agent.cgroups import V1, V2, JobGroup, Layout

V1_MACHINE_MOUNTS = r"""proc /proc proc rw,nosuid 0 0
tmpfs /sys/fs/cgroup tmpfs rw,relatime,mode=755 0 0
cgroup /sys/fs/cgroup/cpu cgroup rw,relatime,cpu 0 0
cgroup /sys/fs/cgroup/cpuacct cgroup rw,relatime,cpuacct 0 0
cgroup /sys/fs/cgroup/memory cgroup rw,relatime,memory 0 0
cgroup /sys/fs/cgroup/systemd cgroup rw,relatime,name=systemd 0 0
cgroup2 /sys/fs/cgroup/unified cgroup2 rw,relatime 0 0
"""
"""A v1 machine as these are: `cpu` and `cpuacct` apart, and a unified mount beside them."""

V1_MACHINE_OWN = """9:name=systemd:/
4:memory:/process_api/abc
2:cpuacct:/
1:cpu:/
0::/
"""


def test_mounts_and_own_groups_are_read_from_their_texts() -> None:
    mounts = cgroups.parse_mounts(
        V1_MACHINE_MOUNTS + r"cgroup /mnt/with\040space cgroup rw,pids 0 0"
    )
    assert [(m.path, m.fstype) for m in mounts][-2:] == [
        ("/sys/fs/cgroup/unified", "cgroup2"),
        ("/mnt/with space", "cgroup"),
    ]
    assert "cpu" in mounts[0].options
    own = cgroups.parse_own_groups(V1_MACHINE_OWN + "3:cpu,cpuacct:/other\n")
    assert own["memory"] == "/process_api/abc"
    assert own[""] == "/"
    assert own["cpu"] == "/"  # the first line that names a controller wins


def test_a_unified_mount_without_memory_and_cpu_is_passed_over_for_v1() -> None:
    layout = cgroups.choose(
        cgroups.parse_mounts(V1_MACHINE_MOUNTS),
        cgroups.parse_own_groups(V1_MACHINE_OWN),
        "hugetlb\n",
    )
    assert layout == Layout(
        V1,
        (
            ("memory", "/sys/fs/cgroup/memory/process_api/abc"),
            ("cpu", "/sys/fs/cgroup/cpu"),
            ("cpuacct", "/sys/fs/cgroup/cpuacct"),
        ),
    )


def test_v2_is_chosen_only_when_its_root_offers_memory_and_cpu() -> None:
    mounts = cgroups.parse_mounts("cgroup2 /sys/fs/cgroup cgroup2 rw,nosuid 0 0\n")
    own = cgroups.parse_own_groups("0::/system.slice/agent.service\n")
    assert cgroups.choose(mounts, own, "cpuset cpu io memory pids\n") == Layout(
        V2, (("unified", "/sys/fs/cgroup/system.slice/agent.service"),), "/sys/fs/cgroup"
    )
    assert cgroups.choose(mounts, own, "cpuset io memory\n") is None  # no cpu, and no v1
    assert cgroups.choose(mounts, own, None) is None


def test_co_mounted_cpu_and_cpuacct_share_one_folder_and_no_memory_means_none() -> None:
    mounts = cgroups.parse_mounts(
        "cgroup /sys/fs/cgroup/cpu,cpuacct cgroup rw,cpu,cpuacct 0 0\n"
        "cgroup /sys/fs/cgroup/memory cgroup rw,memory 0 0\n"
    )
    own = cgroups.parse_own_groups("5:memory:/a\n3:cpu,cpuacct:/a\n")
    layout = cgroups.choose(mounts, own, None)
    assert layout is not None
    assert layout.base("cpu") == layout.base("cpuacct") == "/sys/fs/cgroup/cpu,cpuacct/a"
    only_cpu = cgroups.parse_mounts("cgroup /sys/fs/cgroup/cpu cgroup rw,cpu 0 0\n")
    assert cgroups.choose(only_cpu, own, None) is None


def v1_layout(root: Path) -> Layout:
    bases = []
    for role in ("memory", "cpu", "cpuacct"):
        (root / role).mkdir()
        bases.append((role, str(root / role)))
    return Layout(V1, tuple(bases))


def test_a_v1_group_gets_the_memory_limit_with_swap_and_the_cpu_quota(tmp_path: Path) -> None:
    layout = v1_layout(tmp_path)
    # The kernel makes these files in a new group; a plain folder needs them made.
    group = cgroups.create(layout, "job-7.0.x", memory_mb=0, cpus=0)
    (tmp_path / "memory" / "job-7.0.x" / "memory.memsw.limit_in_bytes").touch()
    group.limit(memory_mb=64, cpus=2)
    memory = tmp_path / "memory" / "job-7.0.x"
    assert (memory / "memory.limit_in_bytes").read_text() == str(64 << 20)
    assert (memory / "memory.memsw.limit_in_bytes").read_text() == str(64 << 20)
    cpu = tmp_path / "cpu" / "job-7.0.x"
    assert (cpu / "cpu.cfs_quota_us").read_text() == "200000"
    assert (cpu / "cpu.cfs_period_us").read_text() == "100000"
    assert group.remove() is False  # not empty: plain folders hold the files written
    assert JobGroup.from_spec(group.to_spec()) == group


def test_what_a_job_did_not_ask_for_is_not_limited(tmp_path: Path) -> None:
    group = cgroups.create(v1_layout(tmp_path), "job-8.0.x", memory_mb=0, cpus=0)
    assert sorted(p.name for p in (tmp_path / "memory" / "job-8.0.x").iterdir()) == []
    assert sorted(p.name for p in (tmp_path / "cpu" / "job-8.0.x").iterdir()) == []
    assert group.remove() is True
    assert not (tmp_path / "cpu" / "job-8.0.x").exists()


def test_a_v2_group_gets_memory_max_no_swap_and_cpu_max(tmp_path: Path) -> None:
    (tmp_path / "agent.service").mkdir()
    layout = Layout(V2, (("unified", str(tmp_path / "agent.service")),), str(tmp_path))
    group = cgroups.create(layout, "job-9.1.x", memory_mb=0, cpus=0)
    folder = tmp_path / "agent.service" / "job-9.1.x"
    (folder / "memory.swap.max").touch()
    group.limit(memory_mb=100, cpus=1)
    assert (folder / "memory.max").read_text() == str(100 << 20)
    assert (folder / "memory.swap.max").read_text() == "0"
    assert (folder / "cpu.max").read_text() == "100000 100000"


def test_the_usage_and_the_oom_count_are_read_from_the_groups_files(tmp_path: Path) -> None:
    layout = v1_layout(tmp_path)
    group = cgroups.create(layout, "g", 0, 0)
    memory, account = tmp_path / "memory" / "g", tmp_path / "cpuacct" / "g"
    (memory / "memory.oom_control").write_text("oom_kill_disable 0\nunder_oom 0\noom_kill 2\n")
    (memory / "memory.max_usage_in_bytes").write_text(f"{70 << 20}\n")
    (account / "cpuacct.usage").write_text("2500000000\n")
    assert group.oom_kills() == 2
    assert cgroups.usage(3.0, 0.1, 5.0, group) == {
        "cpu_secs": 2.5,
        "max_rss_mb": 70.0,
        "wall_secs": 3.0,
    }
    (tmp_path / "u").mkdir()
    v2 = cgroups.create(Layout(V2, (("unified", str(tmp_path / "u")),), str(tmp_path)), "g", 0, 0)
    folder = tmp_path / "u" / "g"
    (folder / "memory.events").write_text("low 0\nhigh 0\nmax 4\noom 1\noom_kill 1\n")
    (folder / "cpu.stat").write_text("usage_usec 1500000\nuser_usec 1000000\n")
    assert v2.oom_kills() == 1
    # No memory.peak (a kernel before 5.19): the rusage's peak instead.
    assert cgroups.usage(2.0, 0.4, 12.34, v2) == {
        "cpu_secs": 1.5,
        "max_rss_mb": 12.3,
        "wall_secs": 2.0,
    }
    # No group at all (enforcement none): all from the rusage.
    assert cgroups.usage(2.0, 0.4, 12.34, None)["cpu_secs"] == 0.4
    (memory / "memory.oom_control").write_text("oom_kill_disable 0\nunder_oom 0\n")
    assert group.oom_kills() is None  # a kernel before 4.13: it cannot tell


def test_an_out_of_memory_end_is_a_failure_after_the_count_rose() -> None:
    assert cgroups.out_of_memory(0, 1, 137)
    assert not cgroups.out_of_memory(0, 0, 137)  # a kill -9 from a person: an ordinary exit
    assert not cgroups.out_of_memory(0, 1, 0)  # a child was killed, the job recovered: done
    assert not cgroups.out_of_memory(None, None, 137)  # the kernel does not say


def test_a_group_spec_of_another_shape_names_no_group() -> None:
    for spec in (None, {}, {"version": "v3", "dirs": {}}, {"version": V1, "dirs": {"cpu": "rel"}}):
        assert JobGroup.from_spec(spec) is None


def test_a_hierarchy_that_cannot_be_written_says_why(tmp_path: Path) -> None:
    layout = Layout(V1, (("memory", str(tmp_path / "missing")), ("cpu", str(tmp_path))))
    assert "No such file or directory" in cgroups.layout_check(layout, "probe")
    assert cgroups.layout_check(Layout(V1, (("cpu", str(tmp_path)),)), "probe") == ""
    assert not (tmp_path / "probe").exists()


def test_leftovers_are_this_agents_groups_whose_job_folders_are_gone(tmp_path: Path) -> None:
    layout = v1_layout(tmp_path)
    prefix = "tiny-scheduler.abc."
    for name in (f"{prefix}job-1.0.a", f"{prefix}job-2.0.b", "tiny-scheduler.other.job-3.0.c"):
        for role in ("memory", "cpu", "cpuacct"):
            (tmp_path / role / name).mkdir()
    (tmp_path / "cpu" / f"{prefix}job-4.0.d").mkdir()  # in one hierarchy only
    found = cgroups.leftovers(layout, prefix, keep=["job-1.0.a"])
    assert [group.paths()[0] for group in found] == [
        str(tmp_path / "memory" / f"{prefix}job-2.0.b"),
        str(tmp_path / "memory" / f"{prefix}job-4.0.d"),
    ]
    assert all(group.remove() for group in found)
    assert not (tmp_path / "cpu" / f"{prefix}job-4.0.d").exists()
    assert (tmp_path / "cpu" / f"{prefix}job-1.0.a").exists()
    assert (tmp_path / "cpu" / "tiny-scheduler.other.job-3.0.c").exists()


def test_v2_moves_the_agent_into_a_leaf_before_it_hands_controllers_down(tmp_path: Path) -> None:
    base = tmp_path / "agent.service"
    base.mkdir()
    (base / "cgroup.controllers").write_text("cpu memory pids\n")
    (base / "cgroup.subtree_control").write_text("\n")
    (base / "cgroup.procs").write_text("4242\n")  # the agent, in the group it was started in
    layout = Layout(V2, (("unified", str(base)),), str(tmp_path))
    assert cgroups.layout_check(layout, "probe") == ""
    assert (base / "agent" / "cgroup.procs").read_text() == str(os.getpid())
    assert (base / "cgroup.subtree_control").read_text() == "+memory +cpu"
    # At the hierarchy's root, processes and controlled children may be together: no move.
    root = tmp_path / "root"
    root.mkdir()
    for name, text in (("cgroup.controllers", "cpu memory"), ("cgroup.subtree_control", "")):
        (root / name).write_text(text)
    (root / "cgroup.procs").write_text("1\n")
    assert cgroups.layout_check(Layout(V2, (("unified", str(root)),), str(root)), "probe") == ""
    assert not (root / "agent").exists()
    # A group that is not given both controllers cannot limit its jobs.
    (base / "cgroup.subtree_control").write_text("\n")
    (base / "cgroup.controllers").write_text("pids memory\n")
    assert "its group is not given cpu" in cgroups.layout_check(layout, "probe")
