// Caller mask tensors (mask_tensor.h): the key-padding lowering to
// per-sequence key rows (core/mask_lowering.h), the CPU flash that takes
// it and Inputs::kv_rows, the broadcast checks every front end shares, and the
// .npy reader behind --mask-file, fed good and hostile files.
#include "attnprof/mask_tensor.h"

#include <gtest/gtest.h>
#include <sys/wait.h>

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>
#include <optional>
#include <string>
#include <vector>

#include "attnprof/backend.h"
#include "attnprof/error.h"
#include "attnprof/problem.h"
#include "attnprof/reference.h"
#include "attnprof/runner.h"
#include "common/temp_dir.h"
#include "common/test_problem.h"
#include "core/mask_lowering.h"

#ifndef ATTNPROF_CLI_PATH
#error "ATTNPROF_CLI_PATH must name the attnprof executable"
#endif

namespace attnprof {
namespace {

namespace fs = std::filesystem;

Backend& cpu_backend(const std::string& name) {
  Backend* b = find_backend(name, Device::Cpu);
  if (!b) throw std::runtime_error("no CPU backend " + name);
  return *b;
}

// A [B, 1, 1, Skv] key-padding mask: sequence b keeps its first lens[b] keys,
// after its first pads[b] (left padding) when pads is given.
Tensor key_padding(const std::vector<std::int64_t>& lens, std::int64_t kv_seq,
                   const std::vector<std::int64_t>& pads = {}) {
  const auto B = static_cast<std::int64_t>(lens.size());
  Tensor m = Tensor::empty({B, 1, 1, kv_seq}, DType::Bool, cpu_allocator());
  for (std::int64_t b = 0; b < B; ++b) {
    const std::int64_t pad = pads.empty() ? 0 : pads[static_cast<std::size_t>(b)];
    for (std::int64_t j = 0; j < kv_seq; ++j) m.data_as<std::uint8_t>()[b * kv_seq + j] = j >= pad && j < pad + lens[b];
  }
  return m;
}

// Rows as flat (begin, end) pairs, for comparing.
std::vector<std::int32_t> flat(const std::optional<std::vector<RowSpan>>& rows) {
  std::vector<std::int32_t> v;
  if (rows) {
    for (const RowSpan& r : *rows) v.insert(v.end(), {r.begin, r.end});
  }
  return v;
}

// Inputs::kv_rows of (begin, end) pairs.
Tensor kv_rows_of(const std::vector<std::int32_t>& pairs) {
  const auto B = static_cast<std::int64_t>(pairs.size() / 2);
  Tensor t = Tensor::empty({1, 1, B, 2}, DType::I32, cpu_allocator());
  std::memcpy(t.data(), pairs.data(), sizeof(std::int32_t) * pairs.size());
  return t;
}

// ---- The lowering --------------------------------------------------------

TEST(KeyPaddingLowering, PrefixRowsGiveTheirRowsThroughAnyBroadcast) {
  const Tensor m = key_padding({5, 0, 9, 3}, 9);
  const auto lens = key_padding_rows(m.expand({4, 3, 7, 9}));
  ASSERT_TRUE(lens.has_value());
  EXPECT_EQ(flat(lens), (std::vector<std::int32_t>{0, 5, 0, 0, 0, 9, 0, 3}));
  // A materialised copy (every row stored, no stride 0) says the same.
  Tensor full = Tensor::empty({4, 3, 7, 9}, DType::Bool, cpu_allocator());
  testing::for_each_index(full, [&](auto b, auto h, auto i, auto j) {
    full.data_as<std::uint8_t>()[full.index(b, h, i, j)] = m.data_as<std::uint8_t>()[b * 9 + j];
  });
  EXPECT_EQ(flat(key_padding_rows(full)), flat(lens));
}

TEST(KeyPaddingLowering, LeftAndBothSidePaddingGiveTheirRows) {
  // Left padding (generate()), both sides, none, and a sequence of no key.
  const Tensor m = key_padding({5, 3, 9, 0}, 9, {4, 2, 0, 6});
  EXPECT_EQ(flat(key_padding_rows(m.expand({4, 2, 3, 9}))), (std::vector<std::int32_t>{4, 9, 2, 5, 0, 9, 0, 0}));
}

TEST(KeyPaddingLowering, OtherMasksAreNotLowered) {
  // A hole after a False: not a prefix.
  Tensor holed = key_padding({4}, 8);
  holed.data_as<std::uint8_t>()[6] = 1;
  EXPECT_FALSE(key_padding_rows(holed).has_value());
  // Two runs of Trues, the first not at key 0.
  Tensor two_runs = key_padding({3}, 9, {1});
  two_runs.data_as<std::uint8_t>()[7] = 1;
  EXPECT_FALSE(key_padding_rows(two_runs).has_value());
  // Causal: rows differ within a sequence.
  Tensor causal = Tensor::empty({1, 1, 6, 6}, DType::Bool, cpu_allocator());
  for (int i = 0; i < 6; ++i)
    for (int j = 0; j < 6; ++j) causal.data_as<std::uint8_t>()[i * 6 + j] = j <= i;
  EXPECT_FALSE(key_padding_rows(causal.expand({2, 2, 6, 6})).has_value());
  // Padding that differs between heads of one sequence.
  Tensor per_head = Tensor::empty({1, 2, 1, 4}, DType::Bool, cpu_allocator());
  const std::uint8_t bits[] = {1, 1, 0, 0, 1, 0, 0, 0};
  std::memcpy(per_head.data(), bits, sizeof bits);
  EXPECT_FALSE(key_padding_rows(per_head).has_value());
  // A float mask is a bias, never lowered.
  EXPECT_FALSE(key_padding_rows(Tensor::empty({1, 1, 1, 4}, DType::F32, cpu_allocator())).has_value());
}

// ---- CPU flash on a caller's mask ------------------------------------------

Problem boolean_problem(std::int64_t batch, std::int64_t seq, std::int64_t kv_seq, DType dtype = DType::F32) {
  testing::Shape s{.batch = batch, .heads = 4, .kv_heads = 2, .seq = seq, .kv_seq = kv_seq, .head_dim = 32};
  Problem p = testing::to_problem(s, dtype, MaskKind::Boolean);
  p.validate();
  return p;
}

TEST(CallerMask, FlashLowersAKeyPaddingMaskAndMatchesFloat64) {
  // Lengths across block edges (flash's key blocks are 128): 0 (a fully
  // masked sequence, zeros), 1, 129, 300 (all keys).
  const Problem p = boolean_problem(4, 70, 300);
  Inputs in = make_inputs(p, 11, cpu_allocator());
  attach_mask(p, key_padding({0, 1, 129, 300}, 300), in, "attn_mask");
  Tensor out = testing::nan_tensor(p, p.heads, p.seq);
  RunContext ctx{cpu_allocator(), nullptr, 2};
  cpu_backend("flash").forward(p, in, out, ctx);
  const ErrorStats e = check_against_reference(p, in, out, sample_rows(p, 1 << 20));
  EXPECT_EQ(e.nan_rows, 0);
  EXPECT_LT(e.rel, 1e-5);
  for (std::int64_t d = 0; d < p.head_dim; ++d) EXPECT_EQ(out.get(0, 1, 5, d), 0.0f);  // no key: zeros, not NaN
}

TEST(CallerMask, FlashLowersALeftPaddedMaskAndMatchesFloat64) {
  // Left padding (generate()'s) and both sides, across key blocks.
  const Problem p = boolean_problem(3, 70, 300);
  Inputs in = make_inputs(p, 12, cpu_allocator());
  attach_mask(p, key_padding({170, 1, 150}, 300, {130, 299, 7}), in, "attn_mask");
  Tensor out = testing::nan_tensor(p, p.heads, p.seq);
  RunContext ctx{cpu_allocator(), nullptr, 2};
  cpu_backend("flash").forward(p, in, out, ctx);
  const ErrorStats e = check_against_reference(p, in, out, sample_rows(p, 1 << 20));
  EXPECT_EQ(e.nan_rows, 0);
  EXPECT_LT(e.rel, 1e-5);
}

TEST(CallerMask, EveryCpuBackendReadsTheSameGeneralMask) {
  // Not key padding (a checkerboard with the diagonal kept): read per element.
  const Problem p = boolean_problem(2, 48, 64);
  Tensor m = Tensor::empty({2, 1, 48, 64}, DType::Bool, cpu_allocator());
  testing::for_each_index(m, [&](auto b, auto, auto i, auto j) {
    m.data_as<std::uint8_t>()[m.index(b, 0, i, j)] = ((i + j + b) % 3 != 0) || i == j;
  });
  ASSERT_FALSE(key_padding_rows(m.expand({2, 4, 48, 64})).has_value());
  Inputs in = make_inputs(p, 3, cpu_allocator());
  attach_mask(p, m, in, "attn_mask");
  for (const char* name : {"flash", "naive", "math"}) {
    Tensor out = testing::nan_tensor(p, p.heads, p.seq);
    RunContext ctx{cpu_allocator(), nullptr, 2};
    cpu_backend(name).forward(p, in, out, ctx);
    EXPECT_LT(check_against_reference(p, in, out, sample_rows(p, 1 << 20)).rel, 1e-5) << name;
  }
}

TEST(CallerMask, FlashBackwardReadsAKeyPaddingMask) {
  Problem p = boolean_problem(3, 40, 150);
  p.pass = Pass::Train;
  Inputs in = make_inputs(p, 5, cpu_allocator());
  attach_mask(p, key_padding({150, 77, 1}, 150), in, "attn_mask");
  Tensor out = testing::nan_tensor(p, p.heads, p.seq);
  const Tensor dout = make_dout(p, 5, cpu_allocator());
  Gradients g{testing::nan_tensor(p, p.heads, p.seq), testing::nan_tensor(p, p.kv_heads, p.kv_seq),
              testing::nan_tensor(p, p.kv_heads, p.kv_seq)};
  RunContext ctx{cpu_allocator(), nullptr, 2};
  Backend& flash = cpu_backend("flash");
  Saved saved;
  flash.forward_train(p, in, out, saved, ctx);
  flash.backward(p, in, out, dout, saved, g, ctx);
  const GradientErrors e =
      check_gradients_against_reference(p, in, dout, g, sample_rows(p, 1 << 20), sample_kv_rows(p, 1 << 20));
  for (const ErrorStats* s : {&e.dq, &e.dk, &e.dv}) {
    EXPECT_EQ(s->nan_rows, 0);
    EXPECT_LT(s->rel, 1e-4);
  }
  // Keys past a sequence's length get no gradient.
  for (std::int64_t d = 0; d < p.head_dim; ++d) EXPECT_EQ(g.dk.get(2, 1, 100, d), 0.0f);
}

// Inputs::kv_rows on a paged cache: each sequence against float64 on its own
// keys (a problem of kv_seq = its length, the logical K and V sliced).
TEST(PerSequenceLengths, FlashReadsEachSequencesOwnKeysAndAlignment) {
  for (const MaskKind mask : {MaskKind::None, MaskKind::CausalBottomRight, MaskKind::SlidingWindow}) {
    testing::Shape s{.batch = 3, .heads = 2, .kv_heads = 1, .seq = 5, .kv_seq = 200, .head_dim = 32, .window = 40};
    Problem p = testing::to_problem(s, DType::F32, mask);
    if (mask != MaskKind::SlidingWindow) p.window = 0;
    p.kv_cache = KvCache::Paged;
    p.page_size = 16;
    p.validate();
    Inputs in = make_inputs(p, 9, cpu_allocator());
    const std::vector<std::int32_t> lens{200, 17, 130};
    in.kv_rows = kv_rows_of({0, 200, 0, 17, 0, 130});
    Tensor out = testing::nan_tensor(p, p.heads, p.seq);
    RunContext ctx{cpu_allocator(), nullptr, 2};
    Backend& flash = cpu_backend("flash");
    ASSERT_TRUE(flash.traits().rows);
    flash.forward(p, in, out, ctx);
    for (std::int64_t b = 0; b < 3; ++b) {
      Problem one = p;
      one.batch = 1;
      one.kv_seq = lens[static_cast<std::size_t>(b)];
      one.kv_cache = KvCache::Contiguous;
      one.page_size = 0;
      const auto slice = [&](const Tensor& t, std::int64_t rows) {
        return t.as_strided({1, t.size(1), rows, t.size(3)}, t.strides(), t.offset() + b * t.stride(0));
      };
      Inputs mine;
      mine.q = slice(in.q, p.seq);
      mine.k = slice(in.k, one.kv_seq);
      mine.v = slice(in.v, one.kv_seq);
      const ErrorStats e = check_against_reference(one, mine, slice(out, p.seq), sample_rows(one, 1 << 20));
      EXPECT_EQ(e.nan_rows, 0) << mask_name(mask) << " sequence " << b;
      EXPECT_LT(e.rel, 1e-5) << mask_name(mask) << " sequence " << b;
    }
  }
}

TEST(PerSequenceLengths, AreCheckedAndPagesPastThemAreNotRead) {
  testing::Shape s{.batch = 2, .heads = 1, .seq = 1, .kv_seq = 64, .head_dim = 32};
  Problem p = testing::to_problem(s, DType::F32, MaskKind::None);
  p.kv_cache = KvCache::Paged;
  p.page_size = 16;
  p.validate();
  Inputs in = make_inputs(p, 1, cpu_allocator());
  in.kv_rows = kv_rows_of({0, 64, 0, 16});
  std::int32_t* lens = in.kv_rows.data_as<std::int32_t>() + 1;  // lens[2 b]: sequence b's end
  // Sequence 1 reads one page: garbage in its other entries is never read.
  in.block_table.data_as<std::int32_t>()[4 + 3] = -7;
  Tensor out = testing::nan_tensor(p, p.heads, p.seq);
  RunContext ctx{cpu_allocator(), nullptr, 1};
  EXPECT_NO_THROW(cpu_backend("flash").forward(p, in, out, ctx));
  lens[2] = 64;  // now it reads that entry
  try {
    cpu_backend("flash").forward(p, in, out, ctx);
    ADD_FAILURE() << "a block table entry of -7 was read";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("block table [1][3] = -7 is not a physical page"), std::string::npos)
        << e.what();
  }
  lens[2] = 65;  // more keys than kv_seq
  try {
    cpu_backend("flash").forward(p, in, out, ctx);
    ADD_FAILURE() << "kv_rows past kv_seq were taken";
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()), "kv_rows[1] = (0, 65) is outside 0 .. 64");
  }
}

