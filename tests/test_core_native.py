"""The native writer's module: multi-phase initialisation, so it declares what it supports."""

from __future__ import annotations

import ctypes
import importlib.util
import sys

import pytest


def test_writer_module_uses_multi_phase_init() -> None:
    # With multi-phase init (PEP 489) the loader creates an empty module first and
    # runs its exec slot separately; a single-phase module would come back from
    # create_module already filled in.
    spec = importlib.util.find_spec("aiodiskqueue._core._writer")
    assert spec is not None and spec.loader is not None, "the native writer is not built"
    module = importlib.util.module_from_spec(spec)
    assert not hasattr(module, "Writer")
    spec.loader.exec_module(module)
    assert module.RING == 16
    w = module.Writer(spin_us=0, small_max=1 << 17)
    try:
        assert w.inflight() == 0
    finally:
        w.close()


def test_a_second_module_object_shares_the_writer_type() -> None:
    from aiodiskqueue._core import _writer

    spec = importlib.util.find_spec("aiodiskqueue._core._writer")
    assert spec is not None and spec.loader is not None
    again = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(again)
    assert again is not _writer
    assert again.Writer is _writer.Writer


class _Slot(ctypes.Structure):
    _fields_ = [("slot", ctypes.c_int), ("value", ctypes.c_void_p)]


class _ModuleDef(ctypes.Structure):
    # PyModuleDef of a default (GIL) build: PyModuleDef_Base is PyObject_HEAD,
    # m_init, m_index, m_copy; then m_name, m_doc, m_size, m_methods, m_slots.
    _fields_ = [("ob_refcnt", ctypes.c_ssize_t), ("ob_type", ctypes.c_void_p),
                ("m_init", ctypes.c_void_p), ("m_index", ctypes.c_ssize_t),
                ("m_copy", ctypes.c_void_p), ("m_name", ctypes.c_char_p),
                ("m_doc", ctypes.c_char_p), ("m_size", ctypes.c_ssize_t),
                ("m_methods", ctypes.c_void_p), ("m_slots", ctypes.POINTER(_Slot))]


PY_MOD_EXEC, PY_MOD_MULTIPLE_INTERPRETERS, PY_MOD_GIL = 2, 3, 4


def test_writer_module_declares_its_slots() -> None:
    # Py_mod_gil = Py_MOD_GIL_NOT_USED (3.13+): a free-threaded build keeps the GIL
    # off when it imports the writer, whose thread never touches Python objects.
    # Read from the module definition itself, since only a free-threaded
    # interpreter would show the effect.
    from aiodiskqueue._core import _writer

    lib = ctypes.PyDLL(_writer.__file__)
    init = lib.PyInit__writer
    init.restype = ctypes.POINTER(_ModuleDef)
    mdef = init().contents
    assert mdef.m_name == b"aiodiskqueue._core._writer"
    assert mdef.m_size == 0
    slots = {}
    i = 0
    while mdef.m_slots[i].slot:
        slots[mdef.m_slots[i].slot] = mdef.m_slots[i].value
        i += 1
    expected = {PY_MOD_EXEC}
    if sys.version_info >= (3, 12):
        expected.add(PY_MOD_MULTIPLE_INTERPRETERS)
        assert slots.get(PY_MOD_MULTIPLE_INTERPRETERS) == 1  # shared GIL: supported
    if sys.version_info >= (3, 13):
        expected.add(PY_MOD_GIL)
        assert slots.get(PY_MOD_GIL) == 1  # Py_MOD_GIL_NOT_USED
    assert set(slots) == expected


def test_writer_takes_its_spin_and_small_batch_limits_from_the_caller() -> None:
    # The engine owns both (options.spin_us, lane.SMALL_MAX); the module has no copy.
    from aiodiskqueue._core import _writer

    with pytest.raises(TypeError):
        _writer.Writer(0)  # type: ignore[call-arg]
    with pytest.raises(ValueError, match="small_max"):
        _writer.Writer(0, -1)
    with pytest.raises(ValueError, match="spin_us"):
        _writer.Writer(-1, 1 << 17)
