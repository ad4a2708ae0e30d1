// The portable backend: every op written with Kokkos views and team policies.
#pragma once

#include "hk/engine.hpp"

namespace hk::kokkos {
const Backend& backend();
}