// ---- broadcast checks --------------------------------------------------------

std::string refusal(const std::function<void()>& f) { return testing::invalid_argument_line(f); }

TEST(BroadcastMask, RefusesWrongShapeDtypeAndDevice) {
  Problem p = boolean_problem(2, 8, 16, DType::BF16);
  Inputs in;
  EXPECT_NE(refusal([&] {
              attach_mask(p, key_padding({1, 2, 3}, 16), in, "attn_mask");
            }).find("attn_mask [3, 1, 1, 16] does not broadcast to [B, H, S, Skv] = [2, 4, 8, 16]"),
            std::string::npos);
  EXPECT_NE(refusal([&] {
              attach_mask(p, key_padding({1, 2}, 15), in, "attn_mask");
            }).find("dimension 3 is 15"),
            std::string::npos);
  p.mask = MaskKind::Bias;
  EXPECT_NE(refusal([&] {
              attach_mask(p, Tensor::empty({1, 1, 8, 16}, DType::F32, cpu_allocator()), in, "attn_mask");
            }).find("a float mask takes the query's dtype"),
            std::string::npos);
  EXPECT_NE(refusal([&] { (void)mask_kind_of("attn_mask", DType::I32); }).find("boolean (True attends)"),
            std::string::npos);
  static std::uint8_t fake[16];
  const Tensor on_gpu = Tensor::from_blob(fake, {1, 1, 1, 16}, {16, 16, 16, 1}, DType::BF16, Device::Cuda);
  EXPECT_NE(refusal([&] { attach_mask(p, on_gpu, in, "attn_mask"); }).find("attn_mask is on cuda but q is on cpu"),
            std::string::npos);
  EXPECT_FALSE(in.mask.defined());
  EXPECT_FALSE(in.bias.defined());
  // A good bias lands in Inputs::bias, broadcast with stride 0.
  attach_mask(p, Tensor::empty({1, 1, 8, 16}, DType::BF16, cpu_allocator()), in, "attn_mask");
  EXPECT_EQ(in.bias.sizes(), (Dims{2, 4, 8, 16}));
  EXPECT_EQ(in.bias.stride(0), 0);
  EXPECT_EQ(in.bias.stride(1), 0);
}

