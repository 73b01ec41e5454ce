"""``--device cuda`` on a machine without a GPU: the code path that records where a job ran (its key) and the
refusal. The GPU itself is exercised where one is lent (docs/cluster.md says what was and was not run)."""

import pytest
import torch

from difftransformer.cli import main
from difftransformer.jobs import device_key, job_key
from difftransformer.lmsweep.config import quick_config as lm_quick
from difftransformer.lmsweep.sweep import job_description as lm_description
from difftransformer.retrieval.benchmark import job_description
from difftransformer.retrieval.config import quick_config

no_cuda = pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a CUDA GPU")


def test_the_device_and_precision_are_part_of_a_gpu_jobs_key_and_cpu_keys_are_unchanged():
    cfg_d = quick_config().to_dict()
    job = ("baseline", 3000, 2e-3)
    cpu, gpu = job_description(cfg_d, job), job_description(cfg_d, job, "cuda")
    assert cpu == job_description(cfg_d, job, "cpu") and "device" not in cpu  # the keys of existing journals
    want = {"type": "cuda", "precision": "float32", "matmul": "highest"}
    assert gpu["device"] == want == device_key("cuda")["device"]
    assert job_key(cpu) != job_key(gpu)
    lm = lm_quick()
    lm_job = (16, "baseline", 4000, 4e-3)
    assert "device" not in lm_description(lm, "fp", lm_job)
    assert job_key(lm_description(lm, "fp", lm_job)) != job_key(lm_description(lm, "fp", lm_job, "cuda"))


@no_cuda
@pytest.mark.parametrize("argv", [["retrieval", "--quick"], ["retrieval", "--quick", "--sweep-width", "16,32"],
                                  ["lm-sweep", "--quick"], ["demo", "--quick"]])
def test_device_cuda_without_a_gpu_is_one_error_line_and_writes_nothing(tmp_path, capsys, argv):
    rc = main([*argv, "--device", "cuda", "--out", str(tmp_path / "o"), "--no-progress"])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and "--device cuda: this process sees no CUDA GPU" in err[0], err
    assert not (tmp_path / "o").exists()
