"""fk-agentd real-GPU check: a GELU with deliberately wrong numerics (scaled by 1.5).

The bench must report INCORRECT_NUMERICAL; fk-agentd must not count it as a winner.
"""

import torch
import torch.nn as nn


class GELU(nn.Module):
    def __init__(self, approximate: str = "none"):
        super().__init__()
        self.approximate = approximate

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.gelu(x, approximate=self.approximate) * 1.5
