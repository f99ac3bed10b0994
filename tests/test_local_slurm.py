"""The test cluster's handling of the default configuration file: it replaces only one it wrote itself."""

import pytest

from tests import local_slurm
from tests.local_slurm import LocalSlurm


def test_a_stale_configuration_of_its_own_is_replaced_and_a_foreign_one_refused(tmp_path, monkeypatch):
    default = tmp_path / "etc" / "slurm.conf"
    monkeypatch.setattr(local_slurm, "DEFAULT_CONF", default)
    default.parent.mkdir()
    # a run killed before it stopped leaves its file behind (ports and paths of a cluster long gone)
    default.write_text("ClusterName=ar2dlm-test\nSlurmctldPort=1\nStateSaveLocation=/gone/state\n")
    cluster = LocalSlurm(tmp_path / "a")
    cluster._write_config()
    assert default.read_text() == (tmp_path / "a" / "slurm.conf").read_text() and cluster.wrote_default
    cluster.stop()
    assert not default.exists()

    default.write_text("ClusterName=production\n")
    with pytest.raises(RuntimeError, match="real SLURM installation"):
        LocalSlurm(tmp_path / "b")._write_config()
    assert default.read_text() == "ClusterName=production\n"
