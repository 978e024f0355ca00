"""The elastic example scripts (examples/elastic/, Horovod's elastic recipes on synthetic data)
run under the elastic driver and finish: exit 0, the driver's closing line, the script's own
closing line, and no process of the job left. Tiny settings: what is checked here is that the
scripts and the driver work together; restarts are tested in test_elastic_driver.py, whose torch
worker is the MNIST recipe (pytorch_mnist_elastic.py is left out here to keep CI short)."""
import os

import pytest

from elastic_job import ElasticJob

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
EXAMPLES = os.path.join(ROOT, "examples", "elastic")

CASES = {
    "pytorch_synthetic_benchmark_elastic.py": (
        ["--num-warmup-batches", 1, "--num-batches-per-iter", 2, "--num-iters", 2, "--image-size", 16],
        r"img/sec per rank: [\d.]+; total on 2 ranks"),
    "tensorflow2_keras_mnist_elastic.py": (
        ["--epochs", 1, "--steps-per-epoch", 4],
        r"after 1 epochs on 2 ranks: loss [\d.]+, accuracy [\d.]+%"),
}


@pytest.mark.parametrize("script", sorted(CASES))
def test_example_runs_under_the_driver(script):
    args, closing = CASES[script]
    job = ElasticJob(["--min-np", 2, "--max-np", 2, "-H", "localhost:2", "python", os.path.join(EXAMPLES, script),
                      *args], timeout=240)
    job.wait_for(closing, stream="stdout")
    assert job.finish() == 0, job.describe()
    assert any(line.startswith("elastic: the job finished: 2 ranks exited 0") for line in job.driver_lines()), \
        job.describe()
    job.assert_nothing_left()
