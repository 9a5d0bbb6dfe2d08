"""Building blocks shared by HRM and TRM: casted layers, RoPE (1D, and 2D over a square grid), attention, SwiGLU,
RMSNorm, a depthwise 3x3 convolution over the grid, the post-norm reasoning block (attention, TRM's sequence-axis MLP
or the convolution), and the puzzle-prefixed input embedding.

Parameter names, shapes and initialisation follow the reference HRM (docs/REFERENCE.md, HRM) so
that its checkpoints load unchanged. Weights are stored in fp32 and cast to the
activation dtype in ``forward`` ("casted" layers): the optimizer always sees fp32
master weights while the matmuls run in bf16 where the hardware is fast at it.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

try:  # FlashAttention 3 (Hopper) first, then FlashAttention 2; both are optional CUDA extensions.
    from flash_attn_interface import flash_attn_func  # type: ignore[import-not-found]
except ImportError:
    try:
        from flash_attn import flash_attn_func  # type: ignore[import-not-found]
    except ImportError:
        flash_attn_func = None

CosSin = tuple[torch.Tensor, torch.Tensor]


def trunc_normal_init_(tensor: torch.Tensor, std: float = 1.0, lower: float = -2.0, upper: float = 2.0) -> torch.Tensor:
    """Fill ``tensor`` in place from a normal truncated at ``[lower, upper]`` standard deviations.

    Unlike ``torch.nn.init.trunc_normal_``, the result has standard deviation exactly ``std``:
    the pre-truncation std is scaled up to make up for the mass cut off, as in JAX's
    ``truncated_normal`` initialiser (used by the reference HRM). ``std == 0`` gives zeros.
    """
    with torch.no_grad():
        if std == 0:
            return tensor.zero_()
        sqrt2 = math.sqrt(2)
        a, b = math.erf(lower / sqrt2), math.erf(upper / sqrt2)
        z = (b - a) / 2
        c = (2 * math.pi) ** -0.5
        pdf_u, pdf_l = c * math.exp(-0.5 * lower**2), c * math.exp(-0.5 * upper**2)
        comp_std = std / math.sqrt(1 - (upper * pdf_u - lower * pdf_l) / z - ((pdf_u - pdf_l) / z) ** 2)
        tensor.uniform_(a, b).erfinv_().mul_(sqrt2 * comp_std).clip_(lower * comp_std, upper * comp_std)
    return tensor


class CastedLinear(nn.Module):
    """``y = x W^T (+ b)`` with fp32 weights cast to ``x.dtype``; LeCun truncated-normal init, zero bias.

    Shapes: x ``[..., in_features]`` -> ``[..., out_features]``.
    """

    def __init__(self, in_features: int, out_features: int, bias: bool):
        super().__init__()
        self.weight = nn.Parameter(trunc_normal_init_(torch.empty(out_features, in_features), std=1.0 / math.sqrt(in_features)))
        self.bias = nn.Parameter(torch.zeros(out_features)) if bias else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        bias = self.bias.to(x.dtype) if self.bias is not None else None
        return F.linear(x, self.weight.to(x.dtype), bias)


class CastedEmbedding(nn.Module):
    """Embedding lookup with an fp32 table (``embedding_weight`` [num, dim]) cast to ``cast_to``.

    Shapes: ids ``[...]`` int -> ``[..., dim]`` of ``cast_to``.
    """

    def __init__(self, num_embeddings: int, embedding_dim: int, init_std: float, cast_to: torch.dtype):
        super().__init__()
        self.cast_to = cast_to
        self.embedding_weight = nn.Parameter(trunc_normal_init_(torch.empty(num_embeddings, embedding_dim), std=init_std))

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return F.embedding(ids, self.embedding_weight.to(self.cast_to))


class RotaryEmbedding(nn.Module):
    """GPT-NeoX rotate-half RoPE tables (Su et al., arXiv 2104.09864), fp32, not saved in the state dict.

    ``forward()`` returns ``(cos, sin)``, each ``[max_position_embeddings, dim]`` fp32.
    """

    def __init__(self, dim: int, max_position_embeddings: int, base: float):
        super().__init__()
        inv_freq = 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.float32) / dim))
        freqs = torch.outer(torch.arange(max_position_embeddings, dtype=torch.float32), inv_freq)
        emb = torch.cat((freqs, freqs), dim=-1)
        self.register_buffer("cos_cached", emb.cos(), persistent=False)
        self.register_buffer("sin_cached", emb.sin(), persistent=False)

    def forward(self) -> CosSin:
        return self.cos_cached, self.sin_cached


class RotaryEmbedding2D(nn.Module):
    """2D RoPE over a square grid flattened row-major: the first half of each head's rotary pairs turns with the
    cell's row, the second half with its column (axial 2D RoPE, Heo et al., "Rotary Position Embedding for Vision
    Transformer", arXiv 2403.13298, Sec. 3.2), each axis with 1D RoPE's frequencies over ``dim / 2``. The attention
    score of two cells then depends only on their row and column offsets, so the tables of any side serve the same
    weights. Tables are laid out for :func:`apply_rotary_pos_emb` (rotate-half pairs ``i`` and ``i + dim/2``).

    ``forward(side)`` returns ``(cos, sin)``, each ``[side * side, dim]`` fp32, made for ``side`` on first use and
    kept (none are saved in the state dict); ``dim`` must be a multiple of 4.
    """

    def __init__(self, dim: int, side: int, base: float):
        super().__init__()
        quarter = dim // 4
        inv_freq = 1.0 / (base ** (torch.arange(0, quarter, dtype=torch.float32) * 2 / (dim // 2)))
        self.register_buffer("inv_freq", inv_freq, persistent=False)
        self.tables: dict[tuple[int, torch.device], CosSin] = {}
        self.forward(side)

    def forward(self, side: int) -> CosSin:
        key = (side, self.inv_freq.device)
        if key not in self.tables:
            axis = torch.arange(side, dtype=torch.float32, device=self.inv_freq.device)
            rows, cols = axis.repeat_interleave(side), axis.repeat(side)
            freqs = torch.cat((torch.outer(rows, self.inv_freq), torch.outer(cols, self.inv_freq)), dim=-1)
            emb = torch.cat((freqs, freqs), dim=-1)
            self.tables[key] = (emb.cos(), emb.sin())
        return self.tables[key]


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


def apply_rotary_pos_emb(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Rotate ``q``, ``k`` ``[B, S, H, D]`` by position; the rotation runs in fp32 and returns the input dtype."""
    dtype = q.dtype
    cos, sin = cos.unsqueeze(-2), sin.unsqueeze(-2)
    q32, k32 = q.to(cos.dtype), k.to(cos.dtype)
    q_out = q32 * cos + _rotate_half(q32) * sin
    k_out = k32 * cos + _rotate_half(k32) * sin
    return q_out.to(dtype), k_out.to(dtype)