// ---- the .npy reader ---------------------------------------------------------

struct Npy : testing::TempDir {
  Npy() : testing::TempDir("attnprof_npy") {}
  // A file of a header dict (padded as numpy pads it) and raw data bytes.
  fs::path write(const std::string& name, const std::string& dict, const std::string& data, int version = 1) const {
    std::string header = dict;
    const std::size_t prefix = version == 1 ? 10 : 12;
    while ((prefix + header.size() + 1) % 64 != 0) header += ' ';
    header += '\n';
    std::string bytes = "\x93NUMPY";
    bytes += static_cast<char>(version);
    bytes += '\0';
    const auto n = static_cast<std::uint32_t>(header.size());
    bytes += static_cast<char>(n & 0xff);
    bytes += static_cast<char>((n >> 8) & 0xff);
    if (version > 1) {
      bytes += static_cast<char>((n >> 16) & 0xff);
      bytes += static_cast<char>((n >> 24) & 0xff);
    }
    return raw(name, bytes + header + data);
  }
  fs::path raw(const std::string& name, const std::string& bytes) const {
    const fs::path f = path() / name;
    std::ofstream(f, std::ios::binary) << bytes;
    return f;
  }
};

std::string floats(const std::vector<float>& v) {
  return std::string(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(float));
}

