"""Issue 10 item 1: a GPU job at truss's cpu/memory defaults gets its GPUs' share of the nodes.

The cookbook shape (8 GPUs, ``cpu_count``/``memory`` left at 1 / ``2Gi``) must not become
``--cpus-per-task=1 --mem=2048M``. Node sizes come from recorded ``scontrol --oneliner show node``
answers in tests/data/scontrol/ (the dev cluster's, and an 8xH100 cluster's).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from slurm_bt.compat.definitions import Compute, Image, Runtime, TrainingJob, TrainingProject
from slurm_bt.errors import UserError
from slurm_bt.job_spec import build_job_spec, wants_node_sizes
from slurm_bt.render.batch_script import render_batch_script, sbatch_directives
from slurm_bt.render.sbatch_args import check_sbatch_args, sbatch_partition
from slurm_bt.site.settings import AcceleratorMapping, SiteSettings
from slurm_bt.slurm.client import SlurmClient
from slurm_bt.slurm.node_shapes import GpuShare, NodeSizes, gpu_share, node_shapes, parse_gpu_gres, read_node_sizes
from slurm_bt.slurm.runner import CommandResult
from slurm_bt.slurm.scontrol import parse_nodes
from tests.spec_helpers import fixed_context

DATA = Path(__file__).parent.parent / "data" / "scontrol"
DEV = node_shapes(parse_nodes((DATA / "2205_show_node_devcluster.txt").read_text()))
BIG = node_shapes(parse_nodes((DATA / "show_node_8xh100.txt").read_text()))
HOPPER = SiteSettings(accelerators={"H100": AcceleratorMapping(gres_type="h100", partition="hopper"),
                                    "A100": AcceleratorMapping(gres_type="a100", partition="ampere")})


def _project(**compute: object) -> TrainingProject:
    return TrainingProject(name="cookbook", job=TrainingJob(
        image=Image(base_image="pytorch/pytorch:2.7.0"), compute=Compute(**compute),
        runtime=Runtime(start_commands=["torchrun train.py"])))


def _spec(project: TrainingProject, site: SiteSettings, nodes: NodeSizes | None):
    return build_job_spec(project, site, fixed_context(Path("/w/config.py")), nodes=nodes)


def _directives(spec: object) -> set[str]:
    return set(sbatch_directives(spec))  # type: ignore[arg-type]


# -- reading the nodes ---------------------------------------------------------------------------


def test_dev_cluster_nodes_are_read() -> None:
    assert [(s.name, s.cpus, s.mem_mib, dict(s.gpus)) for s in DEV] == [
        ("n1", 2, 8000, {"h100": 4}), ("n2", 2, 8000, {"h100": 4})]
    assert "gpu" in DEV[0].partitions and "staging" in DEV[0].partitions


def test_effective_cpus_and_reserved_memory_count() -> None:
    by_name = {s.name: s for s in BIG}
    assert by_name["gpu01"].mem_mib == 2050000 - 16384  # MemSpecLimit is the system's, not the job's
    assert by_name["gpu02"].cpus == 88  # CPUEfctv: CPUs left after CoreSpecCount
    assert dict(by_name["a100-01"].gpus) == {"a100": 8}  # one entry per socket, added up
    assert dict(by_name["cpu01"].gpus) == {}


@pytest.mark.parametrize(("gres", "expected"), [
    ("gpu:h100:4", {"h100": 4}), ("gpu:4", {"": 4}), ("gpu:h100:4(S:0-1)", {"h100": 4}),
    ("gpu:a100:2,gpu:h100:2", {"a100": 2, "h100": 2}), ("gpu:h100:4(S:0),shard:h100:8", {"h100": 4}),
    ("(null)", {}), ("", {}), ("gpu:h100:x", {}), ("gpu:h100:99999999999", {}), ("gpu", {}),
])
def test_gres_parsing_is_total(gres: str, expected: dict[str, int]) -> None:
    assert parse_gpu_gres(gres) == expected


def test_junk_records_are_left_out() -> None:
    assert node_shapes([{}, {"NodeName": "x"}, {"NodeName": "y", "CPUTot": "junk"}]) == []
    [only] = node_shapes([{"NodeName": "z", "CPUTot": "4", "RealMemory": "bogus"}])
    assert only.mem_mib is None


# -- the share -----------------------------------------------------------------------------------


def test_four_of_four_gpus_is_the_whole_dev_node() -> None:
    share = gpu_share(DEV, partition="gpu", gres_type="h100", gpus=4)
    assert isinstance(share, GpuShare)
    assert (share.cpus, share.mem_mib) == (2, 8000)
    assert "n1" in share.cpus_basis and "2 of its 2 CPUs" in share.cpus_basis


def test_half_the_gpus_get_half_the_node() -> None:
    share = gpu_share(DEV, partition="gpu", gres_type="h100", gpus=2)
    assert isinstance(share, GpuShare) and (share.cpus, share.mem_mib) == (1, 4000)
    one = gpu_share(DEV, partition="gpu", gres_type="h100", gpus=1)
    assert isinstance(one, GpuShare) and (one.cpus, one.mem_mib) == (1, 2000)  # never 0 CPUs


def test_the_smallest_node_decides_so_the_job_fits_anywhere() -> None:
    share = gpu_share(BIG, partition="hopper", gres_type="h100", gpus=8)
    assert isinstance(share, GpuShare)
    assert share.cpus == 88 and "gpu02" in share.cpus_basis and "smallest" in share.cpus_basis
    assert share.mem_mib == 2050000 - 16384 and "gpu01" in share.mem_basis


def test_no_node_with_that_many_gpus_says_so() -> None:
    assert gpu_share(DEV, partition="gpu", gres_type="h100", gpus=8) == "no node of partition gpu has 8 h100 GPUs"
    assert isinstance(gpu_share(DEV, partition="nope", gres_type="h100", gpus=1), str)
    assert isinstance(gpu_share(BIG, partition="ampere", gres_type="h100", gpus=1), str)  # wrong type
    assert isinstance(gpu_share(BIG, partition="debug,ampere", gres_type="a100", gpus=8), GpuShare)


# -- the job's request ---------------------------------------------------------------------------


def test_cookbook_config_gets_the_gpu_share() -> None:
    """8 GPUs at truss's defaults on 8xH100 nodes: all the (smallest) node, not 1 CPU and 2 GiB."""
    spec = _spec(_project(accelerator="H100:8"), HOPPER, NodeSizes(shapes=tuple(BIG)))
    assert (spec.cpus_per_task, spec.mem_mib) == (88, 2050000 - 16384)
    assert {"--cpus-per-task=88", f"--mem={2050000 - 16384}M", "--gres=gpu:h100:8"} <= _directives(spec)
    script = render_batch_script(spec)
    assert "# --cpus-per-task=88 is the GPUs' share, 8 of gpu02's 8 h100 GPUs" in script
    assert "# --mem=2033616M is the GPUs' share, 8 of gpu01's" in script
    assert not [w for w in spec.warnings if "job.compute" in w]


