"""Arithmetic on :data:`LANES` numbers side by side, as one LLVM vector (numba intrinsics).

The compiled engine keeps :data:`LANES` matrices of the batch in every number it touches (entry
``p`` of a block's ``Lx`` is ``lx[p, 0:LANES]``), so its inner loops are the same operation on
``LANES`` contiguous numbers. numba leaves such loops scalar (its SLP vectoriser is off by default);
these intrinsics emit them as LLVM ``<LANES x T>`` loads, ``fmul`` / ``fadd`` / ``fsub`` / ``fdiv``
and stores, which LLVM lowers to the machine's SIMD registers (AVX-512, AVX2 or SSE2 alike).

Each lane gets exactly the operations of the scalar loop it replaces, in the same order (no fused
multiply-add, no reassociation: the vector instructions carry no fast-math flags), so the results
are bit for bit those of the scalar code, and a matrix's numbers do not depend on its neighbours.

Arguments are C-contiguous arrays of one real dtype and flat element offsets (``int64``); the
``LANES`` numbers at an offset must lie inside the array (not checked).
"""

from __future__ import annotations

from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic

LANES = 8


def _vector(context, builder, arrty, arr, offset, offty):
    """A ``<LANES x T>*`` to ``arr``'s flat element ``offset``."""
    data = context.make_array(arrty)(context, builder, arr).data
    offset = context.cast(builder, offset, offty, types.intp)
    vty = ir.VectorType(context.get_data_type(arrty.dtype), LANES)
    return builder.bitcast(builder.gep(data, [offset]), vty.as_pointer()), vty


def _load(builder, ptr):
    return builder.load(ptr, align=1)


def _store(builder, value, ptr):
    builder.store(value, ptr, align=1)


@intrinsic
def copy(typingctx, out, oo, a, ia):
    """``out[oo:oo+L] = a[ia:ia+L]``."""
    def codegen(context, builder, sig, args):
        po, _ = _vector(context, builder, sig.args[0], args[0], args[1], sig.args[1])
        pa, _ = _vector(context, builder, sig.args[2], args[2], args[3], sig.args[3])
        _store(builder, _load(builder, pa), po)
        return context.get_dummy_value()
    return types.void(out, oo, a, ia), codegen


def _elementwise(combine, doc):
    """An intrinsic ``op(out, oo, a, ia, b, ib)`` storing ``combine(builder, old_out, a, b)`` at
    ``out[oo:oo+L]`` (``old_out()`` loads the current value, for the ops that update it)."""
    def op(typingctx, out, oo, a, ia, b, ib):
        def codegen(context, builder, sig, args):
            po, _ = _vector(context, builder, sig.args[0], args[0], args[1], sig.args[1])
            pa, _ = _vector(context, builder, sig.args[2], args[2], args[3], sig.args[3])
            pb, _ = _vector(context, builder, sig.args[4], args[4], args[5], sig.args[5])
            value = combine(builder, lambda: _load(builder, po), _load(builder, pa), _load(builder, pb))
            _store(builder, value, po)
            return context.get_dummy_value()
        return types.void(out, oo, a, ia, b, ib), codegen
    op.__doc__ = doc
    return intrinsic(op)


mul = _elementwise(lambda bld, old, x, y: bld.fmul(x, y), "``out[oo:oo+L] = a[ia:ia+L] * b[ib:ib+L]``.")
div = _elementwise(lambda bld, old, x, y: bld.fdiv(x, y), "``out[oo:oo+L] = a[ia:ia+L] / b[ib:ib+L]``.")
sub_mul = _elementwise(lambda bld, old, x, y: bld.fsub(old(), bld.fmul(x, y)),
                       "``out[oo:oo+L] -= a[ia:ia+L] * b[ib:ib+L]`` (the product rounded, then subtracted).")
add_mul = _elementwise(lambda bld, old, x, y: bld.fadd(old(), bld.fmul(x, y)),
                       "``out[oo:oo+L] += a[ia:ia+L] * b[ib:ib+L]`` (the product rounded, then added).")


