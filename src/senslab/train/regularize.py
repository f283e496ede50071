r"""Sensitivity regularization (main paper §7;
docs/definitions.md#regularization).

Two ways to push a vision model towards low sensitivity:

* **Augmentation** — :func:`gaussian_noise_augment`: train on :math:`x + \varepsilon`,
  :math:`\varepsilon \sim \mathcal N(0, \sigma^2 I)`, with the labels of :math:`x`.
* **Regularizer** — :func:`sensitivity_regularized_loss`:

  .. math::

      \mathcal L = (1-\alpha)\,\mathrm{CE}\big(f(x), y\big)
                 + \alpha\,\mathrm{MSE}\big(f(\tilde x), f(x)\big),

  where :math:`\tilde x` (:func:`random_patch_noise`) is :math:`x` with Gaussian noise of std
  :math:`\sigma` added to **one** contiguous :math:`p\times p` patch per example (all channels),
  the patch drawn uniformly and independently for every example from the same grid that
  :class:`senslab.tokens.Patches` uses. Paper code: :math:`\sigma = 1`, :math:`\alpha = 0.5`. (The
  paper code shared one set of perturbed pixels across the whole batch — a defect not copied.)

The noise functions take a ``torch.Generator`` that the caller keeps across steps; an int seed is
refused because re-seeding every step would add the *same* noise at every step.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..tokens import Patches
from ..tokens.base import call_model


def _check_generator(generator: object) -> torch.Generator:
    if not isinstance(generator, torch.Generator):
        raise TypeError(
            f"generator must be a torch.Generator kept across training steps, got "
            f"{type(generator).__name__}; an int seed would repeat the same noise every step — "
            "create one with torch.Generator(device=x.device).manual_seed(seed)"
        )
    return generator


def _check_sigma(sigma: float) -> None:
    if not (isinstance(sigma, (int, float)) and math.isfinite(sigma) and sigma >= 0):
        raise ValueError(f"sigma is a noise standard deviation and must be >= 0, got {sigma!r}")


def _check_float(x: Tensor, what: str) -> None:
    if not isinstance(x, Tensor) or not x.is_floating_point():
        kind = x.dtype if isinstance(x, Tensor) else type(x).__name__
        raise TypeError(
            f"{what} must be a floating-point tensor, got {kind}; convert with .float()"
        )


def _randn_like(x: Tensor, shape: tuple[int, ...], generator: torch.Generator) -> Tensor:
    """Standard normals drawn on the generator's device, returned on x's device and dtype."""
    noise = torch.randn(shape, generator=generator, device=generator.device, dtype=torch.float32)
    return noise.to(device=x.device, dtype=x.dtype)


def gaussian_noise_augment(x: Tensor, sigma: float, generator: torch.Generator) -> Tensor:
    r""":math:`x + \varepsilon`, :math:`\varepsilon \sim \mathcal N(0, \sigma^2 I)` on every entry;
    the labels of ``x`` stay as they are. ``sigma`` is a standard deviation in the units of ``x``
    (senslab's images are normalised to [−1, 1]). ``x`` itself is not modified."""
    _check_float(x, "x")
    _check_sigma(sigma)
    gen = _check_generator(generator)
    return x + sigma * _randn_like(x, tuple(x.shape), gen)


def random_patch_noise(x: Tensor, patch: int, sigma: float, generator: torch.Generator) -> Tensor:
    r"""``x`` (B, C, H, W) with :math:`\mathcal N(0, \sigma^2)` noise added to one random
    ``patch``×``patch`` patch per example (all channels), everything else untouched.

    Patch positions lie on the non-overlapping grid of :class:`senslab.tokens.Patches` (patch
    ``t`` at row ``t // (W/p)``, column ``t % (W/p)``) and are drawn uniformly and independently
    per example. Vectorised: one ``randint`` for the positions, one ``randn`` of shape
    (B, C, p, p) for the noise, one indexed add. ``x`` itself is not modified.
    """
    _check_float(x, "x")
    if x.dim() != 4:
        raise ValueError(
            f"random_patch_noise expects images of shape (batch, channels, height, width), got "
            f"{tuple(x.shape)}; add a channel axis with x.unsqueeze(1) for grayscale images"
        )
    _check_sigma(sigma)
    gen = _check_generator(generator)
    b, c, h, w = x.shape
    gh, gw = Patches(patch).grid(h, w)  # checks that the patch size divides the image
    tok = torch.randint(gh * gw, (b,), generator=gen, device=gen.device).to(x.device)
    noise = sigma * _randn_like(x, (b, c, patch, patch), gen)
    out = x.clone(memory_format=torch.contiguous_format)  # the view below needs this layout
    grid = out.view(b, c, gh, patch, gw, patch)
    rows = torch.arange(b, device=x.device)
    # advanced indices (rows, tok // gw, tok % gw) select a (B, C, p, p) block, one per example
    grid[rows, :, tok // gw, :, tok % gw, :] += noise
    return out


def sensitivity_regularized_loss(
    model: nn.Module,
    x: Tensor,
    y: Tensor,
    *,
    alpha: float = 0.5,
    patch: int = 4,
    sigma: float = 1.0,
    generator: torch.Generator,
) -> tuple[Tensor, dict[str, Tensor]]:
    r"""The regularized training loss :math:`(1-\alpha)\,\mathrm{CE}(f(x), y) + \alpha\,
    \mathrm{MSE}(f(\tilde x), f(x))` with :math:`\tilde x` = :func:`random_patch_noise`.

    Gradients flow through **both** branches, :math:`f(\tilde x)` and :math:`f(x)`, as in the
    paper code (the MSE pulls the clean output towards the noisy one as well as the reverse).
    The two branches are separate forward passes, so a BatchNorm model normalises clean and noisy
    images with their own batch statistics (as the paper code did), not with a mixed batch. The
    MSE is the mean over all logits of the batch (``F.mse_loss`` with ``reduction="mean"``).

    Returns:
        ``(loss, parts)``: the scalar loss to back-propagate and, for logging, detached scalars
        ``parts = {"loss", "ce", "mse"}`` (tensors, so logging needs no device sync until read).

    Example:
        >>> import torch
        >>> model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(16, 3))
        >>> x, y = torch.randn(4, 1, 4, 4), torch.tensor([0, 1, 2, 0])
        >>> g = torch.Generator().manual_seed(0)
        >>> loss, parts = sensitivity_regularized_loss(model, x, y, patch=2, generator=g)
        >>> loss.backward(); sorted(parts)
        ['ce', 'loss', 'mse']
    """
    if not (isinstance(alpha, (int, float)) and 0.0 <= alpha <= 1.0):
        raise ValueError(f"alpha weighs CE against the MSE term and must be in [0, 1], got {alpha}")
    x_noisy = random_patch_noise(x, patch, sigma, generator)
    clean = call_model(model, x)
    noisy = call_model(model, x_noisy)
    ce = F.cross_entropy(clean, y)
    mse = F.mse_loss(noisy, clean)
    loss = (1.0 - alpha) * ce + alpha * mse
    parts = {"loss": loss.detach(), "ce": ce.detach(), "mse": mse.detach()}
    return loss, parts