def test_dev_cluster_four_gpus_get_the_whole_node() -> None:
    spec = _spec(_project(accelerator="H100:4"), SiteSettings(), NodeSizes(shapes=tuple(DEV)))
    assert (spec.cpus_per_task, spec.mem_mib) == (2, 8000)


def test_explicit_defaults_count_as_defaults() -> None:
    """Some cookbook configs spell the defaults out; 1 CPU and 2Gi still mean "follow the GPUs"."""
    spec = _spec(_project(accelerator="H100:2", cpu_count=1, memory="2Gi"), SiteSettings(),
                 NodeSizes(shapes=tuple(DEV)))
    assert (spec.cpus_per_task, spec.mem_mib) == (1, 4000)


def test_explicit_larger_values_are_honoured_as_written() -> None:
    spec = _spec(_project(accelerator="H100:8", cpu_count=12, memory="64Gi"), HOPPER,
                 NodeSizes(shapes=tuple(BIG)))
    assert (spec.cpus_per_task, spec.mem_mib) == (12, 65536)
    script = render_batch_script(spec)
    assert "# --cpus-per-task=12 is job.compute.cpu_count=12, used as written" in script
    assert "# --mem=65536M is job.compute.memory='64Gi', used as written" in script
    smaller = _spec(_project(accelerator="H100:4", cpu_count=1, memory="512Mi"), SiteSettings(),
                    NodeSizes(shapes=tuple(DEV)))  # less than the default: packing small jobs on purpose
    assert (smaller.cpus_per_task, smaller.mem_mib) == (2, 512)
    # one explicit, one default: each number on its own
    mixed = _spec(_project(accelerator="H100:8", cpu_count=12), HOPPER, NodeSizes(shapes=tuple(BIG)))
    assert (mixed.cpus_per_task, mixed.mem_mib) == (12, 2050000 - 16384)


