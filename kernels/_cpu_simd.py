"""SIMD vectors for numba: one 64-byte vector of a real dtype (8 float64 or 16 float32) as a value.

numba leaves loops over a handful of lanes scalar (its SLP vectoriser is off by default), so the
compiled engine's batched LU (``batchlu.kernels._cpu_lanes``) does not leave its vector arithmetic
to the auto-vectoriser: :class:`Vec` is a numba type whose LLVM type is ``<W x T>``, and the
functions below are LLVM's vector instructions (a load, a store, ``llvm.fma``, a compare-select,
transposes by shuffles). A ``Vec`` held in a local variable lives in a register, so a tile of
accumulators stays in registers across a loop, as in a hand-written GEMM micro-kernel. On a CPU
without 64-byte vectors LLVM splits each operation into narrower ones, with the same results.

Loads and stores take a 1-D C-contiguous array and the index of the vector's first element; they do
not check bounds. The arithmetic works on each lane alone, so a lane's results do not depend on
what the other lanes hold; only the transposes move numbers between lanes.
"""

from __future__ import annotations

from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic, models, register_model

__all__ = ["Vec", "lanes", "vabs", "vadd", "vfma", "vfnma", "vload", "vmul", "vsel_gt", "vsplat",
           "vstore", "vsub", "vtranspose", "vtranspose_join", "vtranspose_split"]

VECTOR_BYTES = 64


def lanes(dtype) -> int:
    """Lanes of one vector of the real ``dtype`` (numpy dtype or numba type)."""
    bits = dtype.bitwidth if isinstance(dtype, types.Float) else dtype.itemsize * 8
    return VECTOR_BYTES * 8 // bits


class Vec(types.Type):
    """``lanes(dtype)`` numbers of the real ``dtype`` in one SIMD register."""

    def __init__(self, dtype):
        self.dtype = dtype
        self.width = lanes(dtype)
        super().__init__(name=f"Vec({dtype} x {self.width})")


@register_model(Vec)
class _VecModel(models.PrimitiveModel):
    def __init__(self, dmm, fe_type):
        scalar = dmm.lookup(fe_type.dtype).get_value_type()
        super().__init__(dmm, fe_type, ir.VectorType(scalar, fe_type.width))


def _vec_of(t):
    return isinstance(t, Vec)


def _pointer(context, builder, arrty, arr, idx, vecty):
    """Address of ``arr[idx]`` as a pointer to a vector."""
    ary = context.make_array(arrty)(context, builder, arr)
    ptr = builder.gep(ary.data, [idx])
    return builder.bitcast(ptr, vecty.as_pointer())


@intrinsic
def vload(typingctx, arr, idx):
    """The vector ``arr[idx : idx + W]``."""
    if not (isinstance(arr, types.Array) and arr.ndim == 1 and isinstance(arr.dtype, types.Float)
            and isinstance(idx, types.Integer)):
        return None
    vt = Vec(arr.dtype)

    def codegen(context, builder, sig, args):
        llty = context.get_value_type(vt)
        ptr = _pointer(context, builder, sig.args[0], args[0], args[1], llty)
        return builder.load(ptr, align=arr.dtype.bitwidth // 8)
    return vt(arr, idx), codegen


@intrinsic
def vstore(typingctx, arr, idx, v):
    """``arr[idx : idx + W] = v``."""
    if not (isinstance(arr, types.Array) and arr.ndim == 1 and _vec_of(v) and v.dtype == arr.dtype
            and isinstance(idx, types.Integer)):
        return None

    def codegen(context, builder, sig, args):
        llty = context.get_value_type(sig.args[2])
        ptr = _pointer(context, builder, sig.args[0], args[0], args[1], llty)
        builder.store(args[2], ptr, align=arr.dtype.bitwidth // 8)
        return context.get_dummy_value()
    return types.none(arr, idx, v), codegen


@intrinsic
def vsplat(typingctx, x):
    """Every lane = the scalar ``x`` (a float of the vector's dtype)."""
    if not isinstance(x, types.Float):
        return None
    vt = Vec(x)

    def codegen(context, builder, sig, args):
        llty = context.get_value_type(vt)
        undef = ir.Constant(llty, ir.Undefined)
        one = builder.insert_element(undef, args[0], ir.Constant(ir.IntType(32), 0))
        mask = ir.Constant(ir.VectorType(ir.IntType(32), vt.width), [0] * vt.width)
        return builder.shuffle_vector(one, undef, mask)
    return vt(x), codegen


def _binary(name):
    @intrinsic
    def op(typingctx, a, b):
        if not (_vec_of(a) and a == b):
            return None

        def codegen(context, builder, sig, args):
            return getattr(builder, name)(args[0], args[1])
        return a(a, b), codegen
    return op


vadd = _binary("fadd")
vsub = _binary("fsub")
vmul = _binary("fmul")


def _fma(builder, vt, x, y, z):
    """``x * y + z`` of vectors of type ``vt``, one rounding (``llvm.fma``)."""
    llty = x.type
    fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(llty, [llty] * 3),
                                        f"llvm.fma.v{vt.width}f{vt.dtype.bitwidth}")
    return builder.call(fn, [x, y, z])


@intrinsic
def vfma(typingctx, a, b, c):
    """``a * b + c``, one rounding (``llvm.fma``)."""
    if not (_vec_of(a) and a == b == c):
        return None

    def codegen(context, builder, sig, args):
        return _fma(builder, a, *args)
    return a(a, b, c), codegen


@intrinsic
def vfnma(typingctx, a, b, c):
    """``c - a * b``, one rounding (``llvm.fma`` of ``-a``)."""
    if not (_vec_of(a) and a == b == c):
        return None

    def codegen(context, builder, sig, args):
        return _fma(builder, a, builder.fneg(args[0]), args[1], args[2])
    return a(a, b, c), codegen


@intrinsic
def vabs(typingctx, a):
    """``|a|`` lane by lane (``llvm.fabs``)."""
    if not _vec_of(a):
        return None

    def codegen(context, builder, sig, args):
        llty = args[0].type
        fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(llty, [llty]),
                                            f"llvm.fabs.v{a.width}f{a.dtype.bitwidth}")
        return builder.call(fn, [args[0]])
    return a(a), codegen