TEST(MaskFile, ReadsBoolAndFloatArraysRightAligned) {
  Npy dir;
  const auto b = dir.write("b.npy", "{'descr': '|b1', 'fortran_order': False, 'shape': (2, 3), }",
                           std::string("\x01\x00\x01\x00\x00\x01", 6));
  const Tensor t = read_mask_file(b.string());
  EXPECT_EQ(t.dtype(), DType::Bool);
  EXPECT_EQ(t.sizes(), (Dims{1, 1, 2, 3}));
  EXPECT_EQ(t.get(0, 0, 1, 2), 1.0f);
  EXPECT_EQ(t.get(0, 0, 1, 0), 0.0f);
  const auto f = dir.write("f.npy", "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 1, 1, 2), }",
                           floats({0.5f, -std::numeric_limits<float>::infinity(), 2.0f, -3.0f}), 2);
  const Tensor u = read_mask_file(f.string());
  EXPECT_EQ(u.dtype(), DType::F32);
  EXPECT_EQ(u.sizes(), (Dims{2, 1, 1, 2}));
  EXPECT_EQ(u.get(1, 0, 0, 1), -3.0f);
  EXPECT_TRUE(std::isinf(u.get(0, 0, 0, 1)));
  const double d[] = {1.25, -0.5};
  const auto f8 = dir.write("d.npy", "{'descr': '<f8', 'fortran_order': False, 'shape': (2,), }",
                            std::string(reinterpret_cast<const char*>(d), sizeof d));
  EXPECT_EQ(read_mask_file(f8.string()).get(0, 0, 0, 0), 1.25f);
  // Converted to the problem's dtype for a bias.
  Problem p = boolean_problem(1, 1, 2, DType::BF16);
  p.mask = MaskKind::Bias;
  EXPECT_EQ(convert_mask(p, read_mask_file(f8.string())).dtype(), DType::BF16);
}

