"""A DLPack producer (ctypes) that hands over host memory while claiming another device: the device rules of the
bindings can be tested on a machine without that device, since a refused array is never read."""

import ctypes

import numpy as np

# DLPack dtype codes (dlpack.h: DLDataTypeCode) by NumPy kind.
_CODES = {"i": 0, "u": 1, "f": 2}


class FakeDLPack:
    class DLDevice(ctypes.Structure):
        _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]

    class DLDataType(ctypes.Structure):
        _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]

    class DLTensor(ctypes.Structure):
        pass

    class DLManagedTensor(ctypes.Structure):
        pass

    DLTensor._fields_ = [("data", ctypes.c_void_p), ("device", DLDevice), ("ndim", ctypes.c_int32),
                         ("dtype", DLDataType), ("shape", ctypes.POINTER(ctypes.c_int64)),
                         ("strides", ctypes.POINTER(ctypes.c_int64)), ("byte_offset", ctypes.c_uint64)]
    DLManagedTensor._fields_ = [("dl_tensor", DLTensor), ("manager_ctx", ctypes.c_void_p),
                                ("deleter", ctypes.c_void_p)]

    def __init__(self, array, device_type, device_id=0):
        self.array = np.require(array, requirements=["C"])  # keeps a 0-d array 0-d
        dt = self.array.dtype
        self.code = 4 if dt.name == "bfloat16" else _CODES[dt.kind]
        self.shape = (ctypes.c_int64 * max(self.array.ndim, 1))(*self.array.shape)
        self.strides = (ctypes.c_int64 * max(self.array.ndim, 1))(*(s // dt.itemsize for s in self.array.strides))
        self.device = (device_type, device_id)
        self.shape_tuple = self.array.shape

    def __dlpack_device__(self):
        return self.device

    def __dlpack__(self, stream=None, max_version=None, dl_device=None, copy=None):
        if max_version is not None:
            raise TypeError("this producer only makes unversioned capsules")
        managed = self.DLManagedTensor()
        managed.dl_tensor = self.DLTensor(self.array.ctypes.data, self.DLDevice(*self.device), self.array.ndim,
                                          self.DLDataType(self.code, 8 * self.array.dtype.itemsize, 1), self.shape,
                                          self.strides, 0)
        managed.deleter = None
        self._keep = managed  # the capsule points into it; no deleter
        PyCapsule_New = ctypes.pythonapi.PyCapsule_New
        PyCapsule_New.restype = ctypes.py_object
        PyCapsule_New.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]
        return PyCapsule_New(ctypes.addressof(managed), b"dltensor", None)
