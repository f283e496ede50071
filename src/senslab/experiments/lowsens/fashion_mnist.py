"""Fashion-MNIST: ViT-small vs CNN vs MLP (LeakyReLU) vs MLP (sigmoid) (main paper §5, Fig. 5;
docs/definitions.md#fashion_mnist).

Claim: trained with SGD (batch 100; lr MLP-LeakyReLU 0.1, MLP-sigmoid 0.5, CNN 0.005, ViT 0.1),
the ViT ends with the lowest token-wise sensitivity of the four.

Command: ``senslab run fashion_mnist [--scale paper] [--set data.root=DIR]``.

Data. The four official idx-gz files (``train-images-idx3-ubyte.gz`` ...), found by the one
rule of :mod:`senslab.data._roots`: ``--set data.root=DIR`` if given (the only place looked
in), else ``$SENSLAB_DATA/fashion_mnist`` (``~/.cache/senslab/data/fashion_mnist`` without
``SENSLAB_DATA``; point ``SENSLAB_DATA`` at the folder that holds ``fashion_mnist/``, e.g. a
project's shared, verified copies). The folder found is recorded in each run's config.json. If
the files are in neither, the run stops before training with an error that names the files, the
places looked in and the fixes (``--set data.root=DIR``, ``SENSLAB_DATA=DIR``,
``--set data.download=true``).

Settings. Widths lost from our copy of the paper are ours: MLPs 512-256, CNN 32/64 channels,
3×3 kernels, fc 128 (``models/vision.py``). Sensitivity
(docs/definitions.md#token-wise-sensitivity): Gaussian noise of std σ = 0.1
(the paper code's value, pixels in [−1, 1]) on one 4×4 patch at a time, all 49 patches, on a
fixed seeded subset of the training set, every epoch; the final models are also measured at
σ = 0.25, 0.5, 1 (A.3). Training stops at the first epoch end with train accuracy ≥ the target,
so the four models are compared at nearly the same accuracy. Both scales train 3 seeds per model.

Verdict: one part per other model, (other − ViT) final sensitivity paired by seed, the three
judged together (Holm); not comparable when the seed-mean train accuracies differ by more than
0.03.

* paper scale: full training set (60,000), ViT-small with the CIFAR-10 script's defaults
  (``cifar_sens.py``: dim 64, depth 8, 32 heads of 64, MLP 512, dropout 0.1; patch 4), target
  0.95, at most 50 epochs (also that script's default), sensitivity on 2,000 training images × 5
  draws. The paper sets Fashion-MNIST's own ViT depth, heads and MLP width; those values are
  lost from our copy and no Fashion-MNIST code is public, so these sizes and the epoch cap are
  ours.
* CPU scale: a seeded 5,000-image training subset, ViT depth 2 with 4 heads of 16 and MLP 128,
  CNN with 16/32 channels and fc 64, target 0.80 (the sigmoid MLP and the CNN at lr 0.005 learn
  slowly), at most 25 epochs, sensitivity on 200 training images × 1 draw, train
  accuracy on 2,000 fixed training images.

Scale ladder (``senslab run fashion_mnist --scale ladder``; docs/definitions.md#scale-ladders),
3 seeds per model on every rung, the same verdict rule on every rung; ``size`` is the number of
training images:

1. ``cpu``: the CPU scale (5,000 images, stop at 80% train accuracy, at most 25 epochs).
2. ``full-data``: the same small models and learning rates on all 60,000 training images, to
   85% train accuracy (at most 12 epochs): more data and a model trained further, both towards
   the paper (60,000 images, 95%). Twelve times the steps per epoch let the CNN at lr 0.005
   reach the higher target.
3. ``paper`` (GPU): the paper scale itself (``--scale paper``).

The paper-scale ViT with patch 4 (50 tokens) is not a CPU rung: about 40 ms per training image
on one core, about an hour per seed even on 5,000 images.
"""

from __future__ import annotations

from ..base import Run, Rung, fit_runs, register_experiment
from ._comparison import ComparisonSettings, VisionComparison, comparison_common

#: SGD learning rates of docs/definitions.md#fashion_mnist / the paper's Appendix D
LRS = {"vit_small": 0.1, "cnn": 0.005, "mlp": 0.1, "mlp_sigmoid": 0.5}


@register_experiment("fashion_mnist")
class FashionMNIST(VisionComparison):
    paper = "Transformers Learn Low Sensitivity Functions (ICLR 2025), §5 / Fig. 5"
    claim = ("Fashion-MNIST: ViT-small, 3-layer CNN, MLP (LeakyReLU) and MLP (sigmoid) trained "
             "with SGD at the paper's learning rates: the ViT has the lowest sensitivity.")
    cpu_scale_note = ("seeded 5,000-image training subset, ViT depth 2 with 4 heads of 16 and MLP "
                      "128 (paper code: depth 8, 32 heads of 64, MLP 512), CNN 16/32 channels "
                      "and fc 64, stop at 80% train accuracy (≤ 25 epochs: the sigmoid MLP and "
                      "the CNN at lr 0.005 learn slowly), sensitivity on 200 training images × "
                      "1 draw; same SGD, learning rates, batch 100, patch 4 and σ = 0.1 as the "
                      "paper.")
    requires = ("Fashion-MNIST's four idx-gz files in $SENSLAB_DATA/fashion_mnist (found "
                "automatically: SENSLAB_DATA=DIR), or anywhere with "
                "--set data.root=DIR.")
    scales = {
        "cpu": ComparisonSettings(target=0.80, epochs=25, train_subset=5000, track_examples=200,
                                  repeats=1, eval_examples=2000, small=True),
        "paper": ComparisonSettings(target=0.95, epochs=50, track_examples=2000, repeats=5),
    }
    ladder = (
        Rung("cpu", "cpu", size=5000, note="5,000 training images, stop at 80%"),
        Rung("full-data", "cpu", ("train_subset=none", "target=0.85", "epochs=12"), size=60000,
             note="the same small models on all 60,000 training images, to 85%"),
        Rung("paper", "paper", size=60000, cpu=False,
             note="the paper scale: the paper code's ViT-small, 60,000 images, to 95%"),
    )

    def runs(self, s: ComparisonSettings) -> list[Run]:
        common = ["data.name=fashion_mnist", "train.batch_size=100", "optim.name=sgd",
                  *comparison_common(s)]
        vit = ["model.overrides.patch_size=4"]
        cnn = ["model.overrides.sens_patch=4"]
        if s.small:
            vit += ["model.overrides.depth=2", "model.overrides.heads=4",
                    "model.overrides.dim_head=16", "model.overrides.mlp_dim=128"]
            cnn += ["model.overrides.channels=[16, 32]", "model.overrides.hidden=64"]
        models = {
            "vit_small": vit,
            "cnn": cnn,
            "mlp": ["model.overrides.sens_patch=4"],
            "mlp_sigmoid": ["model.overrides.sens_patch=4"],
        }
        models = {k: [f"optim.lr={LRS[k]}", *v] for k, v in models.items()}
        return fit_runs(models, common, s.seeds)