TEST(MaskFile, HostileFilesAreRefusedInOneLine) {
  Npy dir;
  const std::string ok_dict = "{'descr': '|b1', 'fortran_order': False, 'shape': (4,), }";
  const std::string four(4, '\x01');
  struct Case {
    fs::path file;
    std::string needle;
  };
  std::string huge_header = "\x93NUMPY\x02";
  huge_header += std::string("\0\xff\xff\xff\x7f", 5);
  const std::vector<Case> cases = {
      {dir.path() / "missing.npy", "cannot open it"},
      {dir.raw("empty.npy", ""), "not a .npy file"},
      {dir.raw("text.npy", "hello world, not numpy"), "not a .npy file"},
      {dir.raw("v9.npy", std::string("\x93NUMPY\x09\x00", 8)), "format version 9"},
      {dir.raw("short.npy", std::string("\x93NUMPY\x01\x00\x40", 9)), "truncated"},
      {dir.raw("huge.npy", huge_header), "at most 64 KiB"},
      {dir.write("int.npy", "{'descr': '<i4', 'fortran_order': False, 'shape': (4,), }", std::string(16, '\0')),
       "its dtype is '<i4'"},
      {dir.write("big_endian.npy", "{'descr': '>f4', 'fortran_order': False, 'shape': (1,), }", std::string(4, '\0')),
       "its dtype is '>f4'"},
      {dir.write("fortran.npy", "{'descr': '|b1', 'fortran_order': True, 'shape': (2, 2), }", four), "Fortran order"},
      {dir.write("five_d.npy", "{'descr': '|b1', 'fortran_order': False, 'shape': (1, 1, 1, 2, 2), }", four),
       "5 dimensions"},
      {dir.write("scalar.npy", "{'descr': '|b1', 'fortran_order': False, 'shape': (), }", "\x01"), "0 dimensions"},
      {dir.write("zero.npy", "{'descr': '|b1', 'fortran_order': False, 'shape': (0, 4), }", ""), "is empty"},
      {dir.write("vast.npy", "{'descr': '|b1', 'fortran_order': False, 'shape': (99999999999, 99999999), }", four),
       "more than 2^31 elements"},
      {dir.write("less_data.npy", ok_dict, "\x01\x01"), "needs 4 bytes of data, the file holds 2"},
      {dir.write("more_data.npy", ok_dict, four + four), "needs 4 bytes of data, the file holds 8"},
      {dir.write("bad_bool.npy", ok_dict, "\x01\x02\x01\x01"), "neither 0 nor 1"},
      {dir.write("nan.npy", "{'descr': '<f4', 'fortran_order': False, 'shape': (2,), }",
                 floats({1.0f, std::numeric_limits<float>::quiet_NaN()})),
       "is NaN"},
      {dir.write("no_shape.npy", "{'descr': '|b1', 'fortran_order': False, }", four), "has no 'shape'"},
      {dir.write("junk_shape.npy", "{'descr': '|b1', 'fortran_order': False, 'shape': (4, x), }", four),
       "not a tuple of sizes"},
      {dir.write("unclosed.npy", "{'descr': '|b1', 'fortran_order': False, 'shape': (4, ", four), "does not parse"},
      {dir.write("binary.npy", std::string("{'descr': '|b1'\x01\x02}"), four), "header is not text"},
  };
  for (const Case& c : cases) {
    try {
      (void)read_mask_file(c.file.string());
      ADD_FAILURE() << c.file << " was read";
    } catch (const Error& e) {
      const std::string what = e.what();
      EXPECT_EQ(e.kind(), ErrorKind::BadInput) << what;
      EXPECT_EQ(what.find('\n'), std::string::npos) << what;
      EXPECT_EQ(what.rfind("cannot read mask file " + c.file.string() + ": ", 0), 0u) << what;
      EXPECT_NE(what.find(c.needle), std::string::npos) << c.file << ": " << what;
    }
  }
}

