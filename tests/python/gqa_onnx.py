"""ONNX Runtime as the oracle of attnkit.group_query_attention: the one-node com.microsoft GroupQueryAttention model
built with onnx.helper, run on ONNX Runtime's CPU execution provider.

    outputs = run_ort(inputs, attrs)   # inputs: {contract name: NumPy array}, attrs: {ONNX attribute: value}

Inputs are named as the contract (and ONNX Runtime) names them; an absent optional input is the empty name "" in
the node. Outputs: output, present_key, present_value and output_qk when qk_output != 0.
"""

import functools

import numpy as np

INPUT_NAMES = ("query", "key", "value", "past_key", "past_value", "seqlens_k", "total_sequence_length", "cos_cache",
               "sin_cache", "position_ids", "attention_bias", "head_sink", "k_scale", "v_scale", "q_norm_weight",
               "k_norm_weight")
OUTPUT_NAMES = ("output", "present_key", "present_value", "output_qk")

_sessions = {}


def _onnx_type(dtype):
    from onnx import helper

    dtype = np.dtype(dtype)
    if dtype.name == "bfloat16":
        from onnx import TensorProto

        return TensorProto.BFLOAT16
    return helper.np_dtype_to_tensor_dtype(dtype)


@functools.lru_cache(maxsize=None)
def schema_is_new_enough():
    """Whether this onnxruntime's GroupQueryAttention has the contract's schema: causal, sliding_window_cache,
    qk_norm_epsilon, quantized caches, head_sink, norms. False when onnx / onnxruntime are missing."""
    try:
        from onnxruntime.capi import onnxruntime_pybind11_state as C
        import onnx  # noqa: F401 -- the model is built with onnx.helper
    except ImportError:
        return False
    for s in C.get_all_operator_schema():
        if s.name == "GroupQueryAttention" and s.domain == "com.microsoft":
            inputs = {i.name for i in s.inputs}
            return {"causal", "sliding_window_cache", "qk_norm_epsilon", "k_quant_type", "v_quant_type",
                    "kv_cache_bit_width", "smooth_softmax", "qk_output"} <= set(s.attributes) and \
                {"head_sink", "k_scale", "v_scale", "q_norm_weight", "k_norm_weight"} <= inputs
    return False


def ort_version():
    import onnxruntime

    return onnxruntime.__version__


def build_model(input_types, attrs, qk_output=0):
    """The serialized one-node model. input_types: {name: (numpy dtype, shape)} for the inputs that are given;
    attrs: the node's attributes (ONNX names). Output shapes are left to ONNX Runtime."""
    from onnx import TensorProto, helper

    last = max((INPUT_NAMES.index(n) for n in input_types), default=0)
    node_inputs = [n if n in input_types else "" for n in INPUT_NAMES[: last + 1]]
    outputs = list(OUTPUT_NAMES[:4 if qk_output else 3])
    node = helper.make_node("GroupQueryAttention", node_inputs, outputs, domain="com.microsoft", **attrs)
    graph_inputs = [helper.make_tensor_value_info(n, _onnx_type(t), list(s)) for n, (t, s) in input_types.items()]
    q_type = _onnx_type(input_types["query"][0])
    out_types = {"output": q_type, "output_qk": q_type}
    for n, past, quant in (("present_key", "past_key", "k_quant_type"), ("present_value", "past_value", "v_quant_type")):
        if past in input_types:  # the past's type
            out_types[n] = _onnx_type(input_types[past][0])
        elif attrs.get(quant, "NONE") != "NONE":  # int8, or int4 packed in uint8
            out_types[n] = TensorProto.INT8 if attrs.get("kv_cache_bit_width", 8) == 8 else TensorProto.UINT8
        else:
            out_types[n] = q_type
    graph_outputs = [helper.make_tensor_value_info(n, out_types[n], None) for n in outputs]
    graph = helper.make_graph([node], "gqa", graph_inputs, graph_outputs)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21), helper.make_opsetid("com.microsoft", 1)])
    model.ir_version = 10
    return model.SerializeToString()


def session(input_types, attrs, qk_output=0, threads=0):
    """A cached onnxruntime.InferenceSession on the CPU execution provider."""
    import onnxruntime

    key = (tuple((n, np.dtype(t).str, tuple(s)) for n, (t, s) in sorted(input_types.items())),
           tuple(sorted((k, v) for k, v in attrs.items())), qk_output, threads)
    s = _sessions.get(key)
    if s is None:
        onnxruntime.set_default_logger_severity(4)  # a rejected node raises; its log line would only be noise
        options = onnxruntime.SessionOptions()
        options.log_severity_level = 4
        if threads:
            options.intra_op_num_threads = threads
        s = onnxruntime.InferenceSession(build_model(input_types, attrs, qk_output), options,
                                         providers=["CPUExecutionProvider"])
        if len(_sessions) > 64:
            _sessions.clear()
        _sessions[key] = s
    return s


def run_ort(inputs, attrs, threads=0):
    """ONNX Runtime's outputs for `inputs` ({name: array or None}) and `attrs` (ONNX attributes): a dict
    {output name: array}. Raises whatever ONNX Runtime raises for a node it rejects."""
    given = {n: a for n, a in inputs.items() if a is not None}
    types = {n: (given[n].dtype, given[n].shape) for n in INPUT_NAMES if n in given}
    qk_output = int(attrs.get("qk_output", 0))
    s = session(types, attrs, qk_output, threads)
    names = [o.name for o in s.get_outputs()]
    results = s.run(names, {n: np.ascontiguousarray(a) for n, a in given.items()})
    return dict(zip(names, results))
