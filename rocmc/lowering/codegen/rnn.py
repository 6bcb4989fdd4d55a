"""Generated lowering of LSTM/GRU inference: one input projection for every time step, then an
`scf.for` over time carrying one tensor that holds y's rows and the states (see lower_rnn).

- The input projection x @ W_ih^T + b_ih (+ b_hh for the LSTM, whose gates only see the sum) is a
  single linalg.generic over (seq, batch, gates): it has no recurrence, so it is one big matmul.
- Each step computes h @ W_hh^T into an accumulator that starts as b_hh (GRU) or zero (LSTM), then
  one elementwise linalg.generic applies the gate nonlinearities to the packed gate columns (slices
  at offsets k*hidden, torch's order) and writes the new h (and c).
- The trip count is `tensor.dim x, 0`, so a symbolic sequence length needs no recompile.
- Each step computes in f32 whatever the storage type: x and the weights are extended once,
  before the loop, so every matmul accumulates in f32; the carried state is stored in the storage
  type between steps (as torch's half-precision LSTM/GRU keep it), which is also what the results are.
"""

from __future__ import annotations

from ...frontend.graph import TensorType
from ..emitter import Emitter, T, affine_map, tensor_type
from ..registry import lowering

ACC = "f32"


def _sizes_type(sizes, elt) -> str:
    return tensor_type([s if isinstance(s, int) else "?" for s in sizes], elt)


def _dyn(sizes) -> str:
    return ", ".join(str(s) for s in sizes)


def _ext(E: Emitter, v: str, elt: str) -> str:
    return E.cast_scalar(v, elt, ACC)


def _bias_init(E: Emitter, biases: list, sizes: list) -> str:
    """An f32 tensor of `sizes` whose last dim is the sum of the present biases (zeros when none).
    The biases are extended to f32 on their own first: IREE 3.13's CPU backend fails to build a
    broadcast that extends bf16 inside the same generic."""
    biases = [E.convert(b, ACC) for b in biases if b is not None]
    if not biases:
        return E.filled(sizes, ACC, 0.0)
    rank = len(sizes)
    ty = _sizes_type(sizes, ACC)
    maps = [affine_map(rank, [rank - 1])] * len(biases) + [affine_map(rank, range(rank))]

    def body(E, a):
        acc = a[0]
        for v in a[1 : len(biases)]:
            acc = E.op(f"arith.addf {acc}, {v} : {ACC}")
        return [acc]

    return E.generic([(b.name, b.mlir) for b in biases], [(E.empty(sizes, ACC), ty)], maps, ["parallel"] * rank, body)[
        0
    ]


def _matmul_t(E: Emitter, a: str, a_ty: str, a_elt: str, w: T, init: str, init_ty: str, rank: int) -> str:
    """init + a @ w^T over a's last dim, in f32: a is (..., k), w (g, k), init (..., g)."""
    n = rank + 1  # the output's dims, then k
    lead = list(range(rank - 1))
    maps = [affine_map(n, lead + [rank]), affine_map(n, [rank - 1, rank]), affine_map(n, range(rank))]

    def body(E, v):
        p = E.op(f"arith.mulf {_ext(E, v[0], a_elt)}, {_ext(E, v[1], w.mlir_elt)} : {ACC}")
        return [E.op(f"arith.addf {v[2]}, {p} : {ACC}")]

    return E.generic([(a, a_ty), (w.name, w.mlir)], [(init, init_ty)], maps, ["parallel"] * rank + ["reduction"], body)[
        0
    ]


def _sigmoid(E: Emitter, v: str) -> str:
    one = E.const(1.0, ACC)
    e = E.op(f"math.exp {E.op(f'arith.negf {v} : {ACC}')} : {ACC}")
    return E.op(f"arith.divf {one}, {E.op(f'arith.addf {one}, {e} : {ACC}')} : {ACC}")


def _tanh(E: Emitter, v: str) -> str:
    return E.op(f"math.tanh {v} : {ACC}")


def _lstm_cell(E: Emitter, gx, gh, h, c):
    """Gates i, f, g, o (torch's order); gx already holds both biases."""
    i, f, g, o = (E.add(a, b, ACC) for a, b in zip(gx, gh))
    c2 = E.add(E.mul(_sigmoid(E, f), c, ACC), E.mul(_sigmoid(E, i), _tanh(E, g), ACC), ACC)
    return E.mul(_sigmoid(E, o), _tanh(E, c2), ACC), c2


def _gru_cell(E: Emitter, gx, gh, h, c):
    """Gates r, z, n; the n gate sees r * (W_hn h + b_hn), so gh keeps b_hh apart from gx."""
    r = _sigmoid(E, E.add(gx[0], gh[0], ACC))
    z = _sigmoid(E, E.add(gx[1], gh[1], ACC))
    n = _tanh(E, E.add(gx[2], E.mul(r, gh[2], ACC), ACC))
    one = E.const(1.0, ACC)
    keep = E.op(f"arith.subf {one}, {z} : {ACC}")
    return E.add(E.mul(keep, n, ACC), E.mul(z, h, ACC), ACC), None


