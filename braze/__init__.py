"""braze: eager tensor code, recorded as a stream, fused and compiled.

``import braze`` gives a PyTorch-like API: ``braze.tensor``, ``braze.zeros``,
``x.exp()``, ``braze.softmax(x, -1)``, ``x @ w``. Ops are recorded, not run; a sync
point (``numpy()``, ``item()``, printing) runs them. See docs/ARCHITECTURE.md.
"""

from . import ops as _ops  # noqa: F401  (fills the op registry)
from .device import Device
from .device import as_device as device
from .dtypes import (
    DType,
    bfloat16,
    bool_,
    float16,
    float32,
    float64,
    int8,
    int16,
    int32,
    int64,
    uint8,
)
from .errors import (
    BrazeError,
    CompileError,
    DeviceMismatch,
    DeviceUnavailable,
    DimOutOfRange,
    DtypeMismatch,
    FormatError,
    IndexOutOfRange,
    OutOfMemory,
    RankMismatch,
    ShapeMismatch,
    Unsupported,
)
from .jit import jit
from . import plan as _plan  # noqa: F401,E402  (the fused executor: registers itself with the stream)
from .runtime import cuda as _cuda_runtime  # noqa: F401,E402  (the cuda executor: registers itself too)
from . import cuda  # noqa: E402
from .random import Generator, manual_seed, rand, rand_like, randint, randn, randn_like
from .runtime.memory import memory_limit, set_memory_limit
from .runtime.threads import get_num_threads, set_num_threads
from .stats import reset_stats, stats
from .stream import synchronize
from .tensor import Tensor, ValuesIndices
from .creation import *  # noqa: F401,F403
from .functions import *  # noqa: F401,F403
from .functions import prod_ as prod
from .composites import *  # noqa: F401,F403
from . import indexing as _indexing  # noqa: F401,E402  (attaches x[...] and x[...] = v)

__version__ = "0.1.0"

half = float16
float = float32  # noqa: A001  (torch.float)
double = float64
long = int64
int = int32  # noqa: A001
bool = bool_  # noqa: A001