def flash_attention_usable(device: torch.device, dtype: torch.dtype) -> bool:
    """True when ``flash_attn`` is installed and suits ``device``/``dtype`` (CUDA, fp16 or bf16)."""
    return flash_attn_func is not None and device.type == "cuda" and dtype in (torch.float16, torch.bfloat16)


def attention_backend(device: torch.device, dtype: torch.dtype) -> tuple[str, str]:
    """The attention kernel :class:`Attention` will use on ``device``/``dtype``, and why."""
    if flash_attention_usable(device, dtype):
        return "flash_attn", "flash_attn is installed and the device is CUDA with fp16/bf16"
    if flash_attn_func is None:
        why = "flash_attn not installed"
    elif device.type != "cuda":
        why = f"flash_attn needs CUDA, device is {device.type}"
    else:
        why = f"flash_attn needs fp16/bf16, dtype is {dtype}"
    if sdpa_in_float32(device, dtype):
        return "sdpa", (f"torch scaled_dot_product_attention in float32 ({why}; its CPU kernel is ~3x slower in {dtype}), "
                        f"by its definition up to {SHORT_SEQUENCE} positions")
    return "sdpa", f"torch scaled_dot_product_attention ({why})"


def sdpa_in_float32(device: torch.device, dtype: torch.dtype) -> bool:
    """True where :class:`Attention` runs ``scaled_dot_product_attention`` on fp32 copies of bf16/fp16 q, k, v.

    On a CPU, PyTorch's flash-attention kernel is about 3x slower in bf16 than in fp32 at the recipes'
    shapes (forward and backward, [64, 4, 100, 32]; ``python scripts/benchmark_attention.py``), and the
    fp32 result rounded to bf16 is at least as close to a float64 computation. Same function (the flash
    kernel, or the definition for short sequences: :func:`sdpa`), so only the rounding differs from the bf16 kernel.
    """
    return device.type == "cpu" and dtype in (torch.bfloat16, torch.float16)