CELLS = {"lstm": (4, _lstm_cell), "gru": (3, _gru_cell)}


def _initial(E: Emitter, t: T | None, batch, hidden: int) -> str:
    """A (batch, hidden) f32 state from a (1, batch, hidden) operand, or zeros."""
    if t is None:
        return E.filled([batch, hidden], ACC, 0.0)
    ty = _sizes_type([batch, hidden], t.mlir_elt)
    s = E.op(f"tensor.extract_slice {t.name}[0, 0, 0] [1, {_dyn([batch, hidden])}] [1, 1, 1] : {t.mlir} to {ty}")
    return E.convert(
        T(s, TensorType(tuple(d if isinstance(d, int) else "?" for d in (batch, hidden)), t.type.dtype), t.elt), ACC
    ).name


def _gate_columns(E: Emitter, t: str, g: int, batch, hidden: int) -> list:
    """The g (batch, hidden) column blocks of a packed (batch, g*hidden) gate tensor."""
    src = _sizes_type([batch, g * hidden], ACC)
    dst = _sizes_type([batch, hidden], ACC)
    return [
        E.op(f"tensor.extract_slice {t}[0, {k * hidden}] [{_dyn([batch, hidden])}] [1, 1] : {src} to {dst}")
        for k in range(g)
    ]


def _gate_step(E: Emitter, op: str, gx: str, gh: str, h: str, c: str | None, batch, hidden: int):
    """One elementwise pass over (batch, hidden): the new h and c (f32)."""
    g, cell = CELLS[op]
    state_ty = _sizes_type([batch, hidden], ACC)
    states = [h] + ([c] if c is not None else [])
    columns = _gate_columns(E, gx, g, batch, hidden) + _gate_columns(E, gh, g, batch, hidden)
    ins = [(v, state_ty) for v in states + columns]
    outs = [(E.empty([batch, hidden], ACC), state_ty) for _ in states]
    maps = [affine_map(2, [0, 1])] * (len(ins) + len(outs))
    k = len(states)

    def body(E, a):
        hn, cn = cell(E, a[k : k + g], a[k + g : k + 2 * g], a[0], a[1] if c is not None else None)
        return [hn] + ([cn] if c is not None else [])

    res = E.generic(ins, outs, maps, ["parallel", "parallel"], body)
    return res[0], (res[1] if c is not None else None)


def _put_row(E: Emitter, rows: str, rows_ty: str, row, v: str, batch, hidden: int, dtype) -> str:
    """Row block `row` (batch rows) of a (n*batch, hidden) tensor of `dtype` = v, a (batch, hidden)
    f32 tensor rounded to `dtype`."""
    v = _to_storage(E, v, [batch, hidden], dtype)
    return E.op(
        f"tensor.insert_slice {v} into {rows}[{E.muli(row, batch)}, 0] [{_dyn([batch, hidden])}] [1, 1] : "
        f"{_sizes_type([batch, hidden], dtype.mlir)} into {rows_ty}"
    )


def _get_row(E: Emitter, rows: str, rows_ty: str, row, batch, width: int, dtype=None) -> str:
    """Row block `row` of a (n*batch, width) tensor, as f32."""
    elt = dtype.mlir if dtype is not None else ACC
    v = E.op(
        f"tensor.extract_slice {rows}[{E.muli(row, batch)}, 0] [{_dyn([batch, width])}] [1, 1] : "
        f"{rows_ty} to {_sizes_type([batch, width], elt)}"
    )
    if elt == ACC:
        return v
    shape = tuple(d if isinstance(d, int) else "?" for d in (batch, width))
    return E.convert(T(v, TensorType(shape, dtype)), ACC).name


def _projection(E: Emitter, op: str, x: T, w_ih: T, b_ih, b_hh, sizes) -> tuple:
    """x @ W_ih^T + biases for every step at once (seq, batch, gates) f32; the LSTM's gates only
    see b_ih + b_hh, the GRU keeps b_hh for its n gate. Operands are extended to f32 first: f16 x f16
    -> f32 and f32 x f16 matmuls with two dynamic dims crash IREE 3.13's AMDGPU instruction
    selector ("Cannot select f32 -1")."""
    ty = _sizes_type(sizes, ACC)
    x32, w32 = E.convert(x, ACC), E.convert(w_ih, ACC)
    init = _bias_init(E, [b_ih, b_hh] if op == "lstm" else [b_ih], sizes)
    return _matmul_t(E, x32.name, x32.mlir, ACC, w32, init, ty, 3), ty