def test_site_file_per_gpu_amounts_win_over_the_nodes() -> None:
    site = SiteSettings(accelerators=HOPPER.accelerators, cpus_per_gpu=10, mem_per_gpu="100Gi")
    project = _project(accelerator="H100:8")
    assert not wants_node_sizes(project, site)  # nothing to ask Slurm
    spec = _spec(project, site, None)
    assert (spec.cpus_per_task, spec.mem_mib) == (80, 8 * 102400)
    assert "# --cpus-per-task=80 is 8 GPUs x site cpus_per_gpu=10" in render_batch_script(spec)
    half = SiteSettings(accelerators=HOPPER.accelerators, cpus_per_gpu=10)
    assert wants_node_sizes(project, half)
    spec = _spec(project, half, NodeSizes(shapes=tuple(BIG)))
    assert (spec.cpus_per_task, spec.mem_mib) == (80, 2050000 - 16384)


def test_cpu_jobs_are_not_resized() -> None:
    project = _project()
    assert not wants_node_sizes(project, SiteSettings())
    spec = _spec(project, SiteSettings(), NodeSizes(shapes=tuple(DEV)))
    assert (spec.cpus_per_task, spec.mem_mib) == (1, 2048)
    assert "# --cpus-per-task=1 is job.compute.cpu_count=1 (truss's default)" in render_batch_script(spec)


def test_no_share_warns_naming_the_reason() -> None:
    for nodes, why in [
        (NodeSizes(error="scontrol: command not found"), "could not read the node sizes from Slurm"),
        (NodeSizes(shapes=tuple(DEV)), "no node of partition gpu has 8 h100 GPUs"),
        (None, "the node sizes were not read from Slurm"),
    ]:
        spec = _spec(_project(accelerator="H100:8"), SiteSettings(), nodes)
        assert (spec.cpus_per_task, spec.mem_mib) == (1, 2048)
        [warning] = [w for w in spec.warnings if w.startswith("job.compute")]
        assert why in warning and "cpu_count=1 and memory='2Gi'" in warning


def test_partition_from_the_sbatch_command_line_is_the_one_sized() -> None:
    nodes = NodeSizes(shapes=tuple(BIG), partition="ampere")
    spec = _spec(_project(accelerator="H100:4"), HOPPER, nodes)
    assert spec.cpus_per_task == 1 and any("partition ampere" in w for w in spec.warnings)


@pytest.mark.parametrize(("args", "expected"), [
    ([], None), (["--partition=urgent"], "urgent"), (["--partition", "urgent"], "urgent"),
    (["-p", "urgent"], "urgent"), (["-purgent"], "urgent"), (["--part=urgent"], "urgent"),
    (["-p", "a", "--partition=b"], "b"), (["--parsable"], None), (["--partition"], None),
    (["--qos=high", "--account", "team1"], None),
])
def test_sbatch_partition(args: list[str], expected: str | None) -> None:
    assert sbatch_partition(args) == expected


@pytest.mark.parametrize("arg", ["--wra=true", "--wrap=true", "--get-u", "--get-user-env=10L", "--export-f=/x",
                                 "--export=ALL", "--expor=ALL"])
def test_refused_options_are_refused_in_every_getopt_spelling(arg: str) -> None:
    """Failed before: sbatch took ``--wra=...`` as ``--wrap`` (getopt_long prefixes) and it passed."""
    with pytest.raises(UserError):
        check_sbatch_args([arg])


@pytest.mark.parametrize("arg", ["--wait", "--gres=gpu:1", "--exclusive", "-wn1", "--get", "--"])
def test_other_options_pass(arg: str) -> None:
    if arg == "--get":  # a prefix of --get-user-env only: getopt_long reads it as that
        with pytest.raises(UserError):
            check_sbatch_args([arg])
        return
    check_sbatch_args([arg])


class _Runner:
    def __init__(self, result: CommandResult | Exception) -> None:
        self.result = result
        self.calls: list[tuple[str, ...]] = []

    def run(self, argv, *, input=None, env=None, timeout_s=60):  # type: ignore[no-untyped-def]
        self.calls.append(tuple(argv))
        if isinstance(self.result, Exception):
            raise self.result
        return self.result


