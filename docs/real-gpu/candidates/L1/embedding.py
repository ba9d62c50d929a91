"""fk-agentd real-GPU check: a candidate with a syntax error.

The bench itself reports this as SKIPPED "no candidate class found" and exits 0; fk-agentd's
import check and gate must call it a failure.
"""

import torch.nn as nn


class Embedding(nn.Module)
    def forward(self, input_ids):
        return input_ids