@intrinsic
def vsel_gt(typingctx, a, b, x, y):
    """``a > b ? x : y`` lane by lane (``y`` where ``a`` or ``b`` is NaN)."""
    if not (_vec_of(a) and a == b == x == y):
        return None

    def codegen(context, builder, sig, args):
        mask = builder.fcmp_ordered(">", args[0], args[1])
        return builder.select(mask, args[2], args[3])
    return a(a, b, x, y), codegen


def _transpose_in_registers(builder, rows, width):
    """The ``width`` x ``width`` block held as ``rows`` (vectors), transposed: at every scale d =
    1, 2, 4, ... the off-diagonal d x d blocks of each 2d x 2d block swap places."""
    rows = list(rows)
    d = 1
    i32 = ir.IntType(32)
    while d < width:
        low = [j if not j & d else width + j - d for j in range(width)]
        high = [j + d if not j & d else width + j for j in range(width)]
        for i in range(width):
            if i & d:
                continue
            a, b = rows[i], rows[i + d]
            rows[i] = builder.shuffle_vector(a, b, ir.Constant(ir.VectorType(i32, width), low))
            rows[i + d] = builder.shuffle_vector(a, b, ir.Constant(ir.VectorType(i32, width), high))
        d *= 2
    return rows


@intrinsic
def vtranspose(typingctx, dst, dst_idx, dst_stride, src, src_idx, src_stride):
    """Copy a W x W block transposed: vector t of ``src`` (``src[src_idx + t * src_stride :]``)
    becomes lane t of every vector of ``dst`` (``dst[dst_idx + i * dst_stride :]``, i < W)."""
    ok = (isinstance(dst, types.Array) and isinstance(src, types.Array) and dst.ndim == src.ndim == 1
          and isinstance(dst.dtype, types.Float) and dst.dtype == src.dtype
          and all(isinstance(x, types.Integer) for x in (dst_idx, dst_stride, src_idx, src_stride)))
    if not ok:
        return None
    vt = Vec(dst.dtype)
    width = vt.width
    align = dst.dtype.bitwidth // 8

    def codegen(context, builder, sig, args):
        dst_v, dst_i, dst_s, src_v, src_i, src_s = args
        llty = context.get_value_type(vt)
        i64 = ir.IntType(64)
        dst_i, dst_s, src_i, src_s = (context.cast(builder, v, t, types.int64)
                                      for v, t in zip((dst_i, dst_s, src_i, src_s),
                                                      (sig.args[1], sig.args[2], sig.args[4], sig.args[5])))
        rows = []
        for t in range(width):
            idx = builder.add(src_i, builder.mul(src_s, ir.Constant(i64, t)))
            rows.append(builder.load(_pointer(context, builder, sig.args[3], src_v, idx, llty), align=align))
        rows = _transpose_in_registers(builder, rows, width)
        for t in range(width):
            idx = builder.add(dst_i, builder.mul(dst_s, ir.Constant(i64, t)))
            builder.store(rows[t], _pointer(context, builder, sig.args[0], dst_v, idx, llty), align=align)
        return context.get_dummy_value()
    return types.none(dst, dst_idx, dst_stride, src, src_idx, src_stride), codegen