def _unpack(E: Emitter, node, packed: str, packed_ty: str, seq, batch, hidden: int) -> list:
    """y, h_n[, c_n]: slices of the packed (seq + states, batch, hidden) result."""
    elt = node.inputs[0].dtype.mlir
    outs = []
    for i, out in enumerate(node.outputs):
        first, rows = (0, seq) if i == 0 else (E.addi(seq, i - 1), 1)
        ty = tensor_type(out.shape, elt)
        outs.append(
            T(
                E.op(
                    f"tensor.extract_slice {packed}[{first}, 0, 0] [{_dyn([rows, batch, hidden])}] "
                    f"[1, 1, 1] : {packed_ty} to {ty}"
                ),
                out.type,
            )
        )
    return outs


def _to_storage(E: Emitter, name: str, sizes, dtype) -> str:
    """An f32 tensor of `sizes` rounded to the storage type. The sizes are the ones computed
    before the loop: IREE 3.13 (CPU) miscompiles this conversion when its dynamic sizes are read
    back from the loop's results with tensor.dim."""
    if dtype.mlir == ACC:
        return name
    rank = len(sizes)
    ident = affine_map(rank, range(rank))
    return E.generic(
        [(name, _sizes_type(sizes, ACC))],
        [(E.empty(sizes, dtype.mlir), _sizes_type(sizes, dtype.mlir))],
        [ident, ident],
        ["parallel"] * rank,
        lambda E, a: [E.cast_scalar(a[0], ACC, dtype.mlir)],
    )[0]


def lower_rnn(E: Emitter, node, ins: list, ctx) -> list:
    """The loop carries one tensor of (seq + states) * batch rows in the storage type: y's rows,
    then h (and c), overwritten each step (holding h0 / c0 before the first one, so an empty
    sequence returns them); the loop's result is the op's results, no conversion follows it.
    Everything the loop touches is 2-D with one dynamic dim. Both choices avoid miscompiles of
    IREE 3.13's CPU backend seen with batch and seq both symbolic (later steps read stale states
    when a carried tensor has two dynamic dims, or when a dispatch consumes the loop's result)."""
    op = node.op
    g, _ = CELLS[op]
    x, w_ih, w_hh, b_ih, b_hh, h0 = ins[:6]
    c0 = ins[6] if op == "lstm" else None
    dtype = node.inputs[0].dtype
    seq, batch, _ = E.dims(x)
    hidden = w_hh.shape[1]
    gates = g * hidden
    proj3, proj3_ty = _projection(E, op, x, w_ih, b_ih, b_hh, [seq, batch, gates])
    proj_ty = _sizes_type([E.muli(seq, batch), gates], ACC)
    proj = E.op(f"tensor.collapse_shape {proj3} [[0, 1], [2]] : {proj3_ty} into {proj_ty}")
    w_hh32 = E.convert(w_hh, ACC)
    state_ty, gate_ty = _sizes_type([batch, hidden], ACC), _sizes_type([batch, gates], ACC)
    states = [_initial(E, h0, batch, hidden)] + ([_initial(E, c0, batch, hidden)] if op == "lstm" else [])
    blocks = E.addi(seq, len(states))
    rows_sizes = [E.muli(blocks, batch), hidden]
    rows_ty = _sizes_type(rows_sizes, dtype.mlir)
    rows = E.empty(rows_sizes, dtype.mlir)
    for k, v in enumerate(states):
        rows = _put_row(E, rows, rows_ty, E.addi(seq, k), v, batch, hidden, dtype)
    lo, step, hi = E.index(0), E.index(1), E.as_index(seq)
    t, arg, result = E.fresh("t"), E.fresh("it"), E.fresh("rnn")
    with E.region(f"{result} = scf.for {t} = {lo} to {hi} step {step} iter_args({arg} = {rows}) -> ({rows_ty})"):
        h, c = [_get_row(E, arg, rows_ty, E.addi(seq, k), batch, hidden, dtype) for k in range(len(states))] + [
            None
        ] * (2 - len(states))
        gx = _get_row(E, proj, proj_ty, t, batch, gates)
        # The accumulator is made inside the body, so no step's `outs` is a buffer another step wrote.
        rec_init = _bias_init(E, [b_hh] if op == "gru" else [], [batch, gates])
        gh = _matmul_t(E, h, state_ty, ACC, w_hh32, rec_init, gate_ty, 2)
        new = [v for v in _gate_step(E, op, gx, gh, h, c, batch, hidden) if v is not None]
        out = _put_row(E, arg, rows_ty, t, new[0], batch, hidden, dtype)
        for k, v in enumerate(new):
            out = _put_row(E, out, rows_ty, E.addi(seq, k), v, batch, hidden, dtype)
        E.emit(f"scf.yield {out} : {rows_ty}")
    packed_ty = _sizes_type([blocks, batch, hidden], dtype.mlir)
    packed = E.op(
        f"tensor.expand_shape {result} [[0, 1], [2]] output_shape [{_dyn([blocks, batch, hidden])}] : "
        f"{rows_ty} into {packed_ty}"
    )
    return _unpack(E, node, packed, packed_ty, seq, batch, hidden)


lowering("lstm", "gru")(lower_rnn)
