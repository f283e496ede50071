"""senslab inside other people's training stacks.

Each module imports its library only when imported itself, so ``import senslab`` never needs
them:

* :mod:`senslab.integrations.torchmetrics` — :class:`TokenSensitivityMetric`, a
  ``torchmetrics.Metric`` whose sum states torchmetrics syncs across processes
  (``pip install 'senslab[lightning]'``);
* :mod:`senslab.integrations.lightning` — :class:`SensitivityCallback`, a Lightning ``Callback``
  that measures a fixed subset every N epochs and logs it through ``pl_module.log``
  (``pip install 'senslab[lightning]'``);
* :mod:`senslab.integrations.hf` — :class:`SensitivityCallback`, a Hugging Face
  ``TrainerCallback`` that measures a fixed subset on every evaluation and logs it through the
  Trainer's own ``log`` (``pip install 'senslab[hf]'``).

docs/integrations.md shows each in a few lines.
"""
