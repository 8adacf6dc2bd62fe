"""reccl: device-side collectives for GPU inference and training engines.

``reccl.torch`` holds the PyTorch communicator and the ``torch.ops.reccl`` operators; importing
``reccl`` alone does not import torch.
"""

from ._errors import Error

__all__ = ["Error"]
__version__ = "0.1.0"
