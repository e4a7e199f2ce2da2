// Typed errors. Every message says what to change; nothing below main() exits.
#pragma once

#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

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

// The message speaks in the library's terms: a field is named as the Problem
// (or an options struct) spells it, "head_dim must be positive". `fields` lists
// the fields the message names, so a front end can show them in its own terms
// (the CLI writes "--head-dim"; Python's keywords are the field names).
class Error : public std::runtime_error {
 public:
  Error(ErrorKind kind, const std::string& message, std::vector<std::string> fields = {})
      : std::runtime_error(message), kind_(kind), fields_(std::move(fields)) {}
  ErrorKind kind() const noexcept { return kind_; }
  const std::vector<std::string>& fields() const noexcept { return fields_; }

 private:
  ErrorKind kind_;
  std::vector<std::string> fields_;
};

[[noreturn]] inline void fail(ErrorKind kind, const std::string& message, std::vector<std::string> fields = {}) {
  throw Error(kind, message, std::move(fields));
}

}  // namespace attnprof
