"""Recurrent layers (RNN, GRU, LSTM) on remote tensors, with per-example gradients.

torch runs ``nn.RNN``/``nn.GRU``/``nn.LSTM`` through fused functions (``_VF.rnn_tanh``,
``_VF.gru``, ``_VF.lstm``) whose CPU decompositions write remote values into a local buffer
or call ``mkldnn_rnn_layer``, and whose weights are never applied by an ``nn.Linear``
module, so the per-example hooks would not see them. This replacement (registered for
remote tensors in ``sdk._remote.losses.OVERRIDES``) unrolls the time steps with ``linear``
and the gates' elementwise ops, and records each weight's per-example gradient as
``nn.Linear``'s is, summed over the time steps.

Unidirectional layers, stacked, with or without biases, with dropout between layers in
training; bidirectional layers, packed sequences and LSTM projections fall back to torch's
code (and are refused on private data).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

from sdk._per_sample import watch_linear
from sdk._remote.losses import OVERRIDES

__all__: list[str] = []


def _linear(x: torch.Tensor, weight: torch.Tensor, bias: Any) -> torch.Tensor:
    """``x W^T + b`` for rows ``x`` ``(N, in)``, with per-example gradients of ``W`` and
    ``b`` (also where ``out`` is local: the first step's ``h0 @ W_hh + b_hh``, whose bias
    still gets each example's gradient)."""
    out = F.linear(x, weight, bias)
    watch_linear(out, x, weight, bias)
    return out


def _cell(
    kind: str, gi: torch.Tensor, gh: torch.Tensor, h: torch.Tensor, c: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """One time step from the input's and the hidden state's projections (torch's gates);
    ``c`` is an LSTM's cell state, passed through by the others."""
    if kind == "rnn_tanh":
        return torch.tanh(gi + gh), c
    if kind == "rnn_relu":
        return torch.relu(gi + gh), c
    if kind == "gru":
        ir, iz, in_ = gi.chunk(3, dim=-1)
        hr, hz, hn = gh.chunk(3, dim=-1)
        r, z = torch.sigmoid(ir + hr), torch.sigmoid(iz + hz)
        n = torch.tanh(in_ + r * hn)
        return (1 - z) * n + z * h, c
    i, f, g, o = (gi + gh).chunk(4, dim=-1)
    c = torch.sigmoid(f) * c + torch.sigmoid(i) * torch.tanh(g)
    return torch.sigmoid(o) * torch.tanh(c), c


def _unrolled(kind: str) -> Any:
    def run(
        input: torch.Tensor,
        hx: Any,
        params: Any,
        has_biases: bool,
        num_layers: int,
        dropout: float,
        train: bool,
        bidirectional: bool,
        batch_first: bool,
    ) -> Any:
        lstm = kind == "lstm"
        h0: torch.Tensor = hx[0] if lstm else hx
        c0: torch.Tensor = hx[1] if lstm else hx  # (unused but by an LSTM)
        if (
            bidirectional
            or not isinstance(input, torch.Tensor)
            or input.dim() != 3
            or h0.shape[-1] != c0.shape[-1]  # an LSTM projection
        ):
            return NotImplemented
        per = 4 if has_biases else 2
        x = input if batch_first else input.transpose(0, 1)  # (N, T, features)
        last_h: list[torch.Tensor] = []
        last_c: list[torch.Tensor] = []
        for layer in range(num_layers):
            w_ih, w_hh, *biases = params[layer * per : (layer + 1) * per]
            b_ih, b_hh = biases if biases else (None, None)
            h, c = h0[layer], c0[layer]
            steps = []
            for t in range(x.shape[1]):
                gi = _linear(x[:, t], w_ih, b_ih)
                gh = _linear(h, w_hh, b_hh)
                h, c = _cell(kind, gi, gh, h, c)
                steps.append(h)
            x = torch.stack(steps, dim=1)
            last_h.append(h)
            last_c.append(c)
            if dropout and train and layer < num_layers - 1:
                x = F.dropout(x, p=dropout)
        output = x if batch_first else x.transpose(0, 1)
        if lstm:
            return output, torch.stack(last_h), torch.stack(last_c)
        return output, torch.stack(last_h)

    return run


for _name in ("rnn_tanh", "rnn_relu", "gru", "lstm"):
    OVERRIDES[getattr(torch._VF, _name)] = _unrolled(_name)
