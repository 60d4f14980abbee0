"""PyTorch exports for ``zoo_bench.py`` (issue 27): the graphs a user's ``torch.onnx.export`` writes, which
differ from the hand-built ones of ``zoo_mobile.py`` (Clip with its bounds as inputs, Split and the
Reshape/Transpose channel shuffle, ``mean([2, 3])`` as ReduceMean, GELU as five erf nodes, attention's packed
in-projection picked apart by Gather).  Only when torch is installed (``pip install torch``); the networks are
written here torchvision's way (no torchvision needed), random weights, BatchNorm statistics varied so that
folding them is not a no-op, eval mode, the TorchScript exporter (``dynamo=False``), opset 17:

* ``torch_mobilenetv2``: MobileNetV2 1.0 at 224 (ReLU6, inverted residuals);
* ``torch_resnet18``: ResNet-18 at 224;
* ``torch_shufflenetv2``: ShuffleNetV2 x1.0 at 224 (chunk, channel shuffle, ``mean([2, 3])``);
* ``torch_squeezenet11``: SqueezeNet 1.1 at 224 (ceil-mode max pools, Fire concatenations);
* ``torch_encoder``: ``nn.TransformerEncoder``, 4 layers, width 256, 4 heads, FFN 1024 with GELU, 128 tokens.

Each export is cached by name in the temporary directory (``RPCSRV_TORCH_ZOO`` overrides it).
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

MODELS = ("torch_mobilenetv2", "torch_resnet18", "torch_shufflenetv2", "torch_squeezenet11", "torch_encoder")


def available() -> bool:
    try:
        import torch  # noqa: F401
    except ImportError:
        return False
    return True


def _nets():
    import torch
    from torch import nn
    from torch.nn import functional as F

    def cbr(i, o, k=3, s=1, g=1, act=nn.ReLU6):
        return nn.Sequential(nn.Conv2d(i, o, k, s, (k - 1) // 2, groups=g, bias=False), nn.BatchNorm2d(o),
                             act(inplace=True) if act else nn.Identity())

    class InvertedResidual(nn.Module):
        def __init__(self, i, o, stride, t):
            super().__init__()
            h, self.res = i * t, stride == 1 and i == o
            layers = [] if t == 1 else [cbr(i, h, 1)]
            self.body = nn.Sequential(*layers, cbr(h, h, 3, stride, h), nn.Conv2d(h, o, 1, bias=False),
                                      nn.BatchNorm2d(o))

        def forward(self, x):
            return x + self.body(x) if self.res else self.body(x)

    class MobileNetV2(nn.Module):
        def __init__(self):
            super().__init__()
            layers, i = [cbr(3, 32, 3, 2)], 32
            for t, c, n, s in ((1, 16, 1, 1), (6, 24, 2, 2), (6, 32, 3, 2), (6, 64, 4, 2), (6, 96, 3, 1),
                               (6, 160, 3, 2), (6, 320, 1, 1)):
                for k in range(n):
                    layers.append(InvertedResidual(i, c, s if k == 0 else 1, t))
                    i = c
            self.features = nn.Sequential(*layers, cbr(i, 1280, 1))
            self.classifier = nn.Sequential(nn.Dropout(0.2), nn.Linear(1280, 1000))

        def forward(self, x):
            return self.classifier(torch.flatten(F.adaptive_avg_pool2d(self.features(x), 1), 1))

    class Basic(nn.Module):
        def __init__(self, i, o, stride):
            super().__init__()
            self.a, self.b = cbr(i, o, 3, stride, act=nn.ReLU), cbr(o, o, 3, 1, act=None)
            self.down = None if stride == 1 and i == o else nn.Sequential(nn.Conv2d(i, o, 1, stride, bias=False),
                                                                          nn.BatchNorm2d(o))

        def forward(self, x):
            return F.relu(self.b(self.a(x)) + (x if self.down is None else self.down(x)))

    class ResNet18(nn.Module):
        def __init__(self):
            super().__init__()
            layers, i = [cbr(3, 64, 7, 2, act=nn.ReLU), nn.MaxPool2d(3, 2, 1)], 64
            for o, s in ((64, 1), (64, 1), (128, 2), (128, 1), (256, 2), (256, 1), (512, 2), (512, 1)):
                layers.append(Basic(i, o, s))
                i = o
            self.features, self.fc = nn.Sequential(*layers), nn.Linear(512, 1000)

        def forward(self, x):
            return self.fc(torch.flatten(F.adaptive_avg_pool2d(self.features(x), 1), 1))

    class ShuffleBlock(nn.Module):
        def __init__(self, i, o, stride):
            super().__init__()
            self.stride, b = stride, o // 2
            if stride > 1:
                self.branch1 = nn.Sequential(cbr(i, i, 3, stride, i, act=None), cbr(i, b, 1, act=nn.ReLU))
            self.branch2 = nn.Sequential(cbr(i if stride > 1 else b, b, 1, act=nn.ReLU),
                                         cbr(b, b, 3, stride, b, act=None), cbr(b, b, 1, act=nn.ReLU))

        def forward(self, x):
            if self.stride == 1:
                x1, x2 = x.chunk(2, dim=1)
                out = torch.cat((x1, self.branch2(x2)), 1)
            else:
                out = torch.cat((self.branch1(x), self.branch2(x)), 1)
            n, c, h, w = out.shape
            return out.view(n, 2, c // 2, h, w).transpose(1, 2).contiguous().view(n, c, h, w)

    class ShuffleNetV2(nn.Module):
        def __init__(self):
            super().__init__()
            layers, i = [cbr(3, 24, 3, 2, act=nn.ReLU), nn.MaxPool2d(3, 2, 1)], 24
            for o, n in ((116, 4), (232, 8), (464, 4)):
                for k in range(n):
                    layers.append(ShuffleBlock(i, o, 2 if k == 0 else 1))
                    i = o
            self.features, self.fc = nn.Sequential(*layers, cbr(i, 1024, 1, act=nn.ReLU)), nn.Linear(1024, 1000)

        def forward(self, x):
            return self.fc(self.features(x).mean([2, 3]))

    class Fire(nn.Module):
        def __init__(self, i, s, e):
            super().__init__()
            self.squeeze, self.e1, self.e3 = nn.Conv2d(i, s, 1), nn.Conv2d(s, e, 1), nn.Conv2d(s, e, 3, padding=1)

        def forward(self, x):
            x = F.relu(self.squeeze(x))
            return torch.cat([F.relu(self.e1(x)), F.relu(self.e3(x))], 1)

    class SqueezeNet11(nn.Module):
        def __init__(self):
            super().__init__()
            pool = nn.MaxPool2d(3, 2, ceil_mode=True)
            self.features = nn.Sequential(nn.Conv2d(3, 64, 3, 2), nn.ReLU(), pool, Fire(64, 16, 64), Fire(128, 16, 64),
                                          pool, Fire(128, 32, 128), Fire(256, 32, 128), pool, Fire(256, 48, 192),
                                          Fire(384, 48, 192), Fire(384, 64, 256), Fire(512, 64, 256))
            self.classifier = nn.Sequential(nn.Dropout(0.5), nn.Conv2d(512, 1000, 1), nn.ReLU(),
                                            nn.AdaptiveAvgPool2d(1))

        def forward(self, x):
            return torch.flatten(self.classifier(self.features(x)), 1)

    class Encoder(nn.Module):
        def __init__(self):
            super().__init__()
            layer = nn.TransformerEncoderLayer(256, 4, 1024, dropout=0.0, batch_first=True, activation="gelu")
            self.encoder = nn.TransformerEncoder(layer, 4, enable_nested_tensor=False)

        def forward(self, x):
            return self.encoder(x)

    image = (1, 3, 224, 224)
    return {"torch_mobilenetv2": (MobileNetV2, image), "torch_resnet18": (ResNet18, image),
            "torch_shufflenetv2": (ShuffleNetV2, image), "torch_squeezenet11": (SqueezeNet11, image),
            "torch_encoder": (Encoder, (1, 128, 256))}


def export(name: str) -> Path:
    """The ONNX file of model ``name`` (exported once, then cached: a cached file needs no torch)."""
    folder = Path(os.environ.get("RPCSRV_TORCH_ZOO") or Path(tempfile.gettempdir()) / "rpcsrv-torch-zoo")
    path = folder / f"{name}.onnx"
    if path.exists():
        return path
    import torch

    folder.mkdir(parents=True, exist_ok=True)
    cls, shape = _nets()[name]
    torch.manual_seed(0)
    net = cls().eval()
    with torch.no_grad():
        for mod in net.modules():
            if isinstance(mod, torch.nn.BatchNorm2d):
                mod.running_mean.uniform_(-0.1, 0.1)
                mod.running_var.uniform_(0.5, 1.5)
                mod.weight.uniform_(0.5, 1.5)
                mod.bias.uniform_(-0.1, 0.1)
    part = path.with_suffix(".part")
    torch.onnx.export(net, torch.randn(*shape), str(part), dynamo=False, opset_version=17,
                      input_names=["input"], output_names=["output"])
    part.replace(path)
    return path


def load(name: str):
    import onnx

    return onnx.load(str(export(name)))


BUILDERS = {name: (lambda n=name: load(n)) for name in MODELS}