def _complex_args(dst, src):
    return (isinstance(dst, types.Array) and isinstance(src, types.Array) and dst.ndim == src.ndim == 1
            and isinstance(dst.dtype, types.Float) and dst.dtype == src.dtype)


def _as_i64(context, builder, sig, args, positions):
    return [context.cast(builder, args[p], sig.args[p], types.int64) for p in positions]


@intrinsic
def vtranspose_split(typingctx, dre, dim, dst_idx, dst_stride, src, src_idx, src_stride):
    """:func:`vtranspose` of complex numbers stored as (re, im) pairs in ``src`` (W complex numbers,
    two vectors, from ``src[src_idx + t * src_stride]``), split: the real parts go to ``dre``, the
    imaginary parts to ``dim``, each transposed as :func:`vtranspose` does."""
    if not (_complex_args(dre, src) and dre == dim):
        return None
    vt = Vec(dre.dtype)
    width = vt.width
    align = dre.dtype.bitwidth // 8

    def codegen(context, builder, sig, args):
        llty = context.get_value_type(vt)
        i32, i64 = ir.IntType(32), ir.IntType(64)
        dst_i, dst_s, src_i, src_s = _as_i64(context, builder, sig, args, (2, 3, 5, 6))
        even = ir.Constant(ir.VectorType(i32, width), [2 * j for j in range(width)])
        odd = ir.Constant(ir.VectorType(i32, width), [2 * j + 1 for j in range(width)])
        re, im = [], []
        for t in range(width):
            idx = builder.add(src_i, builder.mul(src_s, ir.Constant(i64, t)))
            lo = builder.load(_pointer(context, builder, sig.args[4], args[4], idx, llty), align=align)
            idx = builder.add(idx, ir.Constant(i64, width))
            hi = builder.load(_pointer(context, builder, sig.args[4], args[4], idx, llty), align=align)
            re.append(builder.shuffle_vector(lo, hi, even))
            im.append(builder.shuffle_vector(lo, hi, odd))
        for rows, pos in ((_transpose_in_registers(builder, re, width), 0),
                          (_transpose_in_registers(builder, im, width), 1)):
            for t in range(width):
                idx = builder.add(dst_i, builder.mul(dst_s, ir.Constant(i64, t)))
                builder.store(rows[t], _pointer(context, builder, sig.args[pos], args[pos], idx, llty),
                              align=align)
        return context.get_dummy_value()
    return types.none(dre, dim, dst_idx, dst_stride, src, src_idx, src_stride), codegen


@intrinsic
def vtranspose_join(typingctx, dst, dst_idx, dst_stride, sre, sim, src_idx, src_stride):
    """The inverse of :func:`vtranspose_split`: real parts from ``sre`` and imaginary parts from
    ``sim`` (vector t at ``src_idx + t * src_stride``), transposed, written as (re, im) pairs, W
    complex numbers from ``dst[dst_idx + i * dst_stride]``."""
    if not (_complex_args(dst, sre) and sre == sim):
        return None
    vt = Vec(dst.dtype)
    width = vt.width
    align = dst.dtype.bitwidth // 8

    def codegen(context, builder, sig, args):
        llty = context.get_value_type(vt)
        i32, i64 = ir.IntType(32), ir.IntType(64)
        dst_i, dst_s, src_i, src_s = _as_i64(context, builder, sig, args, (1, 2, 5, 6))
        half = width // 2
        low = ir.Constant(ir.VectorType(i32, width), [j // 2 + (width if j % 2 else 0) for j in range(width)])
        high = ir.Constant(ir.VectorType(i32, width),
                           [half + j // 2 + (width if j % 2 else 0) for j in range(width)])
        parts = []
        for pos in (3, 4):
            rows = []
            for t in range(width):
                idx = builder.add(src_i, builder.mul(src_s, ir.Constant(i64, t)))
                rows.append(builder.load(_pointer(context, builder, sig.args[pos], args[pos], idx, llty),
                                         align=align))
            parts.append(_transpose_in_registers(builder, rows, width))
        for t in range(width):
            idx = builder.add(dst_i, builder.mul(dst_s, ir.Constant(i64, t)))
            builder.store(builder.shuffle_vector(parts[0][t], parts[1][t], low),
                          _pointer(context, builder, sig.args[0], args[0], idx, llty), align=align)
            idx = builder.add(idx, ir.Constant(i64, width))
            builder.store(builder.shuffle_vector(parts[0][t], parts[1][t], high),
                          _pointer(context, builder, sig.args[0], args[0], idx, llty), align=align)
        return context.get_dummy_value()
    return types.none(dst, dst_idx, dst_stride, sre, sim, src_idx, src_stride), codegen
