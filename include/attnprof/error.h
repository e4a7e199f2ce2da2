// Typed errors. Every message says what to change; nothing below main() exits.
#pragma once

#include <stdexcept>
#include <string>

namespace attnprof {

enum class ErrorKind {
  InvalidArgument,  // a flag or shape the user can fix
  OutOfMemory,      // estimated or real allocation failure
  Unsupported,      // a backend or device that cannot take this problem
  Io,               // a file or directory that cannot be written
  BadInput,         // a file the user handed us that cannot be read (a malformed trace)
  Device,           // CUDA, cuBLAS, cuDNN, CUPTI failures
  Internal,
};

class Error : public std::runtime_error {
 public:
  Error(ErrorKind kind, const std::string& message) : std::runtime_error(message), kind_(kind) {}
  ErrorKind kind() const noexcept { return kind_; }

 private:
  ErrorKind kind_;
};

[[noreturn]] inline void fail(ErrorKind kind, const std::string& message) { throw Error(kind, message); }

}  // namespace attnprof