# Up to this many positions, attention by its definition on fp32 copies beats the CPU flash kernel on them
# (forward + backward, eager and compiled; python scripts/benchmark_attention.py --shape B,H,S,D): at
# [32, 4, 100, 32] (the maze quickstart) 7.6-11.4 ms against 12.0-14.4 in three measurements, the forward alone
# 2.5 against 3.9 eager (compiled, Inductor turns a forward without grad back into the kernel); at [64, 8, 81, 64]
# 42 against 50. From 196 positions on the flash kernel wins ([32, 4, 196, 32]: 26-29 against
# 25 ms; [4, 8, 900, 64]: 318-339 against 179), and its memory does not grow with S².
SHORT_SEQUENCE = 128


def sdpa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = False,
         enable_gqa: bool = False) -> torch.Tensor:
    """torch's ``scaled_dot_product_attention``, on fp32 copies where :func:`sdpa_in_float32`.

    There, sequences of at most :data:`SHORT_SEQUENCE` positions (non-causal, as many k/v heads as q heads) are
    attended by the definition, ``softmax(q k^T / sqrt(D)) v`` in fp32: the function SDPA computes (Vaswani et
    al. 2017, eq. 1), without the flash kernel's blocking, which costs more than it saves at these lengths.

    Shapes: q ``[B, H, S, D]``, k and v ``[B, H_kv, S, D]`` -> ``[B, H, S, D]`` in ``q.dtype``.
    """
    dtype = q.dtype
    if sdpa_in_float32(q.device, dtype):
        q, k, v = q.float(), k.float(), v.float()
        if q.shape[-2] <= SHORT_SEQUENCE and not causal and k.shape[1] == q.shape[1]:
            scores = torch.matmul(q, k.transpose(-2, -1)) * q.shape[-1] ** -0.5
            return torch.matmul(torch.softmax(scores, dim=-1), v).to(dtype)
    return F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=enable_gqa).to(dtype)


class Attention(nn.Module):
    """Multi-head self-attention without biases or mask (non-causal by default).

    ``qkv_proj`` [(H + 2*H_kv)*D, hidden] and ``o_proj`` [hidden, H*D], as in the reference.
    Shapes: x ``[B, S, hidden]`` -> ``[B, S, hidden]``, in ``x.dtype``. Kernel: flash_attn where
    :func:`flash_attention_usable`, else :func:`sdpa`.
    """

    def __init__(self, hidden_size: int, head_dim: int, num_heads: int, num_key_value_heads: int, causal: bool = False):
        super().__init__()
        self.head_dim, self.num_heads, self.num_key_value_heads = head_dim, num_heads, num_key_value_heads
        self.causal = causal
        self.qkv_proj = CastedLinear(hidden_size, (num_heads + 2 * num_key_value_heads) * head_dim, bias=False)
        self.o_proj = CastedLinear(head_dim * num_heads, hidden_size, bias=False)

    def forward(self, x: torch.Tensor, cos_sin: CosSin | None = None) -> torch.Tensor:
        batch, seq_len, _ = x.shape
        qkv = self.qkv_proj(x).view(batch, seq_len, self.num_heads + 2 * self.num_key_value_heads, self.head_dim)
        q, k, v = qkv.split([self.num_heads, self.num_key_value_heads, self.num_key_value_heads], dim=2)
        if cos_sin is not None:
            cos, sin = cos_sin
            q, k = apply_rotary_pos_emb(q, k, cos[:seq_len], sin[:seq_len])
        if flash_attention_usable(x.device, x.dtype):
            out = flash_attn_func(q, k, v, causal=self.causal)
            out = out[0] if isinstance(out, tuple) else out  # FA3 also returns the log-sum-exp
        else:
            out = sdpa(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), causal=self.causal,
                       enable_gqa=self.num_key_value_heads != self.num_heads).transpose(1, 2)
        return self.o_proj(out.reshape(batch, seq_len, self.num_heads * self.head_dim))