// ---- --mask-file through the command -------------------------------------

int run_cli(const std::string& args, const fs::path& dir, std::string& err) {
  const fs::path e = dir / ".err";
  const std::string cmd =
      "cd '" + dir.string() + "' && '" + ATTNPROF_CLI_PATH + "' " + args + " >/dev/null 2>'" + e.string() + "'";
  const int status = std::system(cmd.c_str());
  std::ifstream in(e);
  err.assign(std::istreambuf_iterator<char>(in), {});
  fs::remove(e);
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

TEST(MaskFileCli, ComparesOnTheFilesMaskAndRefusesBadOnesWritingNothing) {
  Npy dir;
  // Key padding for batch 2 over kv-seq 96: lengths 96 and 40.
  std::string bits;
  for (int b = 0; b < 2; ++b)
    for (int j = 0; j < 96; ++j) bits += (j < (b == 0 ? 96 : 40)) ? '\x01' : '\x00';
  dir.write("pad.npy", "{'descr': '|b1', 'fortran_order': False, 'shape': (2, 1, 1, 96), }", bits);
  dir.write("bias.npy", "{'descr': '<f4', 'fortran_order': False, 'shape': (64, 96), }",
            floats(std::vector<float>(64 * 96, -0.25f)));
  const std::string shape =
      "--device cpu --batch 2 --heads 2 --seq 64 --kv-seq 96 --head-dim 32 --dtype fp32 "
      "--warmup 0 --active 1 --threads 1 --quiet ";
  std::string err;
  EXPECT_EQ(
      run_cli("compare " + shape + "--backends flash,naive,math --mask-file pad.npy --trace-dir t1", dir.path(), err),
      0)
      << err;
  EXPECT_TRUE(fs::exists(dir.path() / "t1"));
  EXPECT_EQ(run_cli("compare " + shape + "--backends flash,math --mask-file bias.npy --trace-dir t2", dir.path(), err),
            0)
      << err;
  // Refusals: one line, exit 2 for a mask that does not fit, 4 for a file
  // that is no mask; no trace directory made.
  const auto refused = [&](const std::string& args, int code, const std::string& needle) {
    const int got = run_cli("compare " + shape + args + " --trace-dir bad", dir.path(), err);
    EXPECT_EQ(got, code) << args << ": " << err;
    EXPECT_EQ(err.find('\n'), err.size() - 1) << err;
    EXPECT_NE(err.find(needle), std::string::npos) << err;
    EXPECT_FALSE(fs::exists(dir.path() / "bad")) << args;
  };
  refused("--mask-file pad.npy --batch 3", 2, "does not broadcast to [B, H, S, Skv] = [3, 2, 64, 96]");
  refused("--mask-file pad.npy --mask causal", 2, "--mask-file and --mask are exclusive");
  dir.raw("junk.npy", "not numpy at all");
  refused("--mask-file junk.npy", 4, "cannot read mask file junk.npy: not a .npy file");
  refused("--mask-file nowhere.npy", 4, "cannot read mask file nowhere.npy: cannot open it");
}

}  // namespace
}  // namespace attnprof
