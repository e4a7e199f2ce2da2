// The checking mode: whether a call reads its index tensors (a paged cache's
// block table and lengths, per-sequence rows) on the host before it runs, to
// refuse a bad entry in one line that names it.
//
// On the CPU the tensors are host memory and are always checked. On a GPU the
// default path never reads them on the host: a host read would wait for the
// caller's stream (a synchronisation every call) and, read on another stream,
// would see values the caller's stream has not written yet. There the kernels
// clamp what they read into range and raise a device flag instead; the
// checking mode, for debugging, reads the values in the caller's stream order
// (and so synchronises with it) and checks them as the CPU does.
#pragma once

namespace attnprof {

// On when the environment has ATTNPROF_CHECK_INPUTS=1 (read once per
// process) or a CheckingInputs scope on this thread turned it on.
bool checking_inputs();

// This thread's setting, for a front end that cannot hold a scope (Python):
// 1 on, 0 off, -1 the environment's; returns the previous one.
int exchange_checking_inputs(int setting);

// The checking mode on (or off) for this thread while it lives, whatever the
// environment says: Python's attention(check_inputs=True).
class CheckingInputs {
 public:
  explicit CheckingInputs(bool on);
  ~CheckingInputs();
  CheckingInputs(const CheckingInputs&) = delete;
  CheckingInputs& operator=(const CheckingInputs&) = delete;

 private:
  int previous_;
};

}  // namespace attnprof