def test_read_node_sizes_asks_scontrol_once_and_never_raises() -> None:
    text = (DATA / "2205_show_node_devcluster.txt").read_text()
    runner = _Runner(CommandResult(("scontrol",), 0, text, ""))
    sizes = read_node_sizes(SlurmClient(runner), partition="urgent")  # type: ignore[arg-type]
    assert [s.name for s in sizes.shapes] == ["n1", "n2"] and sizes.partition == "urgent" and sizes.error is None
    assert runner.calls == [("scontrol", "--oneliner", "show", "node")]
    down = read_node_sizes(SlurmClient(_Runner(CommandResult(("scontrol",), 1, "", "Unable to contact slurm "
                                                                                   "controller"))))  # type: ignore[arg-type]
    assert down.shapes == () and down.error and "contact" in down.error


def test_a_loaded_cookbook_config_gets_the_site_share(tmp_path: Path) -> None:
    """Through the real loader (which marks every field as set). Failed before: the old rule asked
    ``model_fields_set`` whether cpu_count was written, so the site's cpus_per_gpu never applied."""
    from slurm_bt.compat.loader import load_training_project

    (tmp_path / "config.py").write_text(
        "from truss_train import definitions\n"
        "from truss.base.truss_config import AcceleratorSpec\n"
        "project = definitions.TrainingProject(name='cb', job=definitions.TrainingJob(\n"
        "    image=definitions.Image(base_image='pytorch/pytorch:2.7.0'),\n"
        "    compute=definitions.Compute(node_count=2, accelerator=AcceleratorSpec(accelerator='H100', count=8))))\n")
    project = load_training_project(tmp_path / "config.py")
    site = SiteSettings(accelerators=HOPPER.accelerators, cpus_per_gpu=10, mem_per_gpu="100Gi")
    spec = _spec(project, site, None)
    assert (spec.cpus_per_task, spec.mem_mib, spec.nodes) == (80, 8 * 102400, 2)
    spec = _spec(project, HOPPER, NodeSizes(shapes=tuple(BIG)))
    assert (spec.cpus_per_task, spec.mem_mib) == (88, 2050000 - 16384)


GPU_CONFIG = """
from truss_train import definitions
project = definitions.TrainingProject(name="gpu", job=definitions.TrainingJob(
    image=definitions.Image(base_image="python:3.11"),
    compute=definitions.Compute({accel}{extra}),
    runtime=definitions.Runtime(start_commands=["python train.py"])))
"""


@pytest.mark.parametrize(("gpus", "extra", "asks"), [
    (4, "", True), (2, "", True), (0, "", False), (4, ", cpu_count=2, memory='4Gi'", False),
])
def test_a_submission_asks_slurm_once_and_only_when_it_needs_to(tmp_path: Path, isolated_home: Path,
                                                                 gpus: int, extra: str, asks: bool) -> None:
    """bt-sbatch reads the nodes once (scontrol show node), passes the partition on, submits the share."""
    from slurm_bt.site.settings import load_site_settings
    from slurm_bt.submit import submit_config
    from tests.fakes.fake_slurm import FakeSlurm

    class DevNodes(FakeSlurm):
        def run(self, argv, *, input=None, env=None, timeout_s=60):  # type: ignore[no-untyped-def]
            if list(argv) == ["scontrol", "--oneliner", "show", "node"]:
                self.node_queries = getattr(self, "node_queries", 0) + 1
                return CommandResult(tuple(argv), 0, (DATA / "2205_show_node_devcluster.txt").read_text(), "")
            return super().run(argv, input=input, env=env, timeout_s=timeout_s)

    accel = f'accelerator="H100:{gpus}"' if gpus else "node_count=1"
    (tmp_path / "config.py").write_text(GPU_CONFIG.format(accel=accel, extra=extra))
    (tmp_path / "train.py").write_text("print('hi')\n")
    env = {"SLURM_BT_SITE_CONFIG": str(isolated_home / "site.toml"), "PATH": "/usr/bin:/bin"}
    slurm = DevNodes()
    result = submit_config(tmp_path / "config.py", sbatch_args=["-p", "gpu"], runner=slurm,
                           site=load_site_settings(environ=env), environ=env)
    assert getattr(slurm, "node_queries", 0) == (1 if asks else 0)
    [call] = slurm.calls_to("sbatch")
    want = {4: ("2", "8000M"), 2: ("1", "4000M"), 0: ("1", "2048M")}[gpus] if asks or not gpus else ("2", "4096M")
    assert f"#SBATCH --cpus-per-task={want[0]}" in call.stdin and f"#SBATCH --mem={want[1]}" in call.stdin
    assert not [w for w in result.warnings if w.startswith("job.compute")]
