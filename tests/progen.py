"""Hypothesis strategies that write random well-formed .epi programs (as text).

A program is one gemm, or a chain of two where the first stores a tile scaled by a random
per-row statistic or LayerNorm (`tmp n`, bf16 or f16, or quantized to i8 or e4m3 as dynamic per-token quantization
does) that the second takes as its A operand; the first may also store a tile quantized with a per-row
statistic (i8, i4, e4m3, e5m2: finished by the row combine kernel, never deferred) and a tile
scaled by a random 1x32 block statistic, through maps that may or may not be linear in it (the
hoist-block-scale pass moves the scale only through the linear ones). Expressions are random trees
over the accumulator, a residual tile, a row vector, a column vector, a scalar and literals,
through element-wise ops that stay finite on normal inputs.
"""
from hypothesis import strategies as st

LEAVES = ["acc", "z", "g", "c", "alpha", "0.5", "2", "1.25"]
UNARY = ["tanh({})", "sigmoid({})", "silu({})", "abs({})", "relu({})", "gelu({})", "gelu_tanh({})",
         "-({})", "({}) ** 2", "exp(tanh({}))", "sqrt(abs({}) + 1)", "f32({})", "bf16({})"]
BINARY = ["({}) + ({})", "({}) - ({})", "({}) * ({})", "max({}, {})", "min({}, {})",
          "({}) / (abs({}) + 1)", "select(({}) > 0, {}, 0.5)"]
QUANTIZED = ["i8", "i4", "e4m3", "e5m2"]
REDUCE = ["row_sum({})", "row_max({})", "row_mean({})", "row_lse({})", "row_min({})"]


@st.composite
def tile_expr(draw, depth=3):
    """An expression that is a tile (it mentions acc or z)."""
    if depth == 0:
        return draw(st.sampled_from(["acc", "z", "acc * g", "z + c", "acc + z"]))
    choice = draw(st.integers(0, 3))
    if choice == 0:
        return draw(st.sampled_from(["acc", "z", "acc + z"]))
    if choice == 1:
        return draw(st.sampled_from(UNARY)).format(draw(tile_expr(depth - 1)))
    a = draw(tile_expr(depth - 1))
    b = draw(st.one_of(tile_expr(depth - 1), st.sampled_from(LEAVES)))
    if draw(st.booleans()):
        a, b = b, a
    return draw(st.sampled_from(BINARY)).format(a, b)


@st.composite
def row_stat(draw):
    """A per-row statistic: a reduction of a tile, then vector math."""
    r = draw(st.sampled_from(REDUCE)).format(draw(tile_expr(1)))
    return draw(st.sampled_from(["{}", "rsqrt(abs({}) + 1)", "1 / (abs({}) + 1)", "tanh({}) + 2", "({}) * c + 3"])).format(r)


@st.composite
def block_stat(draw):
    """A per-block statistic of a tile, then scalar math (positive and finite on normal inputs)."""
    t = draw(tile_expr(1))
    r = draw(st.sampled_from(["block_mean(({t}) * ({t}), 32)", "block_max(abs({t}), 32)", "block_sum(abs({t}), 32)",
                              "block_amax({t}, 32)"])).format(t=t)
    return draw(st.sampled_from(["rsqrt({} + 1)", "1 / ({} + 1)", "{} + 0.5", "sqrt({} + 1) * 2"])).format(r)


BLOCK_FORMS = ["({l}) * ({s})", "({s}) * ({l})", "({l}) / ({s})", "-(({l}) * ({s})) + ({l}) * ({s}) * 2",
               "interleave(even(({l}) * ({s})), -odd(({l}) * ({s})))", "tanh(({l}) * ({s}))",
               "({l}) * ({s}) + ({l})", "g * (({s}) * ({l}) * c)"]


@st.composite
def program(draw):
    lines = ["gemm a(x: bf16[M, D] @ w: bf16[D, D]) {", "  in z: bf16[M, D]", "  in g: bf16[D]",
             "  in c: f32[M]", "  in alpha: f32 = 0.75"]
    for i in range(draw(st.integers(1, 3))):
        dtype = draw(st.sampled_from(["bf16", "f32", "f16"]))
        lines.append(f"  out t{i}: {dtype} = {draw(tile_expr())}")
    if draw(st.booleans()):
        lines.append(f"  out s: f32[M] = {draw(row_stat())}")
    if draw(st.booleans()):
        dtype = draw(st.sampled_from(QUANTIZED))
        lines.append(f"  out p: {dtype} = ({draw(tile_expr(2))}) / ({draw(row_stat())})")
    if draw(st.booleans()):
        form = draw(st.sampled_from(BLOCK_FORMS))
        lines.append(f"  out q: f32 = {form.format(l=draw(tile_expr(1)), s=draw(block_stat()))}")
    chain = draw(st.booleans())
    if chain:
        scale = draw(row_stat())
        local = draw(tile_expr(2))
        form = draw(st.sampled_from(["({l}) * ({s})", "({s}) * ({l})", "({l}) / ({s})", "g * ({s}) * ({l})",
                                     "rmsnorm({l}, g)", "-(({l}) * ({s}))", "(({l}) * ({s})) ** 2",
                                     "layernorm({l}, g, g)", "layernorm({l}, g, 0.5)"]))
        dtype = draw(st.sampled_from(["bf16", "bf16", "f16", "i8", "e4m3"]))
        lines.append(f"  tmp n: {dtype} = {form.format(l=local, s=scale)}")
    lines.append("}")
    if chain:
        lines += [f"gemm b(n @ w2: {dtype}[D, E]) {{", f"  out y: f32 = {draw(st.sampled_from(['acc', 'acc * 2', 'tanh(acc)', 'acc + alpha']))}", "}"]
    return "\n".join(lines) + "\n"
