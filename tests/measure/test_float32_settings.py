"""float32 means IEEE float32: where PyTorch's settings would run a model's float32 forwards on
a GPU in TF32 (cuDNN convolutions do by default) or bf16, the decisions reported as float32's
(``precision="float32"``, ``"bf16-checked"``'s re-checks) would not be, and the metric says so.
PyTorch's settings are global, so these tests replace the settings objects for their duration
(``monkeypatch``) rather than change them."""

from __future__ import annotations

import warnings
from types import SimpleNamespace

import pytest
import torch
from torch import nn

from senslab.measure import TokenSensitivity
from senslab.measure._precision import reduced_float32
from senslab.measure.tokenwise import _warn_reduced_float32
from senslab.tokens import Patches

CUDA = torch.device("cuda")  # reduced_float32 reads settings only: no GPU is needed


def conv_model() -> nn.Module:
    return nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.Flatten(), nn.Linear(4 * 8 * 8, 3))


@pytest.fixture
def settings(monkeypatch):
    """Settings objects of the new API (PyTorch ≥ 2.9), all IEEE float32 unless a test says."""
    objs = {name: SimpleNamespace(fp32_precision="none")
            for name in ("matmul", "cuda", "conv", "rnn", "cudnn", "backends")}
    objs["cuda"].matmul = objs["matmul"]
    objs["cudnn"].conv, objs["cudnn"].rnn = objs["conv"], objs["rnn"]
    monkeypatch.setattr(torch.backends, "cuda", objs["cuda"])
    monkeypatch.setattr(torch.backends, "cudnn", objs["cudnn"])
    monkeypatch.setattr(torch.backends, "fp32_precision", "none", raising=False)
    return objs


def test_default_tf32_convolutions_are_named(settings):
    settings["conv"].fp32_precision = "tf32"  # PyTorch's default for cuDNN convolutions
    found = reduced_float32(conv_model(), CUDA)
    assert found == ["convolutions in tf32 (set torch.backends.cudnn.conv.fp32_precision "
                     "= 'ieee')"]
    assert reduced_float32(nn.Linear(4, 2), CUDA) == []  # no convolution: nothing to say
    assert reduced_float32(conv_model(), torch.device("cpu")) == []
    settings["conv"].fp32_precision = "ieee"
    assert reduced_float32(conv_model(), CUDA) == []


def test_a_setting_left_at_none_defers_to_the_broader_one(settings, monkeypatch):
    monkeypatch.setattr(torch.backends, "fp32_precision", "tf32", raising=False)
    found = reduced_float32(nn.LSTM(4, 4), CUDA)
    assert [f.split(" (")[0] for f in found] == ["matrix products in tf32",
                                                 "recurrent layers in tf32"]
    settings["cudnn"].fp32_precision = "ieee"  # nearer than the global one
    settings["matmul"].fp32_precision = "bf16"
    assert [f.split(" (")[0] for f in reduced_float32(nn.LSTM(4, 4), CUDA)] == [
        "matrix products in bf16"]


def test_older_releases_are_read_from_allow_tf32(monkeypatch):
    monkeypatch.setattr(torch.backends, "cuda", SimpleNamespace(
        matmul=SimpleNamespace(allow_tf32=False)))
    monkeypatch.setattr(torch.backends, "cudnn", SimpleNamespace(allow_tf32=True))
    assert reduced_float32(conv_model(), CUDA) == [
        "convolutions in tf32 (set torch.backends.cudnn.allow_tf32 = False)"]


def test_settings_that_cannot_be_read_are_named_too(settings):
    class Mixed:  # PyTorch refuses to read a mix of its legacy and new settings
        @property
        def fp32_precision(self):
            raise RuntimeError("mix of the legacy and new APIs")

    settings["cuda"].matmul = Mixed()
    assert reduced_float32(nn.Linear(4, 2), CUDA)[0].startswith(
        "matrix products in an undetermined reduced precision")


def test_the_metric_warns_once_and_only_where_float32_is_reduced(settings):
    settings["conv"].fp32_precision = "tf32"
    with pytest.warns(RuntimeWarning, match="convolutions in tf32.*not float32"):
        _warn_reduced_float32(conv_model(), CUDA)
    x = torch.randn(2, 3, 8, 8, generator=torch.Generator().manual_seed(0))
    m = TokenSensitivity(conv_model().eval(), Patches(4), sigma=1.0, generator=0)
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)  # on a CPU the settings do not apply
        m.update(x)
    assert m._float32_checked