def swiglu_intermediate_size(hidden_size: int, expansion: float) -> int:
    """``round(expansion * hidden * 2/3)`` rounded up to a multiple of 256 (1536 for hidden 512, expansion 4)."""
    inter = round(expansion * hidden_size * 2 / 3)
    return -(inter // -256) * 256


class SwiGLU(nn.Module):
    """SwiGLU MLP (Shazeer, arXiv 2002.05202): ``down(silu(gate) * up)``; ``gate_up_proj`` holds gate first.

    Shapes: x ``[..., hidden]`` -> ``[..., hidden]``.
    """

    def __init__(self, hidden_size: int, expansion: float):
        super().__init__()
        inter = swiglu_intermediate_size(hidden_size, expansion)
        self.gate_up_proj = CastedLinear(hidden_size, 2 * inter, bias=False)
        self.down_proj = CastedLinear(inter, hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.gate_up_proj(x).chunk(2, dim=-1)
        if torch.is_grad_enabled():
            return self.down_proj(F.silu(gate) * up)
        # Without autograd the product may overwrite the projection it came from: the same values, bitwise, with one
        # pass over memory less (a sixth of the SwiGLU's time at test time on a CPU).
        return self.down_proj(F.silu(gate, inplace=True).mul_(up))


def grid_side(seq_len: int) -> int:
    """The side of the square grid a sequence of ``seq_len`` cells flattens, row-major.

    Raises:
        ValueError: ``seq_len`` is not a perfect square.
    """
    side = math.isqrt(seq_len)
    if side * side != seq_len:
        raise ValueError(f"a grid mixer needs a square grid flattened row-major, got a sequence of {seq_len} cells")
    return side


class GridConv(nn.Module):
    """Depthwise 3x3 convolution over the square grid a sequence flattens (each channel mixes its 8 neighbours and
    itself), zero outside the grid; no bias. Its weights do not depend on the grid's size, so one model runs on
    grids of any side: the recurrent 3x3 block of DT-Net (Bansal et al., "End-to-end Algorithm Synthesis with
    Recurrent Networks", arXiv 2202.05826), here depthwise, the channels mixed by the block's SwiGLU as in ConvNeXt
    (Liu et al., arXiv 2201.03545). Weight ``[hidden, 1, 3, 3]`` fp32, truncated normal of std 1/3 (fan-in 9), cast
    to ``x.dtype``.

    Shapes: x ``[B, side * side, hidden]`` -> ``[B, side * side, hidden]``, in ``x.dtype``.
    """

    def __init__(self, hidden_size: int):
        super().__init__()
        self.weight = nn.Parameter(trunc_normal_init_(torch.empty(hidden_size, 1, 3, 3), std=1.0 / 3))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, seq_len, hidden = x.shape
        side = grid_side(seq_len)
        # [B, side, side, D] seen as [B, D, side, side] is channels-last already: no copy on the way in or out.
        grid = x.view(batch, side, side, hidden).permute(0, 3, 1, 2)
        out = F.conv2d(grid, self.weight.to(x.dtype), padding=1, groups=hidden)
        return out.permute(0, 2, 3, 1).reshape(batch, seq_len, hidden)


TOKEN_MIXERS = ("attention", "conv", "conv_attention")


def rms_norm(x: torch.Tensor, eps: float) -> torch.Tensor:
    """Weightless RMSNorm over the last axis, computed in fp32 and returned in ``x.dtype``."""
    x32 = x.to(torch.float32)
    return (x32 * torch.rsqrt(x32.square().mean(-1, keepdim=True) + eps)).to(x.dtype)


class ReasoningBlock(nn.Module):
    """Post-norm block of HRM and TRM: token mixing, then a SwiGLU over the hidden axis.

    Token mixing is self-attention (``self_attn``), ``x = rms(x + attn(x))``; or, when
    ``mlp_t_len`` is given (TRM's ``mlp_t``, an MLP-mixer step), a SwiGLU over the sequence axis
    (``mlp_t``, width computed from ``mlp_t_len`` and ``expansion``) whose residual sum is
    normalised over the sequence axis as well: ``x = rms(x^T + swiglu_t(x^T))^T``; or, with ``mixer="conv"``, a
    depthwise 3x3 convolution over the grid (``conv``, :class:`GridConv`), ``x = rms(x + conv(x))``. Then
    ``x = rms(x + swiglu(x))``. Sources: ``HierarchicalReasoningModel_ACTV1Block`` in the reference HRM's
    ``models/hrm/hrm_act_v1.py`` and ``TinyRecursiveReasoningModel_ACTV1Block`` in TRM's
    ``models/recursive_reasoning/trm.py``; the convolution is this project's (:class:`GridConv`).

    Shapes: x ``[B, S, hidden]`` -> ``[B, S, hidden]``; with ``mlp_t``, ``S`` must be ``mlp_t_len``; with the
    convolution, ``S`` is a square grid's cells.
    """

    def __init__(self, hidden_size: int, num_heads: int, expansion: float, rms_norm_eps: float, causal: bool = False,
                 mlp_t_len: int | None = None, mixer: str = "attention"):
        super().__init__()
        self.use_mlp_t = mlp_t_len is not None
        self.use_conv = mixer == "conv"
        if self.use_conv:
            self.conv = GridConv(hidden_size)
        elif not self.use_mlp_t:
            self.self_attn = Attention(hidden_size, hidden_size // num_heads, num_heads, num_heads, causal=causal)
        else:
            self.mlp_t = SwiGLU(mlp_t_len, expansion)
        self.mlp = SwiGLU(hidden_size, expansion)
        self.eps = rms_norm_eps

    def forward(self, x: torch.Tensor, cos_sin: CosSin | None) -> torch.Tensor:
        if self.use_conv:
            x = rms_norm(x + self.conv(x), self.eps)
        elif self.use_mlp_t:
            x_t = x.transpose(1, 2)
            x = rms_norm(x_t + self.mlp_t(x_t), self.eps).transpose(1, 2)
        else:
            x = rms_norm(x + self.self_attn(x, cos_sin=cos_sin), self.eps)
        return rms_norm(x + self.mlp(x), self.eps)


class ReasoningModule(nn.Module):
    """A stack of :class:`ReasoningBlock` that first adds its input injection: ``layers(z + injection)``.

    Shapes: z, injection ``[B, S, hidden]`` -> ``[B, S, hidden]``.
    """

    def __init__(self, layers: list[ReasoningBlock]):
        super().__init__()
        self.layers = nn.ModuleList(layers)

    def forward(self, z: torch.Tensor, injection: torch.Tensor, cos_sin: CosSin | None) -> torch.Tensor:
        z = z + injection
        for layer in self.layers:
            z = layer(z, cos_sin)
        return z


def puzzle_input_embedding(tokens: torch.Tensor, puzzle: torch.Tensor | None, prefix_len: int,
                           positions: torch.Tensor | None, scale: float) -> torch.Tensor:
    """The recursive models' input: token embeddings behind a puzzle-embedding prefix, scaled.

    Args:
        tokens: ``[B, S, D]`` token embeddings.
        puzzle: ``[B, P]`` puzzle embeddings (``P <= prefix_len * D``) or None. The vector fills the
            prefix row-major, so it takes ``ceil(P / D)`` positions; the rest of the prefix is zeros.
        prefix_len: number of prefix positions (0 without a puzzle embedding).
        positions: ``[prefix_len + S, D]`` learned position embeddings or None. They are added as
            ``0.707106781 * (emb + pos)``, which keeps the variance of the sum that of one term.
        scale: the final multiplier, ``sqrt(D)`` in both references.

    Returns:
        ``[B, prefix_len + S, D]`` in ``tokens.dtype``. Source: ``_input_embeddings`` of the reference
        HRM (``models/hrm/hrm_act_v1.py``) and TRM (``models/recursive_reasoning/trm.py``).
    """
    if puzzle is not None:
        batch, dim = tokens.shape[0], tokens.shape[-1]
        pad = prefix_len * dim - puzzle.shape[-1]
        if pad > 0:
            puzzle = F.pad(puzzle, (0, pad))
        tokens = torch.cat((puzzle.view(batch, prefix_len, dim), tokens), dim=-2)
    if positions is not None:
        tokens = 0.707106781 * (tokens + positions.to(tokens.dtype))
    return scale * tokens