@intrinsic
def sub_dot(typingctx, out, oo, a, ia, sa, b, ib, sb, count):
    """``out[oo:oo+L] -= acc`` with ``acc = 0``, then ``acc += a[ia + t sa:+L] * b[ib + t sb:+L]``
    for ``t = 0 .. count - 1`` in that order (one accumulator per lane, kept in a register; the
    strides ``sa``, ``sb`` in elements)."""
    def codegen(context, builder, sig, args):
        out_, oo_, a_, ia_, sa_, b_, ib_, sb_, n_ = args
        intp = context.get_value_type(types.intp)
        po, vty = _vector(context, builder, sig.args[0], out_, oo_, sig.args[1])
        pa, _ = _vector(context, builder, sig.args[2], a_, ia_, sig.args[3])
        pb, _ = _vector(context, builder, sig.args[5], b_, ib_, sig.args[6])
        elt = context.get_data_type(sig.args[2].dtype)
        sa_ = context.cast(builder, sa_, sig.args[4], types.intp)
        sb_ = context.cast(builder, sb_, sig.args[7], types.intp)
        n_ = context.cast(builder, n_, sig.args[8], types.intp)
        acc = cgutils.alloca_once_value(builder, ir.Constant(vty, None))
        ea = builder.bitcast(pa, elt.as_pointer())
        eb = builder.bitcast(pb, elt.as_pointer())
        with cgutils.for_range(builder, n_, intp=intp) as loop:
            t = loop.index
            va = _load(builder, builder.bitcast(builder.gep(ea, [builder.mul(t, sa_)]), vty.as_pointer()))
            vb = _load(builder, builder.bitcast(builder.gep(eb, [builder.mul(t, sb_)]), vty.as_pointer()))
            builder.store(builder.fadd(builder.load(acc), builder.fmul(va, vb)), acc)
        _store(builder, builder.fsub(_load(builder, po), builder.load(acc)), po)
        return context.get_dummy_value()
    return types.void(out, oo, a, ia, sa, b, ib, sb, count), codegen


@intrinsic
def sub_mul_rows(typingctx, out, oo, x, p0, p1, rows, y, k, kk):
    """For ``p = p0 .. p1 - 1`` in that order: ``out[oo:oo+L] -= x[p L:+L] * y[(rows[p] k + kk) L:+L]``,
    the running value kept in a register (a column's entries against ``y``, ``y`` (n, k, L))."""
    def codegen(context, builder, sig, args):
        out_, oo_, x_, p0_, p1_, rows_, y_, k_, kk_ = args
        intp = context.get_value_type(types.intp)
        po, vty = _vector(context, builder, sig.args[0], out_, oo_, sig.args[1])
        elt = context.get_data_type(sig.args[2].dtype)
        ex = context.make_array(sig.args[2])(context, builder, x_).data
        ey = context.make_array(sig.args[6])(context, builder, y_).data
        er = context.make_array(sig.args[5])(context, builder, rows_).data
        p0_ = context.cast(builder, p0_, sig.args[3], types.intp)
        p1_ = context.cast(builder, p1_, sig.args[4], types.intp)
        k_ = context.cast(builder, k_, sig.args[7], types.intp)
        kk_ = context.cast(builder, kk_, sig.args[8], types.intp)
        lanes = ir.Constant(intp, LANES)
        acc = cgutils.alloca_once_value(builder, _load(builder, po))
        with cgutils.for_range_slice(builder, p0_, p1_, ir.Constant(intp, 1), intp=intp) as (p, _):
            row = context.cast(builder, builder.load(builder.gep(er, [p])), sig.args[5].dtype, types.intp)
            vx = _load(builder, builder.bitcast(builder.gep(ex, [builder.mul(p, lanes)]), vty.as_pointer()))
            iy = builder.mul(builder.add(builder.mul(row, k_), kk_), lanes)
            vy = _load(builder, builder.bitcast(builder.gep(ey, [iy]), vty.as_pointer()))
            builder.store(builder.fsub(builder.load(acc), builder.fmul(vx, vy)), acc)
        _store(builder, builder.load(acc), po)
        return context.get_dummy_value()
    return types.void(out, oo, x, p0, p1, rows, y, k, kk), codegen


@intrinsic
def prefetch(typingctx, a, ia):
    """A hint that ``a[ia:ia+L]`` will soon be read and written (LLVM's ``prefetch``, for writing,
    into all cache levels); no effect on any value. The offset may lie outside ``a``: a prefetch
    never faults."""
    def codegen(context, builder, sig, args):
        data = context.make_array(sig.args[0])(context, builder, args[0]).data
        offset = context.cast(builder, args[1], sig.args[1], types.intp)
        ptr = builder.bitcast(builder.gep(data, [offset]), ir.IntType(8).as_pointer())
        i32 = ir.IntType(32)
        fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(ir.VoidType(), [ptr.type, i32, i32, i32]),
                                            "llvm.prefetch.p0i8")
        builder.call(fn, [ptr, ir.Constant(i32, 1), ir.Constant(i32, 3), ir.Constant(i32, 1)])
        return context.get_dummy_value()
    return types.void(a, ia), codegen
