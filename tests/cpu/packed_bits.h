// A packed call against per-sequence dense calls, bit for bit, forward and
// backward: what tests/cpu/varlen_test.cpp asserts at the level the
// dispatcher picks, and flash_emulated_test.h over the stand-in kernels of
// the levels this CPU may lack.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <string>
#include <utility>

#include "attnprof/backend.h"
#include "attnprof/varlen.h"
#include "backends/cpu/cpu_isa.h"
#include "common/test_problem.h"

namespace attnprof::testing {

// A packed call of b is the per-sequence dense calls: bit for bit,
// forward and backward (each sequence run alone on views of its rows).
// `level` names the kernels that ran, for the message: by default the
// dispatcher's choice.
inline void expect_packed_is_dense_calls(Backend& b, const Problem& p, std::string level = {}) {
  if (level.empty()) level = cpu::isa_name(cpu::choose_isa().isa);
  const std::string name(b.name());
  const Inputs in = make_inputs(p, 11, cpu_allocator());
  const Tensor dout = make_dout(p, 11, cpu_allocator());
  RunContext ctx{.allocator = cpu_allocator(), .threads = 2};
  Tensor out = nan_tensor(p.q_dims(), p.dtype);
  Gradients g{nan_tensor(p.q_dims(), p.dtype), nan_tensor(p.kv_dims(), p.dtype), nan_tensor(p.kv_dims(), p.dtype)};
  Saved saved;
  b.forward_train(p, in, out, saved, ctx);
  b.backward(p, in, out, dout, saved, g, ctx);
  for (std::int64_t s = 0; s < p.batch; ++s) {
    const Problem one = p.sequence(s);
    if (one.seq == 0 || one.kv_seq == 0) continue;
    const Inputs rows = sequence_inputs(p, in, s);
    Tensor o = Tensor::empty({1, p.heads, one.seq, p.head_dim}, p.dtype, cpu_allocator());
    Gradients dg{Tensor::empty(o.sizes(), p.dtype, cpu_allocator()),
                 Tensor::empty({1, p.kv_heads, one.kv_seq, p.head_dim}, p.dtype, cpu_allocator()),
                 Tensor::empty({1, p.kv_heads, one.kv_seq, p.head_dim}, p.dtype, cpu_allocator())};
    Saved ds;
    b.forward_train(one, rows, o, ds, ctx);
    b.backward(one, rows, o, sequence_q_rows(p, dout, s), ds, dg, ctx);
    const std::pair<Tensor, Tensor> pairs[] = {{o, sequence_q_rows(p, out, s)},
                                               {dg.dq, sequence_q_rows(p, g.dq, s)},
                                               {dg.dk, sequence_kv_rows(p, g.dk, s)},
                                               {dg.dv, sequence_kv_rows(p, g.dv, s)}};
    const char* tensors[] = {"O", "dQ", "dK", "dV"};
    int k = 0;
    for (const auto& [dense, rows_of] : pairs) {
      std::int64_t differ = 0;
      for_each_index(dense, [&](auto a, auto h, auto i, auto d) {
        const float x = dense.get(a, h, i, d), y = rows_of.get(a, h, i, d);
        differ += std::memcmp(&x, &y, sizeof x) != 0;
      });
      EXPECT_EQ(differ, 0) << name << " " << p.describe() << ": sequence " << s << " (" << one.seq << " queries, "
                           << one.kv_seq << " keys) " << tensors[k] << " at kernel level " << level;
      ++k;
    }
  }
}

}  // namespace attnprof::testing
