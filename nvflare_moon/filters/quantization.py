"""NVFlare's quantization filters for models with integer entries. NVFlare 2.9's ``ModelQuantizer`` refuses any entry
that is not float32/float16/bfloat16 ("Invalid source data type: int64"), so BatchNorm's ``num_batches_tracked``
(FedSiam-DA's predictor, ResNet-50) failed every train task. Here such entries travel as they are, beside the
quantized floats. Imported only with ``quantization`` set: NVFlare's filters import bitsandbytes."""

from typing import Dict, Tuple

import numpy as np
import torch
from nvflare.apis.fl_context import FLContext
from nvflare.app_opt.pt.quantization.dequantizer import ModelDequantizer
from nvflare.app_opt.pt.quantization.quantizer import ModelQuantizer


def _split_floats(params: dict) -> Tuple[dict, dict]:
    """(float entries, the others)."""

    def is_float(v) -> bool:
        return v.is_floating_point() if torch.is_tensor(v) else np.issubdtype(np.asarray(v).dtype, np.floating)

    floats = {k: v for k, v in params.items() if is_float(v)}
    return floats, {k: v for k, v in params.items() if k not in floats}


class FloatModelQuantizer(ModelQuantizer):
    """``ModelQuantizer`` (same argument) that passes non-float entries through unquantized."""

    def quantization(self, params: dict, fl_ctx: FLContext):
        floats, others = _split_floats(params)
        quantized, quant_state, source_datatype = super().quantization(floats, fl_ctx)
        params.clear()  # NVFlare's filter replaces the DXO's data with this same dict
        params.update({**quantized, **others})
        return params, quant_state, source_datatype


class FloatModelDequantizer(ModelDequantizer):
    """``ModelDequantizer`` for :class:`FloatModelQuantizer`: entries without a recorded source type came through
    unquantized and stay as they are."""

    def dequantization(self, params: dict, quant_state: dict, quantization_type: str, source_datatype: Dict, fl_ctx):
        quantized = {k: v for k, v in params.items() if k in source_datatype}
        params.update(super().dequantization(quantized, quant_state, quantization_type, source_datatype, fl_ctx))
        return params
