// The CUDA backend: cuBLASLt GEMMs, own row kernels, flash or cuDNN attention, CUDA graphs.
// Usable when a CUDA device of compute capability 8.0 or newer is present; otherwise
// unavailable_reason() says why (e.g. "no CUDA device"). The engine class is in engine.hpp.
#pragma once

#include "hk/engine.hpp"

namespace hk::cuda {
const Backend& backend();
}
