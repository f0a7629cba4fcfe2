"""The reference BA (numpy) and the GPU BA (cupy) are one code path and must agree (the test DPVO lacks).

Skipped without cupy and a CUDA device (CI has none); run on a GPU machine with `pytest -m gpu`.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from pose_core.camera_poses.ba import BAOptions, bundle_adjust
from tests.pose_core.camera_poses.test_ba import _perturbed_problem, prior_focal_problem

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def cupy():
    cp = pytest.importorskip("cupy")
    try:
        if cp.cuda.runtime.getDeviceCount() < 1:
            pytest.skip("no CUDA device")
    except cp.cuda.runtime.CUDARuntimeError:
        pytest.skip("no CUDA device")
    return cp


def _to_device(prob, cp):
    arrays = {f.name: cp.asarray(getattr(prob, f.name)) for f in dataclasses.fields(prob)
              if isinstance(getattr(prob, f.name), np.ndarray)}
    return dataclasses.replace(prob, **arrays)


@pytest.mark.parametrize("loss", ["huber", "cauchy"])
def test_cpu_matches_gpu(cupy, loss):
    prob, *_ = _perturbed_problem(seed=3)
    opts = BAOptions(loss=loss, max_iterations=20)
    cpu = bundle_adjust(prob, opts, xp=np)
    gpu = bundle_adjust(_to_device(prob, cupy), opts, xp=cupy)
    assert gpu.converged == cpu.converged
    assert gpu.cost == pytest.approx(cpu.cost, rel=1e-6)
    np.testing.assert_allclose(cupy.asnumpy(gpu.rotation), cpu.rotation, atol=1e-7)
    np.testing.assert_allclose(cupy.asnumpy(gpu.translation), cpu.translation, atol=1e-6)
    np.testing.assert_allclose(cupy.asnumpy(gpu.points), cpu.points, atol=1e-5)


@pytest.mark.parametrize("path", [{}, {"dense_max_entries": 0, "dense_max_cameras": 0}])
def test_focal_refinement_cpu_matches_gpu(cupy, path):
    """The bordered system (two right-hand sides, dense or sparse) and the focal's std agree on both."""
    prob, _ = prior_focal_problem(0.88, seed=3)
    opts = BAOptions(max_iterations=20, **path)
    cpu = bundle_adjust(prob, opts, xp=np)
    gpu = bundle_adjust(_to_device(prob, cupy), opts, xp=cupy)
    assert gpu.focal_status == cpu.focal_status == "refined"
    assert gpu.focal_scale == pytest.approx(cpu.focal_scale, rel=1e-9)
    assert gpu.focal_scale_std == pytest.approx(cpu.focal_scale_std, rel=1e-5)
    np.testing.assert_allclose(cupy.asnumpy(gpu.points), cpu.points, atol=1e-5)
