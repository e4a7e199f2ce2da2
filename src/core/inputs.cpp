// Random inputs (Q, K, V, masks, paged caches, dO) and FP8 inputs quantized
// from the real values: what the float64 reference (reference.cpp) checks against.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "attnprof/error.h"
#include "attnprof/mask_tensor.h"
#include "attnprof/reference.h"
#include "attnprof/varlen.h"

namespace attnprof {
namespace {

// splitmix64: small, seedable, and good enough for test data.
struct Rng {
  std::uint64_t state;
  std::uint64_t next() {
    std::uint64_t z = (state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  }
  // Uniform in [-1, 1).
  float uniform() { return static_cast<float>(static_cast<double>(next() >> 11) * 0x1.0p-53 * 2.0 - 1.0); }
};

Tensor random_tensor(const Dims& bhsd, DType dtype, Rng& rng, Allocator& allocator, bool bshd) {
  // In the [B, S, H, D] layout the buffer is allocated that way and viewed as [B, H, S, D].
  const Dims storage = bshd ? Dims{bhsd[0], bhsd[2], bhsd[1], bhsd[3]} : bhsd;
  Tensor t = Tensor::empty(storage, dtype, allocator);
  void* data = t.data();
  for (std::int64_t i = 0, n = t.numel(); i < n; ++i) {
    store_from_float(data, dtype, i, rng.uniform());
    // Never zeros, also after rounding: fp16 turns |v| < 2^-25 into zero.
    if (load_as_float(data, dtype, i) == 0.0f) store_from_float(data, dtype, i, 0.5f);
  }
  return bshd ? t.transpose(1, 2) : t;
}

// The paged copies of in.k and in.v: B * pages_per_seq physical pages in a
// random order, the padding of each sequence's last page zeros.
void make_pages(const Problem& p, Rng& rng, Allocator& allocator, Inputs& in) {
  const std::int64_t page = p.page_size, per_seq = p.pages_per_seq(), num_pages = p.batch * per_seq;
  std::vector<std::int32_t> physical(static_cast<std::size_t>(num_pages));
  for (std::int64_t i = 0; i < num_pages; ++i) physical[static_cast<std::size_t>(i)] = static_cast<std::int32_t>(i);
  for (std::int64_t i = num_pages - 1; i > 0; --i) {  // Fisher-Yates
    const auto j = static_cast<std::int64_t>(rng.next() % static_cast<std::uint64_t>(i + 1));
    std::swap(physical[static_cast<std::size_t>(i)], physical[static_cast<std::size_t>(j)]);
  }
  in.block_table = Tensor::empty({1, 1, p.batch, per_seq}, DType::I32, allocator);
  std::memcpy(in.block_table.data(), physical.data(), physical.size() * sizeof(std::int32_t));
  check_block_table(p, in.block_table, num_pages);
  const std::size_t row = static_cast<std::size_t>(p.head_dim) * element_size(p.dtype);
  const auto paged = [&](const Tensor& logical) {
    Tensor pages = Tensor::empty({num_pages, p.kv_heads, page, p.head_dim}, p.dtype, allocator);
    std::memset(pages.data(), 0, pages.nbytes());
    auto* dst = static_cast<unsigned char*>(pages.data());
    for (std::int64_t b = 0; b < p.batch; ++b) {
      for (std::int64_t hk = 0; hk < p.kv_heads; ++hk) {
        for (std::int64_t j = 0; j < p.kv_seq; ++j) {
          const std::int64_t phys = physical[static_cast<std::size_t>(b * per_seq + j / page)];
          unsigned char* to =
              dst + static_cast<std::size_t>(pages.index(phys, hk, j % page, 0)) * element_size(p.dtype);
          if (logical.stride(3) == 1) {
            std::memcpy(to,
                        static_cast<const unsigned char*>(logical.data()) +
                            static_cast<std::size_t>(logical.index(b, hk, j, 0)) * element_size(p.dtype),
                        row);
          } else {
            for (std::int64_t d = 0; d < p.head_dim; ++d) pages.set(phys, hk, j % page, d, logical.get(b, hk, j, d));
          }
        }
      }
    }
    return pages;
  };
  in.k_pages = paged(in.k);
  in.v_pages = paged(in.v);
}

// A fresh tensor of `dtype` laid out as `like`: its strides, over storage of
// their span (offset 0). make_inputs' tensors, contiguous or [B, S, H, D]
// storage viewed as [B, H, S, D], span exactly their elements.
Tensor empty_with_layout(const Tensor& like, DType dtype, Allocator& allocator) {
  std::int64_t span = like.numel() > 0 ? 1 : 0;
  for (int d = 0; d < 4 && span > 0; ++d) span += (like.size(d) - 1) * like.stride(d);
  return Tensor::empty({1, 1, 1, span}, dtype, allocator).as_strided(like.sizes(), like.strides(), 0);
}

// `real` into the e4m3 tensor `stored` (same sizes): stored = e4m3(real /
// descale), and what that cost.
Fp8TensorQuantization quantize_tensor(std::string name, const Tensor& real, std::optional<double> fixed,
                                      Tensor& stored) {
  Fp8TensorQuantization t{.name = std::move(name), .elements = real.numel()};
  const Dims& n = real.sizes();
  const auto each = [&](auto f) {
    for (std::int64_t a = 0; a < n[0]; ++a)
      for (std::int64_t b = 0; b < n[1]; ++b)
        for (std::int64_t c = 0; c < n[2]; ++c)
          for (std::int64_t d = 0; d < n[3]; ++d) f(a, b, c, d);
  };
  each([&](auto a, auto b, auto c, auto d) { t.amax = std::max(t.amax, std::abs(double{real.get(a, b, c, d)})); });
  t.descale = fixed ? *fixed : auto_fp8_descale(t.amax);
  const double limit = max_finite(DType::F8E4M3);
  auto* out = static_cast<std::uint8_t*>(stored.data());
  each([&](auto a, auto b, auto c, auto d) {
    const double x = real.get(a, b, c, d) / t.descale;
    t.saturated += std::abs(x) > limit;
    out[stored.index(a, b, c, d)] = float_to_e4m3(static_cast<float>(x));
  });
  return t;
}

}  // namespace

Problem fp8_real_problem(const Problem& p) {
  Problem r = p;
  if (is_fp8(p.dtype)) r.dtype = DType::BF16;
  return r;
}

double auto_fp8_descale(double amax) { return amax > 0 ? amax / max_finite(DType::F8E4M3) : 1.0; }

void check_fp8_descale(std::string_view field, double descale) {
  if (std::isfinite(descale) && descale > 0) return;
  char buf[64];
  std::snprintf(buf, sizeof buf, "%g", descale);
  fail(ErrorKind::InvalidArgument,
       std::string(field) + " must be a finite positive number (the factor e4m3 values are multiplied by), got " + buf,
       {std::string(field)});
}

Fp8Quantized quantize_inputs(const Problem& p, const Inputs& real, std::optional<double> fixed, Allocator& allocator) {
  if (fixed) check_fp8_descale("fp8_descale", *fixed);
  Fp8Quantized r;
  r.in = real;  // the mask, bias, block table and key counts as they are
  const auto quantize = [&](const char* name, const Tensor& x, Tensor& into, float& descale) {
    into = empty_with_layout(x, DType::F8E4M3, allocator);
    r.tensors.push_back(quantize_tensor(name, x, fixed, into));
    descale = static_cast<float>(r.tensors.back().descale);
  };
  quantize("q", real.q, r.in.q, r.in.q_descale);
  quantize("k", real.k, r.in.k, r.in.k_descale);
  quantize("v", real.v, r.in.v, r.in.v_descale);
  if (p.kv_cache == KvCache::Paged) {
    // The pages hold K's and V's values (and zero padding): their tensor's descale.
    for (auto [pages, into, descale] : {std::tuple{&real.k_pages, &r.in.k_pages, r.in.k_descale},
                                        std::tuple{&real.v_pages, &r.in.v_pages, r.in.v_descale}}) {
      *into = empty_with_layout(*pages, DType::F8E4M3, allocator);
      (void)quantize_tensor("pages", *pages, descale, *into);
    }
  }
  return r;
}

Inputs make_inputs(const Problem& p, std::uint64_t seed, Allocator& allocator, bool bshd) {
  if (is_fp8(p.dtype)) {
    return quantize_inputs(p, make_inputs(fp8_real_problem(p), seed, allocator, bshd), std::nullopt, allocator).in;
  }
  Rng rng{seed * 0x2545f4914f6cdd1dull + 1};
  Inputs in;
  // A packed batch is laid out as FlashAttention's varlen functions take it,
  // [total, H, D]: the [1, total, H, D] storage of the bshd layout.
  bshd = bshd || p.varlen();
  in.q = random_tensor(p.q_dims(), p.dtype, rng, allocator, bshd);
  in.k = random_tensor(p.kv_dims(), p.dtype, rng, allocator, bshd);
  in.v = random_tensor(p.kv_dims(), p.dtype, rng, allocator, bshd);
  if (p.mask == MaskKind::Boolean) {
    // One [S, Skv] mask broadcast over batch and heads: 90% of keys kept, and
    // the diagonal always kept so no row is masked by accident.
    Tensor m = Tensor::empty({1, 1, p.seq, p.kv_seq}, DType::Bool, allocator);
    auto* bits = m.data_as<std::uint8_t>();
    for (std::int64_t i = 0; i < p.seq; ++i) {
      for (std::int64_t j = 0; j < p.kv_seq; ++j) {
        bits[i * p.kv_seq + j] = (rng.next() % 10 != 0) || j == std::min(i, p.kv_seq - 1);
      }
    }
    attach_mask(p, m, in, "the generated mask");
  } else if (p.mask == MaskKind::Bias) {
    Tensor b = Tensor::empty({1, 1, p.seq, p.kv_seq}, p.dtype, allocator);
    for (std::int64_t i = 0, n = b.numel(); i < n; ++i) store_from_float(b.data(), p.dtype, i, 2.0f * rng.uniform());
    attach_mask(p, b, in, "the generated bias");
  }
  if (p.kv_cache == KvCache::Paged) make_pages(p, rng, allocator, in);
  return in;
}

void check_block_table(const Problem& p, const Tensor& block_table, std::int64_t num_pages) {
  const std::int64_t pages = p.pages_per_seq();
  if (!block_table.defined() || block_table.dtype() != DType::I32 || block_table.size(0) != 1 ||
      block_table.size(1) != 1 || block_table.size(2) != p.batch || block_table.size(3) != pages) {
    fail(ErrorKind::InvalidArgument, "block table: want int32 [" + std::to_string(p.batch) + ", " +
                                         std::to_string(pages) + "] (batch, pages per sequence), got " +
                                         (block_table.defined() ? block_table.describe() : std::string("none")));
  }
  std::vector<std::int64_t> owner(static_cast<std::size_t>(std::max<std::int64_t>(num_pages, 0)), -1);
  for (std::int64_t b = 0; b < p.batch; ++b) {
    for (std::int64_t l = 0; l < pages; ++l) {
      const auto page = static_cast<std::int64_t>(block_table.get(0, 0, b, l));
      const std::string slot =
          "block table [" + std::to_string(b) + "][" + std::to_string(l) + "] = " + std::to_string(page);
      if (page < 0 || page >= num_pages) {
        fail(ErrorKind::InvalidArgument, slot + " is not a physical page (the cache has " + std::to_string(num_pages) +
                                             ", 0 .. " + std::to_string(num_pages - 1) + ")");
      }
      std::int64_t& o = owner[static_cast<std::size_t>(page)];
      if (o >= 0) {
        fail(ErrorKind::InvalidArgument, slot + ": physical page " + std::to_string(page) + " is already sequence " +
                                             std::to_string(o / pages) + "'s logical page " +
                                             std::to_string(o % pages) + " (a page serves one slot)");
      }
      o = b * pages + l;
    }
  }
}

void check_block_table_reads(const Problem& p, const Tensor& block_table, std::int64_t num_pages,
                             const std::int32_t* kv_rows) {
  const std::int64_t pages = p.pages_per_seq();
  if (!block_table.defined() || block_table.dtype() != DType::I32 || block_table.device() != Device::Cpu ||
      block_table.size(0) != 1 || block_table.size(1) != 1 || block_table.size(2) != p.batch ||
      block_table.size(3) < pages) {
    fail(ErrorKind::InvalidArgument, "block_table: want int32 [" + std::to_string(p.batch) +
                                         ", >= " + std::to_string(pages) + "] (batch, pages per sequence), got " +
                                         (block_table.defined() ? block_table.describe() : std::string("none")));
  }
  const auto* ids = block_table.data_as<const std::int32_t>();
  for (std::int64_t b = 0; b < p.batch; ++b) {
    const std::int64_t begin = kv_rows ? kv_rows[2 * b] : 0;
    const std::int64_t end = kv_rows ? kv_rows[2 * b + 1] : p.kv_seq;
    const std::int64_t used = (end + p.page_size - 1) / p.page_size;
    for (std::int64_t l = begin < end ? begin / p.page_size : used; l < used; ++l) {
      const std::int64_t page = ids[b * block_table.stride(2) + l * block_table.stride(3)];
      if (page < 0 || page >= num_pages) {
        fail(ErrorKind::InvalidArgument, "block table [" + std::to_string(b) + "][" + std::to_string(l) +
                                             "] = " + std::to_string(page) + " is not a physical page (the cache has " +
                                             std::to_string(num_pages) + ", 0 .. " + std::to_string(num_pages - 1) +
                                             ")");
      }
    }
  }
}

Tensor make_dout(const Problem& p, std::uint64_t seed, Allocator& allocator) {
  Rng rng{seed * 0x9e3779b97f4a7c15ull + 7};
  return random_tensor(p.q_dims(), output_dtype(p.dtype), rng, allocator, false);
}

}  // namespace attnprof
