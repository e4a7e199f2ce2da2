// attnprof._core: the Python bindings. Thin by design: arrays come in as
// DLPack views (nb::ndarray, never converted or copied) and become borrowed
// Tensors; problems, backends, eligibility, the pipeline and its tables are
// the library's own calls. attnprof/__init__.py shapes what comes back.
// Each part of the module is a file of its own (bindings/bindings.h lists them).
#include "attnprof/error.h"
#include "bindings/bindings.h"

NB_MODULE(_core, m) {
  using namespace attnprof;
  using namespace attnprof::python;
  m.doc() = "attnprof's C++ library: attention on DLPack arrays, and the compare/profile/explain pipeline";

  nb::exception<Error>(m, "Error", PyExc_ValueError);
  bind_attention(m);
  bind_varlen(m);
  bind_pipeline(m);
  bind_analyze(m);
  bind_plan(m);
  bind_call_options(m);
}
