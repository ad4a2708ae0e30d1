// hk::Error: every user-facing failure (bad file, bad shape, device trouble) is one of these,
// carrying a one-line message that names the file and object when there is one.
#pragma once

#include <stdexcept>
#include <string>

namespace hk {

class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

}  // namespace hk
