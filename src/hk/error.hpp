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

// The same failure on every process of a collective step (an MPI job's output creation, say):
// every rank throws it with the same message, so a program reports it once for the job and every
// rank ends with the same status, instead of each rank printing it and ending the job on its own.
class CollectiveError : public Error {
 public:
  using Error::Error;
};

}  // namespace hk
